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
from collections.abc import Hashable
from typing import Any, TypeVar

import numpy as np

__all__ = ["QUANTA", "bucketize", "lowest", "push", "quantize", "quantize_many"]

K = TypeVar("K", bound=Hashable)

#: keys are quantised to 1/QUANTA (1.6% in a probability, tau / 64 in time)
QUANTA = 64


#: the quantised key of a block a put has stored but not yet ranked (minus its depth in the put):
#: above every real key, so a put's later blocks evict other blocks before its own earlier ones
PROVISIONAL_RANK = 1 << 40


def quantize(key: float) -> int:
    """The quantised form of a ranking key (``ln p + t / tau``, higher stays)."""
    return int((key + 64.0) * QUANTA)


def quantize_many(keys: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """:func:`quantize` of every float64 key (truncated toward zero, as ``int``), as int64."""
    return np.trunc((keys + 64.0) * QUANTA).astype(np.int64)


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
