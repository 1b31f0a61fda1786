"""Placement without prediction: pure decision functions, no I/O.

* A new block goes to the fastest healthy tier with room for it.
* A tier past its high watermark sheds its least recently used, unpinned
  blocks down one tier until it is back under its low watermark; the bottom
  tier drops them.
* A hit in a lower tier is served from there (no promotion here; the
  predictive scheduler decides promotions).

The predictive scheduler replaces these functions; the core calls them only
through this module so that the swap is one import.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

__all__ = ["TierLoad", "bytes_to_shed", "lower_tier", "put_candidates", "select_victims"]


@dataclass(frozen=True, slots=True)
class TierLoad:
    """What placement needs to know about one tier (index = position, fastest first)."""

    capacity: int
    used: int
    high_watermark: float
    low_watermark: float
    healthy: bool = True

    @property
    def free(self) -> int:
        return max(0, self.capacity - self.used)


def put_candidates(loads: Sequence[TierLoad], nbytes: int) -> list[int]:
    """Tier indices to try for a new block of ``nbytes``, fastest first: every
    healthy tier with room (watermarks are enforced afterwards by shedding)."""
    return [i for i, t in enumerate(loads) if t.healthy and t.free >= nbytes]


def bytes_to_shed(load: TierLoad) -> int:
    """Bytes a tier must shed: 0 under its high watermark, else down to its low watermark."""
    if load.used <= load.high_watermark * load.capacity:
        return 0
    return int(load.used - load.low_watermark * load.capacity)


def lower_tier(loads: Sequence[TierLoad], index: int) -> int | None:
    """The next healthy tier below ``index``, or None if ``index`` is the bottom."""
    for j in range(index + 1, len(loads)):
        if loads[j].healthy:
            return j
    return None


def select_victims(
    lru_order: Iterable[str], sizes: Mapping[str, int], need: int, pinned: Iterable[str] = ()
) -> list[str]:
    """In ``lru_order``, skipping pinned keys and keys without a size, until ``need`` bytes are covered."""
    blocked = set(pinned)
    out: list[str] = []
    freed = 0
    for key in lru_order:
        if freed >= need:
            break
        if key in blocked or key not in sizes:
            continue
        out.append(key)
        freed += sizes[key]
    return out
