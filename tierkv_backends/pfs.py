"""The parallel-filesystem tier: a content-addressed, checksummed directory on any POSIX filesystem.

Options:

``path`` (str, required)
    The store directory (Lustre, GPFS, NFS, or a local filesystem); created if missing.
``capacity`` (size, default ``1GiB``)
    Budget for ``used_bytes`` (see Accounting).
``fsync`` (bool, default true)
    fsync every content file and directory at publish. With false, a crash may lose
    recent blocks (never expose torn ones: every read is verified).
``max_concurrency`` (int, default 8)
    Worker threads doing file I/O (the limiter size); a batch is written and read by up
    to that many threads in parallel.
``max_block_bytes`` (size, default ``1GiB``)
``dedup`` (``"tenant"`` or ``"global"``, default ``"tenant"``)
    The scope within which identical content is stored once (see Content addressing).
``open_files`` (int, default a quarter of the soft ``RLIMIT_NOFILE``, at most 4096)
    Read-only descriptors of recently read records kept open (an LRU), so that reading a
    block again is one ``preadv`` instead of ``open`` + ``preadv`` + ``close`` (on Lustre
    or GPFS an ``open`` is a metadata-server round trip); 0 disables. See Reads.
``revalidate_s`` (float, default 1.0)
    How old a cached descriptor's last check may be before a read checks it again (one
    ``fstat``), like an NFS client's attribute cache; 0 checks on every read. See Reads.

Layout (format 5; all under ``path``)::

    tierkv-pfs-format          "5": the format of the store (a store with records and no
                               such file is of format 4 and refused)
    objects/<scope>/<sha256>   content files: a 64-byte header ("tierkv4\\0", nbytes, the
                               xxh3-128 and the sha256 of the content) then the content;
                               named by the sha256 of the content, written once, never
                               modified
    keys/<key>~<bind>~<tag>    one record per key: a hard link to its content file; <bind>
                               (32 hex digits) binds the key, the content's sha256 and the
                               tag (:func:`record_binding`), <tag> is the block's tag in
                               unpadded base64url
    keys/<key>~<bind>~~<digest> the same for a tag too long for a file name; the tag is in
                               tags/<digest> (the first 40 hex digits of its sha256)
    tmp/<host>.<pid>.<uuid>.tmp    temp files (named publish, record replacement)
    quarantine/<sha256>.<ns>   content that failed verification, kept for inspection

Content addressing: a block's content file is ``objects/<scope>/<sha256 of the bytes>``.
A write whose content already has a file in its scope stores nothing new: the file is
opened, its bytes compared with the new ones (a corrupt file is moved to
``quarantine/`` and replaced instead), and the key's record is linked to that inode.
The reference count of a content file is its link count: every record is a hard
link, so ``st_nlink - 1`` is the number of keys using it, in every process sharing
the directory. Evicting the last key unlinks the content file. Scopes: with
``dedup="tenant"`` a block written by :class:`~tierkv.TierKV` is scoped by the tenant in
its tag (:func:`tierkv.backend.tag_tenant`), an untagged block by the shared scope
``untagged``, and any other tag by a digest of the whole tag (its content is shared
only with blocks of the identical tag); two tenants never share a content file.
``dedup="global"`` puts every block in one scope.

Publish (atomic): the content goes to an unnamed temporary file (``O_TMPFILE`` in the
scope directory), is fsynced, and is published by ``linkat`` as
``objects/<scope>/<sha256>``; the record is linked to the same inode. ``linkat``, like
``rename``, makes the whole file appear at once, and never replaces an existing name
(a concurrent writer of the same content keeps its own file: both are correct).
Filesystems without ``O_TMPFILE`` get the named protocol: ``tmp/`` file, fsync, the
record linked to it, ``rename`` over ``objects/<scope>/<sha256>``. A record that
exists already (another process's record of the key) is replaced by a link made in
``tmp/`` and renamed over it. Directories are fsynced once per batch (``keys/`` and
each scope written). A block is committed when ``write`` returns. A crash leaves
either nothing, an unnamed inode the filesystem frees, a content file without a
record (removed by a later scan once ten minutes old), or a stray temp file; never a
record whose bytes are not durable.

Verification: every read checks the header (magic and size), the xxh3-128 of the bytes
it read against the header (tens of GB/s; the full bytes are compared when a write
deduplicates), and that the record's binding is the digest of the key and tag in its name
and the header's sha256 (so a record renamed to another key or tag, or linked to another
block's content, is never served: it raises IntegrityError and is removed; this catches
misfiled and renamed records, not a writer of the directory who recomputes bindings, who
could as well write any content). Bad
content raises :class:`~tierkv.IntegrityError`; the content file is linked into
``quarantine/`` and every record of it this process knows, and its ``objects/`` name,
are unlinked, so it is never served again (other processes' reads of it fail
verification in turn). A record linked to another block's sound content file, or one whose
binding does not match its name, also raises IntegrityError; only that record is removed. A missing record reads as
:class:`~tierkv.BlockNotFoundError`. With ``read(into=...)`` the caller's buffer
receives the bytes before they are verified; on an error its content is undefined.

Accounting: ``used_bytes`` = the sizes of the distinct content files this process's
keys use (a file shared by several keys counts once) + pending reservations
(``nbytes`` each). Headers and records are not counted. ``details["logical_bytes"]``
sums the keys' sizes. ``used_bytes`` returns exactly to its previous value after
``evict``.

Warm start and sharing: :meth:`PfsBackend.open` (and :meth:`PfsBackend.scan`) rebuild
the index from ``keys/`` (one ``stat`` per record; the tag is in the name). They remove
temp files of dead writers on this host (or older than an hour), content files that no
record links once they are ten minutes old, and, when a crash left two records of one
key (a key rewritten with another tag), all but one. Several processes may open the
same directory: files are immutable once published and records are replaced
atomically, so a reader sees a whole block or a miss. Keys added by another process
become visible after ``scan()``; one evicted by another process (or rewritten with
other bytes: its record's name changes) reads as :class:`~tierkv.BlockNotFoundError`
until then (once this process's cached descriptor of it is rechecked: see Reads). Within a process, a write of a key whose eviction is still unlinking its
record waits for it (the unlink must not take the new record of the same name). A directory written by an earlier development
format (``segments/``, symbolic-link records) is refused with
:class:`~tierkv.ConfigError`.

Reads: a record read before is read through its cached descriptor (``open_files``)
while the inode's change time is the one it had when the descriptor was opened (one
``fstat``, at most once per ``revalidate_s`` per descriptor); a link or unlink of any
record of that content changes it, and the record is then opened again by name, so a
block evicted by another process reads as a miss here at most ``revalidate_s`` later
(until then, and for changes within the filesystem's timestamp granularity of that
``open``, a few milliseconds on Linux, the bytes served are the key's verified content
all the same). An evicted key's descriptor is closed here at once; one pushed out of
the LRU when its last reader is done. What the page cache holds is read first with ``RWF_NOWAIT`` in few worker-thread
hops (one for blocks averaging up to :data:`_SMALL_BLOCK_BYTES`, else at most one per
CPU: a hop costs more than a cached small block), ranges found
not cached get ``POSIX_FADV_WILLNEED``, and the rest is spread over ``max_concurrency``
threads so that several reads are in flight on the medium. Blocks over
:data:`_PIECE_BYTES` are hashed piece by piece while each piece is in the CPU cache.

Cancellation: a cancelled ``read`` or ``read_many`` without ``into`` returns at once even
while the medium stalls: its worker threads finish in the background into the buffers of
that call, which are then dropped (:func:`~tierkv.backend.run_blocking`; each keeps its
slot of the ``max_concurrency`` limiter until it ends). Reads into a caller's buffers, and
every write and evict, wait for their threads. A full filesystem (``ENOSPC``, ``EDQUOT``)
fails a write with :class:`~tierkv.CapacityError` after removing what it created. A cancelled ``write`` or
``write_many`` waits for its I/O, then removes what it published (records, and content
files no other record links; shielded) and releases its reservations; an ``evict``
drops the key from the index first and finishes its unlinks shielded from
cancellation.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import hashlib
import os
import resource
import socket
import struct
import threading
import time
import uuid
import weakref
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread
import numpy as np
import xxhash

from tierkv.backend import (
    Allocation,
    Availability,
    Backend,
    BackendStats,
    BlockInfo,
    Buffer,
    Capabilities,
    RawMeasurement,
    Reservation,
    ReservationLedger,
    TierKind,
    as_byte_view,
    certify_batch,
    into_view,
    opt_bool,
    opt_choice,
    opt_float,
    opt_int,
    opt_size,
    opt_str,
    os_error,
    reject_unknown,
    run_blocking,
    tag_tenant,
    validate_key,
)
from tierkv.errors import (
    BackendClosedError,
    BackendIOError,
    BlockNotFoundError,
    ConfigError,
    InputError,
    IntegrityError,
    TierKVError,
)

from ._copier import CPUS

__all__ = ["PfsBackend"]

_KNOWN = frozenset(
    {"path", "capacity", "fsync", "max_concurrency", "max_block_bytes", "dedup", "open_files", "revalidate_s"}
)
_TMP_MAX_AGE_S = 3600.0
_ORPHAN_MAX_AGE_S = 600.0
_HOST = socket.gethostname().replace(".", "_").replace("/", "_") or "host"
_RWF_NOWAIT: int = getattr(os, "RWF_NOWAIT", 0)
_O_TMPFILE: int = getattr(os, "O_TMPFILE", 0)
_WILLNEED: int = getattr(os, "POSIX_FADV_WILLNEED", 0)
#: the content file header: magic, nbytes, xxh3-128, sha256
_HDR = struct.Struct("<8sQ16s32s")
_MAGIC = b"tierkv4\0"
#: a batch read first reads what the page cache holds in one worker-thread hop per this many bytes
_HOT_GROUP_BYTES = 2 << 20
#: a block larger than this is read in pieces of this size, each fed to a streaming xxh3 right
#: after it is read, while still in the CPU cache (measured on the earlier segment layout:
#: 2 MiB blocks read from the page cache went from 0.78-0.85x to 0.91-0.98x of plain reads)
_PIECE_BYTES = 512 << 10
#: a batch whose blocks average at most this many bytes reads its cached part in one thread
_SMALL_BLOCK_BYTES = 64 << 10
_NAME_MAX = 255
#: bytes of a record's binding in its name: a digest of the key, the content's sha256 and the
#: tag (checked on every read: a record linked to the wrong content file, or renamed to
#: another key or tag, is caught even though the content file is consistent in itself)
_PFX = 16
_FORMAT = 5
_FORMAT_FILE = "tierkv-pfs-format"
_TAG_SEP = "~"


def _b64(tag: bytes) -> str:
    return base64.urlsafe_b64encode(tag).rstrip(b"=").decode("ascii")


def _unb64(s: str) -> bytes:
    return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))


def _tag_digest(tag: bytes) -> str:
    return hashlib.sha256(tag).hexdigest()[:40]


def record_binding(key: str, sha: bytes, tag: bytes) -> bytes:
    """The binding of a record (16 bytes): the first bytes of the sha256 of the key, the
    content's sha256 and the tag. A record's name carries it; a read checks it against the
    key and tag of the name and the sha256 in the content file's header, so a record
    renamed to another key or tag (or linked to another block's content) never serves
    those bytes. Pure."""
    kb = key.encode("ascii")
    return hashlib.sha256(b"tierkv-pfs-record\0" + len(kb).to_bytes(1, "little") + kb + sha + tag).digest()[:_PFX]


def record_name(key: str, tag: bytes, sha: bytes) -> tuple[str, str]:
    """The record file name of ``key`` with ``tag`` and content sha256 ``sha``
    ("<key>~<32 hex digits of the binding>~<tag>", see :func:`record_binding`), and the
    ``tags/`` file name holding the tag when it does not fit in the name ("" when it
    does). Pure."""
    head = key + _TAG_SEP + record_binding(key, sha, tag).hex() + _TAG_SEP
    name = head + _b64(tag)
    if len(name) <= _NAME_MAX:
        return name, ""
    d = _tag_digest(tag)
    return head + _TAG_SEP + d, d


def parse_record_name(name: str) -> tuple[str, bytes, bytes | None, str]:
    """(key, binding, tag, tags/ file) of a record name: the tag when it is
    in the name (the tags/ file is then ""), else None and the tags/ file. ValueError
    for a name that is not a format-4 record. Pure."""
    key, sep, rest = name.partition(_TAG_SEP)
    if not sep or len(rest) < 2 * _PFX + 1 or rest[2 * _PFX] != _TAG_SEP:
        raise ValueError("not a tierkv record name")
    validate_key(key)
    pfx = bytes.fromhex(rest[: 2 * _PFX])
    rest = rest[2 * _PFX + 1 :]
    if rest.startswith(_TAG_SEP):
        d = rest[1:]
        if len(d) != 40 or any(c not in "0123456789abcdef" for c in d):
            raise ValueError("malformed tag digest")
        return key, pfx, None, d
    tag = _unb64(rest)
    if _b64(tag) != rest:
        raise ValueError("non-canonical tag encoding")
    return key, pfx, tag, ""


def dedup_scope(tag: bytes, mode: str) -> str:
    """The ``objects/`` subdirectory a block's content goes to (see Content addressing). Pure."""
    if mode == "global":
        return "shared"
    if not tag:
        return "untagged"
    tenant = tag_tenant(tag)
    if tenant is not None:
        return "t-" + tenant.hex()
    return "x-" + hashlib.sha256(b"tierkv-scope\0" + tag).hexdigest()[:32]


@dataclass(slots=True)
class _Rec:
    """A committed block: its record name, content inode, size and tag; ``sha`` (hex) once
    this process has seen the content file's header."""

    name: str
    ino: int
    nbytes: int
    tag: bytes
    scope: str
    pfx: bytes  # the record's binding (of key, content sha256 and tag), from the name
    sha: str = ""
    shab: bytes = b""  # the content's sha256 once verified (written or read) by this process

    def owns(self, sha: bytes) -> bool:
        """Whether the content file whose header says ``sha`` is the one this record's
        name binds to its key and tag (:func:`record_binding`)."""
        if self.shab:
            return sha == self.shab
        if record_binding(self.name.partition(_TAG_SEP)[0], sha, self.tag) != self.pfx:
            return False
        self.shab = sha
        if not self.sha:
            self.sha = sha.hex()
        return True


@dataclass(frozen=True, slots=True)
class _Put:
    """What one block's publish did: the record linked, its inode, the content's sha256,
    and whether a new content file was written (else an existing one was linked)."""

    name: str
    ino: int
    sha: str
    fresh: bool

    @property
    def pfx(self) -> bytes:
        return parse_record_name(self.name)[1]


@dataclass(slots=True)
class _Undo:
    """Filesystem work that removes blocks, done in one worker thread (:meth:`PfsBackend._apply`)."""

    records: list[_Rec] = field(default_factory=list)  # records to unlink (and their content if last)
    stray: list[_Rec] = field(default_factory=list)  # records to unlink, their content left alone
    quarantine: list[_Rec] = field(default_factory=list)  # corrupt content: linked aside first

    def __bool__(self) -> bool:
        return bool(self.records or self.quarantine or self.stray)


class _Handle:
    """A read-only descriptor of a record (so of its content inode), shared by readers."""

    __slots__ = ("checked", "ctime", "dead", "fd", "users")

    def __init__(self, fd: int, ctime: int, dead: bool, checked: float) -> None:
        self.fd = fd
        self.ctime = ctime  # the inode's st_ctime_ns when opened (a link or unlink changes it)
        self.checked = checked  # time.monotonic() when ctime was last found unchanged
        self.users = 1
        self.dead = dead  # out of the cache: closed by its last user


class _OpenFiles:
    """A bounded LRU of read-only descriptors of records, by record name, shared by the
    worker threads: a cached block is read with one ``preadv`` instead of ``open`` +
    ``preadv`` + ``close`` (on Lustre or GPFS an ``open`` is a metadata-server round trip).

    A descriptor in use is never closed under its user: :meth:`take` and :meth:`adopt` count
    a user, :meth:`give` uncounts, and a handle dropped (its key evicted or found corrupt,
    pushed out of the LRU, the backend closed) while in use is closed by its last user, so a
    descriptor number is never reused while a reader holds it. Thread-safe; every method
    takes one lock once per call (the batch methods once per batch)."""

    __slots__ = ("_d", "_limit", "_lock")

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._d: OrderedDict[str, _Handle] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._d)

    def take(self, names: Sequence[str]) -> list[_Handle | None]:
        """The cached handle of each record name (a user counted), or None."""
        out: list[_Handle | None] = []
        if not self._d:
            return [None] * len(names)
        d = self._d
        with self._lock:
            for name in names:
                h = d.get(name)
                if h is not None:
                    h.users += 1
                    d.move_to_end(name)
                out.append(h)
        return out

    def adopt(self, name: str, fd: int, ctime: int, now: float) -> _Handle:
        """Cache a descriptor just opened for ``name`` (a user counted). When the cache is
        disabled or another thread cached ``name`` meanwhile, the handle is not cached and
        its descriptor is closed by :meth:`give`."""
        if self._limit <= 0:
            return _Handle(fd, ctime, True, now)
        with self._lock:
            if name in self._d:
                return _Handle(fd, ctime, True, now)
            h = self._d[name] = _Handle(fd, ctime, False, now)
            while len(self._d) > self._limit:
                self._retire(self._d.popitem(last=False)[1])
            return h

    def give(self, handles: Iterable[_Handle]) -> None:
        """Uncount a user of each handle; close dropped handles nobody uses any more."""
        with self._lock:
            for h in handles:
                h.users -= 1
                if h.dead and h.users == 0:
                    os.close(h.fd)

    def drop(self, name: str) -> None:
        """Forget the handle of ``name`` (closed now, or by its last user)."""
        with self._lock:
            h = self._d.pop(name, None)
            if h is not None:
                self._retire(h)

    def clear(self) -> None:
        with self._lock:
            while self._d:
                self._retire(self._d.popitem()[1])

    @staticmethod
    def _retire(h: _Handle) -> None:
        h.dead = True
        if h.users == 0:
            os.close(h.fd)


def _default_open_files() -> int:
    """``open_files`` by default: a quarter of the soft descriptor limit, at most 4096."""
    try:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (OSError, ValueError):  # pragma: no cover - no such limit here
        return 256
    if soft == resource.RLIM_INFINITY:
        return 4096
    return max(0, min(4096, soft // 4))


def _is_record(name: str) -> bool:
    try:
        parse_record_name(name)
    except (ValueError, InputError):
        return False
    return True


def _close_fds(*fds: int) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _slices(sizes: Sequence[int], groups: int) -> list[range]:
    """Cut ``len(sizes)`` items into at most ``groups`` consecutive runs of about equal bytes."""
    n = len(sizes)
    groups = max(1, min(groups, n))
    total = sum(sizes)
    if groups == 1 or total == 0:
        step = -(-n // groups) if n else 1
        return [range(i, min(n, i + step)) for i in range(0, n, step)]
    out: list[range] = []
    start = 0
    acc = 0
    for i, s in enumerate(sizes):
        acc += s
        if acc * groups >= total * (len(out) + 1) and len(out) < groups - 1:
            out.append(range(start, i + 1))
            start = i + 1
    if start < n:
        out.append(range(start, n))
    return out


def _advance(bufs: list[memoryview], n: int) -> list[memoryview]:
    """The buffers left after the first ``n`` bytes of ``bufs`` were transferred."""
    i = 0
    while i < len(bufs) and n >= bufs[i].nbytes:
        n -= bufs[i].nbytes
        i += 1
    rest = bufs[i:]
    if rest and n:
        rest[0] = rest[0][n:]
    return rest


def _hashes(src: memoryview) -> tuple[bytes, bytes]:
    """(sha256, xxh3-128) of ``src`` in one pass: a large block is fed to both piece by
    piece, each piece hashed twice while it is in the CPU cache."""
    if src.nbytes <= _PIECE_BYTES:
        return hashlib.sha256(src).digest(), xxhash.xxh3_128_digest(src)
    sh = hashlib.sha256()
    xh = xxhash.xxh3_128()
    for pos in range(0, src.nbytes, _PIECE_BYTES):
        piece = src[pos : pos + _PIECE_BYTES]
        sh.update(piece)
        xh.update(piece)
    return sh.digest(), xh.digest()


def _pwritev_all(fd: int, bufs: list[memoryview], off: int) -> None:
    bufs = [b for b in bufs if b.nbytes]
    while bufs:
        n = os.pwritev(fd, bufs, off)
        off += n
        bufs = _advance(bufs, n)


class PfsBackend(Backend):
    """Content-addressed, checksummed, persistent directory tier (see the module docstring).

    Implements :class:`~tierkv.backend.SupportsScan` and :class:`~tierkv.backend.SupportsContentHash`.
    ``io_path`` is ``"posix pread/pwrite + fsync"``; never emulated.
    """

    def __init__(self, options: Mapping[str, Any] | None = None, *, name: str = "") -> None:
        super().__init__(options, name=name or "pfs")
        o = self.options
        reject_unknown(o, _KNOWN)
        self._root = Path(opt_str(o, "path"))
        self._capacity = opt_size(o, "capacity", 1 << 30)
        self._fsync = opt_bool(o, "fsync", True)
        self._max_conc = opt_int(o, "max_concurrency", 8, minimum=1, maximum=1024)
        self._max_block = opt_size(o, "max_block_bytes", 1 << 30, minimum=1)
        self._dedup = opt_choice(o, "dedup", ("tenant", "global"), "tenant")
        self._files = _OpenFiles(opt_int(o, "open_files", _default_open_files(), minimum=0, maximum=1 << 20))
        self._revalidate_s = opt_float(o, "revalidate_s", 1.0, minimum=0.0, maximum=3600.0)
        self._caps = Capabilities(
            tier_kind=TierKind.PFS,
            persistent=True,
            shared=True,
            alignment=4096,
            max_block_bytes=self._max_block,
            max_concurrency=self._max_conc,
        )
        self._limiter: anyio.CapacityLimiter | None = None
        self._index: dict[str, _Rec] = {}
        self._objs: dict[int, list[int]] = {}  # content inode -> [nbytes, keys indexed here]
        # reservations and the counts; committed bytes are the content files' (each counted once)
        self._ledger: ReservationLedger[Reservation] = ReservationLedger(
            tier=self.name, capacity=self._capacity, max_block_bytes=self._max_block
        )
        self._inflight_tmp: set[str] = set()
        self._scopes: set[str] = set()  # scope directories known to exist
        self._tags: dict[str, bytes] = {}  # tags/ digest -> tag
        self._tmpfile = bool(_O_TMPFILE)
        self._guard = threading.Lock()
        self._publishing: dict[str, threading.Event] = {}  # scope/sha256 being published here
        self._local = threading.local()
        self._dirfd = -1  # the store directory: linkat from /proc/self/fd needs a dirfd argument
        self._keys_fd = -1  # keys/: records are opened relative to it
        self._scan_evicted: set[str] | None = None
        self._evicting: dict[str, anyio.Event] = {}  # key -> set when its record removal is done
        self._nowait = bool(_RWF_NOWAIT)
        self._reading = 0  # read_many calls in progress
        self._reads = self._writes = self._evictions = self._bytes_read = self._bytes_written = 0
        self._dedup_hits = 0
        self._integrity_failures = 0

    # ---------------------------------------------------------------- lifecycle
    @classmethod
    def probe(cls) -> Availability:
        return Availability(True)

    @classmethod
    def default_options(cls, workdir: Path) -> dict[str, Any]:
        return {"path": str(workdir / "pfs"), "capacity": 1 << 30}

    @property
    def capabilities(self) -> Capabilities:
        return self._caps

    async def _open(self) -> None:
        self._limiter = anyio.CapacityLimiter(self._max_conc)
        await self._thread(self._make_dirs)
        await self._rebuild()

    async def _close(self) -> None:
        self._ledger.clear()
        self._files.clear()

    @staticmethod
    def _has_old_records(keys: Path) -> bool:
        """Whether ``keys`` holds records of the earlier format (symlinks to segments)."""
        if not keys.is_dir():
            return False
        with os.scandir(keys) as entries:
            return any(e.is_symlink() and os.readlink(e.path).startswith("tierkv-rec") for e in entries)

    def _make_dirs(self) -> None:
        keys = self._root / "keys"
        if (self._root / "segments").is_dir() or self._has_old_records(keys):
            raise ConfigError(
                f"{self.name}.path",
                str(self._root),
                "an empty directory or a pfs store of format 4; this one was written by an earlier "
                "development format (segments/ or symbolic-link records): move it aside or empty it",
            )
        marker = self._root / _FORMAT_FILE
        try:
            fmt: str | None = marker.read_text(encoding="ascii").strip()
        except FileNotFoundError:
            fmt = None
        except (OSError, UnicodeDecodeError):
            fmt = "unreadable"
        if fmt is None and keys.is_dir() and any(_is_record(e.name) for e in os.scandir(keys)):
            fmt = "4"  # records without a format file: written before record bindings
        if fmt is not None and fmt != str(_FORMAT):
            raise ConfigError(
                f"{self.name}.path",
                str(self._root),
                f"an empty directory or a pfs store of format {_FORMAT}; this one is of format {fmt} "
                "(its records carry no key binding): move it aside or empty it",
            )
        for sub in ("objects", "keys", "tags", "tmp", "quarantine"):
            (self._root / sub).mkdir(parents=True, exist_ok=True)
        if fmt is None:
            tmp = self._root / "tmp" / self._tmp_name()
            try:
                with open(tmp, "w", encoding="ascii") as f:
                    f.write(f"{_FORMAT}\n")
                    f.flush()
                    if self._fsync:
                        os.fsync(f.fileno())
                os.rename(tmp, marker)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            self._fsync_dir(self._root)
        self._dirfd = os.open(self._root, os.O_RDONLY | os.O_DIRECTORY)
        self._keys_fd = os.open(self._root / "keys", os.O_RDONLY | os.O_DIRECTORY)
        # closed when the backend is collected, not at aclose: a worker thread may still be
        # using them, and a closed number reused by another open would redirect its lookups
        weakref.finalize(self, _close_fds, self._dirfd, self._keys_fd)

    async def _thread(self, fn: Any, *args: Any, abandon: bool = False) -> Any:
        """Run blocking ``fn`` in a worker thread (:func:`~tierkv.backend.run_blocking`;
        with ``abandon`` a cancelled caller does not wait for it); an OSError is translated
        by :func:`~tierkv.backend.os_error` (a full disk is CapacityError)."""
        assert self._limiter is not None
        try:
            return await run_blocking(fn, *args, limiter=self._limiter, abandon_on_cancel=abandon)
        except TierKVError:
            raise
        except OSError as exc:
            raise os_error(exc, getattr(fn, "__name__", "io"), tier=self.name) from exc

    # -------------------------------------------------------------- file layer
    def _obj(self, scope: str, sha: str) -> Path:
        return self._root / "objects" / scope / sha

    def _key_path(self, name: str) -> Path:
        return self._root / "keys" / name

    def _fsync_dir(self, d: Path) -> None:
        if not self._fsync:
            return
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _tmp_name(self) -> str:
        return f"{_HOST}.{os.getpid()}.{uuid.uuid4().hex}.tmp"

    def _link_fd(self, fd: int, dst: Path) -> None:
        """Link the open file ``fd`` as ``dst`` (``linkat`` through ``/proc/self/fd``)."""
        os.link(f"/proc/self/fd/{fd}", dst, src_dir_fd=self._dirfd, follow_symlinks=True)

    def _link_record(self, fd: int, name: str) -> None:
        """Publish the record ``keys/<name>`` as a hard link to the open content file
        ``fd``. ``link`` is atomic and fails if the name exists; only then (a record of
        this key left by another process, or a rewrite) the link is made in ``tmp/`` and
        renamed over it."""
        try:
            self._link_fd(fd, self._key_path(name))
            return
        except FileExistsError:
            pass
        tname = self._tmp_name()
        tmp = self._root / "tmp" / tname
        self._inflight_tmp.add(tname)
        try:
            self._link_fd(fd, tmp)
            os.rename(tmp, self._key_path(name))
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        finally:
            self._inflight_tmp.discard(tname)

    def _ensure_scope(self, scope: str) -> None:
        if scope not in self._scopes:
            (self._root / "objects" / scope).mkdir(exist_ok=True)
            self._scopes.add(scope)

    def _ensure_tag(self, digest: str, tag: bytes) -> None:
        """Store a long tag in ``tags/<digest>`` (written once, fsynced, published by rename)."""
        if self._tags.get(digest) == tag:
            return
        path = self._root / "tags" / digest
        try:
            with open(path, "rb") as f:
                if f.read() == tag:
                    self._tags[digest] = tag
                    return
        except FileNotFoundError:
            pass
        tmp = self._root / "tmp" / self._tmp_name()
        try:
            with open(tmp, "wb") as f:
                f.write(tag)
                f.flush()
                if self._fsync:
                    os.fsync(f.fileno())
            os.rename(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)  # a full disk must not leave temp files behind
            raise
        self._fsync_dir(path.parent)
        self._tags[digest] = tag

    @contextmanager
    def _exclusive(self, scope: str, sha: str) -> Iterator[None]:
        """Publish one content at a time in this process: a thread publishing content that
        another thread is publishing waits for it and then finds its file (so equal blocks
        of one batch share one file). Other processes may still race; both files are then
        correct, and each record keeps its own."""
        k = scope + "/" + sha
        while True:
            with self._guard:
                ev = self._publishing.get(k)
                if ev is None:
                    mine = self._publishing[k] = threading.Event()
                    break
            ev.wait()
        try:
            yield
        finally:
            with self._guard:
                del self._publishing[k]
            mine.set()

    def _link_existing(self, fd: int, obj: Path, src: memoryview, sha: bytes, name: str) -> int:
        """Link ``keys/<name>`` to the open content file ``fd`` (``obj``) when it holds
        exactly ``src`` (header and bytes, compared piece by piece); its inode. A file that
        differs (corrupt) is moved to ``quarantine/`` and -1 returned; -2 when the file lost its
        last name meanwhile (a concurrent eviction of the last block holding that content: no
        link to an unlinked file can be made). Closes ``fd``."""
        try:
            st = os.fstat(fd)
            n = src.nbytes
            same = st.st_size == _HDR.size + n
            if same:
                scratch = self._scratch()
                head = scratch[: _HDR.size]
                same = os.preadv(fd, [head], 0) == _HDR.size
                magic, nb, _chk, hsha = _HDR.unpack(head)
                same = same and magic == _MAGIC and nb == n and hsha == sha
                pos = 0
                while same and pos < n:
                    piece = scratch[: min(_PIECE_BYTES, n - pos)]
                    same = os.preadv(fd, [piece], _HDR.size + pos) == piece.nbytes
                    # numpy compares at memory speed; memoryview == goes element by element
                    # under the interpreter lock (1.6 ms per 512 KiB here, against 0.05)
                    same = same and bool(
                        np.array_equal(
                            np.frombuffer(piece, np.uint8), np.frombuffer(src[pos : pos + piece.nbytes], np.uint8)
                        )
                    )
                    pos += piece.nbytes
            if not same:
                self._integrity_failures += 1
                try:
                    if os.stat(obj).st_ino == st.st_ino:
                        os.rename(obj, self._root / "quarantine" / f"{sha.hex()}.{time.time_ns()}")
                except FileNotFoundError:
                    pass
                return -1
            try:
                self._link_record(fd, name)
            except FileNotFoundError:
                if os.fstat(fd).st_nlink == 0:  # its last name went while we compared: publish anew
                    return -2
                raise
            return int(st.st_ino)
        finally:
            os.close(fd)

    def _scratch(self) -> memoryview:
        """This worker thread's buffer of :data:`_PIECE_BYTES` (reused: fresh pages cost a
        fault each)."""
        buf: memoryview | None = getattr(self._local, "buf", None)
        if buf is None:
            buf = self._local.buf = memoryview(bytearray(_PIECE_BYTES))
        return buf

    def _put_block(self, scope: str, tag: bytes, key: str, src: memoryview) -> _Put:
        """Publish one block (see Publish in the module docstring); OSError on failure,
        after removing what it created. The content lock (:meth:`_exclusive`) covers only
        the lookup of an existing content file and the publish of a new one: comparing
        and linking an existing file runs outside it (the file is immutable)."""
        self._ensure_scope(scope)
        sha_b, chk = _hashes(src)
        sha = sha_b.hex()
        name = self._record_for(key, tag, sha_b)
        obj = self._obj(scope, sha)
        while True:
            with self._exclusive(scope, sha):
                try:
                    fd = os.open(obj, os.O_RDONLY)
                except FileNotFoundError:
                    return self._publish_new(obj, name, src, sha_b, chk)
            ino = self._link_existing(fd, obj, src, sha_b, name)
            if ino >= 0:
                return _Put(name, ino, sha, False)
            # the file was corrupt and is in quarantine now, or it was removed: publish a new one

    def _record_for(self, key: str, tag: bytes, sha: bytes) -> str:
        """The record name of a block (storing its tag in ``tags/`` when it is too long)."""
        name, tdig = record_name(key, tag, sha)
        if tdig:
            self._ensure_tag(tdig, tag)
        return name

    def _publish_new(self, obj: Path, name: str, src: memoryview, sha_b: bytes, chk: bytes) -> _Put:
        """Write a new content file for ``src`` (sha256 ``sha_b``, xxh3-128 ``chk``) and link
        ``obj`` and ``keys/<name>`` to it."""
        sha = sha_b.hex()
        head = _HDR.pack(_MAGIC, src.nbytes, chk, sha_b)
        if self._tmpfile:
            try:
                fd = os.open(obj.parent, os.O_TMPFILE | os.O_WRONLY, 0o644)
            except OSError as exc:
                if exc.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL, errno.ENOENT):
                    raise
                self._tmpfile = False  # not supported here: the named protocol from now on
            else:
                try:
                    self._write_content(fd, head, src)
                    try:
                        self._link_fd(fd, obj)
                    except FileExistsError:
                        pass  # the same content published meanwhile: this record keeps its own file
                    self._link_record(fd, name)
                    return _Put(name, int(os.fstat(fd).st_ino), sha, True)
                finally:
                    os.close(fd)
        tname = self._tmp_name()
        tmp = self._root / "tmp" / tname
        self._inflight_tmp.add(tname)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                self._write_content(fd, head, src)
                ino = int(os.fstat(fd).st_ino)
                self._link_record(fd, name)
            finally:
                os.close(fd)
            os.rename(tmp, obj)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        finally:
            self._inflight_tmp.discard(tname)
        return _Put(name, ino, sha, True)

    def _write_content(self, fd: int, head: bytes, src: memoryview) -> None:
        """Header and bytes of a new content file, then its fsync (with ``fsync``)."""
        _pwritev_all(fd, [memoryview(head), src], 0)
        if self._fsync:
            os.fsync(fd)

    def _read_header_sha(self, path: Path) -> tuple[str, int]:
        """(sha256 hex from the header or "", inode) of a content file; ("", -1) if missing."""
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return "", -1
        try:
            head = os.pread(fd, _HDR.size, 0)
            ino = int(os.fstat(fd).st_ino)
        finally:
            os.close(fd)
        if len(head) == _HDR.size:
            magic, _n, _c, sha = _HDR.unpack(head)
            if magic == _MAGIC:
                return sha.hex(), ino
        return "", ino

    def _drop_content(self, rec: _Rec, nlink: int) -> None:
        """After a record of ``rec``'s inode was unlinked: unlink ``objects/<scope>/<sha>``
        when it names that inode and no other record links it (``nlink`` was the link
        count before the unlink)."""
        if nlink > 2 or not rec.sha:
            return
        obj = self._obj(rec.scope, rec.sha)
        try:
            if os.stat(obj).st_ino == rec.ino:
                os.unlink(obj)
        except FileNotFoundError:
            pass

    def _apply(self, undo: _Undo) -> None:
        """Remove what ``undo`` lists: link corrupt content into ``quarantine/`` and unlink
        its ``objects/`` name; unlink records (then sync ``keys/`` once), and content files
        whose last record went. Missing files are fine."""
        for rec in undo.quarantine:
            path = self._key_path(rec.name)
            sha, ino = self._read_header_sha(path)
            if rec.pfx and not (
                sha and record_binding(rec.name.partition(_TAG_SEP)[0], bytes.fromhex(sha), rec.tag) == rec.pfx
            ):
                sha = ""  # the header itself is damaged
            sha = rec.sha or sha
            if ino == rec.ino:
                try:
                    os.link(path, self._root / "quarantine" / f"{sha or rec.ino}.{time.time_ns()}")
                except FileNotFoundError:
                    pass
            if sha:
                self._drop_content(_Rec(rec.name, rec.ino, rec.nbytes, rec.tag, rec.scope, rec.pfx, sha), 0)
            else:  # unreadable header: find its objects/ name by inode
                d = self._root / "objects" / rec.scope
                try:
                    for e in os.scandir(d):
                        if e.inode() == rec.ino:
                            os.unlink(e.path)
                except FileNotFoundError:
                    pass
        gone = False
        for rec in undo.stray:
            try:
                if os.stat(self._key_path(rec.name)).st_ino == rec.ino:
                    os.unlink(self._key_path(rec.name))
                    gone = True
            except FileNotFoundError:
                pass
        dirs: set[str] = set()
        for rec in undo.records:
            path = self._key_path(rec.name)
            try:
                st = os.stat(path)
            except FileNotFoundError:
                continue
            if not rec.sha and st.st_ino == rec.ino:
                rec.sha = self._read_header_sha(path)[0]
            try:
                os.unlink(path)
                gone = True
            except FileNotFoundError:
                continue
            if st.st_ino == rec.ino:
                self._drop_content(rec, st.st_nlink)
                dirs.add(rec.scope)
        if gone:
            self._fsync_dir(self._root / "keys")
        for scope in dirs:
            try:
                self._fsync_dir(self._root / "objects" / scope)
            except FileNotFoundError:
                pass

    def _read_one(self, rec: _Rec, dst: memoryview, nowait: bool, pieces: bool, head: bytearray, fd: int) -> str:
        """Read and verify one block from ``fd`` (its record, open) into ``dst``: "ok" (then
        ``rec.sha`` is set from the header), "bad" (the content file fails verification),
        "wrong" (a sound content file, but not the one the record names) or, only with
        ``nowait``, "cold" (not all cached, nothing verified). ``head``: a scratch buffer of
        the header's size."""
        n = rec.nbytes
        if pieces and n > _PIECE_BYTES:
            got = self._preadv(fd, [memoryview(head)], 0, _HDR.size, nowait)
            if got < _HDR.size:
                return self._cold_or_bad(fd, got, 0, _HDR.size + n, nowait)
            h = xxhash.xxh3_128()
            pos = 0
            while pos < n:
                piece = dst[pos : min(n, pos + _PIECE_BYTES)]
                g = self._preadv(fd, [piece], _HDR.size + pos, piece.nbytes, nowait)
                if g < piece.nbytes:
                    return self._cold_or_bad(fd, g, _HDR.size + pos, n - pos, nowait)
                h.update(piece)
                pos += g
            chk = h.digest()
        else:
            total = _HDR.size + n
            got = self._preadv(fd, [memoryview(head), dst], 0, total, nowait)
            if got < total:
                return self._cold_or_bad(fd, got, 0, total, nowait)
            chk = xxhash.xxh3_128_digest(dst)
        magic, nb, hchk, sha = _HDR.unpack(head)
        if magic == _MAGIC and nb == n and hchk == chk:
            return "ok" if rec.owns(sha) else "wrong"
        return "bad"

    def _cold_or_bad(self, fd: int, got: int, off: int, want: int, nowait: bool) -> str:
        if not nowait:
            return "bad"  # shorter than its record says
        if _WILLNEED:
            got = max(got, 0)
            os.posix_fadvise(fd, off + got, want - got, _WILLNEED)
        return "cold"

    def _read_slice(self, jobs: list[tuple[_Rec, memoryview]], nowait: bool, pieces: bool) -> list[str]:
        """:meth:`_read_one` for each job, or "missing" when its record is gone.

        Records are read through :class:`_OpenFiles`: a cached descriptor is used while
        the inode's change time is the one it had when the descriptor was opened, checked
        when the last check is over ``revalidate_s`` old (else a record of that content was
        linked or unlinked, perhaps this one by another process: the record is opened
        again by name, so an evicted record reads as "missing"). Blocks up to
        :data:`_PIECE_BYTES` read with ``RWF_NOWAIT`` take an inlined loop: cached small
        blocks cost little more than their system calls, so the interpreter's work per
        block is what is left to save."""
        head = bytearray(_HDR.size)
        read_one = self._read_one
        files = self._files
        handles = files.take([rec.name for rec, _ in jobs])
        held: list[_Handle] = [h for h in handles if h is not None]
        out: list[str] = []
        append = out.append
        kfd, rdonly, flag = self._keys_fd, os.O_RDONLY, _RWF_NOWAIT
        o_open, o_preadv, o_fstat = os.open, os.preadv, os.fstat
        inline = nowait and self._nowait
        now = time.monotonic()
        stale = now - self._revalidate_s
        digest, unpack, magic0, hsize = xxhash.xxh3_128_digest, _HDR.unpack, _MAGIC, _HDR.size
        try:
            for (rec, dst), h in zip(jobs, handles, strict=True):
                if h is not None and h.checked <= stale:
                    if o_fstat(h.fd).st_ctime_ns == h.ctime:
                        h.checked = now
                    else:
                        files.drop(rec.name)  # closed when given back
                        h = None
                if h is None:
                    try:
                        fd = o_open(rec.name, rdonly, dir_fd=kfd)
                    except FileNotFoundError:
                        append("missing")
                        continue
                    try:
                        ct = o_fstat(fd).st_ctime_ns
                    except BaseException:
                        os.close(fd)
                        raise
                    h = files.adopt(rec.name, fd, ct, now)
                    held.append(h)
                n = rec.nbytes
                if not inline or n > _PIECE_BYTES:
                    append(read_one(rec, dst, nowait, pieces, head, h.fd))
                    continue
                try:
                    got = o_preadv(h.fd, [head, dst], 0, flag)
                except OSError:
                    got = -1  # not cached (or RWF_NOWAIT refused): the full path decides
                if got != hsize + n:
                    append(read_one(rec, dst, nowait, pieces, head, h.fd))
                    continue
                magic, nb, hchk, sha = unpack(head)
                if magic == magic0 and nb == n and hchk == digest(dst):
                    append("ok" if (sha == rec.shab if rec.shab else rec.owns(sha)) else "wrong")
                else:
                    append("bad")
        finally:
            files.give(held)
        return out

    def _preadv(self, fd: int, bufs: list[memoryview], off: int, total: int, nowait: bool) -> int:
        """Fill ``bufs`` from ``off``; the bytes read (fewer at end of file). With
        ``nowait``: -1 when nothing could be read without waiting for the medium, and
        possibly fewer bytes when only part of the range is cached."""
        got = 0
        if nowait and self._nowait and total:
            try:
                got = os.preadv(fd, bufs, off, _RWF_NOWAIT)
            except BlockingIOError:
                return -1
            except OSError as exc:
                if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                    raise
                self._nowait = False  # not supported here: read normally
                got = 0
            else:
                return got
        rest = _advance(bufs, got) if got else [b for b in bufs if b.nbytes]
        while rest:
            r = os.preadv(fd, rest, off + got)
            if r == 0:
                break
            got += r
            rest = _advance(rest, r)
        return got

    def _scan_dir(self) -> dict[str, _Rec]:
        """Read every valid record; clean temp garbage, duplicate records and old orphans."""
        root = self._root
        now = time.time()
        for e in os.scandir(root / "tmp"):
            parts = e.name.split(".")
            mine = len(parts) == 4 and parts[0] == _HOST and parts[1].isdigit()
            stale = False
            if mine and int(parts[1]) == os.getpid():
                stale = e.name not in self._inflight_tmp
            elif mine:
                stale = not _pid_alive(int(parts[1]))
            try:
                if stale or now - e.stat().st_mtime > _TMP_MAX_AGE_S:
                    os.unlink(e.path)
            except FileNotFoundError:
                pass
        found: dict[str, _Rec] = {}
        removed = False
        for e in os.scandir(root / "keys"):
            try:
                key, pfx, tag, tdig = parse_record_name(e.name)
            except (ValueError, InputError):
                continue  # not ours (NFS silly-rename files, editors): left alone
            try:
                st = e.stat(follow_symlinks=False)
                if tag is None:
                    tag = self._tags.get(tdig)
                    if tag is None:
                        tag = (root / "tags" / tdig).read_bytes()
                        self._tags[tdig] = tag
            except FileNotFoundError:
                continue  # the record (or its tag) vanished meanwhile
            if not e.is_file(follow_symlinks=False) or st.st_size < _HDR.size:
                continue
            rec = _Rec(e.name, int(st.st_ino), st.st_size - _HDR.size, tag, dedup_scope(tag, self._dedup), pfx)
            prev = found.get(key)
            if prev is not None:
                # a crash between linking a rewrite's record and unlinking the old one: both
                # are whole, committed blocks of the key; keep one (the greater name)
                drop, rec = (prev, rec) if prev.name < rec.name else (rec, prev)
                if key in self._index and self._index[key].name == drop.name:
                    drop, rec = rec, drop
                try:
                    os.unlink(self._key_path(drop.name))
                    removed = True
                except FileNotFoundError:
                    pass
            found[key] = rec
        if removed:
            self._fsync_dir(root / "keys")
        for d in os.scandir(root / "objects"):
            if not d.is_dir(follow_symlinks=False):
                continue
            self._scopes.add(d.name)
            for e in os.scandir(d.path):
                try:
                    st = e.stat(follow_symlinks=False)
                    if st.st_nlink <= 1 and now - st.st_mtime > _ORPHAN_MAX_AGE_S:
                        os.unlink(e.path)  # no record links it: an orphan of a crash
                except FileNotFoundError:
                    pass
        return found

    # ----------------------------------------------------------- index helpers
    def _add(self, key: str, rec: _Rec) -> int:
        """Index a committed block; the bytes its content newly holds (0 when another key
        links the same content file already): what the ledger counts for it."""
        self._index[key] = rec
        o = self._objs.get(rec.ino)
        if o is None:
            self._objs[rec.ino] = [rec.nbytes, 1]
            return rec.nbytes
        o[1] += 1
        return 0

    def _forget(self, key: str) -> _Rec:
        """Drop a committed key from the index and its bytes from the accounting (its
        content's only when no other key links the content file)."""
        rec = self._index.pop(key)
        self._files.drop(rec.name)
        if self._scan_evicted is not None:
            self._scan_evicted.add(key)
        o = self._objs[rec.ino]
        o[1] -= 1
        freed = 0
        if o[1] == 0:
            del self._objs[rec.ino]
            freed = o[0]
        self._ledger.release(rec.nbytes, freed)
        return rec

    async def _run_undo(self, undo: _Undo) -> None:
        """Apply ``undo`` in a worker thread, shielded from cancellation. Until it is done,
        a write of one of its keys waits (:meth:`write_many`): the unlink of an evicted
        record must not remove a new record of the same name."""
        if not undo:
            return
        done = anyio.Event()
        keys = {r.name.partition(_TAG_SEP)[0] for r in (*undo.records, *undo.stray, *undo.quarantine)}
        waits = [self._evicting.get(k) for k in keys]
        for k in keys:
            self._evicting[k] = done
        try:
            with anyio.CancelScope(shield=True):
                for w in waits:
                    if w is not None:  # an earlier removal of the same key goes first
                        await w.wait()
                await self._thread(self._apply, undo)
        finally:
            for k in keys:
                if self._evicting.get(k) is done:
                    del self._evicting[k]
            done.set()

    async def _rebuild(self) -> list[BlockInfo]:
        self._scan_evicted = set()
        try:
            found: dict[str, _Rec] = await self._thread(self._scan_dir)
            evicted = self._scan_evicted
        finally:
            self._scan_evicted = None
        for key, rec in found.items():
            if key in self._ledger or key in evicted:
                continue
            old = self._index.get(key)
            if old is not None:
                if old.name == rec.name and old.ino == rec.ino:
                    continue
                self._forget(key)  # replaced by another process: index what is on disk now
            self._ledger.restore(rec.nbytes, self._add(key, rec))
        return [BlockInfo(k, r.nbytes, r.tag) for k, r in self._index.items()]

    # ---------------------------------------------------------------------- data
    async def scan(self) -> list[BlockInfo]:
        """Rescan the directory (see the module docstring) and list every committed block.

        Raises BackendClosedError, BackendIOError."""
        self._check_open()
        return await self._rebuild()

    async def allocate(self, key: str, nbytes: int, *, tag: bytes = b"") -> Allocation:
        """See :meth:`Backend.allocate`; the reservation counts ``nbytes`` until written."""
        self._check_open()
        return self._ledger.reserve(key, nbytes, tag, committed=self._index)

    async def write(self, allocation: Allocation, data: Buffer) -> None:
        """See :meth:`Backend.write`: published durably (the :meth:`write_many` path)."""
        await self.write_many([allocation], [data])

    async def read(self, key: str, *, into: Buffer | None = None) -> memoryview:
        """See :meth:`Backend.read`; the header and the xxh3-128 of the bytes are checked
        on every read."""
        return (await self.read_many([key], into=None if into is None else [into]))[0]

    async def evict(self, key: str) -> bool:
        """See :meth:`Backend.evict`: the key leaves the index at once; its record (and its
        content file, when no other record links it) is unlinked, shielded."""
        return (await self.evict_many([key]))[0]

    async def evict_many(self, keys: Sequence[str]) -> list[bool]:
        """Evict several keys: they leave the index at once; one worker-thread hop
        (shielded from cancellation) unlinks their records and unreferenced content files
        and syncs the directories once. Idempotent like :meth:`evict`."""
        self._check_open()
        for k in keys:
            validate_key(k, tier=self.name)
        out: list[bool] = []
        undo = _Undo()
        for key in keys:
            if key in self._index:
                undo.records.append(self._forget(key))
                self._evictions += 1
                out.append(True)
                continue
            # a reservation: a write in flight undoes what it published
            out.append(self._ledger.drop(key) is not None)
        await self._run_undo(undo)
        return out

    async def content_hash(self, key: str) -> str | None:
        """The sha256 (hex) of the block under ``key`` (its content address), or None when
        it is absent (or fails verification) (:class:`~tierkv.backend.SupportsContentHash`).
        Answered from memory once this process wrote or read the block; else the block
        is read (verified). Raises BackendClosedError, BackendIOError."""
        self._check_open()
        validate_key(key, tier=self.name)
        rec = self._index.get(key)
        if rec is None:
            return None
        if not rec.sha:
            try:
                await self.read(key)
            except (BlockNotFoundError, IntegrityError):
                return None
        return rec.sha or None

    async def contains(self, key: str) -> bool:
        self._check_open()
        validate_key(key, tier=self.name)
        return key in self._index

    # ------------------------------------------------------------- raw reference
    async def raw_reference(self, op: str, block_bytes: int, count: int, concurrency: int) -> Any:
        """The certification envelope's reference for a file-per-object store: the plain
        filesystem client, ``count`` files of ``block_bytes`` in ``tmp/`` moved by
        ``concurrency`` threads: write = create + ``pwrite`` + ``fsync`` + close (each file
        durable, no directory sync, no rename, no checksum), read = open + ``preadv`` into a
        buffer + close of files written (and so cached) just before, as the tier's are.
        Reads go into a ring of ``concurrency`` x (blocks per envelope batch) touched
        buffers: the memory the envelope's callers read into on the tier's side, so that
        neither side reads into a destination that stays in the CPU caches when the other's
        does not. Cleans up its files. Raises BackendIOError."""
        self._check_open()
        try:
            return await anyio.to_thread.run_sync(self._raw_files, op, block_bytes, count, concurrency)
        except OSError as exc:
            raise os_error(exc, "raw reference", tier=self.name) from exc

    def _raw_files(self, op: str, block_bytes: int, count: int, concurrency: int) -> Any:
        from concurrent.futures import ThreadPoolExecutor

        d = self._root / "tmp" / f"raw-{os.getpid()}-{uuid.uuid4().hex}"
        d.mkdir()
        data = np.random.default_rng(1).integers(0, 256, block_bytes, dtype=np.uint8)
        ring = max(1, concurrency) * certify_batch(block_bytes, count) if op == "read" else 0
        bufs = [np.ones(block_bytes, dtype=np.uint8) for _ in range(ring)]

        def put(i: int) -> None:
            fd = os.open(d / str(i), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.pwrite(fd, data.data, 0)
                if self._fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)

        def get(i: int) -> None:
            fd = os.open(d / str(i), os.O_RDONLY)
            try:
                os.preadv(fd, [bufs[i % len(bufs)].data], 0)
            finally:
                os.close(fd)

        try:
            with ThreadPoolExecutor(max(1, concurrency)) as ex:
                if op == "read":
                    list(ex.map(put, range(count)))
                t0 = time.perf_counter()
                list(ex.map(put if op == "write" else get, range(count)))
                dt = time.perf_counter() - t0
        finally:
            for i in range(count):
                try:
                    os.unlink(d / str(i))
                except FileNotFoundError:
                    pass
            os.rmdir(d)
        how = "create+pwrite+fsync+close" if op == "write" else f"open+preadv+close (page cache) into {ring} buffers"
        return RawMeasurement(block_bytes * count, dt, f"one file per block: {how}, {concurrency} threads")

    def stats(self) -> BackendStats:
        return BackendStats(
            tier=self.name,
            kind=TierKind.PFS,
            capacity_bytes=self._capacity,
            used_bytes=self._ledger.used_bytes,
            blocks=len(self._index),
            reserved_bytes=self._ledger.reserved_bytes,
            reads=self._reads,
            writes=self._writes,
            evictions=self._evictions,
            bytes_read=self._bytes_read,
            bytes_written=self._bytes_written,
            io_path="posix pread/pwrite + fsync" if self._fsync else "posix pread/pwrite (no fsync)",
            emulated=False,
            details={
                "path": str(self._root),
                "format": _FORMAT,
                "publish": "O_TMPFILE + linkat" if self._tmpfile else "temp file + rename",
                "dedup": self._dedup,
                "logical_bytes": self._ledger.logical_bytes,
                "content_files": len(self._objs),
                "dedup_hits": self._dedup_hits,
                "integrity_failures": self._integrity_failures,
                "fsync": self._fsync,
                "open_files": len(self._files),
            },
        )

    # -------------------------------------------------------------- batch twins
    async def write_many(self, allocations: Sequence[Allocation], datas: Sequence[Buffer]) -> None:
        """Write several blocks: up to ``max_concurrency`` worker threads each take the
        next block of the batch as they become free, and hash, write, fsync and publish it
        (one content file per distinct content); then the directories written are fsynced
        once. Every block is durable
        when this returns.

        Each block commits or fails independently (a wrong length, an unknown or
        evicted reservation, an I/O error); the others still complete and the first
        error is raised at the end. Cancellation waits for the threads, then undoes
        every block of the batch (shielded): records and unreferenced content files are
        removed and the reservations released."""
        if len(allocations) != len(datas):
            raise InputError(f"write_many: {len(allocations)} allocations but {len(datas)} buffers")
        self._check_open()
        errors: list[Exception] = []
        items: list[tuple[str, Reservation, memoryview, str]] = []
        for a, d in zip(allocations, datas, strict=True):
            try:
                res = self._ledger.claim(a)
            except BlockNotFoundError as exc:
                errors.append(exc)
                continue
            try:
                src = as_byte_view(d)
            except InputError as exc:
                self._ledger.abort(res)
                errors.append(exc)
                continue
            if src.nbytes != res.nbytes:
                self._ledger.abort(res)
                errors.append(InputError(f"[{self.name}] data has {src.nbytes} bytes, allocation has {res.nbytes}"))
                continue
            items.append((res.key, res, src, dedup_scope(res.tag, self._dedup)))
        if not items:
            if errors:
                raise errors[0]
            return
        n = len(items)
        puts: list[_Put | None] = [None] * n
        failed: dict[int, BaseException] = {}
        workers = min(self._max_conc, n)
        todo = iter(range(n))  # shared: each worker takes the next block when it is free

        def write_share(last: bool) -> None:
            for i in todo:
                key, res, src, scope = items[i]
                try:
                    puts[i] = self._put_block(scope, res.tag, key, src)
                except Exception as exc:
                    failed[i] = exc
            if last:
                sync()

        def sync() -> None:
            done = [i for i in range(n) if puts[i] is not None]
            if not done or not self._fsync:
                return
            try:
                self._fsync_dir(self._root / "keys")
                for scope in sorted({items[i][3] for i in done}):
                    self._fsync_dir(self._root / "objects" / scope)
            except OSError as exc:
                for i in done:
                    failed[i] = exc

        try:
            if self._evicting:
                for key, *_ in items:
                    ev = self._evicting.get(key)
                    if ev is not None:
                        await ev.wait()
            if workers == 1:
                await self._thread(write_share, True)
            else:
                async with anyio.create_task_group() as tg:
                    for _ in range(workers):
                        tg.start_soon(self._thread, write_share, False)
                await self._thread(sync)
            await anyio.lowlevel.checkpoint_if_cancelled()
        except BaseException:
            with anyio.CancelScope(shield=True):
                undo = _Undo()
                for i, (_key, res, src, scope) in enumerate(items):
                    self._ledger.abort(res)
                    p = puts[i]
                    if p is not None:
                        undo.records.append(_Rec(p.name, p.ino, src.nbytes, res.tag, scope, b"", p.sha))
                await self._run_undo(undo)
            raise
        undo = _Undo()
        for i, (key, res, _src, scope) in enumerate(items):
            p = puts[i]
            err: Exception | None = None
            if i in failed:
                f = failed[i]
                err = (
                    os_error(f, f"write of {key!r}", tier=self.name)
                    if isinstance(f, OSError)
                    else BackendIOError(f"write of {key!r} failed: {f}", tier=self.name)
                )
                err.__cause__ = f
            elif res.dropped:
                err = BlockNotFoundError(f"reservation for {key!r} was evicted during the write", tier=self.name)
            elif self._closed:
                err = BackendClosedError("backend closed during the write", tier=self.name)
            rec = (
                None
                if p is None
                else _Rec(p.name, p.ino, res.nbytes, res.tag, scope, p.pfx, p.sha, bytes.fromhex(p.sha))
            )
            if err is not None:
                self._ledger.abort(res)
                if rec is not None:
                    undo.records.append(rec)
                errors.append(err)
                continue
            assert rec is not None and p is not None
            self._ledger.commit(res, held=self._add(key, rec))  # pending: neither dropped nor closed
            self._writes += 1
            self._bytes_written += res.nbytes
            self._dedup_hits += not p.fresh
        await self._run_undo(undo)
        if errors:
            raise errors[0]

    async def read_many(self, keys: Sequence[str], *, into: Sequence[Buffer] | None = None) -> list[memoryview]:
        """Read and verify several blocks: first what the page cache holds, in one
        worker-thread hop per about :data:`_HOT_GROUP_BYTES`, then the rest spread over
        ``max_concurrency`` threads. The first error is raised after every block was
        read (see :meth:`read` for the errors)."""
        if into is not None and len(into) != len(keys):
            raise InputError(f"read_many: {len(keys)} keys but {len(into)} buffers")
        self._check_open()
        try:
            recs = [self._index[k] for k in keys]
        except (KeyError, TypeError):
            recs = [self._lookup(k) for k in keys]  # raises the contract's error for the first bad key
        outs = self._targets(recs, into)
        n = len(keys)
        statuses: list[str] = ["cold"] * n
        order = list(range(n))

        # reads into this call's own buffers are abandoned by a cancelled caller (a stalled
        # medium cannot hold its deadline); into a caller's buffers they are waited for
        abandon = into is None

        async def one(idx: list[int], nowait: bool, pieces: bool = False) -> None:
            nonlocal statuses
            if len(idx) == n:  # the whole batch in one hop
                statuses = await self._thread(
                    self._read_slice, list(zip(recs, outs, strict=True)), nowait, pieces, abandon=abandon
                )
                return
            jobs = [(recs[i], outs[i]) for i in idx]
            got: list[str] = await self._thread(self._read_slice, jobs, nowait, pieces, abandon=abandon)
            for i, st in zip(idx, got, strict=True):
                statuses[i] = st

        async def spread(idx: list[int], groups: int, nowait: bool, pieces: bool = False) -> None:
            parts = [[idx[p] for p in sl] for sl in _slices([recs[i].nbytes for i in idx], groups)]
            if len(parts) == 1:
                await one(parts[0], nowait, pieces)
                return
            async with anyio.create_task_group() as tg:
                for part in parts:
                    tg.start_soon(one, part, nowait, pieces)

        total = sum(r.nbytes for r in recs)
        if n:
            # cached reads are memory copies: split one across the CPUs only when no other
            # read is in flight (concurrent callers already keep the CPUs busy); only then
            # are large blocks verified piece by piece (each piece still in its CPU's cache)
            alone = self._reading == 0
            # small cached blocks: one thread (two threads spend more handing the interpreter
            # lock back and forth than they gain: measured here, 16 KiB blocks read at 0.51x of
            # a plain one-thread loop with two threads and 0.61x with one)
            hot = 1
            if alone and total > n * _SMALL_BLOCK_BYTES:
                # cached reads are memory copies: more threads than cores only add hops
                hot = max(1, min(self._max_conc, CPUS, n, -(-total // _HOT_GROUP_BYTES)))
            cold_groups = max(1, min(self._max_conc, n))
            self._reading += 1
            try:
                if self._nowait and hot < cold_groups:
                    await spread(order, hot, True, alone)
                    cold = [i for i in order if statuses[i] == "cold"]
                    if cold:
                        await spread(cold, cold_groups, False)
                else:
                    await spread(order, cold_groups, False)
            finally:
                self._reading -= 1
        bad = [i for i, st in enumerate(statuses) if st != "ok"]
        self._reads += n - len(bad)
        self._bytes_read += (total if n else 0) - sum(recs[i].nbytes for i in bad)
        if bad:
            errs = await self._settle([(keys[i], recs[i], statuses[i]) for i in bad])
            first: Exception | None = None
            for e in errs:
                if first is None or (isinstance(e, IntegrityError) and not isinstance(first, IntegrityError)):
                    first = e
            if first is not None:
                raise first
        return outs

    # ------------------------------------------------------------------ helpers
    def _targets(self, recs: list[_Rec], into: Sequence[Buffer] | None) -> list[memoryview]:
        """The buffers to read into: the callers' (checked; a flat writable byte buffer of
        exactly the block's size takes the fast path) or new ones."""
        if into is None:
            return [self._target(r, None) for r in recs]
        out: list[memoryview] = []
        append = out.append
        for r, x in zip(recs, into, strict=True):
            try:
                mv = memoryview(x)  # type: ignore[arg-type]  # ndarray exposes the buffer protocol
            except TypeError:
                append(self._target(r, x))
                continue
            if mv.nbytes == r.nbytes and mv.format == "B" and mv.c_contiguous and not mv.readonly and mv.ndim == 1:
                append(mv)
            else:
                append(self._target(r, x))
        return out

    def _target(self, rec: _Rec, into: Buffer | None) -> memoryview:
        if into is None:
            out: memoryview = np.empty(rec.nbytes, dtype=np.uint8).data
            return out
        try:  # fast path (a flat writable byte buffer, e.g. a uint8 array); else the full checks
            mv = memoryview(into)  # type: ignore[arg-type]  # ndarray exposes the buffer protocol
        except TypeError:
            mv = None
        if mv is not None and mv.format == "B" and mv.ndim == 1 and mv.c_contiguous and not mv.readonly:
            if mv.nbytes >= rec.nbytes:
                return mv[: rec.nbytes] if mv.nbytes > rec.nbytes else mv
        return into_view(into, rec.nbytes, tier=self.name)

    def _lookup(self, key: str) -> _Rec:
        rec = self._index.get(key) if type(key) is str else None  # indexed keys are valid keys
        if rec is None:
            validate_key(key, tier=self.name)
            raise BlockNotFoundError(f"no block under {key!r}", tier=self.name)
        return rec

    async def _settle(self, failures: list[tuple[str, _Rec, str]]) -> list[Exception]:
        """Turn non-ok read statuses into the contract's errors, dropping what must go: a
        missing record means another process evicted the key (BlockNotFoundError, the key
        leaves the index); bytes that fail verification are corrupt (IntegrityError: the
        content is quarantined and every key of this process on that inode dropped)."""
        undo = _Undo()
        errors: list[Exception] = []
        for key, rec, st in failures:
            if self._index.get(key) is not rec:
                errors.append(BlockNotFoundError(f"{key!r} left the store during the read", tier=self.name))
                continue
            if st == "wrong":
                self._integrity_failures += 1
                undo.stray.append(self._forget(key))
                errors.append(
                    IntegrityError(
                        f"the record of {key!r} names another block's content; the record was removed", tier=self.name
                    )
                )
                continue
            if st != "bad":  # "missing" ("cold" cannot happen after a blocking pass)
                self._forget(key)
                errors.append(BlockNotFoundError(f"the record of {key!r} is gone from the store", tier=self.name))
                continue
            self._integrity_failures += 1
            undo.quarantine.append(rec)
            for k in [k for k, r in self._index.items() if r.ino == rec.ino]:
                undo.records.append(self._forget(k))
            errors.append(
                IntegrityError(
                    f"block {key!r} failed checksum verification; its content file was quarantined", tier=self.name
                )
            )
        await self._run_undo(undo)
        return errors
