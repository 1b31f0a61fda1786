"""The parallel-filesystem tier: a log-structured, checksummed directory on any POSIX filesystem.

Options:

``path`` (str, required)
    The store directory (Lustre, GPFS, NFS, or a local filesystem); created if missing.
``capacity`` (size, default ``1GiB``)
    Budget for ``used_bytes`` (see Accounting).
``fsync`` (bool, default true)
    fsync every segment and directory at publish. With false, a crash may lose
    recent blocks (never expose torn ones: every read is verified).
``max_concurrency`` (int, default 8)
    Worker threads doing file I/O (the limiter size); a batch is written as up to
    that many segments in parallel, and cold reads run that many threads.
``max_block_bytes`` (size, default ``1GiB``)

Layout (all under ``path``)::

    segments/<host>.<pid>.<uuid>   data: the blocks of one write batch (or of one share of
                                   it), each at a 4096-aligned offset, written once, never
                                   modified afterwards except to punch out evicted blocks
    keys/<key>            one record per key: a symbolic link whose target is the text
                          "tierkv-rec3/<segment>/<offset>/<nbytes>/<xxh3-128>[/<tag hex>...]"
    objects/<sha256>      content files of format-2 and format-1 stores (records
                          "tierkv-rec2/<sha256>/<nbytes>/<xxh3-128>[/<tag hex>...]" and JSON
                          files {"v", "sha256", "nbytes", "tag", "xxh3"}): still read, verified
                          and evicted; nothing new is written there (layout-1 shards,
                          objects/ab/<sha256>, are moved up when opened)
    tmp/<host>.<pid>.<rand>.tmp   record links being replaced
    quarantine/<name>.<ns>        bytes that failed verification

Why segments: a file per block costs a create, a rename, a data fsync and two
directory entries per block, and content addressing costs a sha256 (about
1.8 GB/s, most of a raw write's time at 2 MiB). ``write_many`` instead packs the
batch into at most ``max_concurrency`` segments (consecutive shares of at least
:data:`_SHARE_BYTES`, so a small batch is one segment and a large one keeps
several writes in flight), each written with one ``pwritev`` and fsynced once;
then one thread syncs ``segments/`` once, links the records and syncs ``keys/``
once for the whole batch (one journal commit for all the records rather than one
per segment). The only per-block metadata is the record link. The check value
is xxh3-128 (tens of GB/s), computed by the segment's writer thread and kept in
the record.

Publish: a segment is created under a unique name with ``O_EXCL`` (no temp file
or rename: nothing references it yet), written and fsynced; ``segments/`` is
fsynced; only then are the records linked (``symlink``; an existing record of
the key, left by another process, is replaced by a link made in ``tmp/`` and
renamed over it) and ``keys/`` fsynced. A single-segment batch (and ``write``)
does all of it in one worker-thread hop. A block is committed once its record
is durable. A crash leaves either nothing, or a segment no record references
(removed by a later scan, see Warm start), or stray links in ``tmp/``; never a
record whose bytes are not durable.

No dedup: identical bytes written under two keys are stored twice (KV keys are
prefix hashes, so equal content under different keys is rare). Stores written
by the content-addressed format 2 keep sharing their content files, reference
counted in memory as before.

Verification: every read checksums the bytes it read against the record
(xxh3-128; sha256 of the content address for old records without one). A
mismatch of a segment block is first checked against the record on disk: when
the record is gone or changed (another process evicted or rewrote the key, and
may have punched its bytes) the read is a :class:`~tierkv.BlockNotFoundError`
(the key leaves the index; nothing is quarantined). When the record still names
those bytes, they are corrupt: :class:`~tierkv.IntegrityError`, the record is
deleted, the bytes are copied to ``quarantine/`` and punched out of the
segment, so the block is never served again. A corrupt content file of an old
store is moved to ``quarantine/`` and every key pointing at it dropped. A
missing segment or content file reads as BlockNotFoundError. With
``read(into=...)`` the caller's buffer receives the bytes before they are
verified; on an error its content is undefined.

Eviction: the record is unlinked and ``keys/`` synced, then the block's range
(rounded up to 4096 bytes) is freed with ``fallocate(PUNCH_HOLE | KEEP_SIZE)``;
the segment file is unlinked when this process's count of live blocks in it
reaches zero. Where the filesystem refuses to punch holes the bytes stay until
the segment dies (``details["unpunched_bytes"]``). A crash between the unlink
and the punch leaves those bytes allocated until the segment dies.

Accounting: ``used_bytes`` = the sizes of the live blocks (segment blocks each
count their ``nbytes``; old content files count once however many keys share
them) + pending reservations (``nbytes`` each). Segment padding, records and
punched-out ranges are not counted. ``details["logical_bytes"]`` sums the keys'
sizes. ``used_bytes`` returns exactly to its previous value after ``evict``.

Warm start and sharing: :meth:`PfsBackend.open` (and :meth:`PfsBackend.scan`)
rebuild the index from ``keys/``, deleting records whose segment (or content
file) is missing or too short, temp links of dead writers on this host (or
older than an hour), and segments or content files that no record references
once their writer's process is dead (this host) or they are older than ten
minutes. Several processes may open the same directory: records are replaced
atomically and segments are never rewritten, so a reader sees whole blocks or
a miss. There is no cross-process locking: live-block counts are per process,
so an evict in one process may unlink (or punch) bytes another process still
indexes; that process then reads :class:`~tierkv.BlockNotFoundError`, never
wrong bytes. Likewise a scan that runs while another process is still linking a
batch's records may see only some of them; evicting exactly those unlinks the
segment, and the records it did not see then read as misses. Keys added by another
process become visible after ``scan()``.

Reads: the keys of a batch are grouped by segment and sorted by offset, and
each run of adjacent blocks (up to :data:`_RUN_BYTES`, so that its blocks are
verified while still in the CPU cache) is read with one ``preadv`` straight
into the callers' buffers (one open per segment per worker). What the page
cache holds is read first with ``RWF_NOWAIT`` in few worker-thread hops (about
:data:`_HOT_GROUP_BYTES` each, at most one per CPU: a hop costs more than a
cached small block, and cached reads are memory copies); ranges found not
cached get ``POSIX_FADV_WILLNEED`` (readahead starts at once), and the rest is
then spread over ``max_concurrency`` threads so that several reads are in
flight on the medium.

Cancellation: worker threads are never abandoned. A cancelled ``write`` or
``write_many`` waits for its I/O, then removes what it published (records and
segments, in a shielded cleanup) and releases its reservations; an ``evict``
drops the key from the index first and finishes its unlinks and punches
shielded from cancellation.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import json
import os
import re
import socket
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread
import numpy as np
import xxhash

from tierkv._backend import (
    Allocation,
    Availability,
    Backend,
    BackendStats,
    BlockInfo,
    Buffer,
    Capabilities,
    TierKind,
    as_byte_view,
    check_allocation,
    into_view,
    validate_key,
)
from tierkv._errors import (
    BackendClosedError,
    BackendIOError,
    BlockExistsError,
    BlockNotFoundError,
    CapacityError,
    InputError,
    IntegrityError,
    TierKVError,
)
from tierkv._options import opt_bool, opt_int, opt_size, opt_str, reject_unknown

__all__ = ["PfsBackend"]

_KNOWN = frozenset({"path", "capacity", "fsync", "max_concurrency", "max_block_bytes"})
_TMP_MAX_AGE_S = 3600.0
_ORPHAN_MAX_AGE_S = 600.0
_HOST = socket.gethostname().replace(".", "_").replace("/", "_") or "host"
_RWF_NOWAIT: int = getattr(os, "RWF_NOWAIT", 0)
#: blocks start at multiples of this in a segment (the page size; also the punch granule)
_ALIGN = 4096
#: a write batch is split into segments of at least this many bytes (at most ``max_concurrency``):
#: every segment costs a create and a data fsync, so a batch of the envelope's 8 MiB is one
#: segment (concurrent batches still write in parallel); measured here, 1 MiB shares took 2 MiB
#: blocks to 0.78x of a file-per-block client and 8 MiB shares to 0.95x
_SHARE_BYTES = 8 << 20
#: a batch read first reads what the page cache holds in one worker-thread hop per this many bytes
_HOT_GROUP_BYTES = 2 << 20
_WILLNEED: int = getattr(os, "POSIX_FADV_WILLNEED", 0)
#: cached reads are memory copies: more threads than cores only add hops
_CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
#: a read run stops growing past this many bytes: its blocks are verified while still in the CPU cache
_RUN_BYTES = 512 << 10
#: a segment block larger than this is read in pieces of this size, each hashed (streaming
#: xxh3) right after it is read, while still in the CPU cache (this machine's L2: 1 MiB per
#: core): measured here, 2 MiB blocks read from the page cache went from 0.78-0.85x to 0.90x
#: of plain reads with 256 KiB pieces; 512 KiB pieces beat 256 KiB ones in 4 of 4 interleaved
#: runs (0.91-0.98x against 0.86-0.95x), 1 MiB and whole blocks did not
_PIECE_BYTES = 512 << 10
#: at most this many buffers in one preadv / pwritev (Linux IOV_MAX is 1024)
_MAX_IOV = 512
_ZEROS = bytes(_ALIGN)
_SEG_RE = re.compile(r"[0-9A-Za-z_.-]{1,200}")
_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02


@dataclass(frozen=True, slots=True)
class _Rec:
    """Where a committed block lives: ``segments/<seg>`` at ``off`` (format 3), or the
    content file ``objects/<sha>`` (formats 1 and 2, ``seg == ""``)."""

    nbytes: int
    tag: bytes
    check: str  # xxh3-128 of the content ("" in old records: the sha256 is checked)
    seg: str = ""
    off: int = 0
    sha: str = ""


_LINK3 = "tierkv-rec3"
_LINK2 = "tierkv-rec2"


def _tag_parts(tag: bytes) -> list[str]:
    h = tag.hex()
    return [h[i : i + 200] for i in range(0, len(h), 200)]


def _record_text(rec: _Rec) -> str:
    """A record as the target text of a symbolic link ``keys/<key>``: format 3
    ``tierkv-rec3/<segment>/<offset>/<nbytes>/<xxh3>[/<tag hex, in parts of 200>...]``
    (format 2 for content-file records). Every component is short and
    ``keys/tierkv-rec3`` is not a directory, so following the link fails with ENOENT
    (tools that stat it see a dangling link)."""
    if rec.seg:
        parts = [_LINK3, rec.seg, str(rec.off), str(rec.nbytes), rec.check]
    else:
        parts = [_LINK2, rec.sha, str(rec.nbytes), rec.check or "-"]
    return "/".join(parts + _tag_parts(rec.tag))


def _parse_record(text: str) -> _Rec:
    """Inverse of :func:`_record_text`; ValueError for anything else (left alone by a scan)."""
    parts = text.split("/")
    if len(parts) >= 5 and parts[0] == _LINK3:
        seg, off, n, check = parts[1], int(parts[2]), int(parts[3]), parts[4]
        if not _SEG_RE.fullmatch(seg) or seg.startswith(".") or off < 0 or n < 0 or len(check) != 32:
            raise ValueError("malformed tierkv record link")
        return _Rec(n, bytes.fromhex("".join(parts[5:])), check, seg, off)
    if len(parts) >= 4 and parts[0] == _LINK2:
        check = "" if parts[3] == "-" else parts[3]
        n = int(parts[2])
        if len(parts[1]) != 64 or n < 0:
            raise ValueError("malformed tierkv record link")
        return _Rec(n, bytes.fromhex("".join(parts[4:])), check, sha=parts[1])
    raise ValueError("not a tierkv record link")


def _fast_check(data: memoryview) -> str:
    """The per-read checksum: xxh3-128 (tens of GB/s, against about 0.5-2 GB/s for sha256)."""
    return str(xxhash.xxh3_128_hexdigest(data))


def _align_up(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


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


def _pwritev_all(fd: int, bufs: list[memoryview], off: int) -> None:
    bufs = [b for b in bufs if b.nbytes]
    while bufs:
        n = os.pwritev(fd, bufs[:_MAX_IOV], off)
        off += n
        bufs = _advance(bufs, n)


_libc: Any = None


def _punch(fd: int, off: int, n: int) -> bool:
    """Free ``n`` bytes at ``off`` (``fallocate(PUNCH_HOLE | KEEP_SIZE)``); False where
    the filesystem or platform cannot. Other errors raise OSError."""
    global _libc
    if not hasattr(os, "posix_fallocate"):  # not a Linux-like libc
        return False
    if _libc is None:
        try:
            lib = ctypes.CDLL(None, use_errno=True)
            fn = lib.fallocate
        except (OSError, AttributeError):
            _libc = False
            return False
        fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
        fn.restype = ctypes.c_int
        _libc = fn
    if _libc is False:
        return False
    if _libc(fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, off, n) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
        return False
    raise OSError(err, os.strerror(err))


class _Res:
    __slots__ = ("counted", "dropped", "handle", "nbytes", "tag", "writing")

    def __init__(self, nbytes: int, tag: bytes, handle: int) -> None:
        self.nbytes = nbytes
        self.tag = tag
        self.handle = handle
        self.writing = False
        self.dropped = False
        self.counted = True  # nbytes still counted in reserved_bytes


@dataclass(slots=True)
class _Undo:
    """Filesystem work that removes blocks, done in one worker thread (:meth:`PfsBackend._apply`)."""

    records: list[str] = field(default_factory=list)  # keys whose record link goes
    objects: list[str] = field(default_factory=list)  # old content files (sha) to unlink
    punch: list[tuple[str, int, int]] = field(default_factory=list)  # (segment, offset, nbytes)
    segments: list[str] = field(default_factory=list)  # segment files to unlink
    quarantine: list[tuple[str, int, int]] = field(default_factory=list)  # ranges copied aside first

    def __bool__(self) -> bool:
        return bool(self.records or self.objects or self.punch or self.segments)


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


class PfsBackend(Backend):
    """Log-structured, checksummed, persistent directory tier (see the module docstring).

    Implements :class:`~tierkv.SupportsScan` and :class:`~tierkv.SupportsContentHash`.
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
        self._caps = Capabilities(
            tier_kind=TierKind.PFS,
            persistent=True,
            shared=True,
            alignment=_ALIGN,
            max_block_bytes=self._max_block,
            max_concurrency=self._max_conc,
            envelope_threshold=0.8,
        )
        self._limiter: anyio.CapacityLimiter | None = None
        self._index: dict[str, _Rec] = {}
        self._seg_live: dict[str, int] = {}  # segment -> blocks indexed or being written by this process
        self._unpunched: dict[str, int] = {}  # segment -> evicted bytes still allocated (no punch support)
        self._refs: dict[str, int] = {}  # old content file sha -> keys indexed
        self._sizes: dict[str, int] = {}  # sha -> bytes counted in _physical
        self._physical = 0
        self._logical = 0
        self._reserved: dict[str, _Res] = {}
        self._reserved_bytes = 0
        self._inflight_tmp: set[str] = set()
        self._scan_evicted: set[str] | None = None
        self._nowait = bool(_RWF_NOWAIT)
        self._reading = 0  # read_many calls in progress
        self._handle = 0
        self._reads = self._writes = self._evictions = self._bytes_read = self._bytes_written = 0
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
        self._reserved.clear()
        self._reserved_bytes = 0

    def _make_dirs(self) -> None:
        for sub in ("segments", "objects", "keys", "tmp", "quarantine"):
            (self._root / sub).mkdir(parents=True, exist_ok=True)

    async def _thread(self, fn: Any, *args: Any) -> Any:
        """Run blocking ``fn`` in a worker thread; OSError becomes BackendIOError."""
        try:
            return await anyio.to_thread.run_sync(fn, *args, limiter=self._limiter)
        except TierKVError:
            raise
        except OSError as exc:
            raise BackendIOError(f"{getattr(fn, '__name__', 'io')}: {exc}", tier=self.name) from exc

    # -------------------------------------------------------------- file layer
    def _seg_path(self, seg: str) -> Path:
        return self._root / "segments" / seg

    def _obj(self, sha: str) -> Path:
        return self._root / "objects" / sha

    def _data_path(self, rec: _Rec) -> Path:
        return self._seg_path(rec.seg) if rec.seg else self._obj(rec.sha)

    def _key_path(self, key: str) -> Path:
        return self._root / "keys" / key

    def _fsync_dir(self, d: Path) -> None:
        if not self._fsync:
            return
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _link_record(self, key: str, text: str) -> None:
        """Publish a record as a symbolic link whose target is the record text: one
        metadata operation, made durable by the fsync of ``keys/`` (no data fsync).
        ``symlink`` is atomic and fails if the name exists; only then (a record of this
        key left by another process) the link is made in ``tmp/`` and renamed over it."""
        try:
            os.symlink(text, self._key_path(key))
            return
        except FileExistsError:
            pass
        name = f"{_HOST}.{os.getpid()}.{uuid.uuid4().hex}.tmp"
        tmp = self._root / "tmp" / name
        self._inflight_tmp.add(name)
        try:
            os.symlink(text, tmp)
            os.rename(tmp, self._key_path(key))
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        finally:
            self._inflight_tmp.discard(name)

    def _write_segment(self, seg: str, jobs: list[tuple[int, str, int, memoryview]]) -> list[str]:
        """Phase 1 of a write, one worker thread per segment: compute each block's
        xxh3-128, create ``segments/<seg>`` (``O_EXCL``), write every block at its
        offset (``jobs``: batch index, key, offset, bytes, by offset) with one
        ``pwritev``, fsync. Returns the checksums; on failure the segment is unlinked
        and OSError raised."""
        checks = [_fast_check(src) for _, _, _, src in jobs]
        path = self._seg_path(seg)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                bufs: list[memoryview] = []
                pos = 0
                for _, _, off, src in jobs:
                    if off > pos:
                        bufs.append(memoryview(_ZEROS)[: off - pos])
                    bufs.append(src)
                    pos = off + src.nbytes
                _pwritev_all(fd, bufs, 0)
                if self._fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
        except BaseException:
            try:
                os.unlink(path)
            except OSError:
                pass
            raise
        return checks

    def _publish(self, records: list[tuple[int, str, str]]) -> tuple[dict[int, BaseException], list[int]]:
        """Phase 2 of a write, one worker thread: sync ``segments/`` (the new segments'
        names are durable), link the records (batch index, key, record text), sync
        ``keys/`` once. Returns the exceptions of the blocks that failed and the
        indices whose record was linked (a linked block may still have failed:
        ``keys/`` not synced)."""
        out: dict[int, BaseException] = {}
        try:
            self._fsync_dir(self._root / "segments")
        except OSError as exc:
            return {i: exc for i, _, _ in records}, []
        linked: list[int] = []
        for i, key, text in records:
            try:
                self._link_record(key, text)
                linked.append(i)
            except Exception as exc:
                out[i] = exc
        if linked:
            try:
                self._fsync_dir(self._root / "keys")
            except OSError as exc:
                for i in linked:
                    out[i] = exc
        return out, linked

    def _apply(self, undo: _Undo) -> list[tuple[str, int]]:
        """Remove what ``undo`` lists: copy quarantined ranges aside, unlink records
        (then sync ``keys/`` once), old content files and segments, and punch the
        ranges of evicted blocks out of live segments. Returns the (segment, bytes)
        that could not be punched (the filesystem refuses). Missing files are fine."""
        for seg, off, n in undo.quarantine:
            self._copy_aside(seg, off, n)
        gone = False
        for key in undo.records:
            try:
                os.unlink(self._key_path(key))
                gone = True
            except FileNotFoundError:
                pass
        if gone:
            self._fsync_dir(self._root / "keys")
        for sha in undo.objects:
            try:
                os.unlink(self._obj(sha))
            except FileNotFoundError:
                pass
        kept: list[tuple[str, int]] = []
        by_seg: dict[str, list[tuple[int, int]]] = {}
        for seg, off, n in undo.punch:
            by_seg.setdefault(seg, []).append((off, n))
        dying = set(undo.segments)
        for seg, ranges in by_seg.items():
            if seg in dying:
                continue
            try:
                fd = os.open(self._seg_path(seg), os.O_WRONLY)
            except FileNotFoundError:
                continue
            try:
                for off, n in ranges:
                    if n and not _punch(fd, off, _align_up(n)):
                        kept.append((seg, n))
            finally:
                os.close(fd)
        for seg in undo.segments:
            try:
                os.unlink(self._seg_path(seg))
            except FileNotFoundError:
                pass
        return kept

    def _copy_aside(self, seg: str, off: int, n: int) -> None:
        """Keep the bytes of a corrupt block for inspection in ``quarantine/`` (best effort)."""
        try:
            fd = os.open(self._seg_path(seg), os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            data = os.pread(fd, n, off)
        finally:
            os.close(fd)
        dst = self._root / "quarantine" / f"{seg}.{off}.{time.time_ns()}"
        with open(dst, "wb") as f:
            f.write(data)

    def _records_match(self, items: list[tuple[str, str]]) -> list[bool]:
        """Whether ``keys/<key>`` still holds the record text given, for each (key, text)."""
        out: list[bool] = []
        for key, text in items:
            try:
                out.append(os.readlink(self._key_path(key)) == text)
            except OSError:
                out.append(False)
        return out

    def _read_slice(self, jobs: list[tuple[_Rec, memoryview]], nowait: bool, pieces: bool = False) -> list[str]:
        """Read and verify blocks (sorted by file and offset) into their buffers: one
        open per file, one ``preadv`` per run of adjacent blocks (the padding between
        them goes to a scratch buffer). Per block: "ok"; "missing" (no such file);
        "bad" (a segment block failed verification: the caller checks its record);
        "corrupt" (an old content file failed verification: it was moved to
        ``quarantine/``); or, with ``nowait`` (``RWF_NOWAIT``), "cold" when the bytes
        were not all in the page cache (nothing verified): the caller reads it again.
        With ``pieces``, segment blocks over :data:`_PIECE_BYTES` are read and hashed piece
        by piece (:meth:`_read_pieces`)."""
        out = ["cold"] * len(jobs)
        scratch = memoryview(bytearray(_ALIGN))
        i, n = 0, len(jobs)
        while i < n:
            first = jobs[i][0]
            j = i + 1
            while j < n and jobs[j][0].seg == first.seg and jobs[j][0].sha == first.sha:
                j += 1
            path = self._data_path(first)
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                out[i:j] = ["missing"] * (j - i)
                i = j
                continue
            try:
                size = os.fstat(fd).st_size if not first.seg else -1
                k = i
                while k < j:
                    rec0 = jobs[k][0]
                    if pieces and rec0.seg and rec0.check and rec0.nbytes > _PIECE_BYTES:
                        out[k] = self._read_pieces(fd, rec0, jobs[k][1], nowait)
                        k += 1
                        continue
                    start = rec0.off
                    end = start + rec0.nbytes
                    bufs = [jobs[k][1]]
                    m = k + 1
                    while m < j and len(bufs) < _MAX_IOV - 1 and end - start < _RUN_BYTES:
                        gap = jobs[m][0].off - end
                        if gap < 0 or gap >= _ALIGN:
                            break
                        if gap:
                            bufs.append(scratch[:gap])
                        bufs.append(jobs[m][1])
                        end = jobs[m][0].off + jobs[m][0].nbytes
                        m += 1
                    got = self._preadv(fd, bufs, start, end - start, nowait)
                    if nowait and got < end - start and _WILLNEED:
                        # not cached: start reading the rest now (asynchronous readahead), so the
                        # cold pass finds the medium busy with all of it rather than a few reads
                        os.posix_fadvise(fd, start + max(got, 0), end - start - max(got, 0), _WILLNEED)
                    for q in range(k, m):
                        rec, dst = jobs[q]
                        if got < 0 or (got < end - start and rec.off + rec.nbytes > start + got and nowait):
                            out[q] = "cold"
                            continue
                        ok = rec.off + rec.nbytes <= start + got and (size < 0 or size == rec.nbytes)
                        if ok and rec.check:
                            ok = _fast_check(dst) == rec.check
                        elif ok:
                            ok = hashlib.sha256(dst).hexdigest() == rec.sha
                        out[q] = "ok" if ok else ("bad" if rec.seg else "corrupt")
                    k = m
            finally:
                os.close(fd)
            if not first.seg and "corrupt" in out[i:j]:
                try:
                    os.rename(path, self._root / "quarantine" / f"{first.sha}.{time.time_ns()}")
                    self._fsync_dir(path.parent)
                except FileNotFoundError:
                    pass
            i = j
        return out

    def _read_pieces(self, fd: int, rec: _Rec, dst: memoryview, nowait: bool) -> str:
        """Read a large segment block in pieces of :data:`_PIECE_BYTES`, feeding each to a
        streaming xxh3-128 right after it is read. "ok", "bad" (checksum or short read)
        or, with ``nowait``, "cold" as soon as a piece is not all cached (the rest gets
        ``POSIX_FADV_WILLNEED``; the cold pass reads the block again)."""
        h = xxhash.xxh3_128()
        pos, n = 0, rec.nbytes
        while pos < n:
            piece = dst[pos : min(n, pos + _PIECE_BYTES)]
            got = self._preadv(fd, [piece], rec.off + pos, piece.nbytes, nowait)
            if got < piece.nbytes:
                if not nowait:
                    return "bad"  # the segment is shorter than its record says
                if _WILLNEED:
                    os.posix_fadvise(fd, rec.off + pos + max(got, 0), n - pos - max(got, 0), _WILLNEED)
                return "cold"
            h.update(piece)
            pos += got
        return "ok" if h.hexdigest() == rec.check else "bad"

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

    def _scan_dir(self, known_shas: frozenset[str]) -> dict[str, _Rec]:
        """Read every valid record; clean temp garbage, dead records and old orphans."""
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
        self._migrate_shards()
        found: dict[str, _Rec] = {}
        sizes: dict[str, int] = {}  # data file (segments/x, objects/sha) -> size, -1 missing

        def size_of(rel: str) -> int:
            s = sizes.get(rel)
            if s is None:
                try:
                    s = os.stat(root / rel).st_size
                except FileNotFoundError:
                    s = -1
                sizes[rel] = s
            return s

        for e in os.scandir(root / "keys"):
            link = e.is_symlink()
            if not e.name or len(e.name) > 128 or e.name.startswith(".") or not (link or e.is_file()):
                continue  # not ours (NFS silly-rename files, editors); leave it alone
            try:
                if link:
                    rec = _parse_record(os.readlink(e.path))
                else:  # a JSON record file of version 1
                    with open(e.path, "rb") as f:
                        d = json.loads(f.read(4096))
                    rec = _Rec(int(d["nbytes"]), bytes.fromhex(d["tag"]), str(d.get("xxh3", "")), sha=str(d["sha256"]))
                    if len(rec.sha) != 64 or rec.nbytes < 0:
                        raise ValueError("malformed record")
            except FileNotFoundError:
                continue  # the record vanished meanwhile
            except (ValueError, KeyError, TypeError, OSError):
                continue  # unreadable record (another version?): ignored, kept
            if rec.seg:
                size = size_of("segments/" + rec.seg)
                dead = size < rec.off + rec.nbytes
            else:
                size = size_of("objects/" + rec.sha)
                dead = size != rec.nbytes
            if dead:  # data missing, or too short: a dead record
                try:
                    os.unlink(e.path)
                except FileNotFoundError:
                    pass
                continue
            found[e.name] = rec
        segs = {r.seg for r in found.values() if r.seg}
        shas = {r.sha for r in found.values() if not r.seg} | known_shas
        for e in os.scandir(root / "segments"):
            if e.name in segs or e.name in self._seg_live:
                continue
            parts = e.name.split(".")
            stale = False
            if len(parts) == 3 and parts[0] == _HOST and parts[1].isdigit() and int(parts[1]) != os.getpid():
                stale = not _pid_alive(int(parts[1]))
            try:
                if e.is_file(follow_symlinks=False) and (stale or now - e.stat().st_mtime > _ORPHAN_MAX_AGE_S):
                    os.unlink(e.path)
            except FileNotFoundError:
                pass
        for e in os.scandir(root / "objects"):
            try:
                if e.is_file() and e.name not in shas and now - e.stat().st_mtime > _ORPHAN_MAX_AGE_S:
                    os.unlink(e.path)
            except FileNotFoundError:
                pass
        return found

    def _migrate_shards(self) -> None:
        """Layout 1 kept content in ``objects/ab/<sha>``; later layouts are flat. Move
        such files up (atomic renames), sync, remove the shard."""
        objects = self._root / "objects"
        moved = False
        for sub in os.scandir(objects):
            if not sub.is_dir(follow_symlinks=False) or len(sub.name) != 2:
                continue
            for e in os.scandir(sub.path):
                if len(e.name) == 64 and e.is_file(follow_symlinks=False):
                    os.rename(e.path, objects / e.name)
                    moved = True
            if moved:
                self._fsync_dir(objects)
            try:
                os.rmdir(sub.path)
            except OSError:
                pass  # something else in there: left alone

    # ----------------------------------------------------------- index helpers
    def _add(self, key: str, rec: _Rec) -> None:
        """Index a committed block and count its bytes (the caller counted ``_logical``)."""
        self._index[key] = rec
        if rec.seg:
            self._physical += rec.nbytes
        else:
            c = self._refs.get(rec.sha, 0)
            self._refs[rec.sha] = c + 1
            if c == 0:
                self._sizes[rec.sha] = rec.nbytes
                self._physical += rec.nbytes

    def _forget(self, key: str, undo: _Undo, *, record: bool = True, punch: bool = True) -> _Rec:
        """Drop a committed key from the index and its bytes from the accounting; add to
        ``undo`` what must go on disk: its record (with ``record``), and its bytes (the
        segment when this was its last live block here, else its range with ``punch``;
        an old content file when no other key shares it)."""
        rec = self._index.pop(key)
        self._logical -= rec.nbytes
        if self._scan_evicted is not None:
            self._scan_evicted.add(key)
        if record:
            undo.records.append(key)
        if rec.seg:
            self._physical -= rec.nbytes
            self._seg_release(rec.seg, rec.off, rec.nbytes, undo, punch=punch)
        else:
            c = self._refs[rec.sha] - 1
            if c:
                self._refs[rec.sha] = c
            else:
                del self._refs[rec.sha]
                self._physical -= self._sizes.pop(rec.sha)
                undo.objects.append(rec.sha)
        return rec

    def _seg_release(self, seg: str, off: int, nbytes: int, undo: _Undo, *, punch: bool = True) -> None:
        c = self._seg_live.get(seg, 0) - 1
        if c > 0:
            self._seg_live[seg] = c
            if punch:
                undo.punch.append((seg, off, nbytes))
        else:
            self._seg_live.pop(seg, None)
            self._unpunched.pop(seg, None)
            undo.segments.append(seg)

    async def _run_undo(self, undo: _Undo) -> None:
        """Apply ``undo`` in a worker thread, shielded from cancellation."""
        if not undo and not undo.quarantine:
            return
        with anyio.CancelScope(shield=True):
            kept: list[tuple[str, int]] = await self._thread(self._apply, undo)
        for seg, n in kept:
            if seg in self._seg_live:
                self._unpunched[seg] = self._unpunched.get(seg, 0) + n

    def _release(self, key: str, res: _Res) -> None:
        res.writing = False
        if not res.dropped and self._reserved.get(key) is res:
            del self._reserved[key]
            self._logical -= res.nbytes
        if res.counted:
            self._reserved_bytes -= res.nbytes
            res.counted = False

    async def _rebuild(self) -> list[BlockInfo]:
        self._scan_evicted = set()
        try:
            found = await self._thread(self._scan_dir, frozenset(self._refs))
            evicted = self._scan_evicted
        finally:
            self._scan_evicted = None
        for key, rec in found.items():
            if key in self._index or key in self._reserved or key in evicted:
                continue
            if rec.seg:
                self._seg_live[rec.seg] = self._seg_live.get(rec.seg, 0) + 1
            self._logical += rec.nbytes
            self._add(key, rec)
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
        check_allocation(key, nbytes, tag, max_block_bytes=self._max_block, tier=self.name)
        if key in self._index or key in self._reserved:
            raise BlockExistsError(f"a block or reservation exists under {key!r}", tier=self.name)
        used = self._physical + self._reserved_bytes
        if used + nbytes > self._capacity:
            raise CapacityError(
                f"cannot reserve {nbytes} bytes: {self._capacity - used} of {self._capacity} free", tier=self.name
            )
        self._handle += 1
        self._reserved[key] = _Res(nbytes, bytes(tag), self._handle)
        self._reserved_bytes += nbytes
        self._logical += nbytes
        return Allocation(key, nbytes, bytes(tag), self._handle)

    async def write(self, allocation: Allocation, data: Buffer) -> None:
        """See :meth:`Backend.write`: a one-block segment, published durably (the
        :meth:`write_many` path)."""
        await self.write_many([allocation], [data])

    async def read(self, key: str, *, into: Buffer | None = None) -> memoryview:
        """See :meth:`Backend.read`; the checksum of the bytes (xxh3-128 recorded at
        write, sha256 for old records without one) is checked on every read."""
        return (await self.read_many([key], into=None if into is None else [into]))[0]

    async def evict(self, key: str) -> bool:
        """See :meth:`Backend.evict`: the key leaves the index at once; its record is
        unlinked and its bytes punched out (or its segment unlinked), shielded."""
        return (await self.evict_many([key]))[0]

    async def evict_many(self, keys: Sequence[str]) -> list[bool]:
        """Evict several keys: they leave the index at once; one worker-thread hop
        (shielded from cancellation) unlinks their records, syncs ``keys/`` once and
        frees their bytes. Idempotent like :meth:`evict`."""
        self._check_open()
        for k in keys:
            validate_key(k, tier=self.name)
        out: list[bool] = []
        undo = _Undo()
        for key in keys:
            if key in self._index:
                self._forget(key, undo)
                self._evictions += 1
                out.append(True)
                continue
            res = self._reserved.get(key)
            if res is not None:
                del self._reserved[key]
                self._logical -= res.nbytes
                if res.counted:
                    self._reserved_bytes -= res.nbytes
                    res.counted = False
                res.dropped = True
                out.append(True)
                continue
            out.append(False)
        await self._run_undo(undo)
        return out

    async def content_hash(self, key: str) -> str | None:
        """The sha256 (hex) of the block under ``key``, or None when it is absent (or
        fails verification) (:class:`~tierkv.SupportsContentHash`). Old content-addressed
        blocks answer from their record; segment blocks are read (verified) and hashed.
        Raises BackendClosedError, BackendIOError."""
        self._check_open()
        validate_key(key, tier=self.name)
        rec = self._index.get(key)
        if rec is None:
            return None
        if rec.sha:
            return rec.sha
        try:
            data = await self.read(key)
        except (BlockNotFoundError, IntegrityError):
            return None
        digest: str = await self._thread(lambda: hashlib.sha256(data).hexdigest())
        return digest

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
            raise BackendIOError(f"raw reference failed: {exc}", tier=self.name) from exc

    def _raw_files(self, op: str, block_bytes: int, count: int, concurrency: int) -> Any:
        from concurrent.futures import ThreadPoolExecutor

        from tierkv_conformance._reference import RawMeasurement

        d = self._root / "tmp" / f"raw-{os.getpid()}-{uuid.uuid4().hex}"
        d.mkdir()
        from tierkv_conformance._envelope import batch_blocks

        data = np.random.default_rng(1).integers(0, 256, block_bytes, dtype=np.uint8)
        ring = max(1, concurrency) * batch_blocks(block_bytes, count) if op == "read" else 0
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
            used_bytes=self._physical + self._reserved_bytes,
            blocks=len(self._index),
            reserved_bytes=self._reserved_bytes,
            reads=self._reads,
            writes=self._writes,
            evictions=self._evictions,
            bytes_read=self._bytes_read,
            bytes_written=self._bytes_written,
            io_path="posix pread/pwrite + fsync" if self._fsync else "posix pread/pwrite (no fsync)",
            emulated=False,
            details={
                "path": str(self._root),
                "logical_bytes": self._logical,
                "segments": len(self._seg_live),
                "unpunched_bytes": sum(self._unpunched.values()),
                "content_files": len(self._refs),
                "integrity_failures": self._integrity_failures,
                "fsync": self._fsync,
            },
        )

    # -------------------------------------------------------------- batch twins
    async def write_many(self, allocations: Sequence[Allocation], datas: Sequence[Buffer]) -> None:
        """Write several blocks as one group commit: the batch is cut into at most
        ``max_concurrency`` segments (consecutive blocks, at least about
        :data:`_SHARE_BYTES` each), each checksummed, written (one ``pwritev``) and
        fsynced by one worker thread; then one thread syncs ``segments/``, links the
        records and syncs ``keys/`` (a single segment does both in one hop). Every
        block is durable when this returns.

        Each block commits or fails independently (a wrong length, an unknown or
        evicted reservation, an I/O error); the others still complete and the first
        error is raised at the end. Cancellation waits for the threads, then undoes
        every block of the batch (shielded): records and segments are removed and the
        reservations released."""
        if len(allocations) != len(datas):
            raise InputError(f"write_many: {len(allocations)} allocations but {len(datas)} buffers")
        self._check_open()
        errors: list[Exception] = []
        items: list[tuple[str, _Res, memoryview]] = []
        for a, d in zip(allocations, datas, strict=True):
            key = a.key if isinstance(a, Allocation) else ""
            res = self._reserved.get(key)
            if res is None or res.handle != a.handle or res.writing:
                errors.append(BlockNotFoundError(f"unknown or already written allocation {a!r}", tier=self.name))
                continue
            try:
                src = as_byte_view(d)
            except InputError as exc:
                self._release(key, res)
                errors.append(exc)
                continue
            if src.nbytes != res.nbytes:
                self._release(key, res)
                errors.append(InputError(f"[{self.name}] data has {src.nbytes} bytes, allocation has {res.nbytes}"))
                continue
            res.writing = True
            items.append((key, res, src))
        if not items:
            if errors:
                raise errors[0]
            return
        # plan: consecutive shares, one segment each; blocks at 4096-aligned offsets
        total = sum(s.nbytes for _, _, s in items)
        groups = max(1, min(self._max_conc, len(items), -(-total // _SHARE_BYTES)))
        recs: list[_Rec] = []
        shares: list[tuple[str, list[tuple[int, str, int, memoryview]]]] = []
        for sl in _slices([s.nbytes for _, _, s in items], groups):
            seg = f"{_HOST}.{os.getpid()}.{uuid.uuid4().hex}"
            jobs: list[tuple[int, str, int, memoryview]] = []
            off = 0
            for i in sl:
                key, res, src = items[i]
                rec = _Rec(res.nbytes, res.tag, "", seg, off)
                recs.append(rec)
                jobs.append((i, key, off, src))
                off = _align_up(off + src.nbytes)
            self._seg_live[seg] = len(jobs)  # known to scans from now on
            shares.append((seg, jobs))
        failed: dict[int, BaseException] = {}
        linked: set[int] = set()
        started: list[bool] = [False]  # set by the publish thread: records may be linked from then on

        def publish(records: list[tuple[int, str, str]]) -> tuple[dict[int, BaseException], list[int]]:
            started[0] = True
            return self._publish(records)

        try:

            def write_one(g: int) -> list[tuple[int, str, str]]:
                """One segment (and, for a single segment, its publish too: one hop)."""
                seg, jobs = shares[g]
                try:
                    checks = self._write_segment(seg, jobs)
                except OSError as exc:
                    for i, *_ in jobs:
                        failed[i] = exc
                    return []
                records = []
                for (i, key, _, _), check in zip(jobs, checks, strict=True):
                    r = recs[i]
                    recs[i] = _Rec(r.nbytes, r.tag, check, r.seg, r.off)
                    records.append((i, key, _record_text(recs[i])))
                if len(shares) == 1:
                    bad, ok = publish(records)
                    failed.update(bad)
                    linked.update(ok)
                return records

            if len(shares) == 1:
                await self._thread(write_one, 0)
            else:
                ready: list[tuple[int, str, str]] = []

                async def share(g: int) -> None:
                    ready.extend(await self._thread(write_one, g))

                async with anyio.create_task_group() as tg:
                    for g in range(len(shares)):
                        tg.start_soon(share, g)
                if ready:
                    bad, ok = await self._thread(publish, sorted(ready))
                    failed.update(bad)
                    linked.update(ok)
            await anyio.lowlevel.checkpoint_if_cancelled()
        except BaseException:
            with anyio.CancelScope(shield=True):
                undo = _Undo()
                for seg, jobs in shares:
                    self._seg_live.pop(seg, None)
                    undo.segments.append(seg)
                    for i, key, *_ in jobs:
                        self._release(key, items[i][1])
                        if started[0]:
                            undo.records.append(key)
                await self._run_undo(undo)
            raise
        undo = _Undo()
        for i, (key, res, _) in enumerate(items):
            rec = recs[i]
            err = failed.get(i)
            if err is not None:
                err = BackendIOError(f"write of {key!r} failed: {err}", tier=self.name)
            elif res.dropped:
                err = BlockNotFoundError(f"reservation for {key!r} was evicted during the write", tier=self.name)
            elif self._closed:
                err = BackendClosedError("backend closed during the write", tier=self.name)
            if err is not None:
                self._release(key, res)
                if i in linked:
                    undo.records.append(key)
                self._seg_release(rec.seg, rec.off, rec.nbytes, undo)
                errors.append(err)
                continue
            del self._reserved[key]
            res.writing = False
            if res.counted:
                self._reserved_bytes -= res.nbytes
                res.counted = False
            self._add(key, rec)
            self._writes += 1
            self._bytes_written += res.nbytes
        await self._run_undo(undo)
        if errors:
            raise errors[0]

    async def read_many(self, keys: Sequence[str], *, into: Sequence[Buffer] | None = None) -> list[memoryview]:
        """Read and verify several blocks, grouped by segment and sorted by offset
        (adjacent blocks in one ``preadv``): first what the page cache holds, in one
        worker-thread hop per about :data:`_HOT_GROUP_BYTES`, then the rest spread over
        ``max_concurrency`` threads. The first error is raised after every block was
        read (see :meth:`read` for the errors)."""
        if into is not None and len(into) != len(keys):
            raise InputError(f"read_many: {len(keys)} keys but {len(into)} buffers")
        self._check_open()
        recs = [self._lookup(k) for k in keys]
        outs = [self._target(r, None if into is None else into[i]) for i, r in enumerate(recs)]
        n = len(keys)
        statuses: list[str] = ["cold"] * n
        order = sorted(range(n), key=lambda i: (recs[i].seg, recs[i].sha, recs[i].off))

        async def one(idx: list[int], nowait: bool, pieces: bool = False) -> None:
            jobs = [(recs[i], outs[i]) for i in idx]
            got: list[str] = await self._thread(self._read_slice, jobs, nowait, pieces)
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

        if n:
            total = sum(r.nbytes for r in recs)
            # cached reads are memory copies: split one across the CPUs only when no other
            # read is in flight (concurrent callers already keep the CPUs busy, and more
            # copying threads than CPUs only contend: measured here, 8 callers of 8 MiB reads
            # went from 0.55x to 0.8x of plain reads with one hop each). Only then are large
            # blocks verified piece by piece (each piece still in its CPU's cache); with more
            # threads than CPUs the pieces only add system calls.
            alone = self._reading == 0
            hot = max(1, min(self._max_conc, _CPUS, n, -(-total // _HOT_GROUP_BYTES))) if alone else 1
            cold_groups = max(1, min(self._max_conc, n))
            self._reading += 1
            try:
                if self._nowait and hot < cold_groups:
                    # pass 1: what the page cache holds, in few hops (a thread hop costs more
                    # than a cached small block); pass 2: the rest, spread over more threads
                    await spread(order, hot, True, alone)
                    cold = [i for i in order if statuses[i] == "cold"]
                    if cold:
                        await spread(cold, cold_groups, False)
                else:
                    await spread(order, cold_groups, False)
            finally:
                self._reading -= 1
        first: Exception | None = None
        bad: list[int] = []
        for i, st in enumerate(statuses):
            if st == "ok":
                self._reads += 1
                self._bytes_read += recs[i].nbytes
            else:
                bad.append(i)
        if bad:
            errs = await self._settle([(keys[i], recs[i], statuses[i]) for i in bad])
            for e in errs:
                if first is None or (isinstance(e, IntegrityError) and not isinstance(first, IntegrityError)):
                    first = e
        if first is not None:
            raise first
        return outs

    # ------------------------------------------------------------------ helpers
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
        """Turn non-ok read statuses into the contract's errors, dropping what must go.
        Segment blocks ("missing", "bad") are checked against their record on disk
        first: a record that is gone or changed means another process evicted or
        rewrote the key (BlockNotFoundError, the key leaves the index, the record is
        left alone); a record that still names the block means a dead record (missing
        segment: the record is deleted) or corrupt bytes (IntegrityError: record
        deleted, bytes copied to ``quarantine/`` and punched out)."""
        seg_items = [(k, r) for k, r, st in failures if r.seg and st in ("missing", "bad")]
        current: dict[str, bool] = {}
        if seg_items:
            with anyio.CancelScope(shield=True):
                got: list[bool] = await self._thread(self._records_match, [(k, _record_text(r)) for k, r in seg_items])
            current = {k: m for (k, _), m in zip(seg_items, got, strict=True)}
        undo = _Undo()
        errors: list[Exception] = []
        for key, rec, st in failures:
            if st == "cold":  # cannot happen after a blocking pass; treated as a miss
                st = "missing"
            if self._index.get(key) is not rec:
                errors.append(BlockNotFoundError(f"{key!r} left the store during the read", tier=self.name))
                continue
            if rec.seg:
                still = current.get(key, False)
                if st == "bad" and still:
                    self._integrity_failures += 1
                    undo.quarantine.append((rec.seg, rec.off, rec.nbytes))
                    self._forget(key, undo)
                    errors.append(
                        IntegrityError(
                            f"block {key!r} failed checksum verification; its bytes were quarantined", tier=self.name
                        )
                    )
                    continue
                self._forget(key, undo, record=still, punch=False)
                errors.append(BlockNotFoundError(f"the bytes of {key!r} are gone from the store", tier=self.name))
                continue
            if st == "missing":
                self._forget(key, undo)
                errors.append(BlockNotFoundError(f"content of {key!r} is gone from the store", tier=self.name))
                continue
            # an old content file failed verification: it is in quarantine; drop every key on it
            self._integrity_failures += 1
            for k in [k for k, r in self._index.items() if r.sha == rec.sha and not r.seg]:
                self._forget(k, undo)
            errors.append(
                IntegrityError(
                    f"block {key!r} failed checksum verification; content {rec.sha[:16]}... quarantined",
                    tier=self.name,
                )
            )
        await self._run_undo(undo)
        return errors
