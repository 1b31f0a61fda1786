"""Frequency-based admission: the access history TinyLFU admits by (pure, no I/O).

A cache that admits every missed block lets a burst of one-shot prompts flush what is reused. TinyLFU's
answer is an *admission filter*: when the cache is full, a missed block is stored only if it was
accessed more often recently than the block it would evict. :class:`FrequencySketch` keeps that
history: a count per block id over a sliding window of about ``window`` x the cache's capacity in
accesses (every count halved when the window fills, TinyLFU's "reset"), including blocks that are not
or no longer cached. Counts are exact (a dict), not a count-min sketch: it holds at most about
2 x ``window`` x capacity ids (those of the current window and the survivors of the last halving).

The library's adaptive policy applies the filter only while a sampled shadow of "LRU + this filter"
beats a plain LRU shadow (:class:`~tierkv.scheduler.TauAdapter`, ``admit_mode``): on a workload where
first accesses are usually reused (a conversation's next turn, an agent loop) admission loses badly,
on one flooded by one-shot prompts it wins.

Owns: the counts and their aging. Not thread-safe (one event loop, or the replay's thread).
"""

from __future__ import annotations

from ..errors import ConfigError

__all__ = ["FrequencySketch"]


class FrequencySketch:
    """Recent access counts per integer block id, halved every ``window * capacity`` increments.

    Raises ConfigError for bad parameters; the methods never raise for ints."""

    __slots__ = ("_counts", "_limit", "_since", "_window")

    def __init__(self, capacity_blocks: int, *, window: int = 10) -> None:
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ConfigError("window", window, "an integer >= 1")
        self._window = window
        self._counts: dict[int, int] = {}
        self._since = 0
        self._limit = 1
        self.resize(capacity_blocks)

    def resize(self, capacity_blocks: int) -> None:
        """The cache's capacity in blocks sets the window; the counts are kept."""
        if isinstance(capacity_blocks, bool) or not isinstance(capacity_blocks, int) or capacity_blocks < 1:
            raise ConfigError("capacity_blocks", capacity_blocks, "an integer >= 1")
        self._limit = self._window * capacity_blocks

    def add(self, block: int) -> int:
        """Count one access of ``block``; returns its count after it."""
        c = self._counts.get(block, 0) + 1
        self._counts[block] = c
        self._since += 1
        if self._since >= self._limit:
            self._age()
        return c

    def get(self, block: int) -> int:
        """``block``'s recent access count (0 if none)."""
        return self._counts.get(block, 0)

    def __len__(self) -> int:
        return len(self._counts)

    def _age(self) -> None:
        """Halve every count (dropping those that reach 0): old accesses weigh half."""
        self._since = 0
        self._counts = {b: c >> 1 for b, c in self._counts.items() if c > 1}
