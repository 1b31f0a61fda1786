"""``belady``: Belady's MIN with bypass, the offline upper bound for block hits.

Needs the next-use index of every access (:func:`next_use_index`): evicts the block used furthest in the
future and does not admit a block whose next use is further than every resident block's. Prefix-consistent
because a parent's next use always precedes its child's.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from .base import hits as _hits

__all__ = ["BeladyPolicy", "next_use_index"]

_INF = 1 << 62


def next_use_index(requests: Sequence[Sequence[int]]) -> list[list[int]]:
    """For every access (request i, position j): the global access index of the block's next use, or a huge int."""
    out: list[list[int]] = [[] for _ in requests]
    nxt: dict[int, int] = {}
    pos = sum(len(r) for r in requests)
    for i in range(len(requests) - 1, -1, -1):
        ids = requests[i]
        pos -= len(ids)
        row = [0] * len(ids)
        for j in range(len(ids) - 1, -1, -1):
            b = ids[j]
            row[j] = nxt.get(b, _INF)
            nxt[b] = pos + j
        out[i] = row
    return out


class BeladyPolicy:
    """Belady's MIN with bypass; ``next_uses[i]`` is :func:`next_use_index` for request ``i`` (served in order)."""

    __slots__ = ("cache", "capacity", "heap", "i", "name", "next_uses")

    def __init__(self, capacity: int, next_uses: list[list[int]]) -> None:
        self.name = "belady"
        self.capacity = capacity
        self.next_uses = next_uses
        self.cache: dict[int, int] = {}
        self.heap: list[tuple[int, int]] = []  # (-next_use, block)
        self.i = 0

    def request(self, ids: Sequence[int], now: float, tail_partial: bool) -> tuple[int, int]:
        cache, heap, cap = self.cache, self.heap, self.capacity
        lead, hits, _flags = _hits(cache, ids)  # type: ignore[arg-type]
        nu_row = self.next_uses[self.i]
        self.i += 1
        push, pop = heapq.heappush, heapq.heappop
        for b, nu in zip(ids, nu_row, strict=True):
            if b in cache:
                if nu >= _INF:
                    del cache[b]
                else:
                    cache[b] = nu
                    push(heap, (-nu, b))
                continue
            if nu >= _INF:
                continue
            if len(cache) >= cap:
                while True:
                    neg, v = heap[0]
                    if cache.get(v) == -neg:
                        break
                    pop(heap)
                if -neg <= nu:
                    continue  # bypass: everything resident is needed sooner
                pop(heap)
                del cache[v]
            cache[b] = nu
            push(heap, (-nu, b))
        if len(heap) > 4 * len(cache) + 1024:
            self.heap = [(-nu, v) for v, nu in cache.items()]
            heapq.heapify(self.heap)
        return lead, hits
