"""A host-memory arena carved by a binary buddy allocator (shared by the DRAM and CXL tiers).

Two layers, kept apart so the logic can be tested without memory:

* :class:`BuddyAllocator` is pure bookkeeping over ``size`` bytes split into
  *granules* (a power of two, 4 KiB by default). It knows nothing of memory.
* :class:`Arena` wraps any writable, C-contiguous buffer (a numpy ``uint8``
  array, a pinned torch tensor's ``.numpy()``, an ``mmap`` of a ``/dev/shm``
  file or a devdax device) and owns one :class:`BuddyAllocator` for it, plus a
  lock, a pre-fault helper and the memcpy helpers.

Size classes and fragmentation
------------------------------
Free space is kept as aligned power-of-two runs of granules in one free set per
order (a binary buddy system: splitting on allocation, merging a freed run
with its free buddy). A request of ``n`` granules takes the smallest free run
of order ``k = ceil(log2 n)`` and immediately gives back the unused tail of that
run (decomposed into aligned power-of-two pieces), so a request never holds
more than ``ceil(nbytes / granule)`` granules: internal fragmentation is below
one granule per block, not the 2x of a plain buddy system. Freeing a block
decomposes it into aligned power-of-two runs again and merges each with its
buddies, so an emptied arena always coalesces back to its initial runs.
External fragmentation: when no free run of order >= ``k`` exists, a request is
carved from *neighbouring* free runs (first fit in address order), so a block size
that is not a power of two (most KV blocks) can use the whole arena rather than one
block per power-of-two run; it fails only when no contiguous free stretch is large
enough. ``largest_free`` reports the largest aligned run (a request sure to succeed).

Accounting
----------
``used`` counts *granule-rounded* bytes held (what the memory really gives
up), never the requested bytes; ``held_bytes(n)`` gives the amount a request
of ``n`` bytes holds. A zero-byte request holds nothing and always succeeds.

Concurrency
-----------
:class:`BuddyAllocator` is not thread-safe; :class:`Arena` serialises it with
a ``threading.Lock`` (cheap when uncontended), so an arena may be shared by
event-loop code and worker threads, or by several backends of one process.
Copies (:meth:`Arena.write_at`, :meth:`Arena.read_at`) take no lock: the
caller guarantees that nobody frees an extent while it copies into or out of it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Arena", "BuddyAllocator", "Extent"]


@dataclass(frozen=True, slots=True)
class Extent:
    """A run of bytes held in an arena: ``[offset, offset + nbytes)``; ``held`` is the
    granule-rounded size counted in ``used``."""

    offset: int
    nbytes: int
    held: int


def _is_pow2(x: int) -> bool:
    return x > 0 and (x & (x - 1)) == 0


class BuddyAllocator:
    """Pure bookkeeping of a binary buddy allocator over ``size`` bytes.

    ``size`` is rounded down to whole granules. Offsets are in bytes and are
    multiples of ``granule``. :meth:`allocate` returns ``None`` when no free
    run is large enough; :meth:`free` raises ``ValueError`` for an extent that
    is not currently allocated (double free).
    """

    __slots__ = ("_cursor", "_free", "_free_order", "_granule", "_live", "_shift", "_total", "used")

    def __init__(self, size: int, granule: int = 4096) -> None:
        if not _is_pow2(granule):
            raise ValueError(f"granule must be a power of two, got {granule}")
        if size < 0:
            raise ValueError(f"size must be >= 0, got {size}")
        self._granule = granule
        self._shift = granule.bit_length() - 1
        self._total = size >> self._shift  # in granules
        # one set of free run starts (in granules) per order; order -> {start}
        self._free: list[set[int]] = [set() for _ in range(max(1, self._total.bit_length()))]
        self._free_order: dict[int, int] = {}  # start -> order, for free runs only
        self._live: dict[int, int] = {}  # start -> granules, for allocated extents
        self.used = 0  # bytes (granule-rounded)
        self._cursor = 0  # granule after the last run handed out (next fit for odd sizes)
        for start, order in self._pieces(0, self._total):
            self._push(start, order)

    # ------------------------------------------------------------------ views
    @property
    def granule(self) -> int:
        return self._granule

    @property
    def capacity(self) -> int:
        """Bytes managed (``size`` rounded down to whole granules)."""
        return self._total << self._shift

    @property
    def free_bytes(self) -> int:
        return self.capacity - self.used

    @property
    def largest_free(self) -> int:
        """Size in bytes of the largest free run (the largest request sure to succeed)."""
        for order in range(len(self._free) - 1, -1, -1):
            if self._free[order]:
                return (1 << order) << self._shift
        return 0

    @property
    def live_count(self) -> int:
        return len(self._live)

    def held_bytes(self, nbytes: int) -> int:
        """Bytes a request of ``nbytes`` holds (rounded up to whole granules)."""
        g = self._granule
        return (nbytes + g - 1) // g * g

    def free_runs(self) -> list[tuple[int, int]]:
        """Sorted ``(offset, nbytes)`` of every free run (for tests and diagnostics)."""
        return sorted((s << self._shift, (1 << o) << self._shift) for s, o in self._free_order.items())

    def live_extents(self) -> list[tuple[int, int]]:
        """Sorted ``(offset, held_bytes)`` of every allocated extent."""
        return sorted((s << self._shift, n << self._shift) for s, n in self._live.items())

    # ---------------------------------------------------------------- helpers
    @staticmethod
    def _pieces(start: int, count: int) -> list[tuple[int, int]]:
        """Decompose ``[start, start + count)`` granules into maximal aligned power-of-two runs."""
        out: list[tuple[int, int]] = []
        end = start + count
        p = start
        while p < end:
            # largest order allowed by the alignment of p and by the remaining length
            align = (p & -p).bit_length() - 1 if p else 63
            order = min(align, (end - p).bit_length() - 1)
            out.append((p, order))
            p += 1 << order
        return out

    def _push(self, start: int, order: int) -> None:
        self._free[order].add(start)
        self._free_order[start] = order

    def _release_run(self, start: int, order: int) -> None:
        """Free one aligned run, merging it with free buddies as far as possible."""
        top = len(self._free) - 1
        while order < top:
            buddy = start ^ (1 << order)
            if self._free_order.get(buddy) != order or buddy + (1 << order) > self._total:
                break
            del self._free_order[buddy]
            self._free[order].discard(buddy)
            start = min(start, buddy)
            order += 1
        self._push(start, order)

    # ------------------------------------------------------------------- API
    def _take_run(self, n: int) -> int | None:
        """Hold ``n`` (> 0) granules: the start of the run, or ``None``. Does not
        touch ``_live`` or ``used``. A size that is not a power of two goes right after
        the run handed out last when the granules there are free (so blocks of one odd
        size pack back to back instead of one per power-of-two run), else to the
        smallest aligned run that holds it, else to neighbouring free runs."""
        if n & (n - 1):  # not a power of two: right after the previous one, if free there
            start = self._take_at(self._cursor, n)
            if start is not None:
                self._cursor = start + n
                return start
        start = self._take_aligned(n)
        if start is None:
            start = self._take_span(n)
        if start is not None:
            self._cursor = start + n
        return start

    def _take_at(self, p: int, n: int) -> int | None:
        """Hold granules ``[p, p + n)`` if free runs cover them exactly from ``p`` on."""
        acc = 0
        chosen: list[tuple[int, int]] = []
        q = p
        get = self._free_order.get
        while acc < n:
            o = get(q)
            if o is None:
                return None
            chosen.append((q, o))
            acc += 1 << o
            q += 1 << o
        for s, o in chosen:
            del self._free_order[s]
            self._free[o].discard(s)
        for s, o in self._pieces(p + n, acc - n):
            self._release_run(s, o)
        return p

    def _take_aligned(self, n: int) -> int | None:
        """The buddy way: the smallest free run of order ``ceil(log2 n)`` or more."""
        k = (n - 1).bit_length()  # ceil(log2 n)
        order = k
        free = self._free
        while order < len(free) and not free[order]:
            order += 1
        if order >= len(free):
            return None
        start = free[order].pop()
        del self._free_order[start]
        # split down to order k, keeping the lower half each time
        while order > k:
            order -= 1
            self._push(start + (1 << order), order)
        # give back the unused tail of the 2**k run
        if n < (1 << k):
            for s, o in self._pieces(start + n, (1 << k) - n):
                self._push(s, o)  # its buddies are inside the held head: no merge possible
        return start

    def _take_span(self, n: int) -> int | None:
        """Hold ``n`` granules from neighbouring free runs when no single aligned run is
        large enough: a request that is not a power of two (a 5.6 MiB block needs an
        8 MiB run) would otherwise leave most of an arena's runs too small for it while
        the free space, in adjacent pieces, would do. First fit over the runs in address
        order; the unused tail goes back (merged with its buddies). ``None`` if no
        contiguous free stretch of ``n`` granules exists."""
        span = 0
        acc = 0
        chosen: list[tuple[int, int]] = []
        end = -1
        for start, order in sorted(self._free_order.items()):
            size = 1 << order
            if start != end:
                span, acc, chosen = start, 0, []
            chosen.append((start, order))
            acc += size
            end = start + size
            if acc >= n:
                for s, o in chosen:
                    del self._free_order[s]
                    self._free[o].discard(s)
                for s, o in self._pieces(span + n, acc - n):
                    self._release_run(s, o)
                return span
        return None

    def _release(self, start: int, n: int) -> None:
        for s, o in self._pieces(start, n):
            self._release_run(s, o)

    def allocate(self, nbytes: int) -> Extent | None:
        """Reserve ``nbytes`` (>= 0); ``None`` if no free run is large enough."""
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        if nbytes == 0:
            return Extent(0, 0, 0)
        n = (nbytes + self._granule - 1) >> self._shift
        start = self._take_run(n)
        if start is None:
            return None
        self._live[start] = n
        held = n << self._shift
        self.used += held
        return Extent(start << self._shift, nbytes, held)

    def allocate_spans(self, sizes: list[int]) -> list[int] | None:
        """Reserve one block per size (each >= 0), all or nothing; the byte offsets,
        or ``None`` (nothing held). Each block holds ``held_bytes(size)`` and is
        freed on its own later (:meth:`free_spans` or :meth:`free`).

        The batch is first carved out of *one* free run (one buddy operation for
        the whole batch, and neighbouring blocks for the copies); only if no run
        is large enough is each block placed on its own."""
        g1 = self._granule - 1
        sh = self._shift
        counts = [(s + g1) >> sh for s in sizes]
        total = sum(counts)
        if total == 0:
            return [0] * len(counts)
        live = self._live
        start = self._take_run(total)
        offsets: list[int] = []
        if start is not None:
            c0 = counts[0]
            if c0 and counts.count(c0) == len(counts):  # one block size: C-level bookkeeping
                end = start + total
                live.update(dict.fromkeys(range(start, end, c0), c0))
                self.used += total << sh
                return list(range(start << sh, end << sh, c0 << sh))
            p = start
            for c in counts:
                if c:
                    live[p] = c
                    offsets.append(p << sh)
                    p += c
                else:
                    offsets.append(0)
            self.used += total << sh
            return offsets
        held: list[int] = []
        for c in counts:
            if not c:
                offsets.append(0)
                continue
            st = self._take_run(c)
            if st is None:
                for done in held:
                    self._release(done, live.pop(done))
                return None
            live[st] = c
            held.append(st)
            offsets.append(st << sh)
        self.used += total << sh
        return offsets

    def free_spans(self, spans: list[tuple[int, int]]) -> None:
        """Give back blocks given as ``(offset, held_bytes)``; all or nothing:
        ``ValueError`` (and nothing freed) if one of them is not allocated.
        Neighbouring blocks are merged before they go back to the free lists."""
        live = self._live
        sh = self._shift
        taken: list[tuple[int, int]] = []
        for off, held in spans:
            if held == 0:
                continue
            st = off >> sh
            n = live.pop(st, None)
            if n is None or (n << sh) != held:
                if n is not None:
                    live[st] = n
                for s, c in taken:
                    live[s] = c
                raise ValueError(f"extent at offset {off} holding {held} bytes is not allocated")
            taken.append((st, n))
        if not taken:
            return
        self.used -= sum(c for _, c in taken) << sh
        taken.sort()
        run_start, run_n = taken[0]
        for s, c in taken[1:]:
            if s == run_start + run_n:
                run_n += c
            else:
                self._release(run_start, run_n)
                run_start, run_n = s, c
        self._release(run_start, run_n)

    def free(self, extent: Extent) -> None:
        """Give an extent back. Raises ``ValueError`` if it is not allocated."""
        if extent.held == 0:
            return
        start = extent.offset >> self._shift
        n = self._live.get(start)
        if n is None or (n << self._shift) != extent.held:
            raise ValueError(f"extent {extent} is not allocated")
        del self._live[start]
        self.used -= n << self._shift
        self._release(start, n)


class Arena:
    """A writable host buffer carved by a :class:`BuddyAllocator`.

    ``buffer`` is any writable C-contiguous object (numpy array, ``mmap``,
    ``bytearray``, pinned tensor ``.numpy()``); the arena keeps a reference so it
    stays alive, and views it as a flat ``uint8`` array without copying.
    Raises ``ValueError`` for a read-only or non-contiguous buffer.
    """

    __slots__ = ("_alloc", "_buffer", "_lock", "mv", "view")

    def __init__(self, buffer: Any, *, granule: int = 4096) -> None:
        mv = memoryview(buffer)
        if mv.readonly:
            raise ValueError("arena buffer must be writable")
        if not mv.c_contiguous:
            raise ValueError("arena buffer must be C-contiguous")
        self._buffer = buffer
        self.view: np.ndarray[Any, np.dtype[np.uint8]] = np.frombuffer(mv.cast("B"), dtype=np.uint8)
        #: the same bytes as a flat writable ``memoryview`` (slice assignment is a
        #: plain memcpy under the GIL: the cheapest copy for small blocks)
        self.mv: memoryview = self.view.data
        self._alloc = BuddyAllocator(self.view.nbytes, granule)
        self._lock = threading.Lock()

    @property
    def allocator(self) -> BuddyAllocator:
        """The bookkeeping (read it under no lock only for diagnostics)."""
        return self._alloc

    @property
    def capacity(self) -> int:
        return self._alloc.capacity

    @property
    def used(self) -> int:
        return self._alloc.used

    @property
    def granule(self) -> int:
        return self._alloc.granule

    def held_bytes(self, nbytes: int) -> int:
        return self._alloc.held_bytes(nbytes)

    def allocate(self, nbytes: int) -> Extent | None:
        with self._lock:
            return self._alloc.allocate(nbytes)

    def allocate_many(self, sizes: list[int]) -> list[Extent] | None:
        """All or nothing: ``None`` (and nothing held) if one of them does not fit."""
        offsets = self.allocate_spans(sizes)
        if offsets is None:
            return None
        held = self._alloc.held_bytes
        return [Extent(o, n, held(n)) for o, n in zip(offsets, sizes, strict=True)]

    def allocate_spans(self, sizes: list[int]) -> list[int] | None:
        """Offsets of one block per size, all or nothing (see :meth:`BuddyAllocator.allocate_spans`)."""
        with self._lock:
            return self._alloc.allocate_spans(sizes)

    def free_spans(self, spans: list[tuple[int, int]]) -> None:
        """Free ``(offset, held_bytes)`` blocks under one lock acquisition (all or nothing)."""
        with self._lock:
            self._alloc.free_spans(spans)

    def free(self, extent: Extent) -> None:
        with self._lock:
            self._alloc.free(extent)

    def free_many(self, extents: list[Extent]) -> None:
        with self._lock:
            self._alloc.free_spans([(e.offset, e.held) for e in extents])

    def slice(self, extent: Extent) -> np.ndarray[Any, np.dtype[np.uint8]]:
        """The arena bytes of ``extent`` (a view, no copy)."""
        return self.view[extent.offset : extent.offset + extent.nbytes]

    def write_at(self, extent: Extent, src: np.ndarray[Any, np.dtype[np.uint8]]) -> None:
        """memcpy ``src`` (exactly ``extent.nbytes`` bytes) into the extent (releases the GIL)."""
        np.copyto(self.view[extent.offset : extent.offset + extent.nbytes], src)

    def read_at(self, extent: Extent, dst: np.ndarray[Any, np.dtype[np.uint8]]) -> None:
        """memcpy the extent into ``dst`` (exactly ``extent.nbytes`` bytes; releases the GIL)."""
        np.copyto(dst, self.view[extent.offset : extent.offset + extent.nbytes])

    def prefault(self, chunk: int = 64 << 20) -> None:
        """Touch every page once (write zeros) so later copies do not pay first-touch
        page faults. Blocking: run it in a worker thread."""
        v = self.view
        for off in range(0, v.nbytes, chunk):
            v[off : off + chunk].fill(0)
