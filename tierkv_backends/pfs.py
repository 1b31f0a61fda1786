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

    objects/ab/<sha256>   content files, named by the sha256 of their bytes
    keys/<key>            one small record per key: {"v", "sha256", "nbytes", "tag", "xxh3"} (JSON)
    tmp/<host>.<pid>.<rand>.tmp   files being written
    quarantine/<sha256>.<ns>      content files that failed verification

Publish: the content file (unless identical content is already there) and then
the record are each written to ``tmp/``, fsynced, renamed into place, and their
directory fsynced. A block is committed once its record is renamed; a crash
leaves either nothing or a stray temp file / unreferenced content file.

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


@dataclass(frozen=True, slots=True)
class _Rec:
    sha: str
    nbytes: int
    tag: bytes
    check: str = ""  # xxh3-128 of the content ("" in records of older versions: sha256 is checked)


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
        return self._root / "objects" / sha[:2] / sha

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

    def _atomic_write(self, dst: Path, data: memoryview | bytes) -> None:
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
            if not obj.parent.is_dir():
                obj.parent.mkdir(exist_ok=True)
                self._fsync_dir(obj.parent.parent)
            self._atomic_write(obj, src)
        rec = json.dumps({"v": 1, "sha256": sha, "nbytes": len(src), "tag": tag.hex(), "xxh3": check}).encode()
        self._atomic_write(self._key_path(key), rec)
        return created

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

    def _read_file(self, sha: str, n: int, dst: memoryview, check: str = "") -> str:
        """Read and verify (xxh3-128 from the record, or sha256 for records
        without one); returns "ok", "missing" or "corrupt" (then the file is
        quarantined)."""
        path = self._obj(sha)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return "missing"
        try:
            ok = os.fstat(fd).st_size == n
            got = 0
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
        found: dict[str, _Rec] = {}
        for e in os.scandir(root / "keys"):
            if not e.name or len(e.name) > 128 or e.name.startswith(".") or not e.is_file():
                continue  # not ours (NFS silly-rename files, editors); leave it alone
            try:
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
        for sub in os.scandir(root / "objects"):
            if not sub.is_dir():
                continue
            for e in os.scandir(sub.path):
                try:
                    if e.name not in referenced and now - e.stat().st_mtime > _ORPHAN_MAX_AGE_S:
                        os.unlink(e.path)
                except FileNotFoundError:
                    pass
        return found

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
            self._release(key, res)
            paths: list[Path] = [self._key_path(key)] if published else []
            deleting: str | None = None
            if sha is not None and self._unref(sha) and sha not in self._deleting:
                paths.append(self._obj(sha))
                deleting = sha
                self._deleting[sha] = anyio.Event()
            if paths:
                await self._remove_files(paths, deleting)
            raise
        del self._reserved[key]
        res.writing = False
        self._index[key] = _Rec(digest, res.nbytes, res.tag, check)
        self._writes += 1
        self._bytes_written += res.nbytes

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

    def _read_group(self, jobs: list[tuple[_Rec, memoryview]]) -> list[str]:
        return [self._read_file(rec.sha, rec.nbytes, out, rec.check) for rec, out in jobs]

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
        """Writes up to ``max_concurrency`` blocks in parallel; each commits
        independently. On failure the others still complete; the first error is raised."""
        if len(allocations) != len(datas):
            raise InputError(f"write_many: {len(allocations)} allocations but {len(datas)} buffers")
        self._check_open()
        errors: list[Exception] = []

        async def one(a: Allocation, d: Buffer) -> None:
            try:
                await self.write(a, d)
            except Exception as exc:
                errors.append(exc)

        async with anyio.create_task_group() as tg:
            for a, d in zip(allocations, datas, strict=True):
                tg.start_soon(one, a, d)
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
        groups = max(1, min(self._max_conc, len(keys)))
        statuses: list[str] = [""] * len(keys)

        async def one(g: int) -> None:
            idx = list(range(g, len(keys), groups))
            got: list[str] = await self._thread(self._read_group, [(recs[i], outs[i]) for i in idx])
            for i, st in zip(idx, got, strict=True):
                statuses[i] = st

        async with anyio.create_task_group() as tg:
            for g in range(groups):
                tg.start_soon(one, g)
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
