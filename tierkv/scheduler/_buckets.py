"""The priority queue of the ``tierkv`` ranking: quantised keys, a FIFO of blocks per key, and a min-heap
of the keys that have a FIFO (shared by the replay policy and the adaptive tau's shadow caches).

``index`` maps each resident block to its current quantised key. Re-keying a block appends it to its new
key's FIFO and leaves a stale entry behind, skipped when met (an entry is live when ``index`` still maps
the block to that key); :func:`bucketize` rebuilds without the stale entries. An access costs O(1)
dict/deque operations instead of a heap push of a tuple.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["QUANTA", "RankQueue", "bucketize", "lowest", "push", "quantize"]

K = TypeVar("K", bound=Hashable)

#: keys are quantised to 1/QUANTA (1.6% in a probability, tau / 64 in time)
QUANTA = 64


def quantize(key: float) -> int:
    """The quantised form of a ranking key (``ln p + t / tau``, higher stays)."""
    return int((key + 64.0) * QUANTA)


def push(buckets: dict[int, deque[int]], bheap: list[int], block: int, q: int) -> None:
    """Append ``block`` to key ``q``'s FIFO (the caller has set ``index[block] = q``)."""
    dq = buckets.get(q)
    if dq is None:
        buckets[q] = deque((block,))
        heapq.heappush(bheap, q)
    else:
        dq.append(block)


def lowest(index: dict[int, int], buckets: dict[int, deque[int]], bheap: list[int]) -> tuple[int, deque[int]]:
    """The lowest key with a live block and its FIFO, whose head is then that live block (the victim);
    drops the stale entries and empty keys met on the way. ``index`` must not be empty."""
    while True:
        qv = bheap[0]
        dq = buckets[qv]
        while dq and index.get(dq[0]) != qv:
            dq.popleft()
        if dq:
            return qv, dq
        del buckets[qv]
        heapq.heappop(bheap)


def bucketize(index: dict[K, int]) -> tuple[dict[int, deque[K]], list[int]]:
    """FIFOs and key heap rebuilt from ``index`` (no stale entries)."""
    buckets: dict[int, deque[K]] = {}
    for b, q in index.items():
        dq = buckets.get(q)
        if dq is None:
            buckets[q] = deque((b,))
        else:
            dq.append(b)
    bheap = list(buckets)
    heapq.heapify(bheap)
    return buckets, bheap


class RankQueue(Generic[K]):
    """Resident keys ranked by a quantised key (lowest leaves first; FIFO among equal keys).

    ``set`` (insert or re-rank) and ``discard`` are O(1) dict/deque operations plus a heap push
    for a new key value; taking the lowest is amortised O(log n). Stale FIFO entries are
    skipped when met and compacted once they outnumber the live ones four to one."""

    __slots__ = ("_bheap", "_buckets", "_entries", "index")

    def __init__(self) -> None:
        self.index: dict[K, int] = {}
        self._buckets: dict[int, deque[K]] = {}
        self._bheap: list[int] = []
        self._entries = 0

    def __len__(self) -> int:
        return len(self.index)

    def __contains__(self, k: object) -> bool:
        return k in self.index

    def set(self, k: K, q: int) -> None:
        if self.index.get(k) == q:
            return
        self.index[k] = q
        dq = self._buckets.get(q)
        if dq is None:
            self._buckets[q] = deque((k,))
            heapq.heappush(self._bheap, q)
        else:
            dq.append(k)
        self._entries += 1
        if self._entries > 4 * len(self.index) + 1024:
            self._compact()

    def discard(self, k: K) -> None:
        self.index.pop(k, None)

    def pick(self, want: Callable[[K], int | None], need: int) -> list[K]:
        """Keys in ascending rank order for which ``want(k)`` gives a size (None: skip it,
        e.g. pinned), until the sizes add up to ``need``; the queue is left as it was."""
        out: list[tuple[K, int]] = []
        skipped: list[tuple[K, int]] = []
        freed = 0
        index, buckets, bheap = self.index, self._buckets, self._bheap
        while freed < need and index:
            qv = bheap[0]
            dq = buckets[qv]
            while dq and index.get(dq[0]) != qv:
                dq.popleft()
            if not dq:
                del buckets[qv]
                heapq.heappop(bheap)
                continue
            k = dq.popleft()
            del index[k]
            size = want(k)
            if size is None:
                skipped.append((k, qv))
                continue
            out.append((k, qv))
            freed += size
        for k, q in (*skipped, *out):  # restored: a victim leaves when it is really moved or dropped
            self.set(k, q)
        return [k for k, _ in out]

    def _compact(self) -> None:
        self._buckets, self._bheap = bucketize(self.index)
        self._entries = len(self.index)
