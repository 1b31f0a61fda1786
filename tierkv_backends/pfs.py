"""The parallel-filesystem tier: a content-addressed directory on any POSIX filesystem.

Options:

``path`` (str, required)
    The store directory (Lustre, GPFS, NFS, or a local filesystem); created if missing.
``capacity`` (size, default ``1GiB``)
    Budget for ``used_bytes`` (see Accounting).
``fsync`` (bool, default true)
    fsync every file and its directory at publish. With false, a crash may lose
    recent blocks (never expose torn ones: the publish is still a rename).
``max_concurrency`` (int, default 8)
    Worker threads doing file I/O (the limiter size); batch calls run that many
    blocks in parallel.
``max_block_bytes`` (size, default ``1GiB``)

Layout (all under ``path``)::

    objects/<sha256>      content files, named by the sha256 of their bytes (one flat
                          directory, so a batch syncs one directory; stores of layout 1,
                          objects/ab/<sha256>, are moved up when opened)
    keys/<key>            one record per key: a symbolic link whose target is the text
                          "tierkv-rec2/<sha256>/<nbytes>/<xxh3-128>[/<tag hex>...]" (records of
                          version 1, JSON files {"v", "sha256", "nbytes", "tag", "xxh3"}, are
                          still read)
    tmp/<host>.<pid>.<rand>.tmp   files being written
    quarantine/<sha256>.<ns>      content files that failed verification

Publish: the content file (unless identical content is already there) is
written to ``tmp/``, fsynced, renamed into ``objects/`` and that directory fsynced; then
the record link is created in ``tmp/``, renamed over ``keys/<key>`` and
``keys/`` fsynced. A link is pure metadata, so the record costs no data fsync
(half the syncs of a record file). A block is committed once its record is
renamed; a crash leaves either nothing or a stray temp file / unreferenced
content file.

Dedup: keys holding identical bytes share one content file, reference-counted
in memory among the keys this instance knows; the file is deleted when its
last key is evicted. Keys are already scoped (tenant, model) by the core, so
sharing happens only between keys of the same scope whose bytes are equal.

Verification: every read checksums the bytes it read and compares with the
record: xxh3-128 written with the record (tens of GB/s, so verification does
not cap a page-cache read), or the sha256 content address for records that
carry none. A mismatch (or a wrong length) raises :class:`~tierkv.IntegrityError`;
the content file is moved to ``quarantine/`` at once and every key pointing at
it is dropped (records deleted), so it is never served again. A missing
content file reads as :class:`~tierkv.BlockNotFoundError` (the key is dropped).
With ``read(into=...)`` the caller's buffer receives the bytes before they are
verified; on IntegrityError its content is undefined.

Accounting: ``used_bytes`` = physical bytes of the distinct content files the
index references + pending reservations (``nbytes`` each). A write whose
content already exists adds nothing, and evicting one of two keys sharing
content frees nothing; evicting the last frees the file's bytes. Record files
(~150 bytes) are not counted. ``details["logical_bytes"]`` sums the keys'
sizes. ``used_bytes`` returns exactly to its previous value after ``evict``.

Warm start and sharing: :meth:`PfsBackend.open` (and :meth:`PfsBackend.scan`)
rebuild the index from ``keys/``, ignoring and deleting records whose content
file is missing or of the wrong length, temp files of dead writers on this host
(or older than an hour), and unreferenced content files older than ten
minutes. Several processes may open the same directory: atomic renames keep
every reader safe, and content addressing makes concurrent writes of equal
bytes benign. There is no cross-process locking: reference counts are per
process, so an evict in one process may delete content another process still
references; that process then reads :class:`~tierkv.BlockNotFoundError`, never
wrong bytes. Keys added by another process become visible after ``scan()``.

Cancellation: worker threads are never abandoned. A cancelled ``write`` waits
for its I/O, then removes what it published (in a shielded cleanup) and
releases its reservation; an ``evict`` drops the key from the index first and
finishes its unlinks shielded from cancellation.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread
import numpy as np

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
_HOST = socket.gethostname().replace(".", "_") or "host"
_RWF_NOWAIT: int = getattr(os, "RWF_NOWAIT", 0)
#: a batch read first reads what the page cache holds in one worker-thread hop per this many bytes
_HOT_GROUP_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class _Rec:
    sha: str
    nbytes: int
    tag: bytes
    check: str = ""  # xxh3-128 of the content ("" in records of older versions: sha256 is checked)


_LINK_PREFIX = "tierkv-rec2"


def _record_text(sha: str, nbytes: int, tag: bytes, check: str) -> str:
    """A record as the target text of a symbolic link ``keys/<key>`` (format 2):
    ``tierkv-rec2/<sha256>/<nbytes>/<xxh3>[/<tag hex, in parts of 200>...]``. Every
    component is short and ``keys/tierkv-rec2`` is not a directory, so following
    the link fails with ENOENT (tools that stat it see a dangling link)."""
    h = tag.hex()
    parts = [_LINK_PREFIX, sha, str(nbytes), check or "-"] + [h[i : i + 200] for i in range(0, len(h), 200)]
    return "/".join(parts)


def _parse_record(text: str) -> _Rec:
    """Inverse of :func:`_record_text`; ValueError for anything else (left alone by a scan)."""
    parts = text.split("/")
    if len(parts) < 4 or parts[0] != _LINK_PREFIX:
        raise ValueError("not a tierkv record link")
    check = "" if parts[3] == "-" else parts[3]
    return _Rec(parts[1], int(parts[2]), bytes.fromhex("".join(parts[4:])), check)


def _fast_check(data: memoryview) -> str:
    """The per-read checksum: xxh3-128 (tens of GB/s, against about 0.5-2 GB/s for sha256)."""
    import xxhash

    return str(xxhash.xxh3_128_hexdigest(data))


class _Res:
    __slots__ = ("counted", "dropped", "handle", "nbytes", "tag", "writing")

    def __init__(self, nbytes: int, tag: bytes, handle: int) -> None:
        self.nbytes = nbytes
        self.tag = tag
        self.handle = handle
        self.writing = False
        self.dropped = False
        self.counted = True  # nbytes still counted in reserved_bytes


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class PfsBackend(Backend):
    """Content-addressed, checksummed, persistent directory tier (see the module docstring).

    Implements :class:`~tierkv.SupportsScan`. ``io_path`` is
    ``"posix pread/pwrite + fsync"``; never emulated.
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
            alignment=4096,
            max_block_bytes=self._max_block,
            max_concurrency=self._max_conc,
            envelope_threshold=0.8,
        )
        self._limiter: anyio.CapacityLimiter | None = None
        self._index: dict[str, _Rec] = {}
        self._refs: dict[str, int] = {}  # sha -> committed keys + in-flight claims
        self._sizes: dict[str, int] = {}  # sha -> bytes counted in _physical
        self._physical = 0
        self._logical = 0
        self._reserved: dict[str, _Res] = {}
        self._reserved_bytes = 0
        self._deleting: dict[str, anyio.Event] = {}
        self._inflight_tmp: set[str] = set()
        self._scan_evicted: set[str] | None = None
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
        for sub in ("objects", "keys", "tmp", "quarantine"):
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
    def _obj(self, sha: str) -> Path:
        return self._root / "objects" / sha

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

    def _atomic_write(self, dst: Path, data: memoryview | bytes, *, sync_dir: bool = True) -> None:
        name = f"{_HOST}.{os.getpid()}.{uuid.uuid4().hex}.tmp"
        tmp = self._root / "tmp" / name
        self._inflight_tmp.add(name)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                view = memoryview(data)
                off = 0
                while off < len(view):
                    off += os.pwrite(fd, view[off:], off)
                if self._fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, dst)
            if sync_dir:
                self._fsync_dir(dst.parent)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        finally:
            self._inflight_tmp.discard(name)

    def _publish(self, key: str, sha: str, src: memoryview, tag: bytes, check: str) -> bool:
        """Ensure the content file exists, then publish the key record. True if the content file was created."""
        obj = self._obj(sha)
        try:
            created = os.stat(obj).st_size != len(src)
        except FileNotFoundError:
            created = True
        if created:
            self._atomic_write(obj, src)
        self._link_record(key, _record_text(sha, len(src), tag, check))
        return created

    def _link_record(self, key: str, text: str, *, sync_dir: bool = True) -> None:
        """Publish a record as a symbolic link whose target is the record text: one
        metadata operation, made durable by the fsync of ``keys/`` (no data fsync).
        ``symlink`` is atomic and fails if the name exists; only then (a record of this
        key left by another process) the link is made in ``tmp/`` and renamed over it."""
        try:
            os.symlink(text, self._key_path(key))
        except FileExistsError:
            pass
        else:
            if sync_dir:
                self._fsync_dir(self._root / "keys")
            return
        name = f"{_HOST}.{os.getpid()}.{uuid.uuid4().hex}.tmp"
        tmp = self._root / "tmp" / name
        self._inflight_tmp.add(name)
        try:
            os.symlink(text, tmp)
            os.rename(tmp, self._key_path(key))
            if sync_dir:
                self._fsync_dir(self._root / "keys")
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        finally:
            self._inflight_tmp.discard(name)

    def _put_share(
        self, jobs: list[tuple[str, memoryview, list[tuple[int, str, str]]]]
    ) -> dict[int, BaseException | None]:
        """Batch phase 1, one worker thread per share of the batch. For each distinct content
        of the share: unless it is already there, write it to ``tmp/``, fsync, rename into
        ``objects/``; then sync ``objects/`` once (also when every content existed: another
        writer may not have synced its rename yet); then link the records of the share's
        blocks whose content is durable (``keys/`` is synced once per batch, by the caller).
        Per block (by its index in the batch) its exception or None."""
        out: dict[int, BaseException | None] = {}
        ok: list[tuple[str, str, list[tuple[int, str, str]]]] = []
        for sha, src, links in jobs:
            obj = self._obj(sha)
            try:
                try:
                    exists = os.stat(obj).st_size == len(src)
                except FileNotFoundError:
                    exists = False
                if not exists:
                    self._atomic_write(obj, src, sync_dir=False)
                ok.append((sha, "", links))
            except Exception as exc:
                for i, _, _ in links:
                    out[i] = exc
        if ok:
            try:
                self._fsync_dir(self._root / "objects")
            except OSError as exc:
                for _, _, links in ok:
                    for i, _, _ in links:
                        out[i] = exc
                return out
        for _, _, links in ok:
            for i, key, text in links:
                try:
                    self._link_record(key, text, sync_dir=False)
                    out[i] = None
                except Exception as exc:
                    out[i] = exc
        return out

    def _unlink(self, paths: Sequence[Path]) -> None:
        dirs: set[Path] = set()
        for p in paths:
            try:
                os.unlink(p)
                dirs.add(p.parent)
            except FileNotFoundError:
                pass
        for d in dirs:
            self._fsync_dir(d)

    def _read_file(self, sha: str, n: int, dst: memoryview, check: str = "", *, nowait: bool = False) -> str:
        """Read and verify (xxh3-128 from the record, or sha256 for records
        without one); returns "ok", "missing" or "corrupt" (then the file is
        quarantined). With ``nowait`` (Linux ``RWF_NOWAIT``) it returns "cold"
        instead of waiting for the medium when the bytes are not all in the page
        cache (nothing verified, ``dst`` undefined): the caller reads it again."""
        path = self._obj(sha)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return "missing"
        try:
            ok = os.fstat(fd).st_size == n
            got = 0
            if ok and nowait and n:
                try:
                    got = os.preadv(fd, [dst], 0, _RWF_NOWAIT)
                except BlockingIOError:
                    return "cold"
                except OSError:
                    got = 0  # RWF_NOWAIT unsupported here: read normally
                if 0 < got < n:
                    return "cold"
            while ok and got < n:
                r = os.preadv(fd, [dst[got:]], got)
                if r == 0:
                    ok = False
                got += r
        finally:
            os.close(fd)
        if ok and (_fast_check(dst) == check if check else hashlib.sha256(dst).hexdigest() == sha):
            return "ok"
        try:
            os.rename(path, self._root / "quarantine" / f"{sha}.{time.time_ns()}")
            self._fsync_dir(path.parent)
        except FileNotFoundError:
            pass
        return "corrupt"

    def _scan_dir(self, known: frozenset[str]) -> dict[str, _Rec]:
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
                    rec = _Rec(str(d["sha256"]), int(d["nbytes"]), bytes.fromhex(d["tag"]), str(d.get("xxh3", "")))
                if len(rec.sha) != 64 or os.stat(self._obj(rec.sha)).st_size != rec.nbytes:
                    raise ValueError("content length mismatch")
            except FileNotFoundError:
                self._unlink([Path(e.path)])  # content missing (or the record vanished)
                continue
            except ValueError as exc:
                if "length" in str(exc):
                    self._unlink([Path(e.path)])  # content of the wrong length: a dead record
                continue  # unreadable record (another version?): ignored, kept
            except (KeyError, TypeError, OSError):
                continue
            found[e.name] = rec
        referenced = {r.sha for r in found.values()} | known
        for e in os.scandir(root / "objects"):
            try:
                if e.is_file() and e.name not in referenced and now - e.stat().st_mtime > _ORPHAN_MAX_AGE_S:
                    os.unlink(e.path)
            except FileNotFoundError:
                pass
        return found

    def _migrate_shards(self) -> None:
        """Layout 1 kept content in ``objects/ab/<sha>``; layout 2 is flat (one directory to
        sync per batch). Move such files up (atomic renames), sync, remove the shard."""
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
    def _ref(self, sha: str, n: int) -> None:
        c = self._refs.get(sha, 0)
        self._refs[sha] = c + 1
        if c == 0:
            self._sizes[sha] = n
            self._physical += n

    def _unref(self, sha: str) -> bool:
        """Drop one reference; True if it was the last (the content file may be deleted)."""
        c = self._refs[sha] - 1
        if c:
            self._refs[sha] = c
            return False
        del self._refs[sha]
        self._physical -= self._sizes.pop(sha)
        return True

    def _drop_key(self, key: str) -> tuple[list[Path], str | None]:
        """Remove a committed key from the index; return the paths to unlink and the
        sha whose file is being deleted (or None)."""
        rec = self._index.pop(key)
        self._logical -= rec.nbytes
        if self._scan_evicted is not None:
            self._scan_evicted.add(key)
        paths = [self._key_path(key)]
        if self._unref(rec.sha) and rec.sha not in self._deleting:
            paths.append(self._obj(rec.sha))
            self._deleting[rec.sha] = anyio.Event()
            return paths, rec.sha
        return paths, None

    async def _remove_files(self, paths: list[Path], sha: str | None) -> None:
        """Unlink files shielded from cancellation; wake writers waiting on ``sha``."""
        try:
            with anyio.CancelScope(shield=True):
                await self._thread(self._unlink, paths)
        finally:
            if sha is not None:
                self._deleting.pop(sha).set()

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
            known = frozenset(self._refs) | frozenset(r.sha for r in self._index.values())
            found = await self._thread(self._scan_dir, known)
            evicted = self._scan_evicted
        finally:
            self._scan_evicted = None
        for key, rec in found.items():
            if key in self._index or key in self._reserved or key in evicted:
                continue
            self._index[key] = rec
            self._logical += rec.nbytes
            self._ref(rec.sha, rec.nbytes)
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
        """See :meth:`Backend.write`: hash, publish content (if new) and record, durably."""
        self._check_open()
        key = allocation.key if isinstance(allocation, Allocation) else ""
        res = self._reserved.get(key)
        if res is None or res.handle != allocation.handle or res.writing:
            raise BlockNotFoundError(f"unknown or already written allocation {allocation!r}", tier=self.name)
        res.writing = True
        sha: str | None = None
        published = False
        try:
            src = as_byte_view(data)
            if src.nbytes != res.nbytes:
                raise InputError(f"[{self.name}] data has {src.nbytes} bytes, allocation has {res.nbytes}")
            digest, check = await self._thread(lambda: (hashlib.sha256(src).hexdigest(), _fast_check(src)))
            while digest in self._deleting:  # the last key of this content is being evicted
                await self._deleting[digest].wait()
            if res.dropped:  # evicted while hashing: its bytes were already released by evict
                raise BlockNotFoundError(f"reservation for {key!r} was evicted during the write", tier=self.name)
            self._ref(digest, res.nbytes)  # claim: eviction of other keys keeps the file
            sha = digest
            if res.counted:
                self._reserved_bytes -= res.nbytes  # now counted as physical (or shared)
                res.counted = False
            published = True  # from here a cancelled write may have published the record
            await self._thread(self._publish, key, digest, src, res.tag, check)
            await anyio.lowlevel.checkpoint_if_cancelled()
            if res.dropped:
                raise BlockNotFoundError(f"reservation for {key!r} was evicted during the write", tier=self.name)
            if self._closed:
                raise BackendClosedError("backend closed during the write", tier=self.name)
        except BaseException:
            await self._abort_write(key, res, sha, published)
            raise
        del self._reserved[key]
        res.writing = False
        self._index[key] = _Rec(digest, res.nbytes, res.tag, check)
        self._writes += 1
        self._bytes_written += res.nbytes

    async def _abort_write(self, key: str, res: _Res, sha: str | None, published: bool) -> None:
        """Undo a write that failed or was cancelled: release the reservation, drop the
        content claim, and unlink (shielded) what it may have published."""
        self._release(key, res)
        paths: list[Path] = [self._key_path(key)] if published else []
        deleting: str | None = None
        if sha is not None and self._unref(sha) and sha not in self._deleting:
            paths.append(self._obj(sha))
            deleting = sha
            self._deleting[sha] = anyio.Event()
        if paths:
            await self._remove_files(paths, deleting)

    def _target(self, rec: _Rec, into: Buffer | None) -> memoryview:
        if into is None:
            out: memoryview = np.empty(rec.nbytes, dtype=np.uint8).data
            return out
        return into_view(into, rec.nbytes, tier=self.name)

    def _lookup(self, key: str) -> _Rec:
        validate_key(key, tier=self.name)
        rec = self._index.get(key)
        if rec is None:
            raise BlockNotFoundError(f"no block under {key!r}", tier=self.name)
        return rec

    def _read_group(self, jobs: list[tuple[_Rec, memoryview]], nowait: bool = False) -> list[str]:
        return [self._read_file(rec.sha, rec.nbytes, out, rec.check, nowait=nowait) for rec, out in jobs]

    async def _settle(self, key: str, rec: _Rec, status: str) -> None:
        """Turn a non-ok read status into the contract's error (dropping what must go)."""
        if status == "missing":
            if self._index.get(key) is rec:
                paths, sha = self._drop_key(key)
                await self._remove_files(paths, sha)
            raise BlockNotFoundError(f"content of {key!r} is gone from the store", tier=self.name)
        # corrupt: the file is already in quarantine; drop every key that points at it
        self._integrity_failures += 1
        victims = [k for k, r in self._index.items() if r.sha == rec.sha]
        all_paths: list[Path] = []
        for k in victims:
            paths, sha = self._drop_key(k)
            all_paths.append(paths[0])  # the record only: the content file is in quarantine
            if sha is not None:
                self._deleting.pop(sha).set()
        if all_paths:
            with anyio.CancelScope(shield=True):
                await self._thread(self._unlink, all_paths)
        raise IntegrityError(
            f"block {key!r} failed checksum verification; content {rec.sha[:16]}... quarantined", tier=self.name
        )

    async def read(self, key: str, *, into: Buffer | None = None) -> memoryview:
        """See :meth:`Backend.read`; the checksum of the bytes (xxh3-128 recorded at
        write, sha256 for older records) is checked on every read."""
        self._check_open()
        rec = self._lookup(key)
        out = self._target(rec, into)
        status: str = await self._thread(self._read_file, rec.sha, rec.nbytes, out, rec.check)
        if status != "ok":
            await self._settle(key, rec, status)
        self._reads += 1
        self._bytes_read += rec.nbytes
        return out

    async def evict(self, key: str) -> bool:
        """See :meth:`Backend.evict`: the key leaves the index at once; its record
        (and its content file if no other key shares it) are unlinked shielded."""
        self._check_open()
        validate_key(key, tier=self.name)
        if key in self._index:
            paths, sha = self._drop_key(key)
            self._evictions += 1
            await self._remove_files(paths, sha)
            return True
        res = self._reserved.get(key)
        if res is not None:
            del self._reserved[key]
            self._logical -= res.nbytes
            if res.counted:
                self._reserved_bytes -= res.nbytes
                res.counted = False
            res.dropped = True
            return True
        return False

    async def content_hash(self, key: str) -> str | None:
        """The sha256 (hex) content address of the block under ``key``, or None
        (:class:`~tierkv.SupportsContentHash`; no I/O)."""
        self._check_open()
        validate_key(key, tier=self.name)
        rec = self._index.get(key)
        return None if rec is None else rec.sha

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
        Cleans up its files. Raises BackendIOError."""
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
        data = np.random.default_rng(1).integers(0, 256, block_bytes, dtype=np.uint8)
        bufs = [np.empty(block_bytes, dtype=np.uint8) for _ in range(max(1, concurrency))]

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
        how = "create+pwrite+fsync+close" if op == "write" else "open+preadv+close (page cache)"
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
                "content_files": len(self._refs),
                "integrity_failures": self._integrity_failures,
                "fsync": self._fsync,
            },
        )

    # -------------------------------------------------------------- batch twins
    async def write_many(self, allocations: Sequence[Allocation], datas: Sequence[Buffer]) -> None:
        """Write several blocks with one group commit: hash every block (``max_concurrency``
        threads); in the same number of threads write, fsync and rename the new content
        files, sync ``objects/`` once per thread and link the records; then sync ``keys/``
        once for the batch. Durability is that
        of :meth:`write` (every block is durable when this returns), with one ``keys/``
        sync per batch instead of one per block.

        Each block commits or fails independently (a wrong length, an unknown or
        evicted reservation, an I/O error); the others still complete and the first
        error is raised at the end. Cancellation waits for the threads, then undoes
        every block of the batch (shielded), as :meth:`write` does for one."""
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
            src = as_byte_view(d)
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
        shas: list[str | None] = [None] * len(items)
        checks: list[str] = [""] * len(items)
        published = [False] * len(items)
        failed: dict[int, Exception] = {}
        try:
            groups = max(1, min(self._max_conc, len(items)))

            async def hash_share(g: int) -> None:
                idx = list(range(g, len(items), groups))

                def run() -> list[tuple[str, str]]:
                    return [(hashlib.sha256(items[i][2]).hexdigest(), _fast_check(items[i][2])) for i in idx]

                for i, (h, c) in zip(idx, await self._thread(run), strict=True):
                    shas[i], checks[i] = h, c

            async with anyio.create_task_group() as tg:
                for g in range(groups):
                    tg.start_soon(hash_share, g)
            digests = [h for h in shas if h is not None]
            assert len(digests) == len(items)
            shas = [None] * len(items)  # set again when claimed
            for i, (key, res, _) in enumerate(items):
                while digests[i] in self._deleting:  # the last key of this content is being evicted
                    await self._deleting[digests[i]].wait()
                if res.dropped:
                    failed[i] = BlockNotFoundError(
                        f"reservation for {key!r} was evicted during the write", tier=self.name
                    )
                    continue
                self._ref(digests[i], res.nbytes)
                shas[i] = digests[i]
                if res.counted:
                    self._reserved_bytes -= res.nbytes
                    res.counted = False
                published[i] = True
            # phase 1: content files and records, one job per distinct content
            by_sha: dict[str, tuple[str, memoryview, list[tuple[int, str, str]]]] = {}
            for i, (key, res, src) in enumerate(items):
                if i not in failed:
                    job = by_sha.setdefault(digests[i], (digests[i], src, []))
                    job[2].append((i, key, _record_text(digests[i], src.nbytes, res.tag, checks[i])))
            jobs = list(by_sha.values())
            cg = max(1, min(self._max_conc, len(jobs)))
            linked: list[int] = []

            async def share(g: int) -> None:
                got: dict[int, BaseException | None] = await self._thread(self._put_share, jobs[g::cg])
                for i, err in got.items():
                    if err is None:
                        linked.append(i)
                    else:
                        failed[i] = BackendIOError(f"write of {items[i][0]!r} failed: {err}", tier=self.name)

            async with anyio.create_task_group() as tg:
                for g in range(cg):
                    tg.start_soon(share, g)
            # phase 2: one keys/ sync for the whole batch (group commit)
            if linked:
                try:
                    await self._thread(self._fsync_dir, self._root / "keys")
                except BackendIOError as exc:
                    for i in linked:
                        failed[i] = exc
            await anyio.lowlevel.checkpoint_if_cancelled()
        except BaseException:
            with anyio.CancelScope(shield=True):
                for i, (key, res, _) in enumerate(items):
                    await self._abort_write(key, res, shas[i], published[i])
            raise
        for i, (key, res, _) in enumerate(items):
            err = failed.get(i)
            if err is None and res.dropped:
                err = BlockNotFoundError(f"reservation for {key!r} was evicted during the write", tier=self.name)
            if err is None and self._closed:
                err = BackendClosedError("backend closed during the write", tier=self.name)
            if err is not None:
                with anyio.CancelScope(shield=True):
                    await self._abort_write(key, res, shas[i], published[i])
                errors.append(err)
                continue
            del self._reserved[key]
            res.writing = False
            self._index[key] = _Rec(digests[i], res.nbytes, res.tag, checks[i])
            self._writes += 1
            self._bytes_written += res.nbytes
        if errors:
            raise errors[0]

    async def read_many(self, keys: Sequence[str], *, into: Sequence[Buffer] | None = None) -> list[memoryview]:
        """Reads in at most ``max_concurrency`` worker-thread hops running in parallel
        (each reads and verifies a share of the blocks); the first error is raised
        after every block was read."""
        if into is not None and len(into) != len(keys):
            raise InputError(f"read_many: {len(keys)} keys but {len(into)} buffers")
        self._check_open()
        recs = [self._lookup(k) for k in keys]
        outs = [self._target(r, None if into is None else into[i]) for i, r in enumerate(recs)]
        statuses: list[str] = ["cold"] * len(keys)

        async def one(idx: list[int], nowait: bool) -> None:
            got: list[str] = await self._thread(self._read_group, [(recs[i], outs[i]) for i in idx], nowait)
            for i, st in zip(idx, got, strict=True):
                statuses[i] = st

        async def spread(idx: list[int], groups: int, nowait: bool) -> None:
            async with anyio.create_task_group() as tg:
                for g in range(groups):
                    tg.start_soon(one, idx[g::groups], nowait)

        everything = list(range(len(keys)))
        if _RWF_NOWAIT and keys:
            # pass 1: what the page cache holds, in few hops (a thread hop costs more than a
            # cached small block); pass 2: the rest, spread over max_concurrency threads
            total = sum(r.nbytes for r in recs)
            await spread(everything, max(1, min(self._max_conc, len(keys), -(-total // _HOT_GROUP_BYTES))), True)
        cold = [i for i in everything if statuses[i] == "cold"]
        if cold:
            await spread(cold, max(1, min(self._max_conc, len(cold))), False)
        first: Exception | None = None
        for i, st in enumerate(statuses):
            if st == "ok":
                self._reads += 1
                self._bytes_read += recs[i].nbytes
            elif first is None or st == "corrupt":
                try:
                    await self._settle(keys[i], recs[i], st)
                except (BlockNotFoundError, IntegrityError) as exc:
                    first = first or exc
        if first is not None:
            raise first
        return outs
