"""Tiers and their residency: which indexed rows each tier serves or holds a durable copy of.

Owns: :class:`Tier` (backend, breaker, codec, counters, watermarks) and its residency, kept by
row in :class:`~._columns.Columns`: ``Tier.lru``, the recency order of the serving copies (an
intrusive doubly linked list through the ``lprev``/``lnext`` columns; a row is served by one
tier), ``Tier.backed``, the durable-only copies (the ``bt`` column), ``Tier.queue``, the
serving copies ranked by quantised eviction key (the predictive order: FIFOs per key linked
through the ``qprev``/``qnext`` columns, a min-heap of the keys), and ``Tier.tenant_bytes``,
the per-tenant byte counts kept exact by :meth:`Tier.place` / :meth:`Tier.back` and their
inverses (refunded from the entry's own tenant and size: no per-block charge record).

``Tier.arc`` splits the
serving copies in ARC's recent and frequent lists (``at``/``aprev``/``anext``; the ``arc`` column says
which, :mod:`tierkv.scheduler._arc`), kept by the same mutators and :meth:`Tier.touch`.

``lru`` and ``backed`` are views: ``in`` (a hex key), iteration (hex keys; ``lru`` in recency
order, least recent first, and reversed), ``len``. Everything here is synchronous.

May not touch: backends (no I/O), the key table, the scheduler's state.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import anyio
import numpy as np

from ..backend import Backend, SupportsArrayIO, SupportsDeviceIO
from ..codecs import TierCodec
from ..scheduler import CircuitBreaker
from ._columns import Columns

if TYPE_CHECKING:
    from ._entry import Entry

__all__ = ["Backed", "RankQueue", "Recency", "Tier"]

_NOT_QUEUED = -2
_FREE = -3  # a key-table slot never used
_GONE = -4  # a key-table slot whose key left


class Recency:
    """A tier's serving copies, least recently used first (the ``lprev``/``lnext`` list; with
    ``cols``, another intrusive list through other columns: the ARC lists, ``at``/``aprev``/``anext``,
    whose ``ti`` is ``2 * tier + list``)."""

    __slots__ = ("_c", "_next", "_owner", "_prev", "_ti", "head", "n", "tail", "ver")

    def __init__(self, c: Columns, ti: int, cols: tuple[str, str, str] = ("lt", "lprev", "lnext")) -> None:
        self._c, self._ti = c, ti
        self._owner: array[int] = getattr(c, cols[0])  # (the columns grow in place: never rebound)
        self._prev: array[int] = getattr(c, cols[1])
        self._next: array[int] = getattr(c, cols[2])
        self.head = self.tail = -1
        self.n = 0
        self.ver = 0  # bumped by every change (an iteration that sees one raises, as a dict's does)

    def __len__(self) -> int:
        return self.n

    def __bool__(self) -> bool:
        return self.n > 0

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str):
            return False
        r = self._c.find(key)
        return r >= 0 and self._owner[r] == self._ti

    def has(self, row: int) -> bool:
        return self._owner[row] == self._ti

    def rows(self, *, reverse: bool = False) -> Iterator[int]:
        ver = self.ver
        step = self._prev if reverse else self._next
        r = self.tail if reverse else self.head
        while r >= 0:
            nxt = step[r]
            yield r
            if self.ver != ver:
                raise RuntimeError("a tier's recency order changed during iteration")
            r = nxt

    def __iter__(self) -> Iterator[str]:
        key_of = self._c.key_of
        return (key_of(r) for r in self.rows())

    def __reversed__(self) -> Iterator[str]:
        key_of = self._c.key_of
        return (key_of(r) for r in self.rows(reverse=True))

    def link(self, row: int) -> None:
        """Append ``row`` (in no tier's list) as the most recently used."""
        prev, nxt = self._prev, self._next
        self._owner[row] = self._ti
        prev[row] = self.tail
        nxt[row] = -1
        if self.tail >= 0:
            nxt[self.tail] = row
        else:
            self.head = row
        self.tail = row
        self.n += 1
        self.ver += 1

    def unlink(self, row: int) -> None:
        prev, nxt = self._prev, self._next
        p, nx = prev[row], nxt[row]
        if p >= 0:
            nxt[p] = nx
        else:
            self.head = nx
        if nx >= 0:
            prev[nx] = p
        else:
            self.tail = p
        self._owner[row] = -1
        self.n -= 1
        self.ver += 1

    def move_to_end(self, row: int) -> None:
        if self.tail != row:
            self.unlink(row)
            self.link(row)

    def move_before(self, row: int, ref: int) -> None:
        """Put ``row`` just before ``ref`` (less recently used than it); both in this list."""
        if row == ref:
            return
        prev, nxt = self._prev, self._next
        self.unlink(row)
        p = prev[ref]
        self._owner[row] = self._ti
        prev[row], nxt[row] = p, ref
        prev[ref] = row
        if p >= 0:
            nxt[p] = row
        else:
            self.head = row
        self.n += 1
        self.ver += 1


class Backed:
    """A tier's durable-only copies (rows whose ``bt`` column names it; a row backed on a
    second tier at once is kept in ``extra``)."""

    __slots__ = ("_c", "_ti", "extra", "n")

    def __init__(self, c: Columns, ti: int) -> None:
        self._c, self._ti = c, ti
        self.n = 0
        self.extra: set[int] = set()

    def __len__(self) -> int:
        return self.n + len(self.extra)

    def __bool__(self) -> bool:
        return self.n > 0 or bool(self.extra)

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str):
            return False
        r = self._c.find(key)
        return r >= 0 and self.has(r)

    def has(self, row: int) -> bool:
        return self._c.bt[row] == self._ti or (bool(self.extra) and row in self.extra)

    def rows(self) -> list[int]:
        c = self._c
        out: list[int] = []
        if self.n and c.rows:
            bt = np.frombuffer(c.bt, dtype=np.int8)[: c.rows]
            out = np.flatnonzero(bt == self._ti).tolist()
            del bt
        return out + sorted(self.extra)

    def __iter__(self) -> Iterator[str]:
        key_of = self._c.key_of
        return iter([key_of(r) for r in self.rows()])


class RankQueue:
    """A tier's serving copies ranked by quantised key (lowest leaves first; FIFO among equal
    keys), by row: the FIFO of each key is a circular list through the ``qprev``/``qnext``
    columns, found through a small open-addressing table key -> first row (``array`` slots),
    and the keys that have a FIFO are in a min-heap (an ``array``). ``set`` and ``discard`` are
    O(1) plus a heap push for a new key value; taking the lowest is amortised O(log n). An
    emptied FIFO stays until its key reaches the top of the heap. No Python object per key."""

    __slots__ = ("_c", "_heads", "_keys", "_mask", "_used", "heap", "n")

    def __init__(self, c: Columns) -> None:
        self._c = c
        self._keys = array("q", [0]) * 64
        self._heads = array("i", [_FREE]) * 64  # first row of the key's FIFO; -1: empty FIFO
        self._mask = 63
        self._used = 0
        self.heap = array("q")
        self.n = 0

    def __len__(self) -> int:
        return self.n

    def holds(self, row: int) -> bool:
        return self._c.qprev[row] != _NOT_QUEUED

    # the key table: slot of key ``q`` (or of the free slot where it would go)
    def _slot(self, q: int) -> int:
        keys, heads, mask = self._keys, self._heads, self._mask
        i = _spread(q) & mask
        tomb = -1
        while True:
            h = heads[i]
            if h == _FREE:
                return i if tomb < 0 else tomb
            if h == _GONE:
                if tomb < 0:
                    tomb = i
            elif keys[i] == q:
                return i
            i = (i + 1) & mask

    def _find(self, q: int) -> int:
        keys, heads, mask = self._keys, self._heads, self._mask
        i = _spread(q) & mask
        while True:
            h = heads[i]
            if h == _FREE:
                return -1
            if h != _GONE and keys[i] == q:
                return i
            i = (i + 1) & mask

    def _grow(self) -> None:
        live = [(k, h) for k, h in zip(self._keys, self._heads, strict=True) if h not in (_FREE, _GONE)]
        self._new_table(live, self._mask + 1)

    def _new_table(self, live: list[tuple[int, int]], cap: int) -> None:
        """A fresh key table holding the (key, FIFO head) pairs ``live``: ``cap`` slots, doubled
        until they are at most 30% full."""
        while len(live) + 1 > 0.3 * cap:
            cap *= 2
        self._keys = array("q", [0]) * cap
        self._heads = array("i", [_FREE]) * cap
        self._mask = cap - 1
        self._used = 0
        for k, h in live:
            i = self._slot(k)
            self._keys[i], self._heads[i] = k, h
            self._used += 1

    def set(self, row: int, q: int) -> None:
        c = self._c
        if c.qprev[row] != _NOT_QUEUED:
            if c.qkey[row] == q:
                return
            self.discard(row)
        c.qkey[row] = q
        i = self._find(q)
        if i < 0:
            if self._used + 1 > 0.6 * (self._mask + 1):
                self._grow()
            i = self._slot(q)
            if self._heads[i] == _FREE:
                self._used += 1
            self._keys[i] = q
            self._heads[i] = -1
            _heappush(self.heap, q)
        h = self._heads[i]
        if h < 0:
            self._heads[i] = row
            c.qprev[row] = c.qnext[row] = row
        else:
            t = c.qprev[h]
            c.qnext[t] = row
            c.qprev[row] = t
            c.qnext[row] = h
            c.qprev[h] = row
        self.n += 1

    def requeue(self, row: int, q: int) -> None:
        """:meth:`set` ``row`` to key ``q`` at the end of that key's FIFO even when its key is
        unchanged (an accessed block leaves after the blocks of its key that were not)."""
        self.discard(row)
        self.set(row, q)

    def set_before(self, row: int, q: int, ref: int) -> None:
        """:meth:`set` ``row`` to key ``q``; when ``ref`` is queued with the same key, ``row``
        goes just before it in that key's FIFO (it leaves first), not at the end."""
        c = self._c
        if row == ref or c.qprev[ref] == _NOT_QUEUED or c.qkey[ref] != q:
            self.set(row, q)
            return
        self.discard(row)
        c.qkey[row] = q
        t = c.qprev[ref]
        c.qnext[t] = row
        c.qprev[row] = t
        c.qnext[row] = ref
        c.qprev[ref] = row
        i = self._find(q)
        if self._heads[i] == ref:
            self._heads[i] = row
        self.n += 1

    def discard(self, row: int) -> None:
        c = self._c
        p = c.qprev[row]
        if p == _NOT_QUEUED:
            return
        nx = c.qnext[row]
        i = self._find(c.qkey[row])
        if nx == row:
            self._heads[i] = -1
        else:
            c.qnext[p] = nx
            c.qprev[nx] = p
            if self._heads[i] == row:
                self._heads[i] = nx
        c.qprev[row] = _NOT_QUEUED
        self.n -= 1

    def rebuild(self, rows: np.ndarray[Any, Any], keys: np.ndarray[Any, Any]) -> None:
        """Replace the queue's whole content by ``rows`` (int64, distinct, every row the queue holds
        among them) at ``keys`` (int64): each key's FIFO in the order of ``rows``, as :meth:`requeue`
        of each row in that order would leave it, in O(n log n) array work plus one Python step per
        distinct key instead of two table probes and list splices per row."""
        c = self._c
        n = len(rows)
        order = np.argsort(keys, kind="stable")
        r = rows[order]
        k = keys[order]
        if n:
            starts = np.flatnonzero(np.concatenate(([True], k[1:] != k[:-1])))
            ends = np.concatenate((starts[1:], [n])) - 1  # each FIFO's last position
            nxt = np.empty(n, dtype=np.int64)
            prv = np.empty(n, dtype=np.int64)
            nxt[:-1] = r[1:]
            prv[1:] = r[:-1]
            nxt[ends] = r[starts]  # circular within a key's FIFO
            prv[starts] = r[ends]
            np.frombuffer(c.qnext, dtype=np.int32)[r] = nxt
            np.frombuffer(c.qprev, dtype=np.int32)[r] = prv
            np.frombuffer(c.qkey, dtype=np.int64)[r] = k
            distinct, heads = k[starts].tolist(), r[starts].tolist()
        else:
            distinct, heads = [], []
        self._new_table(list(zip(distinct, heads, strict=True)), 64)
        self.heap = array("q", distinct)  # ascending: a valid min-heap
        self.n = n

    def pick(self, want: Callable[[int], int | None], need: int) -> list[int]:
        """Rows in ascending rank order for which ``want(row)`` gives a size (None: skip it,
        e.g. pinned), until the sizes add up to ``need``; each visited row goes back to the end
        of its key's FIFO (skipped ones first), as a re-ranked one would."""
        out: list[tuple[int, int]] = []
        skipped: list[tuple[int, int]] = []
        freed = 0
        heap = self.heap
        while freed < need and self.n:
            qv = heap[0]
            i = self._find(qv)
            row = self._heads[i]
            if row < 0:
                self._heads[i] = _GONE
                _heappop(heap)
                continue
            c = self._c
            nx = c.qnext[row]  # ``row`` leaves the head of its FIFO (as ``discard`` would)
            if nx == row:
                self._heads[i] = -1
            else:
                p = c.qprev[row]
                c.qnext[p] = nx
                c.qprev[nx] = p
                self._heads[i] = nx
            c.qprev[row] = _NOT_QUEUED
            self.n -= 1
            size = want(row)
            if size is None:
                skipped.append((row, qv))
                continue
            out.append((row, qv))
            freed += size
        for row, q in (*skipped, *out):  # restored: a victim leaves when it is really moved or dropped
            self.set(row, q)
        return [row for row, _ in out]


def _spread(q: int) -> int:
    """A key's first probe slot (before the mask): Fibonacci hashing, the high bits of ``q``
    times 2^64 / phi. Keys are integers in a sliding window: taken as they are (``q & mask``),
    consecutive keys filled consecutive slots, and a key landing inside such a run probed to its
    end -- after a re-key of every block (a switch of the adaptive ``tau``), new keys landing in
    the runs of old ones made that quadratic (10k blocks 0.63 s, 100k blocks 36 s)."""
    return ((q * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF) >> 32


def _heappush(heap: array[int], v: int) -> None:
    heap.append(v)
    i = len(heap) - 1
    while i:
        parent = (i - 1) >> 1
        pv = heap[parent]
        if pv <= v:
            break
        heap[i] = pv
        i = parent
    heap[i] = v


def _heappop(heap: array[int]) -> None:
    """Drop the smallest value."""
    last = heap.pop()
    n = len(heap)
    if not n:
        return
    i = 0
    while True:
        child = 2 * i + 1
        if child >= n:
            break
        if child + 1 < n and heap[child + 1] < heap[child]:
            child += 1
        cv = heap[child]
        if cv >= last:
            break
        heap[i] = cv
        i = child
    heap[i] = last


_UNBOUND = Columns()
_ARC_COLS = ("at", "aprev", "anext")


class Tier:
    __slots__ = (
        "_c",
        "arc",
        "array_io",
        "backed",
        "backend",
        "breaker",
        "bytes_in",
        "bytes_out",
        "codec",
        "config_name",
        "demotions",
        "device_io",
        "high",
        "hits",
        "kind",
        "limiter",
        "low",
        "lru",
        "misses",
        "name",
        "promotions",
        "queue",
        "ranked",
        "room_lock",
        "tenant_bytes",
        "ti",
    )

    def __init__(
        self,
        name: str,
        config_name: str,
        backend: Backend,
        high: float,
        low: float,
        breaker: CircuitBreaker,
        transfers: int,
    ) -> None:
        self.name = name
        self.config_name = config_name
        self.backend = backend
        #: the backend's optional protocols, checked once (a runtime protocol check costs
        #: microseconds, and the write and read paths ask per block)
        self.array_io = isinstance(backend, SupportsArrayIO)
        self.device_io = isinstance(backend, SupportsDeviceIO)
        self.kind = str(backend.capabilities.tier_kind.value)
        self.high = high
        self.low = low
        self.ti = -1
        self._c = _UNBOUND
        self.lru = Recency(_UNBOUND, -1)
        #: serving copies ranked by their entries' eviction keys (the predictive order; kept
        #: only when ``ranked``: under the LRU policy ``lru`` is the order)
        self.queue = RankQueue(_UNBOUND)
        self.ranked = True
        #: the serving copies in ARC's two lists, each least recently used first: (recent: stored
        #: and accessed by one request, frequent: by two or more, see the ``arc`` column); every
        #: serving copy is in exactly one (the adaptive policy's ARC mode evicts from them)
        self.arc = (Recency(_UNBOUND, -1, _ARC_COLS), Recency(_UNBOUND, -1, _ARC_COLS))
        #: blocks whose *durable copy* (not their serving copy) is on this tier
        self.backed = Backed(_UNBOUND, -1)
        self.hits = self.misses = self.bytes_in = self.bytes_out = 0
        self.promotions = self.demotions = 0
        self.breaker = breaker
        self.limiter = anyio.CapacityLimiter(transfers)
        self.codec: TierCodec | None = None
        #: writers that must make room on this tier queue here (see TierKV._allocate_with_room)
        self.room_lock = anyio.Lock()
        #: logical bytes each tenant's copies hold on this tier (serving and durable copies)
        self.tenant_bytes: dict[bytes, int] = {}

    def bind(self, c: Columns, ti: int) -> None:
        """Keep this tier's residency in ``c`` as tier number ``ti`` (done once, by the index)."""
        self._c, self.ti = c, ti
        self.lru = Recency(c, ti)
        self.arc = (Recency(c, 2 * ti, _ARC_COLS), Recency(c, 2 * ti + 1, _ARC_COLS))
        self.queue = RankQueue(c)
        self.backed = Backed(c, ti)

    # Residency: the only mutators of ``lru`` (serving copies) and ``backed`` (durable-only
    # copies); they keep ``tenant_bytes`` exact for the quotas. ``e`` must be indexed.
    def place(self, e: Entry) -> None:
        """``e`` is served from this tier (most recently used, ranked by ``e.rank``)."""
        r = e.row
        if r < 0:
            return
        c = self._c
        lt = c.lt[r]
        if lt != self.ti:
            if lt >= 0:
                c.tiers[lt].unplace(e)
            self.lru.link(r)
            self.arc[c.arc[r]].link(r)
            self._charge(e)
        if self.ranked:
            self.queue.set(r, e.rank)

    def unplace(self, e: Entry) -> None:
        r = e.row
        if r >= 0 and self._c.lt[r] == self.ti:
            self.lru.unlink(r)
            self.arc[self._c.arc[r]].unlink(r)
            self.queue.discard(r)
            self._refund(e)

    def touch(self, row: int) -> None:
        """A serving copy here was accessed: most recently used in ``lru`` and in its ARC list."""
        self.lru.move_to_end(row)
        self.arc[self._c.arc[row]].move_to_end(row)

    def make_frequent(self, row: int) -> None:
        """Indexed ``row`` joins ARC's frequent list (most recently used there, on the tier serving
        it, whichever that is; with none, when it is placed); idempotent."""
        c = self._c
        lt = c.lt[row]
        if lt < 0:
            c.arc[row] = 1
            return
        lists = c.tiers[lt].arc
        if c.arc[row]:
            lists[1].move_to_end(row)
            return
        lists[0].unlink(row)
        c.arc[row] = 1
        lists[1].link(row)

    def trim_frequent(self, share: float) -> None:
        """Move the least recent rows of ARC's frequent list to the end of the recent list (most
        recent there) until the frequent list holds at most ``share`` of this tier's serving copies:
        the segmented LRU's demotion from its protected segment to probation (``SchedulerState.slru``)."""
        recent, frequent = self.arc
        limit = int(share * self.lru.n)
        c = self._c
        while frequent.n > limit:
            r = frequent.head
            frequent.unlink(r)
            c.arc[r] = 0
            recent.link(r)

    def back(self, e: Entry) -> None:
        """This tier holds ``e``'s durable copy (served elsewhere)."""
        r = e.row
        if r < 0 or self.backed.has(r):
            return
        c = self._c
        if c.bt[r] < 0:
            c.bt[r] = self.ti
            self.backed.n += 1
        else:
            self.backed.extra.add(r)
        self._charge(e)

    def unback(self, e: Entry) -> None:
        r = e.row
        if r < 0:
            return
        c, b = self._c, self.backed
        if c.bt[r] == self.ti:
            c.bt[r] = -1
            b.n -= 1
        elif b.extra and r in b.extra:
            b.extra.discard(r)
        else:
            return
        self._refund(e)

    def _charge(self, e: Entry) -> None:
        tid = e.tenant[:16]
        self.tenant_bytes[tid] = self.tenant_bytes.get(tid, 0) + e.nbytes

    def _refund(self, e: Entry) -> None:
        tid = e.tenant[:16]
        left = self.tenant_bytes.get(tid, 0) - e.nbytes
        if left > 0:
            self.tenant_bytes[tid] = left
        else:
            self.tenant_bytes.pop(tid, None)

    @property
    def healthy(self) -> bool:
        """Closed circuit breaker: the tier takes part in placement and serves reads."""
        return self.breaker.healthy
