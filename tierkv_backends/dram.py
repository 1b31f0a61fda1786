"""The host-DRAM tier: one large arena carved by a buddy allocator.

Options (all optional):

``capacity`` (size, default ``256MiB``)
    Size of the arena, allocated once at :meth:`DramBackend.open`.
``pin`` (``"auto"`` | ``"true"`` | ``"false"`` or a bool, default ``"auto"``)
    Page-lock the arena through ``torch`` (``pin_memory=True``) so that host to
    GPU copies run at full DMA speed. ``auto`` pins only when torch is installed
    *and* a CUDA device is present (a CPU-only torch raises on ``pin_memory``);
    otherwise the arena is a plain numpy array. ``true`` without CUDA makes
    ``open`` raise :class:`~tierkv.PluginUnavailableError`.
``max_block_bytes`` (size, default ``1GiB``)
    Largest block ``allocate`` accepts (larger raises InputError).
``max_concurrency`` (int, default 4)
    Worker threads used for copies (the limiter size).
``granule`` (size, power of two in [64, 1MiB], default ``4KiB``)
    Allocation granule of the arena (see :mod:`tierkv_backends._arena`).
``prefault`` (bool, default true)
    Touch every arena page at ``open`` (in a worker thread) so that writes do
    not pay first-touch page faults (about 1 GiB/s on small VMs).
``inline_copy_bytes`` (size, default ``64KiB``)
    Copies (of one call; the sum for batch calls) below this size are done
    inline on the event loop: a memcpy of 64 KiB takes a few microseconds,
    less than one thread hop. Larger ones go to a worker thread.

Accounting: ``used_bytes`` is the arena's held bytes, i.e. every block and
reservation rounded up to whole granules (what the memory really gives up);
``details["logical_bytes"]`` holds the exact requested bytes. Both return
exactly to their previous values after ``evict``.

Concurrency and cancellation: all bookkeeping runs on the event loop without
awaiting in between, so it needs no lock. A block being copied is pinned: an
``evict`` during a read (or a write) hides the key at once but the memory is
given back only when the copy ends. Worker-thread copies are never abandoned:
a cancelled ``write`` waits for its memcpy to finish, then drops the
reservation and raises the cancellation, so it never commits.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread
import numpy as np

from tierkv._backend import (
    MAX_TAG_BYTES,
    Allocation,
    Availability,
    Backend,
    BackendStats,
    Buffer,
    Capabilities,
    TierKind,
    as_byte_view,
    validate_key,
)
from tierkv._errors import (
    BackendClosedError,
    BackendIOError,
    BlockExistsError,
    BlockNotFoundError,
    CapacityError,
    ConfigError,
    InputError,
    PluginUnavailableError,
)
from tierkv._options import opt_bool, opt_choice, opt_int, opt_size, reject_unknown

from ._arena import Arena, Extent

__all__ = ["DramBackend"]

_U8 = np.ndarray[Any, np.dtype[np.uint8]]
_KNOWN = frozenset(
    {"capacity", "pin", "max_block_bytes", "max_concurrency", "granule", "prefault", "inline_copy_bytes"}
)


def _cuda_present() -> bool:
    """True only if torch is installed and reports a usable CUDA device.

    Checks for the NVIDIA driver first so that a CPU-only machine never pays
    the torch import."""
    if importlib.util.find_spec("torch") is None:
        return False
    if not any(os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/nvidia0", "/proc/driver/nvidia/version")):
        return False
    import torch

    return bool(torch.cuda.is_available())


class _Slot:
    """One reservation or committed block (mutable bookkeeping)."""

    __slots__ = ("dropped", "extent", "handle", "key", "readers", "tag", "writing")

    def __init__(self, key: str, extent: Extent, tag: bytes, handle: int) -> None:
        self.key = key
        self.extent = extent
        self.tag = tag
        self.handle = handle
        self.readers = 0  # copies out of the extent in flight
        self.writing = False  # a copy into the extent is in flight
        self.dropped = False  # evicted while pinned: free when the last copy ends


class DramBackend(Backend):
    """Host-DRAM tier backed by one pre-allocated arena (see the module docstring).

    Not persistent, not shared. ``io_path`` is ``"memcpy"``; never emulated.
    """

    def __init__(self, options: Mapping[str, Any] | None = None, *, name: str = "") -> None:
        super().__init__(options, name=name or "dram")
        o = self.options
        reject_unknown(o, _KNOWN)
        self._capacity = opt_size(o, "capacity", 256 << 20)
        pin = o.get("pin", "auto")
        if isinstance(pin, bool):
            pin = "true" if pin else "false"
        self._pin_mode = opt_choice({"pin": pin}, "pin", ("auto", "true", "false"))
        self._max_block = opt_size(o, "max_block_bytes", 1 << 30, minimum=1)
        self._max_conc = opt_int(o, "max_concurrency", 4, minimum=1, maximum=256)
        self._granule = opt_size(o, "granule", 4096, minimum=64, maximum=1 << 20)
        if self._granule & (self._granule - 1):
            raise ConfigError("granule", o.get("granule"), "a power of two between 64 and 1MiB")
        self._prefault = opt_bool(o, "prefault", True)
        self._inline = opt_size(o, "inline_copy_bytes", 64 << 10)
        self._caps = Capabilities(
            tier_kind=TierKind.DRAM,
            alignment=1,
            max_block_bytes=self._max_block,
            max_concurrency=self._max_conc,
            envelope_threshold=0.9,
        )
        self._arena: Arena | None = None
        self._pinned = False
        self._limiter: anyio.CapacityLimiter | None = None
        self._blocks: dict[str, _Slot] = {}
        self._reserved: dict[str, _Slot] = {}
        self._reserved_bytes = 0
        self._logical = 0
        self._handles = itertools.count(1)
        self._reads = self._writes = self._evictions = self._bytes_read = self._bytes_written = 0

    # ----------------------------------------------------------------- lifecycle
    @classmethod
    def probe(cls) -> Availability:
        return Availability(True)

    @classmethod
    def default_options(cls, workdir: Path) -> dict[str, Any]:
        return {"capacity": 256 << 20}

    @property
    def capabilities(self) -> Capabilities:
        return self._caps

    def _make_buffer(self) -> tuple[_U8, bool]:
        cuda = self._pin_mode != "false" and _cuda_present()
        if self._pin_mode == "true" and not cuda:
            raise PluginUnavailableError(
                "dram: pin=true needs torch with a CUDA device",
                group="tierkv.backends",
                name=self.name,
                hint="use pin='auto' or pin='false' on a machine without a GPU",
            )
        try:
            if cuda:
                import torch

                t = torch.empty(self._capacity, dtype=torch.uint8, pin_memory=True)
                arr: _U8 = t.numpy()  # keeps the tensor alive through arr.base
                return arr, True
            return np.empty(self._capacity, dtype=np.uint8), False
        except (MemoryError, RuntimeError) as exc:
            raise BackendIOError(f"cannot allocate a {self._capacity}-byte arena: {exc}", tier=self.name) from exc

    async def _open(self) -> None:
        self._limiter = anyio.CapacityLimiter(self._max_conc)
        buf, self._pinned = await anyio.to_thread.run_sync(self._make_buffer)
        arena = Arena(buf, granule=self._granule)
        if self._prefault and not self._pinned:
            await anyio.to_thread.run_sync(arena.prefault)
        self._arena = arena

    async def _close(self) -> None:
        self._blocks.clear()
        self._reserved.clear()
        self._reserved_bytes = 0
        self._logical = 0
        self._arena = None  # in-flight copies keep their own views alive

    # ------------------------------------------------------------------ helpers
    def _live_arena(self) -> Arena:
        self._check_open()
        if self._arena is None:
            raise BackendClosedError("backend is not open (use `await DramBackend.open(...)`)", tier=self.name)
        return self._arena

    def _check_request(self, key: str, nbytes: int, tag: bytes) -> None:
        validate_key(key, tier=self.name)
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
            raise InputError(f"[{self.name}] nbytes must be a non-negative int, got {nbytes!r}")
        if nbytes > self._max_block:
            raise InputError(f"[{self.name}] block of {nbytes} bytes exceeds max_block_bytes={self._max_block}")
        if not isinstance(tag, (bytes, bytearray)) or len(tag) > MAX_TAG_BYTES:
            raise InputError(f"[{self.name}] tag must be bytes of at most {MAX_TAG_BYTES} bytes")
        if key in self._blocks or key in self._reserved:
            raise BlockExistsError(f"a block or reservation exists under {key!r}", tier=self.name)

    def _capacity_error(self, arena: Arena, nbytes: int) -> CapacityError:
        a = arena.allocator
        return CapacityError(
            f"cannot reserve {nbytes} bytes ({arena.held_bytes(nbytes)} held): "
            f"{a.free_bytes} of {a.capacity} bytes free, largest free run {a.largest_free}",
            tier=self.name,
        )

    def _register(self, key: str, extent: Extent, nbytes: int, tag: bytes) -> Allocation:
        h = next(self._handles)
        self._reserved[key] = _Slot(key, extent, tag, h)
        self._reserved_bytes += extent.held
        self._logical += nbytes
        return Allocation(key, nbytes, tag, h)

    def _take(self, allocation: Allocation) -> _Slot:
        """Claim a reservation for writing; BlockNotFoundError if unknown or already claimed."""
        slot = self._reserved.get(allocation.key) if isinstance(allocation, Allocation) else None
        if slot is None or slot.handle != allocation.handle or slot.writing:
            raise BlockNotFoundError(f"unknown or already written allocation {allocation!r}", tier=self.name)
        slot.writing = True
        return slot

    def _source(self, data: Buffer, nbytes: int) -> _U8:
        mv = as_byte_view(data)
        if mv.nbytes != nbytes:
            raise InputError(f"[{self.name}] data has {mv.nbytes} bytes, allocation has {nbytes}")
        return np.frombuffer(mv, dtype=np.uint8)

    def _free_slot(self, slot: _Slot) -> None:
        if self._arena is not None:
            self._arena.free(slot.extent)

    def _abort(self, slot: _Slot) -> None:
        """Undo a claimed reservation after a failed or cancelled write (sync, no await)."""
        slot.writing = False
        if self._closed:  # aclose dropped every reservation and the arena
            return
        if not slot.dropped:  # still registered: drop it
            del self._reserved[slot.key]
            self._reserved_bytes -= slot.extent.held
            self._logical -= slot.extent.nbytes
        self._free_slot(slot)

    def _commit(self, slot: _Slot) -> None:
        slot.writing = False
        if self._closed:
            raise BackendClosedError("backend closed during the write", tier=self.name)
        if slot.dropped:  # evicted during the copy
            self._free_slot(slot)
            raise BlockNotFoundError(f"reservation for {slot.key!r} was evicted during the write", tier=self.name)
        del self._reserved[slot.key]
        self._reserved_bytes -= slot.extent.held
        self._blocks[slot.key] = slot
        self._writes += 1
        self._bytes_written += slot.extent.nbytes

    def _destination(self, into: Buffer | None, nbytes: int) -> tuple[_U8, memoryview]:
        if into is None:
            arr = np.empty(nbytes, dtype=np.uint8)
            return arr, arr.data
        mv = as_byte_view(into, writable=True, what="into")
        if mv.nbytes < nbytes:
            raise InputError(f"[{self.name}] into has {mv.nbytes} bytes, block has {nbytes}")
        out = mv[:nbytes]
        return np.frombuffer(out, dtype=np.uint8), out

    def _unpin(self, slot: _Slot) -> None:
        slot.readers -= 1
        if slot.dropped and slot.readers == 0:
            self._free_slot(slot)

    def _remove(self, key: str) -> bool:
        slot = self._blocks.pop(key, None)
        if slot is not None:
            self._logical -= slot.extent.nbytes
            self._evictions += 1
            if slot.readers:
                slot.dropped = True
            else:
                self._free_slot(slot)
            return True
        slot = self._reserved.pop(key, None)
        if slot is not None:
            self._reserved_bytes -= slot.extent.held
            self._logical -= slot.extent.nbytes
            if slot.writing:
                slot.dropped = True
            else:
                self._free_slot(slot)
            return True
        return False

    # --------------------------------------------------------------------- data
    async def allocate(self, key: str, nbytes: int, *, tag: bytes = b"") -> Allocation:
        """See :meth:`Backend.allocate`. Holds ``nbytes`` rounded up to the granule."""
        arena = self._live_arena()
        self._check_request(key, nbytes, tag)
        extent = arena.allocate(nbytes)
        if extent is None:
            raise self._capacity_error(arena, nbytes)
        return self._register(key, extent, nbytes, bytes(tag))

    async def write(self, allocation: Allocation, data: Buffer) -> None:
        """See :meth:`Backend.write`. One memcpy into the arena (inline below
        ``inline_copy_bytes``, else in a worker thread)."""
        arena = self._live_arena()
        slot = self._take(allocation)
        try:
            src = self._source(data, slot.extent.nbytes)
            if slot.extent.nbytes >= self._inline:
                await anyio.to_thread.run_sync(arena.write_at, slot.extent, src, limiter=self._limiter)
                # a cancel that arrived during the copy is delivered here, before the commit
                await anyio.lowlevel.checkpoint_if_cancelled()
            elif slot.extent.nbytes:
                arena.write_at(slot.extent, src)
        except BaseException:
            self._abort(slot)
            raise
        self._commit(slot)

    async def read(self, key: str, *, into: Buffer | None = None) -> memoryview:
        """See :meth:`Backend.read`. With ``into``: one memcpy from the arena into it."""
        arena = self._live_arena()
        validate_key(key, tier=self.name)
        slot = self._blocks.get(key)
        if slot is None:
            raise BlockNotFoundError(f"no block under {key!r}", tier=self.name)
        n = slot.extent.nbytes
        dst, out = self._destination(into, n)
        if n >= self._inline:
            slot.readers += 1
            try:
                await anyio.to_thread.run_sync(arena.read_at, slot.extent, dst, limiter=self._limiter)
            finally:
                self._unpin(slot)
        elif n:
            arena.read_at(slot.extent, dst)
        self._reads += 1
        self._bytes_read += n
        return out

    async def evict(self, key: str) -> bool:
        """See :meth:`Backend.evict`. Immediate; memory under an in-flight copy is
        given back when that copy ends."""
        self._live_arena()
        validate_key(key, tier=self.name)
        return self._remove(key)

    async def contains(self, key: str) -> bool:
        self._live_arena()
        validate_key(key, tier=self.name)
        return key in self._blocks

    def stats(self) -> BackendStats:
        arena = self._arena
        details: dict[str, Any] = {
            "pinned": self._pinned,
            "granule": self._granule,
            "logical_bytes": self._logical,
        }
        if arena is not None:
            details["largest_free_bytes"] = arena.allocator.largest_free
        return BackendStats(
            tier=self.name,
            kind=TierKind.DRAM,
            capacity_bytes=arena.capacity if arena is not None else self._capacity // self._granule * self._granule,
            used_bytes=arena.used if arena is not None else 0,
            blocks=len(self._blocks),
            reserved_bytes=self._reserved_bytes,
            reads=self._reads,
            writes=self._writes,
            evictions=self._evictions,
            bytes_read=self._bytes_read,
            bytes_written=self._bytes_written,
            io_path="memcpy",
            emulated=False,
            details=details,
        )

    # -------------------------------------------------------------- batch twins
    async def allocate_many(self, items: Sequence[tuple[str, int, bytes]]) -> list[Allocation]:
        """All or nothing, in one pass over the allocator."""
        arena = self._live_arena()
        seen: set[str] = set()
        for key, nbytes, tag in items:
            self._check_request(key, nbytes, tag)
            if key in seen:
                raise BlockExistsError(f"key {key!r} appears twice in the batch", tier=self.name)
            seen.add(key)
        extents = arena.allocate_many([n for _, n, _ in items])
        if extents is None:
            raise self._capacity_error(arena, sum(n for _, n, _ in items))
        return [self._register(k, e, n, bytes(t)) for (k, n, t), e in zip(items, extents, strict=True)]

    @staticmethod
    def _copy_in_many(arena: Arena, slots: list[_Slot], srcs: list[_U8]) -> None:
        for s, src in zip(slots, srcs, strict=True):
            if s.extent.nbytes:
                arena.write_at(s.extent, src)

    @staticmethod
    def _copy_out_many(arena: Arena, slots: list[_Slot], dsts: list[_U8]) -> None:
        for s, dst in zip(slots, dsts, strict=True):
            if s.extent.nbytes:
                arena.read_at(s.extent, dst)

    async def write_many(self, allocations: Sequence[Allocation], datas: Sequence[Buffer]) -> None:
        """All copies in one thread hop, then every block commits. On a failure or
        cancellation before the commit, no block of the batch is committed and all
        their reservations are released."""
        if len(allocations) != len(datas):
            raise InputError(f"write_many: {len(allocations)} allocations but {len(datas)} buffers")
        arena = self._live_arena()
        slots: list[_Slot] = []
        try:
            for a in allocations:
                slots.append(self._take(a))
            srcs = [self._source(d, s.extent.nbytes) for s, d in zip(slots, datas, strict=True)]
            total = sum(s.extent.nbytes for s in slots)
            if total >= self._inline:
                await anyio.to_thread.run_sync(self._copy_in_many, arena, slots, srcs, limiter=self._limiter)
                await anyio.lowlevel.checkpoint_if_cancelled()
            else:
                self._copy_in_many(arena, slots, srcs)
        except BaseException:
            for s in slots:
                self._abort(s)
            for a in allocations[len(slots) :]:
                s2 = self._reserved.get(a.key)
                if s2 is not None and s2.handle == a.handle and not s2.writing:
                    self._remove(a.key)
            raise
        first: BaseException | None = None
        for s in slots:
            try:
                self._commit(s)
            except (BlockNotFoundError, BackendClosedError) as exc:
                first = first or exc
        if first is not None:
            raise first

    async def read_many(self, keys: Sequence[str], *, into: Sequence[Buffer] | None = None) -> list[memoryview]:
        """All copies in one thread hop (inline when the batch is small)."""
        if into is not None and len(into) != len(keys):
            raise InputError(f"read_many: {len(keys)} keys but {len(into)} buffers")
        arena = self._live_arena()
        slots: list[_Slot] = []
        for k in keys:
            validate_key(k, tier=self.name)
            slot = self._blocks.get(k)
            if slot is None:
                raise BlockNotFoundError(f"no block under {k!r}", tier=self.name)
            slots.append(slot)
        dsts: list[_U8] = []
        outs: list[memoryview] = []
        for i, s in enumerate(slots):
            d, o = self._destination(None if into is None else into[i], s.extent.nbytes)
            dsts.append(d)
            outs.append(o)
        total = sum(s.extent.nbytes for s in slots)
        if total >= self._inline:
            for s in slots:
                s.readers += 1
            try:
                await anyio.to_thread.run_sync(self._copy_out_many, arena, slots, dsts, limiter=self._limiter)
            finally:
                for s in slots:
                    self._unpin(s)
        else:
            self._copy_out_many(arena, slots, dsts)
        self._reads += len(slots)
        self._bytes_read += total
        return outs

    async def evict_many(self, keys: Sequence[str]) -> list[bool]:
        self._live_arena()
        for k in keys:
            validate_key(k, tier=self.name)
        return [self._remove(k) for k in keys]
