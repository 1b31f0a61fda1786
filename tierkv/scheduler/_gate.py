"""Fetch-vs-recompute gate: read a cached prefix from a tier only when that beats recomputing it.

Model (seconds)::

    fetch_s     = latency_s + stored_bytes / bandwidth_Bps + decode_s
    recompute_s = tokens / prefill_tokens_per_s
    stored_bytes = tokens * kv_bytes_per_token / compression_ratio

``decode_s`` is the time the tier's codec takes to turn the stored bytes back into KV (0 without a codec).
The gate fetches iff ``fetch_s < recompute_s``. It *fails closed* (never fetches) when recomputing is not
slower than a single round trip (``recompute_s <= latency_s``): no bandwidth could make the fetch win. A
zero-length prefix is never fetched.

Latency and bandwidth per tier are EWMAs of measured transfers (:class:`TierEstimator`), seeded with the
nominal figures of the tier's kind. An *unmeasured* tier (no transfer observed yet) is not trusted: until
its first measurement the gate uses its seed latency times :data:`UNMEASURED_PESSIMISM` and its seed
bandwidth divided by it (:meth:`TierEstimator.trusted`), so a fetch from it must win by that margin.

A tier the gate has turned down is *probed* at a bounded rate (:class:`ProbeSchedule`): at most one fetch
per ``interval_s`` of the scheduler's clock (the first one interval after the scheduler starts) goes ahead
anyway, so its estimator is re-measured and the gate can change its mind when the tier gets faster (or
was never measured). Such a decision has ``probe=True``.

All functions are pure; :class:`TierEstimator`, :class:`RateEstimator` and :class:`ProbeSchedule` are small
mutable accumulators that are not thread-safe (the scheduler owns one of each per tier).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from ..errors import ConfigError

__all__ = [
    "UNMEASURED_PESSIMISM",
    "GateDecision",
    "LoadFailurePolicy",
    "ProbeSchedule",
    "RateEstimator",
    "TierEstimator",
    "fetch_seconds",
    "gate",
    "parse_load_failure_policy",
    "recompute_seconds",
]


#: How much worse than its seed an unmeasured tier is assumed to be (latency x, bandwidth /).
UNMEASURED_PESSIMISM = 10.0


class LoadFailurePolicy(Enum):
    """What a failed fetch turns into: ``RECOMPUTE`` (a miss: the engine recomputes) or ``FAIL``
    (:class:`~tierkv.LoadFailedError` is raised to the caller)."""

    RECOMPUTE = "recompute"
    FAIL = "fail"


def parse_load_failure_policy(value: object, field: str = "scheduler.load_failure") -> LoadFailurePolicy:
    """Parse ``"recompute"`` / ``"fail"``; raise ``ConfigError`` otherwise."""
    for p in LoadFailurePolicy:
        if value == p.value or value is p:
            return p
    raise ConfigError(field, value, "'recompute' or 'fail'")


def _check(name: str, v: float, *, positive: bool = True) -> None:
    if not math.isfinite(v) or v < 0 or (positive and v == 0):
        raise ConfigError(name, v, "a finite number > 0" if positive else "a finite number >= 0")


def fetch_seconds(
    tokens: int,
    kv_bytes_per_token: float,
    bandwidth_Bps: float,
    latency_s: float,
    compression_ratio: float = 1.0,
    decode_s: float = 0.0,
) -> float:
    """Modelled time to fetch ``tokens`` of KV from a tier; ``ConfigError`` on a non-positive rate."""
    _check("bandwidth_Bps", bandwidth_Bps)
    _check("compression_ratio", compression_ratio)
    _check("latency_s", latency_s, positive=False)
    _check("decode_s", decode_s, positive=False)
    return latency_s + tokens * kv_bytes_per_token / compression_ratio / bandwidth_Bps + decode_s


def recompute_seconds(tokens: int, prefill_tokens_per_s: float) -> float:
    """Modelled time to recompute ``tokens`` of prefill."""
    _check("prefill_tokens_per_s", prefill_tokens_per_s)
    return tokens / prefill_tokens_per_s


@dataclass(frozen=True, slots=True)
class GateDecision:
    """Outcome of :func:`gate`: ``fetch`` and both estimates, with the reason in words. ``probe``: a
    fetch the estimates turned down, allowed to re-measure the tier (:class:`ProbeSchedule`)."""

    fetch: bool
    fetch_s: float
    recompute_s: float
    reason: str
    probe: bool = False


def gate(
    tokens: int,
    kv_bytes_per_token: float,
    bandwidth_Bps: float,
    latency_s: float,
    prefill_tokens_per_s: float,
    compression_ratio: float = 1.0,
    decode_s: float = 0.0,
) -> GateDecision:
    """Decide fetch vs recompute for a prefix of ``tokens`` (see the module docstring)."""
    if tokens < 0:
        raise ConfigError("tokens", tokens, "an integer >= 0")
    rec = recompute_seconds(tokens, prefill_tokens_per_s)
    fet = fetch_seconds(tokens, kv_bytes_per_token, bandwidth_Bps, latency_s, compression_ratio, decode_s)
    if tokens == 0:
        return GateDecision(False, fet, rec, "empty prefix")
    if rec <= latency_s:
        return GateDecision(False, fet, rec, "fail closed: recompute beats one round trip")
    if fet < rec:
        return GateDecision(True, fet, rec, "fetch is faster")
    return GateDecision(False, fet, rec, "recompute is faster")


class TierEstimator:
    """EWMA of a tier's latency (s) and bandwidth (bytes/s) from measured transfers.

    ``observe(nbytes, seconds)`` attributes a transfer to latency (small transfers, ``nbytes <=
    small_bytes``) or bandwidth (``nbytes / (seconds - latency)``). ``weight`` is the EWMA weight of a new
    sample. Invalid samples (non-positive or non-finite time) are ignored.
    """

    __slots__ = ("bandwidth_Bps", "latency_s", "samples", "small_bytes", "weight")
    # ``samples`` counts the valid transfers observed; 0: the seeds are all the estimator knows

    def __init__(self, latency_s: float, bandwidth_Bps: float, *, weight: float = 0.2, small_bytes: int = 4096) -> None:
        _check("latency_s", latency_s, positive=False)
        _check("bandwidth_Bps", bandwidth_Bps)
        if not 0.0 < weight <= 1.0:
            raise ConfigError("weight", weight, "a number in (0, 1]")
        self.latency_s = latency_s
        self.bandwidth_Bps = bandwidth_Bps
        self.weight = weight
        self.small_bytes = small_bytes
        self.samples = 0

    def observe(self, nbytes: int, seconds: float) -> None:
        if not math.isfinite(seconds) or seconds <= 0 or nbytes < 0:
            return
        w = self.weight
        self.samples += 1
        if nbytes <= self.small_bytes:
            self.latency_s = (1 - w) * self.latency_s + w * seconds
            return
        transfer = seconds - self.latency_s
        if transfer <= 0:
            return
        self.bandwidth_Bps = (1 - w) * self.bandwidth_Bps + w * (nbytes / transfer)

    @property
    def measured(self) -> bool:
        """Whether a transfer has been observed (else the estimates are only the seeds)."""
        return self.samples > 0

    def trusted(self, pessimism: float = UNMEASURED_PESSIMISM) -> tuple[float, float]:
        """(latency_s, bandwidth_Bps) the gate may rely on: the estimates once measured, else the seeds
        made ``pessimism`` times worse (see the module docstring)."""
        if self.measured:
            return self.latency_s, self.bandwidth_Bps
        return self.latency_s * pessimism, self.bandwidth_Bps / pessimism


class RateEstimator:
    """EWMA of a throughput in bytes/s (a codec's decode rate), seeded with a nominal rate.

    ``observe(nbytes, seconds)`` blends in ``nbytes / seconds`` with weight ``weight``; invalid samples
    (non-positive or non-finite time, negative bytes) are ignored. ``seconds_for(nbytes)`` is the modelled
    time for ``nbytes``.
    """

    __slots__ = ("rate_Bps", "samples", "weight")

    def __init__(self, rate_Bps: float, *, weight: float = 0.2) -> None:
        _check("rate_Bps", rate_Bps)
        if not 0.0 < weight <= 1.0:
            raise ConfigError("weight", weight, "a number in (0, 1]")
        self.rate_Bps = rate_Bps
        self.weight = weight
        self.samples = 0

    def observe(self, nbytes: int, seconds: float) -> None:
        if not math.isfinite(seconds) or seconds <= 0 or nbytes <= 0:
            return
        self.samples += 1
        self.rate_Bps = (1 - self.weight) * self.rate_Bps + self.weight * (nbytes / seconds)

    def seconds_for(self, nbytes: int) -> float:
        return nbytes / self.rate_Bps


class ProbeSchedule:
    """At most one probe per ``interval_s`` of a clock: ``due(now)`` says whether a probe may go now,
    ``take(now)`` records one. The first probe is due ``interval_s`` after ``start`` (pure: the caller
    passes the clock's readings)."""

    __slots__ = ("interval_s", "last", "taken")

    def __init__(self, interval_s: float, start: float = 0.0) -> None:
        _check("interval_s", interval_s)
        self.interval_s = interval_s
        self.last = start
        self.taken = 0

    def due(self, now: float) -> bool:
        return now - self.last >= self.interval_s

    def take(self, now: float) -> None:
        self.last = now
        self.taken += 1
