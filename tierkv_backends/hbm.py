"""The GPU HBM tier: one large torch CUDA allocation carved into blocks.

* :class:`HbmPool` is pure bookkeeping (keys, reservations, pinned readers,
  exact accounting) over the shared :class:`~tierkv_backends._arena.BuddyAllocator`;
  it touches no memory and is tested on CPU.
* :class:`HbmBackend` owns a ``torch.uint8`` CUDA tensor of ``capacity`` bytes
  and moves bytes with ``Tensor.copy_`` on a dedicated side stream (one per
  backend), synchronised before the call returns: host-to-device for
  :meth:`~HbmBackend.write` (bounced through a pinned staging buffer when the
  source is pageable), device-to-host for :meth:`~HbmBackend.read`, and
  device-to-device for :meth:`~HbmBackend.write_device` /
  :meth:`~HbmBackend.read_device` (``into=`` a caller's CUDA tensor).

Without CUDA, :meth:`HbmBackend.probe` is unusable with the reason and
:meth:`HbmBackend.open` raises PluginUnavailableError. torch is imported only
inside ``open`` and the copy functions.

Options: ``capacity`` (size, default 1 GiB), ``device`` (int CUDA ordinal,
default 0), ``max_block_bytes`` (default 1 GiB), ``max_concurrency`` (copy
threads, default 4), ``granule`` (power of two, default 4 KiB).

Concurrency and cancellation: bookkeeping runs on the event loop; copies run in
worker threads that are never abandoned. A block being read is pinned: ``evict``
hides the key at once and the extent is freed when the last copy ends. A
cancelled write waits for its copy, then drops the reservation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from tierkv.backend import (
    Allocation,
    Availability,
    Backend,
    BackendStats,
    Buffer,
    Capabilities,
    RawMeasurement,
    Reservation,
    ReservationLedger,
    TierKind,
    as_byte_view,
    into_view,
    opt_int,
    opt_size,
    reject_unknown,
    validate_key,
)
from tierkv.errors import (
    BackendClosedError,
    BackendIOError,
    BlockNotFoundError,
    CapacityError,
    ConfigError,
    InputError,
    PluginUnavailableError,
)

from ._arena import BuddyAllocator, Extent
from ._gpu import cuda_usable

__all__ = ["HbmBackend", "HbmPool", "PoolBlock"]

_KNOWN = frozenset({"capacity", "device", "max_block_bytes", "max_concurrency", "granule"})


class PoolBlock(Reservation):
    """A reservation of an :class:`HbmPool`, then the committed block it becomes: the
    ledger's reservation plus its extent of device memory and its pinned readers."""

    __slots__ = ("committed", "extent", "readers")

    def __init__(self, key: str, extent: Extent, tag: bytes) -> None:
        super().__init__(key, extent.nbytes, tag, held=extent.held)
        self.extent = extent
        self.committed = False
        self.readers = 0


class HbmPool:
    """Pure pool arithmetic: a buddy allocator plus the reservation ledger. No memory, no torch.

    Errors: InputError (bad key / size / tag), BlockExistsError, CapacityError,
    BlockNotFoundError, all tagged with ``tier``. Not thread-safe: call from one
    event loop.
    """

    def __init__(self, capacity: int, *, granule: int = 4096, max_block: int = 1 << 30, tier: str = "hbm") -> None:
        self.tier = tier
        self.alloc = BuddyAllocator(capacity, granule)
        self.max_block = max_block
        self.blocks: dict[str, PoolBlock] = {}
        #: reservations and exact counts (the buddy allocator decides what fits)
        self.ledger: ReservationLedger[PoolBlock] = ReservationLedger(tier=tier, max_block_bytes=max_block)

    @property
    def capacity(self) -> int:
        return self.alloc.capacity

    @property
    def used(self) -> int:
        """Granule-rounded bytes held by blocks and reservations (and by evicted blocks
        whose last copy has not ended)."""
        return self.alloc.used

    @property
    def pending(self) -> dict[str, PoolBlock]:
        return self.ledger.pending

    @property
    def reserved(self) -> int:
        return self.ledger.reserved_bytes

    @property
    def logical(self) -> int:
        return self.ledger.logical_bytes

    def reserve(self, key: str, nbytes: int, tag: bytes = b"") -> Allocation:
        self.ledger.check(key, nbytes, tag, committed=self.blocks)
        ext = self.alloc.allocate(nbytes)
        if ext is None:
            raise CapacityError(
                f"cannot reserve {nbytes} bytes: {self.alloc.free_bytes} of {self.capacity} free, "
                f"largest free run {self.alloc.largest_free}",
                tier=self.tier,
            )
        return self.ledger.add(PoolBlock(key, ext, tag))

    def claim(self, a: Allocation) -> PoolBlock:
        """Start writing a reservation; BlockNotFoundError if unknown, already written or being written."""
        return self.ledger.claim(a)

    def commit(self, b: PoolBlock) -> bool:
        """Finish a write; False (and the extent freed) if the reservation was dropped meanwhile."""
        if not self.ledger.commit(b):
            self._release(b)
            return False
        b.committed = True
        self.blocks[b.key] = b
        return True

    def abort(self, b: PoolBlock) -> None:
        """A write failed or was cancelled: drop the reservation (if still there) and free it."""
        self.ledger.abort(b)
        self._release(b)

    def lookup(self, key: str) -> PoolBlock:
        validate_key(key, tier=self.tier)
        b = self.blocks.get(key)
        if b is None:
            raise BlockNotFoundError(f"no block {key!r}", tier=self.tier)
        return b

    def pin(self, b: PoolBlock) -> None:
        b.readers += 1

    def unpin(self, b: PoolBlock) -> None:
        b.readers -= 1
        if b.dropped and b.readers == 0 and not b.writing:
            self._release(b)

    def remove(self, key: str) -> bool:
        """Evict a block or reservation; the extent is freed once no copy uses it."""
        validate_key(key, tier=self.tier)
        b = self.ledger.drop(key)
        if b is not None:
            if not b.writing:  # else the write frees it when its commit fails
                self._release(b)
            return True
        b = self.blocks.pop(key, None)
        if b is None:
            return False
        self.ledger.release(b.nbytes, b.held)
        b.dropped = True
        if b.readers == 0:
            self._release(b)
        return True

    def _release(self, b: PoolBlock) -> None:
        if b.extent.held:
            self.alloc.free(b.extent)
            b.extent = Extent(b.extent.offset, b.extent.nbytes, 0)  # freed once


class HbmBackend(Backend):
    """GPU HBM tier (see the module docstring). Not persistent, device resident."""

    def __init__(self, options: Mapping[str, Any] | None = None, *, name: str = "") -> None:
        super().__init__(options, name=name or "hbm")
        reject_unknown(self.options, _KNOWN)
        self._capacity = opt_size(self.options, "capacity", "1GiB", minimum=1)
        self._device_index = opt_int(self.options, "device", 0, minimum=0)
        self._max_block = opt_size(self.options, "max_block_bytes", "1GiB", minimum=1)
        self._max_conc = opt_int(self.options, "max_concurrency", 4, minimum=1, maximum=64)
        self._granule = opt_size(self.options, "granule", 4096, minimum=256, maximum=1 << 20)
        if self._granule & (self._granule - 1):
            raise ConfigError("granule", self.options.get("granule"), "a power of two between 256 and 1MiB")
        self._pool = HbmPool(self._capacity, granule=self._granule, max_block=self._max_block, tier=self.name)
        self._limiter = anyio.CapacityLimiter(self._max_conc)
        self._mem: Any = None
        self._stream: Any = None
        self._torch: Any = None
        self._counters = {"reads": 0, "writes": 0, "evictions": 0, "bytes_read": 0, "bytes_written": 0}

    @classmethod
    def probe(cls) -> Availability:
        ok, why = cuda_usable()
        if ok:
            return Availability(True, "torch CUDA device available")
        return Availability(False, why, "install torch with CUDA (the hbm extra) on a machine with an NVIDIA GPU")

    @classmethod
    def default_options(cls, workdir: Path) -> dict[str, Any]:
        ok, why = cuda_usable()
        if not ok:
            raise PluginUnavailableError(f"hbm: {why}", group="tierkv.backends", name="hbm")
        return {"capacity": "1GiB"}

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(
            tier_kind=TierKind.HBM,
            device_resident=True,
            alignment=self._granule,
            max_block_bytes=self._max_block,
            max_concurrency=self._max_conc,
        )

    # ------------------------------------------------------------------ lifecycle
    async def _open(self) -> None:
        ok, why = cuda_usable()
        if not ok:
            raise PluginUnavailableError(
                f"hbm: {why}",
                group="tierkv.backends",
                name=self.name,
                hint="install torch with CUDA (the hbm extra) on a machine with an NVIDIA GPU",
            )
        await anyio.to_thread.run_sync(self._allocate_device_memory)

    def _allocate_device_memory(self) -> None:
        import torch

        if self._device_index >= torch.cuda.device_count():
            raise ConfigError("device", self._device_index, f"a CUDA ordinal below {torch.cuda.device_count()}")
        dev = torch.device("cuda", self._device_index)
        try:
            self._mem = torch.empty(self._pool.capacity, dtype=torch.uint8, device=dev)
        except RuntimeError as exc:  # torch.cuda.OutOfMemoryError is a RuntimeError
            raise BackendIOError(
                f"cannot allocate {self._pool.capacity} bytes on {dev}: {exc}", tier=self.name
            ) from exc
        self._stream = torch.cuda.Stream(device=dev)  # type: ignore[no-untyped-call]
        self._torch = torch

    async def _close(self) -> None:
        self._mem = None
        self._stream = None

    def _live(self) -> Any:
        self._check_open()
        if self._mem is None:
            raise BackendClosedError("backend is not open (use `await HbmBackend.open(...)`)", tier=self.name)
        return self._mem

    # ---------------------------------------------------------------------- copies
    def _view(self, b: PoolBlock) -> Any:
        return self._mem[b.extent.offset : b.extent.offset + b.extent.nbytes]

    def _copy_in(self, b: PoolBlock, src: Any) -> None:
        self._copy_in_many([(b, src)])

    def _copy_out(self, b: PoolBlock, dst: Any) -> None:
        self._copy_out_many([(b, dst)])

    def _host_tensor(self, mv: memoryview) -> Any:
        import numpy as np

        arr = np.frombuffer(mv, dtype=np.uint8)
        if not mv.readonly:
            return self._torch.from_numpy(arr)
        import warnings

        with warnings.catch_warnings():  # a read-only source is only ever copied from
            warnings.simplefilter("ignore", UserWarning)
            return self._torch.from_numpy(arr)

    def _check_device_tensor(self, t: Any, nbytes: int, what: str, *, writable: bool = False) -> Any:
        torch = self._torch
        if not isinstance(t, torch.Tensor) or t.device.type != "cuda":
            raise InputError(f"[{self.name}] {what} must be a CUDA tensor")
        if not t.is_contiguous():
            raise InputError(f"[{self.name}] {what} must be contiguous")
        flat = t.view(torch.uint8).reshape(-1) if t.dtype != torch.uint8 else t.reshape(-1)
        if (writable and flat.numel() < nbytes) or (not writable and flat.numel() != nbytes):
            raise InputError(f"[{self.name}] {what} has {flat.numel()} bytes, block needs {nbytes}")
        return flat[:nbytes]

    # ------------------------------------------------------------------------ data
    async def allocate(self, key: str, nbytes: int, *, tag: bytes = b"") -> Allocation:
        """Reserve device memory. Raises InputError, BlockExistsError, CapacityError, BackendClosedError."""
        self._live()
        return self._pool.reserve(key, nbytes, tag)

    async def _write(self, allocation: Allocation, make_src: Any) -> None:
        self._live()
        b = self._pool.claim(allocation)
        try:
            src = make_src(b.extent.nbytes)
            if b.extent.nbytes:
                await anyio.to_thread.run_sync(self._copy_in, b, src, limiter=self._limiter)
        except BaseException as exc:
            self._pool.abort(b)
            if isinstance(exc, RuntimeError):
                raise BackendIOError(f"copy to HBM failed: {exc}", tier=self.name) from exc
            raise
        if self._closed or not self._pool.commit(b):
            raise BlockNotFoundError(f"reservation for {allocation.key!r} was dropped during write", tier=self.name)
        self._counters["writes"] += 1
        self._counters["bytes_written"] += b.extent.nbytes

    async def write(self, allocation: Allocation, data: Buffer) -> None:
        """Host-to-device copy on the side stream, then commit. Raises InputError, BlockNotFoundError,
        BackendIOError, BackendClosedError."""
        mv = as_byte_view(data)
        if len(mv) != allocation.nbytes:
            raise InputError(f"[{self.name}] data has {len(mv)} bytes, allocation has {allocation.nbytes}")
        await self._write(allocation, lambda n: self._host_tensor(mv))

    async def write_device(self, allocation: Allocation, tensor: Any) -> None:
        """Device-to-device copy from a contiguous CUDA tensor of exactly ``allocation.nbytes`` bytes."""
        self._live()
        src = self._check_device_tensor(tensor, allocation.nbytes, "tensor")
        await self._write(allocation, lambda n: src)

    async def _read(self, key: str, make_dst: Any) -> Any:
        self._live()
        b = self._pool.lookup(key)
        dst, result = make_dst(b.extent.nbytes)
        self._pool.pin(b)
        try:
            if b.extent.nbytes:
                await anyio.to_thread.run_sync(self._copy_out, b, dst, limiter=self._limiter)
        except RuntimeError as exc:
            raise BackendIOError(f"copy from HBM failed: {exc}", tier=self.name) from exc
        finally:
            self._pool.unpin(b)
        self._counters["reads"] += 1
        self._counters["bytes_read"] += b.extent.nbytes
        return result

    async def read(self, key: str, *, into: Buffer | None = None) -> memoryview:
        """Device-to-host copy. Raises BlockNotFoundError, InputError, BackendIOError, BackendClosedError."""

        def make(n: int) -> tuple[Any, memoryview]:
            if into is None:
                mv = memoryview(bytearray(n))
            else:
                mv = into_view(into, n, tier=self.name)
            return self._host_tensor(mv), mv

        out: memoryview = await self._read(key, make)
        return out

    async def read_device(self, key: str, *, into: Any) -> Any:
        """Device-to-device copy into a caller's contiguous CUDA tensor; returns its first nbytes (uint8)."""

        def make(n: int) -> tuple[Any, Any]:
            dst = self._check_device_tensor(into, n, "into", writable=True)
            return dst, dst

        return await self._read(key, make)

    # ------------------------------------------------------------------ batches
    def _copy_in_many(self, pairs: list[tuple[PoolBlock, Any]]) -> None:
        torch = self._torch
        with torch.cuda.stream(self._stream):
            for b, src in pairs:
                self._view(b).copy_(src, non_blocking=True)
        self._stream.synchronize()

    def _copy_out_many(self, pairs: list[tuple[PoolBlock, Any]]) -> None:
        torch = self._torch
        with torch.cuda.stream(self._stream):
            for b, dst in pairs:
                dst.copy_(self._view(b), non_blocking=True)
        self._stream.synchronize()

    async def write_many(self, allocations: Sequence[Allocation], datas: Sequence[Buffer]) -> None:
        """Host-to-device copies of every block on the side stream in one worker-thread hop and one
        stream synchronisation, then commit. All or nothing: on any failure (or cancellation) no
        block of the batch is committed and every reservation of the batch is released.
        Raises InputError (before anything is claimed), BlockNotFoundError, BackendIOError."""
        self._live()
        if len(allocations) != len(datas):
            raise InputError(f"write_many: {len(allocations)} allocations but {len(datas)} buffers")
        views = [as_byte_view(d) for d in datas]
        for a, mv in zip(allocations, views, strict=True):
            if len(mv) != a.nbytes:
                raise InputError(f"[{self.name}] data has {len(mv)} bytes, allocation {a.key!r} has {a.nbytes}")
        claimed: list[PoolBlock] = []
        try:
            for a in allocations:
                claimed.append(self._pool.claim(a))
            pairs = [(b, self._host_tensor(mv)) for b, mv in zip(claimed, views, strict=True) if b.extent.nbytes]
            if pairs:
                await anyio.to_thread.run_sync(self._copy_in_many, pairs, limiter=self._limiter)
        except BaseException as exc:
            for b in claimed:
                self._pool.abort(b)
            for b in self._pool.ledger.drop_unclaimed(allocations[len(claimed) :]):
                self._pool.abort(b)
            if isinstance(exc, RuntimeError):
                raise BackendIOError(f"copy to HBM failed: {exc}", tier=self.name) from exc
            raise
        dropped = [b.key for b in claimed if not self._pool.commit(b)]
        committed = len(claimed) - len(dropped)
        self._counters["writes"] += committed
        self._counters["bytes_written"] += sum(b.extent.nbytes for b in claimed if b.committed)
        if dropped or self._closed:
            raise BlockNotFoundError(f"reservations dropped during write_many: {dropped}", tier=self.name)

    async def read_many(self, keys: Sequence[str], *, into: Sequence[Buffer] | None = None) -> list[memoryview]:
        """Device-to-host copies of every block in one worker-thread hop and one stream
        synchronisation. Raises BlockNotFoundError (the first missing key, before any copy),
        InputError, BackendIOError."""
        self._live()
        if into is not None and len(into) != len(keys):
            raise InputError(f"read_many: {len(keys)} keys but {len(into)} buffers")
        blocks = [self._pool.lookup(k) for k in keys]
        outs: list[memoryview] = []
        for i, b in enumerate(blocks):
            n = b.extent.nbytes
            outs.append(memoryview(bytearray(n)) if into is None else into_view(into[i], n, tier=self.name))
        pairs = [(b, self._host_tensor(mv)) for b, mv in zip(blocks, outs, strict=True) if b.extent.nbytes]
        for b in blocks:
            self._pool.pin(b)
        try:
            if pairs:
                await anyio.to_thread.run_sync(self._copy_out_many, pairs, limiter=self._limiter)
        except RuntimeError as exc:
            raise BackendIOError(f"copy from HBM failed: {exc}", tier=self.name) from exc
        finally:
            for b in blocks:
                self._pool.unpin(b)
        self._counters["reads"] += len(blocks)
        self._counters["bytes_read"] += sum(b.extent.nbytes for b in blocks)
        return outs

    # ------------------------------------------------------------- raw reference
    async def raw_reference(self, op: str, block_bytes: int, count: int, concurrency: int) -> Any:
        """The conformance envelope's reference for this medium: plain ``Tensor.copy_`` of
        ``count`` blocks between pageable host buffers (the same kind the tier gets from a
        caller) and a separate device buffer, on one stream, synchronised once per 8 MiB
        (the envelope's batch, after which the tier's batch call returns), without this
        tier's bookkeeping."""
        self._live()
        return await anyio.to_thread.run_sync(self._raw_copy, op, block_bytes, count, limiter=self._limiter)

    def _raw_copy(self, op: str, block_bytes: int, count: int) -> Any:
        import time

        import numpy as np

        torch = self._torch
        dev = torch.empty(block_bytes * count, dtype=torch.uint8, device=self._mem.device)
        ring = [np.full(block_bytes, 1, dtype=np.uint8) for _ in range(max(1, min(count, (8 << 20) // block_bytes)))]
        hosts = [torch.from_numpy(r) for r in ring]
        stream = torch.cuda.Stream(device=self._mem.device)
        torch.cuda.synchronize(self._mem.device)
        per = len(hosts)  # blocks per 8 MiB batch: the tier syncs once per batch call too
        t0 = time.perf_counter()
        with torch.cuda.stream(stream):
            for i in range(count):
                d = dev[i * block_bytes : (i + 1) * block_bytes]
                h = hosts[i % per]
                if op == "write":
                    d.copy_(h, non_blocking=True)
                else:
                    h.copy_(d, non_blocking=True)
                if (i + 1) % per == 0:
                    stream.synchronize()
        stream.synchronize()
        dt = time.perf_counter() - t0
        del dev
        return RawMeasurement(block_bytes * count, dt, "torch Tensor.copy_ host<->device (pageable host, 1 stream)")

    async def evict(self, key: str) -> bool:
        self._check_open()
        removed = self._pool.remove(key)
        if removed:
            self._counters["evictions"] += 1
        return removed

    async def contains(self, key: str) -> bool:
        self._check_open()
        validate_key(key, tier=self.name)
        return key in self._pool.blocks

    def stats(self) -> BackendStats:
        p = self._pool
        return BackendStats(
            tier=self.name,
            kind=TierKind.HBM,
            capacity_bytes=p.capacity,
            used_bytes=p.used,
            blocks=len(p.blocks),
            reserved_bytes=p.reserved,
            io_path="torch CUDA copy_ (side stream)",
            emulated=False,
            details={
                "device": self._device_index,
                "logical_bytes": p.logical,
                "largest_free_bytes": p.alloc.largest_free,
                "granule": self._granule,
            },
            **self._counters,
        )
