"""Calibration of a reuse predictor: reliability table (predicted vs observed reuse) and Brier score.

Pure functions, no I/O; the replay (``tierkv replay --calibration``) records the predictor's probability at
every block access and the trace gives the outcome.

* :func:`reuse_outcomes` -- the observed outcome of every block access of a trace: reused iff the same block
  is accessed again at a time in ``(t, t + horizon]`` (a later request at the *same* time does not count,
  as in :meth:`~tierkv.scheduler.ReusePredictor.advance`); *censored* (``None``) when the trace ends before
  ``t + horizon`` and no reuse was seen, because the outcome is then unknown.
* :func:`calibrate` -- bins the predicted probabilities into ``bins`` equal-width bins of ``[0, 1]``
  (deciles by default: ``[0, 0.1), [0.1, 0.2), ..., [0.9, 1.0]``, the last bin closed), and returns per bin
  the count, the mean predicted probability and the observed reuse frequency, plus the Brier score
  ``mean((p - o)^2)``, the base rate ``mean(o)`` and the expected calibration error
  ``sum(count_b / n * |mean_p_b - observed_b|)``; :attr:`Calibration.skill` compares the Brier score to the
  one of the constant base-rate predictor, ``base_rate * (1 - base_rate)``: ``1 - brier / that`` (None when
  every outcome is the same).

Bad input (different lengths, no observation, a probability outside ``[0, 1]`` or not finite, a negative
horizon, ``bins < 1``) raises :class:`~tierkv.errors.InputError` naming the problem.

Owns: :class:`CalibrationBin`, :class:`Calibration`, :func:`reuse_outcomes`, :func:`calibrate`,
:func:`format_calibration`. Imports only ``tierkv.errors`` from the library.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tierkv.errors import InputError

__all__ = ["Calibration", "CalibrationBin", "calibrate", "format_calibration", "reuse_outcomes"]


@dataclass(frozen=True, slots=True)
class CalibrationBin:
    """One bin of the reliability table: predictions in ``[lower, upper)`` (the last bin also holds 1.0).

    ``mean_predicted`` and ``observed`` are None when ``count`` is 0.
    """

    lower: float
    upper: float
    count: int
    mean_predicted: float | None
    observed: float | None


@dataclass(frozen=True, slots=True)
class Calibration:
    """Reliability table and scores of ``count`` (prediction, outcome) pairs (see the module docstring)."""

    bins: tuple[CalibrationBin, ...]
    count: int
    brier: float
    base_rate: float
    mean_predicted: float
    ece: float

    @property
    def skill(self) -> float | None:
        """Brier skill score against the constant base-rate predictor (None if all outcomes are equal)."""
        ref = self.base_rate * (1.0 - self.base_rate)
        return 1.0 - self.brier / ref if ref > 0 else None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: the scores and ``bins`` as a list of dicts."""
        return {
            "count": self.count,
            "brier": self.brier,
            "base_rate": self.base_rate,
            "mean_predicted": self.mean_predicted,
            "ece": self.ece,
            "skill": self.skill,
            "bins": [
                {
                    "lower": b.lower,
                    "upper": b.upper,
                    "count": b.count,
                    "mean_predicted": b.mean_predicted,
                    "observed": b.observed,
                }
                for b in self.bins
            ],
        }


def reuse_outcomes(
    times: Sequence[float],
    blocks: Sequence[Sequence[int]],
    horizon: float,
    credit: Sequence[Sequence[bool]] | None = None,
) -> list[list[bool | None]]:
    """Per request, per block: reused within ``(t, t + horizon]`` (True/False) or censored (None).

    ``times`` must be non-decreasing and as long as ``blocks``. ``credit`` (optional, shaped as ``blocks``):
    only a credited access counts as a reuse of the block's earlier accesses -- for instance the OPTgen
    verdicts the lab's predictor is trained on. O(accesses).
    """
    if len(times) != len(blocks):
        raise InputError(f"reuse_outcomes: {len(times)} times for {len(blocks)} requests")
    if credit is not None and (
        len(credit) != len(blocks) or any(len(c) != len(b) for c, b in zip(credit, blocks, strict=True))
    ):
        raise InputError("reuse_outcomes: credit is not shaped as blocks")
    if not (isinstance(horizon, (int, float)) and math.isfinite(horizon) and horizon >= 0):
        raise InputError(f"reuse_outcomes: horizon {horizon!r} must be a finite number >= 0")
    if not times:
        return []
    t_end = times[-1]
    nxt: dict[int, float] = {}  # block -> time of its next access strictly after the current time
    same: dict[int, float] = {}  # block -> time of its next access (maybe at the current time)
    out: list[list[bool | None]] = [[] for _ in blocks]
    prev_t = math.inf
    for i in range(len(blocks) - 1, -1, -1):
        t = times[i]
        if t > prev_t:
            raise InputError(f"reuse_outcomes: times not sorted at request {i} ({t} > {prev_t})")
        if t < prev_t:
            nxt.update(same)  # accesses at a later time become "strictly after"
            same = {}
        prev_t = t
        ids = blocks[i]
        row: list[bool | None] = [None] * len(ids)
        for j, b in enumerate(ids):
            tn = nxt.get(b)
            if tn is not None and tn <= t + horizon:
                row[j] = True
            elif t + horizon <= t_end:
                row[j] = False
        if credit is None:
            for b in ids:
                same[b] = t
        else:
            for b, c in zip(ids, credit[i], strict=True):
                if c:
                    same[b] = t
        out[i] = row
    return out


def calibrate(predicted: Sequence[float], outcomes: Sequence[bool], bins: int = 10) -> Calibration:
    """Reliability table in ``bins`` equal-width bins and the Brier score of ``predicted`` vs ``outcomes``."""
    if isinstance(bins, bool) or not isinstance(bins, int) or bins < 1:
        raise InputError(f"calibrate: bins {bins!r} must be an integer >= 1")
    n = len(predicted)
    if n != len(outcomes):
        raise InputError(f"calibrate: {n} predictions for {len(outcomes)} outcomes")
    if n == 0:
        raise InputError("calibrate: no (prediction, outcome) pair")
    cnt = [0] * bins
    psum = [0.0] * bins
    osum = [0] * bins
    sq = 0.0
    for k, (p, o) in enumerate(zip(predicted, outcomes, strict=True)):
        if not (isinstance(p, (int, float)) and 0.0 <= p <= 1.0):  # NaN fails both comparisons
            raise InputError(f"calibrate: prediction {k} is {p!r}, not a probability in [0, 1]")
        y = 1 if o else 0
        b = min(bins - 1, int(p * bins))
        cnt[b] += 1
        psum[b] += p
        osum[b] += y
        sq += (p - y) * (p - y)
    table = tuple(
        CalibrationBin(
            lower=b / bins,
            upper=(b + 1) / bins,
            count=cnt[b],
            mean_predicted=psum[b] / cnt[b] if cnt[b] else None,
            observed=osum[b] / cnt[b] if cnt[b] else None,
        )
        for b in range(bins)
    )
    ece = sum(abs(psum[b] - osum[b]) for b in range(bins)) / n  # = sum (c_b/n) |mean_p_b - obs_b|
    return Calibration(
        bins=table,
        count=n,
        brier=sq / n,
        base_rate=sum(osum) / n,
        mean_predicted=sum(psum) / n,
        ece=ece,
    )


def format_calibration(cal: Calibration, title: str = "") -> str:
    """The reliability table and the scores as text (one line per bin, empty bins shown with ``-``)."""
    lines = [title] if title else []
    lines.append(f"{'predicted':>14}{'count':>10}{'mean pred':>11}{'observed':>10}{'obs - pred':>12}")
    for b in cal.bins:
        rng = f"[{b.lower:.2f},{b.upper:.2f}{']' if b.upper >= 1.0 else ')'}"
        if b.mean_predicted is None or b.observed is None:
            lines.append(f"{rng:>14}{b.count:>10}{'-':>11}{'-':>10}{'-':>12}")
        else:
            diff = b.observed - b.mean_predicted
            lines.append(f"{rng:>14}{b.count:>10}{b.mean_predicted:>11.4f}{b.observed:>10.4f}{diff:>+12.4f}")
    skill = "-" if cal.skill is None else f"{cal.skill:.4f}"
    lines.append(
        f"n={cal.count}  Brier={cal.brier:.4f}  base rate={cal.base_rate:.4f}  "
        f"mean predicted={cal.mean_predicted:.4f}  ECE={cal.ece:.4f}  skill vs base rate={skill}"
    )
    return "\n".join(lines) + "\n"
