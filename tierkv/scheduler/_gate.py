"""Fetch-vs-recompute gate: read a cached prefix from a tier only when that beats recomputing it.

Model (seconds)::

    fetch_s     = latency_s + stored_bytes / bandwidth_Bps + decode_s
    recompute_s = tokens / prefill_tokens_per_s
    stored_bytes = tokens * kv_bytes_per_token / compression_ratio

The gate fetches iff ``fetch_s < recompute_s``. It *fails closed* (never fetches) when recomputing is not
slower than a single round trip (``recompute_s <= latency_s``): no bandwidth could make the fetch win, and
an unmeasured tier must not be trusted. A zero-length prefix is never fetched.

Latency and bandwidth per tier are EWMAs of measured transfers (:class:`TierEstimator`), seeded with
configured values. All functions are pure; :class:`TierEstimator` is a small mutable accumulator that is not
thread-safe (the scheduler owns one per tier).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from .._errors import ConfigError

__all__ = [
    "GateDecision",
    "LoadFailurePolicy",
    "TierEstimator",
    "fetch_seconds",
    "gate",
    "parse_load_failure_policy",
    "recompute_seconds",
]


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
    """Outcome of :func:`gate`: ``fetch`` and both estimates, with the reason in words."""

    fetch: bool
    fetch_s: float
    recompute_s: float
    reason: str


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
