"""``lfu``: least frequently used (frequency while resident), ties broken by recency; a lazy heap."""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from .base import hits as _hits

__all__ = ["LfuPolicy"]


class LfuPolicy:
    """Least frequently used (in-cache frequency), ties by least recent; lazy heap."""

    __slots__ = ("cache", "capacity", "clock", "heap", "name")

    def __init__(self, capacity: int) -> None:
        self.name = "lfu"
        self.capacity = capacity
        self.cache: dict[int, tuple[int, int]] = {}
        self.heap: list[tuple[int, int, int]] = []
        self.clock = 0

    def request(self, ids: Sequence[int], now: float, tail_partial: bool) -> tuple[int, int]:
        cache, heap = self.cache, self.heap
        lead, hits, _flags = _hits(cache, ids)  # type: ignore[arg-type]
        for b in ids:
            self.clock += 1
            if b in cache:
                freq = cache[b][0] + 1
            else:
                freq = 1
                while len(cache) >= self.capacity:
                    fr, ck, v = heapq.heappop(heap)
                    if cache.get(v) == (fr, ck):
                        del cache[v]
            cache[b] = (freq, self.clock)
            heapq.heappush(heap, (freq, self.clock, b))
        if len(heap) > 4 * len(cache) + 1024:
            self.heap = [(fr, ck, v) for v, (fr, ck) in cache.items()]
            heapq.heapify(self.heap)
        return lead, hits
