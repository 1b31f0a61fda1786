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
``inline_copy_bytes`` (size, default ``2MiB``)
    A call (single or batch) moving at most this many bytes in total copies
    them inline on the event-loop thread, in one go.
``large_copies`` (``"auto"`` | ``"slices"`` | ``"thread"`` | ``"split"``, default ``"auto"``)
    How a call moving more bytes copies: ``slices`` copies inline too, but
    yields to the event loop (a checkpoint) after every ``inline_copy_bytes``;
    ``thread`` copies the whole batch in one worker-thread hop (numpy releases
    the GIL), so the loop runs other tasks on another core meanwhile; ``split``
    (array copies: ``write_arrays``/``read_arrays``) shares the copies, in pieces
    of at most ``inline_copy_bytes``, between the loop's own thread (from the
    front) and the backend's copy helper thread (from the back) until they meet
    (:mod:`tierkv_backends._copier`), which run at once on two cores; ``auto``
    splits array copies of at least 16 MiB on a machine with more than one CPU
    and slices the rest. A single core's copy does not reach the memory's
    bandwidth on small VMs (on the 2-vCPU development VM two threads reach a
    single-threaded ``np.copyto`` of the same bytes, one about 0.6-0.8x of it:
    ``benchmarks/bench_api.py``); one 5.6 MB block alone gains nothing split
    (measured: 0.52-0.62 ms sliced, 0.59-0.76 ms split), so ``auto`` leaves it
    sliced. A cancel stops a split copy at the next piece boundary of both
    threads.

Copy policy and its trade-off (measured on the 2-vCPU development VM, medians):
one ``anyio.to_thread`` hop costs 65-90 us empty and 100-190 us more when the
worker is woken after the loop slept, with millisecond tails when other
processes load the cores; a memcpy runs at ~20 GB/s single-stream (2 MiB in
~90 us, 4 MiB ~190 us, 8 MiB ~420 us inline, versus 130 / 220 / 520-1600 us
through a thread). So a batch of up to 2 MiB is cheaper inline than a hop
costs, and the event loop is never stalled longer than about one hop's
wake-up (~100 us here; less on a faster host). Above that the default
``slices`` keeps the same stall bound per slice and pays no hop (an 8 MiB batch
of 2 MiB blocks: 0.96x raw memcpy for puts against 0.72x through a thread on
the same run), at the cost of copying on the loop's own core; choose
``thread`` on a many-core host where the loop has other work to overlap with
the copies. Raise ``inline_copy_bytes`` to trade loop latency for throughput.
Every call is a cancellation point; in ``slices`` mode a cancel is delivered
at the next slice boundary, in ``thread`` mode after the copy ends.

Per-block cost of the batch twins: one C-level validation pass over the whole
batch, one allocator call (one lock acquisition) carving the batch out of a
single free run when possible, one ``_Slot`` and one :class:`Allocation` per
block built in C-level ``map`` loops (the Allocation through its slot
descriptors, by :meth:`~tierkv.backend.ReservationLedger.add_many`), one ``memoryview`` slice assignment
per block (``bytes`` sources and ``bytearray`` destinations taken as they are),
a bulk commit, and one allocator call to free an evicted batch (neighbouring
blocks merged first). Inline reads need no pin (nothing can run between the
lookup and the end of the copies). Copying a contiguous batch with one
``np.concatenate(..., out=)`` was measured and rejected: at 16 KiB it was
slower (1.36 us/block) than the slice assignments (1.20 us/block), since the
per-block ``frombuffer`` it needs costs what the assignments save. Measured on
the 2-vCPU development VM (best of 25, 16 KiB blocks, batches of 512): allocate
1.2 us, write 2.0 us, read into caller buffers 2.2 us per block, against 2.0 us
for a bare ``np.copyto`` loop; the protocol's fixed per-block work (two objects,
two dict updates, claim and commit) is about 1.2 us of that, which a bare copy
loop does not pay.

Accounting: ``used_bytes`` is the arena's held bytes, i.e. every block and
reservation rounded up to whole granules (what the memory really gives up);
``details["logical_bytes"]`` holds the exact requested bytes. Both return
exactly to their previous values after ``evict``.

Concurrency and cancellation: all bookkeeping runs on the event loop without
awaiting in between, so it needs no lock. A block being copied is pinned: an
``evict`` during a read (or a write) hides the key at once but the memory is
given back only when the copy ends (also across slices). Worker-thread copies
are never abandoned: a cancelled ``write`` waits for its memcpy to finish, then
drops the reservation and raises the cancellation, so it never commits; a
``write_many`` commits all its blocks or none.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import re
from collections.abc import Mapping, Sequence
from itertools import repeat
from operator import attrgetter
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread
import numpy as np

from tierkv.backend import (
    MAX_TAG_BYTES,
    Allocation,
    Availability,
    Backend,
    BackendStats,
    Buffer,
    Capabilities,
    Reservation,
    ReservationLedger,
    Taken,
    TierKind,
    as_byte_view,
    device_copy,
    host_view,
    is_device_tensor,
    opt_bool,
    opt_choice,
    opt_int,
    opt_size,
    reject_unknown,
    validate_key,
)
from tierkv.errors import (
    BackendClosedError,
    BackendIOError,
    BlockExistsError,
    BlockNotFoundError,
    CapacityError,
    ConfigError,
    InputError,
    PluginUnavailableError,
)

from ._arena import Arena, Extent
from ._copier import CPUS, Copier

__all__ = ["DramBackend"]

_U8 = np.ndarray[Any, np.dtype[np.uint8]]
_KNOWN = frozenset(
    {
        "capacity",
        "pin",
        "max_block_bytes",
        "max_concurrency",
        "granule",
        "prefault",
        "inline_copy_bytes",
        "large_copies",
    }
)
#: the characters of a block key (lengths are checked apart): one regex pass over a whole batch
_KEY_CHARS = re.compile(r"[0-9A-Za-z._-]*")
_NBYTES = attrgetter("nbytes")
_SKEY = attrgetter("key")
_DROPPED = attrgetter("dropped")


_INLINE_DEFAULT = 2 << 20
_LARGE_DEFAULT = "auto"
_SPLIT_MIN = 16 << 20  # ``auto``: calls moving at least this much are split across two threads


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


class _Slot(Reservation):
    """A reservation of the ledger, then the committed block it becomes: its arena offset
    and pins added (plain ints, no Extent). ``dropped``: evicted while pinned or written,
    freed when the last copy ends."""

    __slots__ = ("offset", "readers")

    def __init__(self, key: str, offset: int, nbytes: int, held: int, tag: bytes, handle: int) -> None:
        # every slot set here (no super().__init__: a batch builds these in a C-level map)
        self.key = key
        self.offset = offset
        self.nbytes = nbytes
        self.held = held
        self.tag = tag
        self.handle = handle
        self.readers = 0  # copies out of the block in flight
        self.writing = False  # a copy into the block is in flight
        self.dropped = False

    @property
    def extent(self) -> Extent:
        return Extent(self.offset, self.nbytes, self.held)


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
        self._inline = opt_size(o, "inline_copy_bytes", _INLINE_DEFAULT)
        self._large = opt_choice(o, "large_copies", ("auto", "thread", "slices", "split"), _LARGE_DEFAULT)
        self._caps = Capabilities(
            tier_kind=TierKind.DRAM,
            alignment=1,
            max_block_bytes=self._max_block,
            max_concurrency=self._max_conc,
        )
        self._arena: Arena | None = None
        self._pinned = False
        self._limiter: anyio.CapacityLimiter | None = None
        self._copier = Copier()  # the helper thread of ``split`` copies (started on first use)
        self._blocks: dict[str, _Slot] = {}
        # reservations, and the exact counts (the arena's allocator decides what fits)
        self._ledger: ReservationLedger[_Slot] = ReservationLedger(tier=self.name, max_block_bytes=self._max_block)
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
        self._ledger.clear(committed=True)  # a memory tier keeps nothing across close
        self._arena = None  # in-flight copies keep their own views alive
        await self._copier.aclose()

    # ------------------------------------------------------------------ helpers
    def _live_arena(self) -> Arena:
        self._check_open()
        if self._arena is None:
            raise BackendClosedError("backend is not open (use `await DramBackend.open(...)`)", tier=self.name)
        return self._arena

    def _check_request(self, key: str, nbytes: int, tag: bytes) -> None:
        self._ledger.check(key, nbytes, tag, committed=self._blocks)

    def _check_batch(self, keys: tuple[str, ...], sizes: tuple[int, ...], tags: tuple[bytes, ...]) -> bool:
        """Validate a whole allocate_many batch with a few C-level passes; on any
        doubt, fall back to the per-item checks (same errors, same order). True
        when the fast passes held (then every tag is ``bytes`` already)."""
        ok = False
        try:
            joined = "".join(keys)
        except TypeError:
            joined = None
        if joined is not None and _KEY_CHARS.fullmatch(joined) is not None:
            lens = list(map(len, keys))
            ok = (
                min(lens) >= 1
                and max(lens) <= 128
                and set(map(type, sizes)) == {int}
                and min(sizes) >= 0
                and max(sizes) <= self._max_block
                and set(map(type, tags)) == {bytes}
                and max(map(len, tags)) <= MAX_TAG_BYTES
                and self._blocks.keys().isdisjoint(keys)
                and self._ledger.pending.keys().isdisjoint(keys)
            )
        if not ok:
            for key, nbytes, tag in zip(keys, sizes, tags, strict=True):
                self._check_request(key, nbytes, tag)
        if len(set(keys)) != len(keys):
            seen: set[str] = set()
            for key in keys:
                if key in seen:
                    raise BlockExistsError(f"key {key!r} appears twice in the batch", tier=self.name)
                seen.add(key)
        return ok

    def _capacity_error(self, arena: Arena, nbytes: int) -> CapacityError:
        a = arena.allocator
        return CapacityError(
            f"cannot reserve {nbytes} bytes ({arena.held_bytes(nbytes)} held): "
            f"{a.free_bytes} of {a.capacity} bytes free, largest free run {a.largest_free}",
            tier=self.name,
        )

    def _claim(
        self, allocations: Sequence[Allocation], datas: Sequence[Buffer], slots: list[_Slot]
    ) -> list[bytes | memoryview]:
        """Claim reservations for writing, appending each to ``slots`` as it is claimed,
        and return flat byte sources of the data (no copy; ``bytes`` as they are),
        each checked against its block's size. BlockNotFoundError if an allocation is
        unknown or already claimed, InputError for data of the wrong size or shape."""
        claim = self._ledger.claim
        out: list[bytes | memoryview] = []
        for a, d in zip(allocations, datas, strict=True):
            slot = claim(a)
            slots.append(slot)
            if type(d) is bytes:  # always flat, contiguous, format "B"
                if len(d) != slot.nbytes:
                    raise InputError(f"[{self.name}] data has {len(d)} bytes, allocation has {slot.nbytes}")
                out.append(d)
                continue
            try:
                mv = memoryview(d)  # type: ignore[arg-type]
            except TypeError:
                mv = as_byte_view(d)
            if mv.ndim != 1 or mv.format != "B" or not mv.c_contiguous:
                mv = as_byte_view(d)
            if mv.nbytes != slot.nbytes:
                raise InputError(f"[{self.name}] data has {mv.nbytes} bytes, allocation has {slot.nbytes}")
            out.append(mv)
        return out

    def _destinations(self, slots: list[_Slot], into: Sequence[Buffer]) -> list[memoryview]:
        """Writable flat views of the first ``nbytes`` of each caller buffer."""
        out: list[memoryview] = []
        for s, d in zip(slots, into, strict=True):
            if type(d) is bytearray:  # always flat, contiguous, format "B", writable
                mv = memoryview(d)
            else:
                try:
                    mv = memoryview(d)  # type: ignore[arg-type]
                except TypeError:
                    mv = as_byte_view(d, writable=True, what="into")
                if mv.readonly or mv.ndim != 1 or mv.format != "B" or not mv.c_contiguous:
                    mv = as_byte_view(d, writable=True, what="into")
            n = s.nbytes
            if mv.nbytes < n:
                raise InputError(f"[{self.name}] into has {mv.nbytes} bytes, block has {n}")
            out.append(mv if mv.nbytes == n else mv[:n])
        return out

    def _free_slots(self, slots: list[_Slot]) -> None:
        if self._arena is not None and slots:
            self._arena.free_spans([(s.offset, s.held) for s in slots])

    def _abort(self, slots: list[_Slot]) -> None:
        """Undo claimed reservations after a failed or cancelled write (sync, no await)."""
        to_free: list[_Slot] = []
        for slot in slots:
            self._ledger.abort(slot)  # dropped from the ledger if still there
            if not self._closed:  # aclose dropped every reservation and the arena
                to_free.append(slot)
        self._free_slots(to_free)

    def _commit(self, slots: list[_Slot]) -> None:
        """Publish written blocks; raises (after publishing the others) if one was
        evicted during its copy or the backend was closed."""
        blocks = self._blocks
        if not self._closed and not any(map(_DROPPED, slots)):  # the usual case: publish all
            self._ledger.commit_many(slots)
            blocks.update(zip(map(_SKEY, slots), slots, strict=True))
            self._writes += len(slots)
            self._bytes_written += sum(map(_NBYTES, slots))
            return
        first: BaseException | None = None
        dropped: list[_Slot] = []
        done = nbytes = 0
        for slot in slots:
            if self._closed:
                slot.writing = False
                first = first or BackendClosedError("backend closed during the write", tier=self.name)
                continue
            if not self._ledger.commit(slot):  # evicted during the copy
                dropped.append(slot)
                first = first or BlockNotFoundError(
                    f"reservation for {slot.key!r} was evicted during the write", tier=self.name
                )
                continue
            blocks[slot.key] = slot
            done += 1
            nbytes += slot.nbytes
        self._writes += done
        self._bytes_written += nbytes
        self._free_slots(dropped)
        if first is not None:
            raise first

    def _unpin(self, slots: list[_Slot]) -> None:
        to_free: list[_Slot] = []
        for slot in slots:
            slot.readers -= 1
            if slot.dropped and slot.readers == 0:
                to_free.append(slot)
        self._free_slots(to_free)

    def _detach(self, key: str) -> _Slot | bool | None:
        """Unregister ``key``: the slot to free now, ``True`` if removed but freed
        later (a copy is in flight), ``None`` if nothing was there."""
        slot = self._blocks.pop(key, None)
        if slot is not None:
            self._ledger.release(slot.nbytes, slot.held)
            self._evictions += 1
            if slot.readers:
                slot.dropped = True
                return True
            return slot
        slot = self._ledger.drop(key)
        if slot is not None:
            return True if slot.writing else slot  # a write in flight frees it when its copy ends
        return None

    def _lookup(self, keys: Sequence[str]) -> list[_Slot]:
        blocks = self._blocks
        try:
            return [blocks[k] for k in keys]
        except (KeyError, TypeError):
            for k in keys:
                validate_key(k, tier=self.name)
                if k not in blocks:
                    raise BlockNotFoundError(f"no block under {k!r}", tier=self.name) from None
            raise  # unreachable: some key was missing

    # ------------------------------------------------------------------- copies
    @staticmethod
    def _copy_in_thread(arena: Arena, slots: list[_Slot], srcs: Sequence[bytes | memoryview]) -> None:
        """Worker-thread copies (numpy releases the GIL during each memcpy)."""
        for s, src in zip(slots, srcs, strict=True):
            if s.nbytes:
                arena.write_at(s.extent, np.frombuffer(src, dtype=np.uint8))

    @staticmethod
    def _copy_out_thread(arena: Arena, slots: list[_Slot], dsts: Sequence[bytes | memoryview]) -> None:
        for s, dst in zip(slots, dsts, strict=True):
            if s.nbytes:
                arena.read_at(s.extent, np.frombuffer(dst, dtype=np.uint8))

    async def _copy(
        self, arena: Arena, slots: list[_Slot], bufs: Sequence[bytes | memoryview], total: int, *, out: bool
    ) -> None:
        """Copy a batch into (``out=False``) or out of the arena, by the policy of
        the module docstring. The caller has pinned or claimed every slot."""
        amv = arena.mv
        if total <= self._inline:
            if out:
                for s, d in zip(slots, bufs, strict=True):
                    d[:] = amv[s.offset : s.offset + s.nbytes]  # type: ignore[index]
            else:
                for s, src in zip(slots, bufs, strict=True):
                    amv[s.offset : s.offset + s.nbytes] = src
            # the call is a cancellation point also when it does not yield
            await anyio.lowlevel.checkpoint_if_cancelled()
        elif self._large == "thread":
            fn = self._copy_out_thread if out else self._copy_in_thread
            await anyio.to_thread.run_sync(fn, arena, slots, bufs, limiter=self._limiter)
            # a cancel that arrived during the copy is delivered here, before the commit
            await anyio.lowlevel.checkpoint_if_cancelled()
        else:  # "slices": inline, yielding to the event loop after every inline_copy_bytes
            budget = max(1, self._inline)
            left = budget
            for s, buf in zip(slots, bufs, strict=True):
                b = memoryview(buf)  # slicing bytes would copy
                pos, n = 0, s.nbytes
                while pos < n:
                    step = min(n - pos, left)
                    a0 = s.offset + pos
                    if out:
                        b[pos : pos + step] = amv[a0 : a0 + step]
                    else:
                        amv[a0 : a0 + step] = b[pos : pos + step]
                    pos += step
                    left -= step
                    if left == 0:
                        await anyio.lowlevel.checkpoint()
                        left = budget
            await anyio.lowlevel.checkpoint_if_cancelled()

    # --------------------------------------------------------------------- data
    async def allocate(self, key: str, nbytes: int, *, tag: bytes = b"") -> Allocation:
        """See :meth:`Backend.allocate`. Holds ``nbytes`` rounded up to the granule."""
        return (await self.allocate_many([(key, nbytes, tag)]))[0]

    async def write(self, allocation: Allocation, data: Buffer) -> None:
        """See :meth:`Backend.write`. One memcpy into the arena (see the copy policy)."""
        await self.write_many([allocation], [data])

    async def read(self, key: str, *, into: Buffer | None = None) -> memoryview:
        """See :meth:`Backend.read`. With ``into``: one memcpy from the arena into it."""
        return (await self.read_many([key], into=None if into is None else [into]))[0]

    async def evict(self, key: str) -> bool:
        """See :meth:`Backend.evict`. Immediate; memory under an in-flight copy is
        given back when that copy ends."""
        return (await self.evict_many([key]))[0]

    async def contains(self, key: str) -> bool:
        self._live_arena()
        validate_key(key, tier=self.name)
        return key in self._blocks

    def stats(self) -> BackendStats:
        arena = self._arena
        details: dict[str, Any] = {
            "pinned": self._pinned,
            "granule": self._granule,
            "logical_bytes": self._ledger.logical_bytes,
        }
        if arena is not None:
            details["largest_free_bytes"] = arena.allocator.largest_free
        return BackendStats(
            tier=self.name,
            kind=TierKind.DRAM,
            capacity_bytes=arena.capacity if arena is not None else self._capacity // self._granule * self._granule,
            used_bytes=arena.used if arena is not None else 0,
            blocks=len(self._blocks),
            reserved_bytes=self._ledger.reserved_bytes,
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
        """All or nothing, with one allocator call (one lock acquisition) for the batch."""
        arena = self._live_arena()
        if not items:
            return []
        keys, sizes, tags = zip(*items, strict=True)
        if not self._check_batch(keys, sizes, tags):
            tags = tuple(t if type(t) is bytes else bytes(t) for t in tags)
        offsets = arena.allocate_spans(list(sizes))
        if offsets is None:
            raise self._capacity_error(arena, sum(sizes))
        count = len(keys)
        g1 = self._granule - 1
        first = sizes[0]
        helds: Sequence[int] | repeat[int]
        if sizes.count(first) == count:  # one block size (the usual batch): one rounding
            held = (first + g1) & ~g1
            helds, held_total = repeat(held, count), held * count
        else:
            helds = [(n + g1) & ~g1 for n in sizes]
            held_total = sum(helds)
        handles = self._ledger.handles(count)
        # C-level loops over the batch: one _Slot and one Allocation per block, nothing else
        slots = list(map(_Slot, keys, offsets, sizes, helds, tags, handles))
        return self._ledger.add_many(slots, nbytes=sum(sizes), held=held_total, columns=(keys, sizes, tags, handles))

    async def write_many(self, allocations: Sequence[Allocation], datas: Sequence[Buffer]) -> None:
        """All copies of the batch by one policy decision (inline, or one thread hop),
        then every block commits. On a failure or cancellation before the commit,
        no block of the batch is committed and all their reservations are released."""
        if len(allocations) != len(datas):
            raise InputError(f"write_many: {len(allocations)} allocations but {len(datas)} buffers")
        arena = self._live_arena()
        slots: list[_Slot] = []
        try:
            srcs = self._claim(allocations, datas, slots)
            await self._copy(arena, slots, srcs, sum(map(_NBYTES, slots)), out=False)
        except BaseException:
            self._abort(slots)
            self._free_slots(self._ledger.drop_unclaimed(allocations[len(slots) :]))
            raise
        self._commit(slots)

    async def read_many(self, keys: Sequence[str], *, into: Sequence[Buffer] | None = None) -> list[memoryview]:
        """All copies of the batch by one policy decision (inline, or one thread hop)."""
        if into is not None and len(into) != len(keys):
            raise InputError(f"read_many: {len(keys)} keys but {len(into)} buffers")
        arena = self._live_arena()
        slots = self._lookup(keys)
        total = sum(map(_NBYTES, slots))
        if into is not None and total <= self._inline:
            # inline copies: nothing can evict between the lookup and the end of the
            # copies (no await in between), so the blocks need no pin
            outs = self._destinations(slots, into)
            amv = arena.mv
            for s, d in zip(slots, outs, strict=True):
                d[:] = amv[s.offset : s.offset + s.nbytes]
            await anyio.lowlevel.checkpoint_if_cancelled()
            self._reads += len(slots)
            self._bytes_read += total
            return outs
        if into is None:
            if total <= self._inline:  # fresh buffers filled as they are made: one pass
                amv = arena.mv
                outs = [memoryview(bytearray(amv[s.offset : s.offset + s.nbytes])) for s in slots]
                await anyio.lowlevel.checkpoint_if_cancelled()
                self._reads += len(slots)
                self._bytes_read += total
                return outs
            outs = [np.empty(s.nbytes, dtype=np.uint8).data for s in slots]
        else:
            outs = self._destinations(slots, into)
        for s in slots:
            s.readers += 1
        try:
            await self._copy(arena, slots, outs, total, out=True)
        finally:
            self._unpin(slots)
        self._reads += len(slots)
        self._bytes_read += total
        return outs

    # ------------------------------------------------------- strided arrays
    def _array_views(
        self, arena: Arena, slots: list[_Slot], arrays: Sequence[Any], *, writable: bool
    ) -> list[tuple[Any, np.ndarray[Any, Any]]]:
        """(caller array, the arena bytes it maps to, viewed with its dtype and shape) for
        every array of every block (a block given as a sequence of arrays occupies their
        bytes one after the other); InputError for a size mismatch, something that is not
        an array, or a read-only destination."""
        out = []
        view = arena.view
        for s, a in zip(slots, arrays, strict=True):
            parts = a if isinstance(a, (list, tuple)) else (a,)
            off = s.offset
            for p in parts:
                if is_device_tensor(p):  # an accelerator tensor: copied to or from a torch view of the arena
                    if off + p.nbytes > s.offset + s.nbytes:
                        break
                    out.append((p, host_view(view[off : off + p.nbytes], p)))
                    off += p.nbytes
                    continue
                arr = p.array if isinstance(p, Taken) else p
                if not isinstance(arr, np.ndarray):
                    raise InputError(f"[{self.name}] expected a numpy array, got {type(p).__name__}")
                if writable and not arr.flags.writeable:
                    raise InputError(f"[{self.name}] destination array is read-only")
                if off + p.nbytes > s.offset + s.nbytes:
                    break
                out.append((p, view[off : off + p.nbytes].view(arr.dtype).reshape(p.shape)))
                off += p.nbytes
            got = sum(p.nbytes for p in parts)
            if got != s.nbytes:
                raise InputError(f"[{self.name}] arrays have {got} bytes, block has {s.nbytes}")
        return out

    async def _copy_arrays(self, pairs: list[tuple[Any, np.ndarray[Any, Any]]], *, out: bool) -> None:
        """Copy between caller arrays and arena views by the copy policy of the module
        docstring; ``slices`` splits a block along its first axis."""
        total = sum(a.nbytes for a, _ in pairs)

        def one(a: Any, v: Any) -> None:
            if isinstance(a, Taken):
                a.scatter_from(v) if out else a.gather_into(v)
            elif isinstance(a, np.ndarray):
                np.copyto(a, v) if out else np.copyto(v, a)
            else:  # an accelerator tensor and a torch view of the (pinned) arena
                device_copy(a, v) if out else device_copy(v, a)

        def run() -> None:
            for a, v in pairs:
                one(a, v)

        if any(not isinstance(a, (Taken, np.ndarray)) for a, _ in pairs):
            # accelerator copies block until the device completes them: a worker thread, waited
            # for even when cancelled (the caller's memory is written until it returns)
            await anyio.to_thread.run_sync(run, limiter=self._limiter)
            await anyio.lowlevel.checkpoint_if_cancelled()
        elif total <= self._inline:
            run()
            await anyio.lowlevel.checkpoint_if_cancelled()
        elif self._large == "thread":
            await anyio.to_thread.run_sync(run, limiter=self._limiter)
            await anyio.lowlevel.checkpoint_if_cancelled()
        elif self._large == "split" or (self._large == "auto" and total >= _SPLIT_MIN and CPUS > 1):
            await self._copy_split(pairs, one, out=out)
        else:
            budget = max(1, self._inline)
            left = budget
            for a, v in pairs:
                if isinstance(a, Taken) or not a.ndim:
                    one(a, v)
                    left -= a.nbytes
                    if left <= 0:
                        await anyio.lowlevel.checkpoint()
                        left = budget
                    continue
                rows = a.shape[0]
                row = a.nbytes // max(1, rows)
                step = max(1, min(rows, budget // max(1, row)))
                for r in range(0, rows, step):
                    src, dst = (v[r : r + step], a[r : r + step]) if out else (a[r : r + step], v[r : r + step])
                    np.copyto(dst, src)
                    left -= (min(rows, r + step) - r) * row
                    if left <= 0:
                        await anyio.lowlevel.checkpoint()
                        left = budget
            await anyio.lowlevel.checkpoint_if_cancelled()

    async def _copy_split(self, pairs: list[tuple[Any, np.ndarray[Any, Any]]], one: Any, *, out: bool) -> None:
        """``split``: the copies, cut along each array's first axis into pieces of at most
        ``inline_copy_bytes`` (at most an eighth of the call, at least 64 KiB), are shared between
        the event-loop thread (from the front) and the backend's copy helper thread (from the
        back) until none is left (:class:`~tierkv_backends._copier.Copier`); numpy releases the GIL, so
        both run at once on two cores. A cancel stops both at their next piece boundary and is
        raised once the helper's piece is done (the caller's memory is written until then)."""
        total = sum(a.nbytes for a, _ in pairs)
        budget = max(1, min(self._inline, max(64 << 10, total // 8)))
        cuts: list[list[tuple[Any, Any, int]]] = []  # per pair: (caller side, arena side, bytes)
        for a, v in pairs:
            if isinstance(a, Taken) or not a.ndim or a.shape[0] < 2:
                cuts.append([(a, v, a.nbytes)])
                continue
            rows = a.shape[0]
            step = max(1, min(rows, budget // max(1, a.nbytes // rows)))
            cuts.append(
                [
                    (a[r : r + step], v[r : r + step], (min(rows, r + step) - r) * (a.nbytes // rows))
                    for r in range(0, rows, step)
                ]
            )
        if out and len(cuts) > 1:
            # reads: the caller's arrays are the destination, and the blocks of one sequence are
            # neighbours along its token axis: the first rows of every block, then the next rows of
            # every block, ... write the destination nearly in address order (a get into new memory
            # faults its pages in order: 38-50 ms block after block against 26-35 ms for two threads
            # copying halves, 16K SmolLM2 tokens); writes fill each arena block in order as they are
            pieces = [p for group in itertools.zip_longest(*cuts) for p in group if p is not None]
        else:
            pieces = [p for c in cuts for p in c]
        await self._copier.run(pieces, one, max(1, self._inline))

    async def write_arrays(self, allocations: Sequence[Allocation], arrays: Sequence[Any]) -> None:
        """:class:`~tierkv.backend.SupportsArrayIO`: :meth:`write_many` with each block
        gathered straight from arrays of any strides into the arena (one copy)."""
        if len(allocations) != len(arrays):
            raise InputError(f"write_arrays: {len(allocations)} allocations but {len(arrays)} arrays")
        arena = self._live_arena()
        slots: list[_Slot] = []
        try:
            for a in allocations:
                slots.append(self._ledger.claim(a))
            pairs = self._array_views(arena, slots, arrays, writable=False)
            await self._copy_arrays(pairs, out=False)
        except BaseException:
            self._abort(slots)
            self._free_slots(self._ledger.drop_unclaimed(allocations[len(slots) :]))
            raise
        self._commit(slots)

    async def read_arrays(self, keys: Sequence[str], arrays: Sequence[Any]) -> None:
        """:class:`~tierkv.backend.SupportsArrayIO`: :meth:`read_many` with each block
        scattered straight from the arena into arrays of any strides (one copy)."""
        if len(keys) != len(arrays):
            raise InputError(f"read_arrays: {len(keys)} keys but {len(arrays)} arrays")
        arena = self._live_arena()
        slots = self._lookup(keys)
        pairs = self._array_views(arena, slots, arrays, writable=True)
        for s in slots:
            s.readers += 1
        try:
            await self._copy_arrays(pairs, out=True)
        finally:
            self._unpin(slots)
        self._reads += len(slots)
        self._bytes_read += sum(map(_NBYTES, slots))

    async def evict_many(self, keys: Sequence[str]) -> list[bool]:
        """Immediate; the memory of the whole batch goes back in one allocator call."""
        self._live_arena()
        blocks, reserved = self._blocks, self._ledger.pending
        for k in keys:  # validate everything before removing anything
            try:
                if k in blocks or k in reserved:
                    continue
            except TypeError:
                pass
            validate_key(k, tier=self.name)
        result: list[bool] = []
        to_free: list[_Slot] = []
        for k in keys:
            d = self._detach(k)
            if d is None:
                result.append(False)
                continue
            result.append(True)
            if isinstance(d, _Slot):
                to_free.append(d)
        self._free_slots(to_free)
        return result
