"""Reference backends: the smallest complete backends, written against ``tierkv.backend`` alone.

``RefMemoryBackend`` keeps blocks in a dict; ``RefFileBackend`` stores one file
per block (temp file + fsync + ``os.replace`` for an atomic commit) and is
persistent. Both follow the contract of :mod:`tierkv.backend` to the letter, with
its :class:`~tierkv.backend.ReservationLedger` keeping reservations and capacity:
the suite's known-good subjects, and a starting point for a new backend. The
broken variants at the bottom each break exactly one rule so that the suite can be
shown to catch them.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread

from tierkv.backend import (
    Allocation,
    Backend,
    BackendStats,
    BlockInfo,
    Buffer,
    Capabilities,
    Reservation,
    ReservationLedger,
    TierKind,
    as_byte_view,
    into_view,
    opt_int,
    opt_size,
    opt_str,
    reject_unknown,
    validate_key,
)
from tierkv.errors import BackendIOError, BlockNotFoundError, InputError

__all__ = [
    "LeakyCancelBackend",
    "RefFileBackend",
    "RefMemoryBackend",
    "StaleAfterEvictBackend",
]

_INLINE_COPY = 4096


class RefMemoryBackend(Backend):
    """In-memory reference backend (exact accounting, atomic commit)."""

    _KNOWN = frozenset({"capacity", "max_block_bytes", "alignment", "max_concurrency"})
    _KIND = TierKind.DRAM
    _PERSISTENT = False

    def __init__(self, options: Mapping[str, Any] | None = None, *, name: str = "") -> None:
        super().__init__(options, name=name or "ref")
        reject_unknown(self.options, self._KNOWN)
        self._capacity = opt_size(self.options, "capacity", "64MiB")
        self._max_block = opt_size(self.options, "max_block_bytes", "32MiB", minimum=1)
        self._alignment = opt_int(self.options, "alignment", 1, minimum=1)
        self._max_conc = opt_int(self.options, "max_concurrency", 4, minimum=1)
        self._blocks: dict[str, tuple[Any, bytes]] = {}  # committed: key -> (stored, tag)
        self._ledger: ReservationLedger[Reservation] = ReservationLedger(
            tier=self.name, capacity=self._capacity, max_block_bytes=self._max_block
        )
        self._counters = {"reads": 0, "writes": 0, "evictions": 0, "bytes_read": 0, "bytes_written": 0}
        self._limiter = anyio.CapacityLimiter(self._max_conc)

    @classmethod
    def default_options(cls, workdir: Path) -> dict[str, Any]:
        return {"capacity": "64MiB"}

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(
            tier_kind=self._KIND,
            persistent=self._PERSISTENT,
            alignment=self._alignment,
            max_block_bytes=self._max_block,
            max_concurrency=self._max_conc,
        )

    # ---------------------------------------------------------------- storage hooks
    async def _store(self, a: Reservation, mv: memoryview) -> Any:
        if len(mv) <= _INLINE_COPY:
            return bytes(mv)
        return await anyio.to_thread.run_sync(bytes, mv, limiter=self._limiter)

    async def _load(self, key: str, stored: Any) -> bytes:
        return stored  # type: ignore[no-any-return]

    async def _discard(self, key: str, stored: Any) -> None:
        return None

    # ------------------------------------------------------------------------ data
    async def allocate(self, key: str, nbytes: int, *, tag: bytes = b"") -> Allocation:
        self._check_open()
        return self._ledger.reserve(key, nbytes, tag, committed=self._blocks)

    async def write(self, allocation: Allocation, data: Buffer) -> None:
        self._check_open()
        r = self._ledger.claim(allocation)
        try:
            mv = as_byte_view(data)
            if len(mv) != r.nbytes:
                raise InputError(f"[{self.name}] write of {len(mv)} bytes into a {r.nbytes}-byte allocation")
            stored = await self._store(r, mv)
        except BaseException:
            self._ledger.abort(r)
            raise
        if not self._ledger.commit(r):
            # evicted (or closed) while the bytes were in flight: nothing becomes visible
            with anyio.CancelScope(shield=True):
                await self._discard(r.key, stored)
            raise BlockNotFoundError(f"reservation for {r.key!r} was dropped during write", tier=self.name)
        self._blocks[r.key] = (stored, r.tag)
        self._counters["writes"] += 1
        self._counters["bytes_written"] += r.nbytes

    def _size_of(self, stored: Any) -> int:
        return len(stored)

    async def read(self, key: str, *, into: Buffer | None = None) -> memoryview:
        self._check_open()
        validate_key(key, tier=self.name)
        entry = self._blocks.get(key)
        if entry is None:
            raise BlockNotFoundError(f"no block {key!r}", tier=self.name)
        n = self._size_of(entry[0])
        out: memoryview | None = None
        if into is not None:
            out = into_view(into, n, tier=self.name)
        raw = await self._load(key, entry[0])
        self._counters["reads"] += 1
        self._counters["bytes_read"] += n
        if out is not None:
            out[:n] = raw
            return out[:n]
        return memoryview(bytearray(raw))

    async def evict(self, key: str) -> bool:
        self._check_open()
        validate_key(key, tier=self.name)
        if self._ledger.drop(key) is not None:  # a write in flight discards its own bytes
            return True
        entry = self._blocks.pop(key, None)
        if entry is None:
            return False
        self._ledger.release(self._size_of(entry[0]))
        self._counters["evictions"] += 1
        with anyio.CancelScope(shield=True):
            await self._discard(key, entry[0])
        return True

    async def contains(self, key: str) -> bool:
        self._check_open()
        validate_key(key, tier=self.name)
        return key in self._blocks

    async def _close(self) -> None:
        self._ledger.clear()

    def stats(self) -> BackendStats:
        return BackendStats(
            tier=self.name,
            kind=self._KIND,
            capacity_bytes=self._capacity,
            used_bytes=self._ledger.used_bytes,
            blocks=len(self._blocks),
            reserved_bytes=self._ledger.reserved_bytes,
            io_path="memcpy",
            reads=self._counters["reads"],
            writes=self._counters["writes"],
            evictions=self._counters["evictions"],
            bytes_read=self._counters["bytes_read"],
            bytes_written=self._counters["bytes_written"],
        )


class RefFileBackend(RefMemoryBackend):
    """Persistent reference backend: one file per block under ``path``.

    File layout: ``u32 tag length | tag | data``; a commit is temp file + fsync +
    ``os.replace`` + directory fsync, so a block is either whole or absent.
    """

    _KNOWN = RefMemoryBackend._KNOWN | {"path"}
    _KIND = TierKind.NVME
    _PERSISTENT = True

    def __init__(self, options: Mapping[str, Any] | None = None, *, name: str = "") -> None:
        super().__init__(options, name=name or "reffile")
        self._dir = Path(opt_str(self.options, "path"))

    @classmethod
    def default_options(cls, workdir: Path) -> dict[str, Any]:
        return {"capacity": "64MiB", "path": str(workdir / "reffile")}

    async def _open(self) -> None:
        def scan() -> dict[str, tuple[int, bytes]]:
            self._dir.mkdir(parents=True, exist_ok=True)
            found: dict[str, tuple[int, bytes]] = {}
            for p in self._dir.iterdir():
                if p.name.endswith(".tmp"):
                    p.unlink(missing_ok=True)
                elif p.name.endswith(".blk"):
                    with p.open("rb") as f:
                        (tl,) = struct.unpack("<I", f.read(4))
                        tag = f.read(tl)
                    found[p.name[:-4]] = (p.stat().st_size - 4 - tl, tag)
            return found

        try:
            found = await anyio.to_thread.run_sync(scan)
        except OSError as exc:
            raise BackendIOError(f"cannot open {self._dir}: {exc}", tier=self.name) from exc
        for key, (n, tag) in found.items():
            self._blocks[key] = (n, tag)
            self._ledger.restore(n)

    def _size_of(self, stored: Any) -> int:
        return int(stored)

    async def _store(self, a: Reservation, mv: memoryview) -> Any:
        final = self._dir / f"{a.key}.blk"
        tmp = self._dir / f"{a.key}.{a.handle}.tmp"

        def do() -> None:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, struct.pack("<I", len(a.tag)) + a.tag)
                view = mv
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, final)
            dfd = os.open(self._dir, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)

        def undo() -> None:
            tmp.unlink(missing_ok=True)
            final.unlink(missing_ok=True)

        try:
            await anyio.to_thread.run_sync(do, limiter=self._limiter)
        except BaseException as exc:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(undo)
            if isinstance(exc, OSError):
                raise BackendIOError(f"write {a.key!r} failed: {exc}", tier=self.name) from exc
            raise
        return a.nbytes

    async def _load(self, key: str, stored: Any) -> bytes:
        def do() -> bytes:
            with (self._dir / f"{key}.blk").open("rb") as f:
                (tl,) = struct.unpack("<I", f.read(4))
                f.seek(4 + tl)
                return f.read()

        try:
            return await anyio.to_thread.run_sync(do, limiter=self._limiter)
        except FileNotFoundError as exc:
            raise BlockNotFoundError(f"block {key!r} vanished", tier=self.name) from exc
        except OSError as exc:
            raise BackendIOError(f"read {key!r} failed: {exc}", tier=self.name) from exc

    async def _discard(self, key: str, stored: Any) -> None:
        try:
            await anyio.to_thread.run_sync((self._dir / f"{key}.blk").unlink, True)
        except OSError as exc:
            raise BackendIOError(f"evict {key!r} failed: {exc}", tier=self.name) from exc

    async def scan(self) -> list[BlockInfo]:
        self._check_open()
        return [BlockInfo(k, int(n), tag) for k, (n, tag) in self._blocks.items()]

    def stats(self) -> BackendStats:
        s = super().stats()
        return BackendStats(**{**{f: getattr(s, f) for f in s.__dataclass_fields__}, "io_path": "buffered write+fsync"})


# --------------------------------------------------------------------------- broken on purpose
class StaleAfterEvictBackend(RefMemoryBackend):
    """BROKEN: keeps a read cache that ``evict`` forgets to invalidate."""

    def __init__(self, options: Mapping[str, Any] | None = None, *, name: str = "") -> None:
        super().__init__(options, name=name or "stale")
        self._cache: dict[str, bytes] = {}

    async def read(self, key: str, *, into: Buffer | None = None) -> memoryview:
        self._check_open()
        if key in self._cache:
            raw = self._cache[key]
            if into is not None:
                out = as_byte_view(into, writable=True)
                out[: len(raw)] = raw
                return out[: len(raw)]
            return memoryview(bytearray(raw))
        mv = await super().read(key, into=into)
        self._cache[key] = bytes(mv)
        return mv

    async def contains(self, key: str) -> bool:
        return await super().contains(key) or key in self._cache


class LeakyCancelBackend(RefMemoryBackend):
    """BROKEN: a write cancelled (or failed) while the copy runs keeps its reservation."""

    async def write(self, allocation: Allocation, data: Buffer) -> None:
        self._check_open()
        r = self._ledger.claim(allocation)
        mv = as_byte_view(data)
        if len(mv) != r.nbytes:
            raise InputError("wrong length")
        await anyio.lowlevel.checkpoint()  # a checkpoint where cancellation lands; the reservation is never dropped
        stored = await anyio.to_thread.run_sync(bytes, mv)
        self._ledger.commit(r)
        self._blocks[r.key] = (stored, r.tag)
