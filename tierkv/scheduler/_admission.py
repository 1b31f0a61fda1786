"""Frequency-based admission: the access history TinyLFU admits by (pure, no I/O).

A cache that admits every missed block lets a burst of one-shot prompts flush what is reused. TinyLFU's
answer is an *admission filter*: when the cache is full, a missed block is stored only if it was
accessed more often recently than the block it would evict. :class:`FrequencySketch` keeps that
history: an estimated count per block id over a sliding window of about ``window`` x the cache's
capacity in accesses (every count halved when the window fills, TinyLFU's "reset"), including blocks
that are not or no longer cached. It is a count-min sketch with conservative update: ``depth`` rows
of 8-bit counters, each row's width the power of two at or above ``width`` x the capacity, so its
memory is fixed by the capacity (``depth x width`` bytes per block of capacity, 64 by default), never
by how many distinct blocks pass by. A count is never underestimated; a block shares all its
counters with others (an overestimate) with a probability that stays small while the window's
distinct blocks are fewer than the row's width.

The library's adaptive policy applies the filter only while a sampled shadow of "LRU + this filter"
beats a plain LRU shadow (:class:`~tierkv.scheduler.TauAdapter`, ``admit_mode``): on a workload where
first accesses are usually reused (a conversation's next turn, an agent loop) admission loses badly,
on one flooded by one-shot prompts it wins.

Owns: the counts and their aging. Not thread-safe (one event loop, or the replay's thread).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ConfigError

__all__ = ["FrequencySketch"]

_M1 = 0x9E3779B97F4A7C15  # odd 64-bit mixers (splitmix64's): the row hashes of a block id
_M2 = 0xBF58476D1CE4E5B9
_MASK = (1 << 64) - 1
_MAX = 255  # a counter saturates (8 bits)
_FRESH_MAX = 15  # ... or, ``fresh``, at TinyLFU's 4 bits


def positive_int(name: str, v: object) -> int:
    """``v`` if it is an int >= 1 (not a bool), else ConfigError naming ``name`` (the scheduler's check)."""
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ConfigError(name, v, "an integer >= 1")
    return v


class FrequencySketch:
    """Estimated recent access counts per integer block id, halved every ``window * capacity`` increments.

    ``width`` (counters per row per block of capacity, rounded up to a power of two per row) and
    ``depth`` (rows) size the table. ``fresh``: age about as TinyLFU's reference implementation (Caffeine's
    ``FrequencySketch.reset``, without its correction for the odd counts' truncation) does -- counters
    saturate at 15 (one per byte still), an increment of a saturated count is not counted towards the
    window, and a halving sets the window's count to half the window instead of restarting it, so that
    after the first every halving comes after ``window * capacity / 2`` counted increments: the counts
    describe a shorter past (the adaptive policy's second segmented shadow, ``TauAdapter``). Raises
    ConfigError for bad parameters; the methods never raise for ints (any int is a valid id: its low
    64 bits are hashed)."""

    __slots__ = ("_depth", "_fresh", "_limit", "_max", "_shift", "_since", "_table", "_width", "_window")

    def __init__(
        self, capacity_blocks: int, *, window: int = 10, width: int = 16, depth: int = 4, fresh: bool = False
    ) -> None:
        self._fresh = bool(fresh)
        self._max = _FRESH_MAX if fresh else _MAX
        self._window = positive_int("window", window)
        self._width = positive_int("width", width)
        self._depth = positive_int("depth", depth)
        if depth > 8:
            raise ConfigError("depth", depth, "an integer in [1, 8]")
        self._since = 0
        self._limit = 1
        self._shift = 64
        self._table = bytearray()
        self.resize(capacity_blocks)

    def resize(self, capacity_blocks: int) -> None:
        """The cache's capacity in blocks sets the window and the table's width. The counts are kept
        unless the table must grow (a capacity past its width): then they start again from zero."""
        cap = positive_int("capacity_blocks", capacity_blocks)
        self._limit = self._window * cap
        bits = max(4, (self._width * cap - 1).bit_length())  # a row of 2**bits counters
        if 64 - bits >= self._shift:
            return  # wide enough already
        self._shift = 64 - bits
        self._table = bytearray(self._depth << bits)
        self._since = 0

    @property
    def nbytes(self) -> int:
        """The table's size in bytes (fixed by the capacity, see the module docstring)."""
        return len(self._table)

    def _cells(self, block: int) -> list[int]:
        h = ((block & _MASK) * _M1) & _MASK
        g = (((h ^ (h >> 31)) * _M2) & _MASK) | 1
        sh, row = self._shift, 1 << (64 - self._shift)
        return [r * row + (((h + r * g) & _MASK) >> sh) for r in range(self._depth)]

    def add(self, block: int) -> int:
        """Count one access of ``block``; returns its estimated count after it."""
        t = self._table
        cells = self._cells(block)
        c = min(t[i] for i in cells)
        if c < self._max:
            c += 1
            for i in cells:  # conservative update: only the counters at the minimum grow
                if t[i] < c:
                    t[i] = c
        elif self._fresh:
            return c  # (not counted towards the window)
        self._since += 1
        if self._since >= self._limit:
            self._age()
        return c

    def get(self, block: int) -> int:
        """``block``'s estimated recent access count (0 if none)."""
        t = self._table
        return min(t[i] for i in self._cells(block))

    def _age(self) -> None:
        """Halve every count: old accesses weigh half (a count of 1 is dropped)."""
        self._since = self._limit // 2 if self._fresh else 0
        # a view made here, not kept: a copy or pickle of the sketch must not share the original's table
        view: np.ndarray[Any, Any] = np.frombuffer(self._table, dtype=np.uint8)
        view >>= 1
