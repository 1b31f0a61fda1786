"""``lru``: least recently used (a classical baseline of the replay lab)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from .base import hits as _hits

__all__ = ["LruPolicy"]


class LruPolicy:
    """Least recently used."""

    __slots__ = ("cache", "capacity", "name")

    def __init__(self, capacity: int) -> None:
        self.name = "lru"
        self.capacity = capacity
        self.cache: OrderedDict[int, None] = OrderedDict()

    def request(self, ids: Sequence[int], now: float, tail_partial: bool) -> tuple[int, int]:
        cache = self.cache
        lead, hits, _flags = _hits(cache, ids)  # type: ignore[arg-type]
        cap = self.capacity
        move = cache.move_to_end
        for b in ids:
            if b in cache:
                move(b)
            else:
                if len(cache) >= cap:
                    cache.popitem(last=False)
                cache[b] = None
        return lead, hits
