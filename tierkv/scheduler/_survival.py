"""Renewal-process model of "when does a session come back": online Kaplan-Meier survival per class.

A *period* is the time from a session's last turn (its start) to its next turn (an *event*: a later request
re-uses the session's prefix). Periods belong to a *class* (for instance turn number x prompt length); the
caller chooses the classes and a pooling *group* per class (classes of one group share a pooled hazard that
regularises classes with little data).

Ages are binned on a log scale, ``bins_per_octave`` bins per doubling of ``1 + age / unit_s``
(:func:`age_bin`), so the same configuration works for turn gaps of seconds or of hours.

Estimation (causal, no future information): a period that had its event at age ``g`` was at risk in bins
``0 .. bin(g)`` and contributes one event to ``bin(g)``; a period still pending at age ``a`` was at risk in the
bins it has *completed*, ``0 .. bin(a) - 1`` (right-censoring, Kaplan-Meier). Per class and bin::

    hazard = (events + m * pooled_hazard) / (at_risk + m)        (m = prior_strength)

where the pooled hazard is the group's own estimate shrunk the same way towards the all-class hazard. The
survival ``S`` at the bin edges is the product of ``1 - hazard``; beyond the last edge it stays flat (the
mass of "never comes back").

Score (:attr:`RenewalHazard.table`): for a session of age ``a`` and a horizon ``H`` (how long the cache can
keep a block: the caller passes its measured eviction age), the *hit density*::

    D(a) = (S(a) - S(a + H)) / integral_a^(a + H) S(u) du

-- the probability that the next turn arrives within ``H`` per unit of expected residence time (Beckmann et
al.'s LHD, NSDI'18, applied to turns). Keeping a block of the session for the next ``H`` seconds earns ``D``
hits per block-second in expectation; the cache keeps the blocks with the highest ``D``. The table is
recomputed by :meth:`RenewalHazard.refresh` (vectorised, O(periods)); looking a score up is a list index.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ..errors import ConfigError

__all__ = ["RenewalHazard", "age_bin", "bin_lower_edges", "hit_density", "km_survival"]


def age_bin(age: float, bins_per_octave: int, n_bins: int, unit_s: float = 1.0) -> int:
    """Bin of an age in seconds: ``floor(bins_per_octave * log2(1 + age / unit_s))`` clipped to the last bin."""
    if age <= 0.0:
        return 0
    b = int(bins_per_octave * math.log2(1.0 + age / unit_s))
    return b if b < n_bins else n_bins - 1


def bin_lower_edges(bins_per_octave: int, n_bins: int, unit_s: float = 1.0) -> np.ndarray:
    """Lower edge (seconds) of every bin, plus the upper edge of the last closed bin: ``n_bins + 1`` values."""
    k = np.arange(n_bins + 1, dtype=np.float64)
    return np.asarray(unit_s * (np.exp2(k / bins_per_octave) - 1.0))


def km_survival(hazard: np.ndarray) -> np.ndarray:
    """Survival at the bin edges from per-bin hazards (last axis): ``S[0] = 1``, ``S[k+1] = S[k] (1 - h[k])``."""
    h = np.clip(hazard, 0.0, 1.0)
    surv = np.cumprod(1.0 - h, axis=-1)
    ones = np.ones((*h.shape[:-1], 1))
    return np.concatenate([ones, surv], axis=-1)


def hit_density(
    edges: np.ndarray, surv: np.ndarray, ages: np.ndarray, horizon: float, per_time: bool = True
) -> np.ndarray:
    """``(S(a) - S(a+H)) / integral_a^(a+H) S`` for each age, ``S`` piecewise linear between ``edges``.

    ``S`` is constant beyond the last edge. Returns 0 where the integral is 0 (nothing survives). With
    ``per_time=False``: the conditional probability ``(S(a) - S(a+H)) / S(a)`` instead.
    """
    if horizon <= 0:
        raise ValueError("horizon must be > 0")
    big = edges[-1] + horizon * 4.0 + ages.max(initial=0.0) + 1.0
    x = np.concatenate([edges, [big]])
    s = np.concatenate([surv, [surv[-1]]])
    cum = np.concatenate([[0.0], np.cumsum(0.5 * (s[1:] + s[:-1]) * np.diff(x))])
    s_a, s_b = np.interp(ages, x, s), np.interp(ages + horizon, x, s)
    c_a, c_b = np.interp(ages, x, cum), np.interp(ages + horizon, x, cum)
    area = c_b - c_a if per_time else s_a
    return np.asarray(np.divide(s_a - s_b, area, out=np.zeros_like(area), where=area > 1e-12))


class RenewalHazard:
    """Online per-class survival of inter-turn gaps and the hit-density score table (single-threaded).

    ``start(now, cls)`` opens a period and returns its id; ``event(pid, now)`` records that the period's
    session came back (no-op if it already did); ``refresh(now, horizon)`` re-estimates and rebuilds
    :attr:`table` (``table[cls][age_bin]``). Times are seconds, non-decreasing. Invalid configuration raises
    ``ConfigError``; nothing raises afterwards.
    """

    __slots__ = (
        "_base",
        "_cls",
        "_gap",
        "_start",
        "bins_per_octave",
        "edges",
        "groups",
        "max_periods",
        "n_bins",
        "n_classes",
        "prior_strength",
        "table",
        "unit_s",
    )

    def __init__(
        self,
        groups: Sequence[int],
        bins_per_octave: int = 4,
        n_bins: int = 64,
        unit_s: float = 1.0,
        prior_strength: float = 20.0,
        max_periods: int = 200_000,
    ) -> None:
        if not groups or any(isinstance(g, bool) or not isinstance(g, int) or g < 0 for g in groups):
            raise ConfigError("scheduler.survival.groups", list(groups), "a non-empty list of integers >= 0")
        for name, v in (("bins_per_octave", bins_per_octave), ("n_bins", n_bins), ("max_periods", max_periods)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"scheduler.survival.{name}", v, "an integer >= 1")
        for name, f in (("unit_s", unit_s), ("prior_strength", prior_strength)):
            if not (isinstance(f, (int, float)) and math.isfinite(f) and f > 0):
                raise ConfigError(f"scheduler.survival.{name}", f, "a finite number > 0")
        self.groups = list(groups)
        self.n_classes = len(groups)
        self.bins_per_octave = bins_per_octave
        self.n_bins = n_bins
        self.unit_s = float(unit_s)
        self.prior_strength = float(prior_strength)
        self.max_periods = max_periods
        self.edges = bin_lower_edges(bins_per_octave, n_bins, unit_s)
        self._base = 0  # id of self._start[0]
        self._start: list[float] = []
        self._cls: list[int] = []
        self._gap: list[float] = []  # -1.0 while pending
        self.table: list[list[float]] = [[0.0] * n_bins for _ in groups]

    def bin(self, age: float) -> int:
        """:func:`age_bin` with this model's parameters."""
        return age_bin(age, self.bins_per_octave, self.n_bins, self.unit_s)

    def start(self, now: float, cls: int) -> int:
        """Open a period of class ``cls`` at ``now``; return its id (forgotten after ``max_periods`` newer ones)."""
        self._start.append(now)
        self._cls.append(cls)
        self._gap.append(-1.0)
        return self._base + len(self._start) - 1

    def event(self, pid: int, now: float) -> bool:
        """Record the period's event at ``now``; return False if it already had one (nothing changes)."""
        i = pid - self._base
        if i < 0 or i >= len(self._gap) or self._gap[i] >= 0.0:
            return False
        self._gap[i] = max(0.0, now - self._start[i])
        return True

    def counts(self, now: float) -> tuple[np.ndarray, np.ndarray]:
        """``(events, at_risk)`` per class and bin, each ``(n_classes, n_bins)``, as of ``now``."""
        nb, nc = self.n_bins, self.n_classes
        if len(self._start) > self.max_periods:
            drop = len(self._start) - self.max_periods
            del self._start[:drop], self._cls[:drop], self._gap[:drop]  # forget the oldest periods
            self._base += drop
        ev = np.zeros((nc, nb))
        risk = np.zeros((nc, nb))
        if not self._start:
            return ev, risk
        st = np.asarray(self._start)
        cl = np.asarray(self._cls, dtype=np.int64)
        gp = np.asarray(self._gap)
        done = gp >= 0.0
        age = np.where(done, gp, np.maximum(now - st, 0.0))
        b = np.minimum((self.bins_per_octave * np.log2(1.0 + age / self.unit_s)).astype(np.int64), nb - 1)
        last = np.where(done, b, b - 1)  # pending: only completed bins are at risk
        row = cl * (nb + 1)
        diff = np.bincount(row, minlength=nc * (nb + 1)).astype(np.float64)
        ok = last >= 0
        diff -= np.bincount(row[ok] + last[ok] + 1, minlength=nc * (nb + 1))
        diff -= np.bincount(row[~ok], minlength=nc * (nb + 1))
        risk = np.cumsum(diff.reshape(nc, nb + 1), axis=1)[:, :nb]
        ev = np.bincount(cl[done] * nb + b[done], minlength=nc * nb).astype(np.float64).reshape(nc, nb)
        return ev, risk

    def hazard(self, now: float) -> np.ndarray:
        """Shrunk per-bin hazard per class, ``(n_classes, n_bins)`` (see the module docstring)."""
        ev, risk = self.counts(now)
        m = self.prior_strength
        g = np.asarray(self.groups)
        all_e, all_r = ev.sum(axis=0), risk.sum(axis=0)
        h_all = np.divide(all_e, all_r, out=np.zeros_like(all_e), where=all_r > 0)
        n_groups = int(g.max()) + 1
        ge = np.zeros((n_groups, self.n_bins))
        gr = np.zeros((n_groups, self.n_bins))
        np.add.at(ge, g, ev)
        np.add.at(gr, g, risk)
        h_group = (ge + m * h_all) / (gr + m)
        return np.asarray((ev + m * h_group[g]) / (risk + m))

    def refresh(self, now: float, horizon: float, per_time: bool = True) -> None:
        """Re-estimate the survival curves and rebuild :attr:`table` for ``horizon`` seconds (> 0).

        ``per_time=False`` scores by the probability of a turn within the horizon instead of the density.
        """
        surv = km_survival(self.hazard(now))
        e = self.edges
        mids = np.concatenate([[0.0], np.sqrt(np.maximum(e[1:-1], 1e-9) * e[2:])])  # age 0 for bin 0
        self.table = [hit_density(e, surv[c], mids, horizon, per_time).tolist() for c in range(self.n_classes)]

    @property
    def periods(self) -> int:
        """Number of periods remembered."""
        return len(self._start)
