"""Agentic Markov chain over tool calls, per-tool KV size profiles and session memory classes.

* Transitions: first-order counts ``count[prev][next]``; ``predict(prev)`` returns the most frequent
  successor and its maximum-likelihood probability ``count / total`` (ties: the tool seen first).
* Size profile per tool: EWMA of the KV bytes a call adds (mean and variance, West's exponentially
  weighted update: ``d = x - mean; mean += w*d; var = (1-w)*(var + w*d*d)``) and the peak seen.
* Session class by memory demand (bytes of KV the session holds at its peak), thresholds in GiB:

  ======== ===============
  Light    < 1 GiB
  Medium   1 GiB .. 8 GiB
  Heavy    8 GiB .. 32 GiB
  Extreme  >= 32 GiB
  ======== ===============

  (1 GiB is ~8K tokens of Llama-3-8B FP16 KV (128 KiB/token); 32 GiB is a 100K-token Llama-3-70B context
  at 320 KiB/token.) Thresholds are configurable.

Not thread-safe; pure bookkeeping, no I/O.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from enum import Enum

from ..errors import ConfigError

__all__ = ["SessionClass", "SizeProfile", "ToolChain", "classify_session"]

GiB = 1 << 30


class SessionClass(Enum):
    LIGHT = "light"
    MEDIUM = "medium"
    HEAVY = "heavy"
    EXTREME = "extreme"


def classify_session(peak_bytes: int, thresholds: tuple[int, int, int] = (1 * GiB, 8 * GiB, 32 * GiB)) -> SessionClass:
    """Memory-demand class of a session from its peak KV bytes; ``ConfigError`` on unsorted thresholds."""
    a, b, c = thresholds
    if not 0 < a <= b <= c:
        raise ConfigError("scheduler.session_thresholds", thresholds, "three increasing byte sizes > 0")
    if peak_bytes < a:
        return SessionClass.LIGHT
    if peak_bytes < b:
        return SessionClass.MEDIUM
    if peak_bytes < c:
        return SessionClass.HEAVY
    return SessionClass.EXTREME


@dataclass(frozen=True, slots=True)
class SizeProfile:
    """KV size profile of one tool: EWMA mean and variance (bytes, bytes^2), peak, number of samples."""

    mean: float
    var: float
    peak: int
    n: int


class ToolChain:
    """First-order Markov chain over tool names with per-tool KV size profiles."""

    __slots__ = ("_counts", "_profiles", "_totals", "weight")

    def __init__(self, weight: float = 0.2) -> None:
        if not 0.0 < weight <= 1.0:
            raise ConfigError("scheduler.markov.weight", weight, "a number in (0, 1]")
        self.weight = weight
        self._counts: dict[str, dict[str, int]] = {}
        self._totals: dict[str, int] = {}
        self._profiles: dict[str, SizeProfile] = {}

    def observe_transition(self, prev: str, nxt: str) -> None:
        """Count one transition ``prev -> nxt``."""
        row = self._counts.setdefault(prev, {})
        row[nxt] = row.get(nxt, 0) + 1
        self._totals[prev] = self._totals.get(prev, 0) + 1

    def observe_sequence(self, tools: list[str]) -> None:
        """Count every consecutive pair of ``tools``."""
        for a, b in itertools.pairwise(tools):
            self.observe_transition(a, b)

    def count(self, prev: str, nxt: str) -> int:
        return self._counts.get(prev, {}).get(nxt, 0)

    def probability(self, prev: str, nxt: str) -> float:
        """ML estimate of P(next = nxt | prev); 0.0 when ``prev`` was never seen."""
        tot = self._totals.get(prev, 0)
        return self.count(prev, nxt) / tot if tot else 0.0

    def predict(self, prev: str) -> tuple[str, float] | None:
        """Most likely next tool and its probability, or None when ``prev`` has no successors yet."""
        row = self._counts.get(prev)
        if not row:
            return None
        best = max(row, key=lambda k: row[k])  # dicts keep insertion order: ties go to the first seen
        return best, row[best] / self._totals[prev]

    def observe_size(self, tool: str, nbytes: int) -> SizeProfile:
        """Fold a call's KV size into the tool's profile; return the new profile."""
        old = self._profiles.get(tool)
        x = float(nbytes)
        if old is None:
            prof = SizeProfile(mean=x, var=0.0, peak=nbytes, n=1)
        else:
            w = self.weight
            d = x - old.mean
            prof = SizeProfile(
                mean=old.mean + w * d,
                var=(1.0 - w) * (old.var + w * d * d),
                peak=max(old.peak, nbytes),
                n=old.n + 1,
            )
        self._profiles[tool] = prof
        return prof

    def profile(self, tool: str) -> SizeProfile | None:
        return self._profiles.get(tool)

    def reservation(self, prev: str, sigmas: float = 2.0) -> int:
        """Bytes to reserve ahead of the predicted next tool: P x (mean + sigmas x std), capped at its peak."""
        pred = self.predict(prev)
        if pred is None:
            return 0
        tool, p = pred
        prof = self._profiles.get(tool)
        if prof is None:
            return 0
        want = min(float(prof.peak), prof.mean + sigmas * prof.var**0.5)
        return int(p * want)
