"""Per-tier codec choice: pick the codec and level that minimize fetch + decode time.

For a tier that moves ``bandwidth`` bytes/s, fetching one byte of fp16 KV
encoded with compression ratio ``r`` and decoded at ``d`` bytes/s (of fp16
output, with ``parallelism`` decoding threads) costs::

    cost = 1 / (r * bandwidth) + 1 / (d * parallelism)      seconds per fp16 byte

The choice is the candidate of least cost. Two candidates ``a`` (more
compression) and ``b`` break even at::

    bandwidth* = (1/r_b - 1/r_a) / (1/d_a' - 1/d_b')       (d' = d * parallelism)

below ``bandwidth*`` the more compressed ``a`` is faster. Pure functions: no
I/O, no measurement (callers pass measured ratios and rates).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import InputError
from ._base import ParamValue

__all__ = [
    "MEASURED_CANDIDATES",
    "CodecCandidate",
    "CodecChoice",
    "break_even_bandwidth",
    "choose_codec",
    "fetch_decode_seconds",
]


@dataclass(frozen=True, slots=True)
class CodecCandidate:
    """A codec configuration with its measured behaviour on this model's KV.

    ``ratio`` is fp16 bytes / encoded bytes; ``decode_mbps``/``encode_mbps``
    are MB/s (1e6 bytes) of fp16 per core; ``lossy`` marks quantizing codecs;
    ``level`` is the codec level (0 for lossless).
    """

    codec: str
    params: Mapping[str, ParamValue]
    ratio: float
    decode_mbps: float
    encode_mbps: float = math.inf
    lossy: bool = False
    level: int = 0

    @property
    def label(self) -> str:
        """Unique name in choices: ``codec``, or ``codec:level[:entropy]`` for lossy candidates."""
        if not self.lossy:
            return self.codec
        entropy = self.params.get("entropy")
        return f"{self.codec}:{self.level}" + (f":{entropy}" if isinstance(entropy, str) else "")


@dataclass(frozen=True, slots=True)
class CodecChoice:
    """The chosen candidate and why (for ``stats()`` and traces).

    ``costs`` maps each considered candidate's label to its estimated seconds
    per MB of fp16 KV; ``break_even`` maps each candidate's label to the
    bandwidth (bytes/s) below which it beats the uncompressed-or-lossless
    baseline (the first allowed lossless candidate), ``inf`` if always,
    ``0`` if never.
    """

    chosen: CodecCandidate
    bandwidth: float
    parallelism: int
    costs: Mapping[str, float]
    break_even: Mapping[str, float]
    reason: str
    excluded: tuple[str, ...] = field(default=())

    def as_dict(self) -> dict[str, Any]:
        return {
            "codec": self.chosen.codec,
            "level": self.chosen.level,
            "params": dict(self.chosen.params),
            "bandwidth_bps": self.bandwidth,
            "parallelism": self.parallelism,
            "seconds_per_mb": dict(self.costs),
            "break_even_bps": dict(self.break_even),
            "excluded": list(self.excluded),
            "reason": self.reason,
        }


def fetch_decode_seconds(candidate: CodecCandidate, nbytes: float, bandwidth: float, parallelism: int = 1) -> float:
    """Estimated seconds to fetch and decode ``nbytes`` of fp16 KV encoded with ``candidate``."""
    if bandwidth <= 0 or candidate.ratio <= 0 or candidate.decode_mbps <= 0 or parallelism < 1:
        raise InputError("bandwidth, ratio, decode rate and parallelism must be positive")
    return nbytes / (candidate.ratio * bandwidth) + nbytes / (candidate.decode_mbps * 1e6 * parallelism)


def break_even_bandwidth(a: CodecCandidate, b: CodecCandidate, parallelism: int = 1) -> float:
    """Bandwidth (bytes/s) below which ``a`` costs less than ``b``.

    ``inf`` when ``a`` is never worse (compresses at least as much and decodes
    at least as fast), ``0.0`` when ``a`` is never better.
    """
    fetch_gain = 1.0 / b.ratio - 1.0 / a.ratio  # seconds per byte*bandwidth saved by a
    decode_loss = 1.0 / (a.decode_mbps * 1e6 * parallelism) - 1.0 / (b.decode_mbps * 1e6 * parallelism)
    if fetch_gain < 0:
        return 0.0
    if fetch_gain == 0:
        return math.inf if decode_loss < 0 else 0.0
    if decode_loss <= 0:
        return math.inf
    return fetch_gain / decode_loss


def choose_codec(
    candidates: Sequence[CodecCandidate],
    bandwidth: float,
    *,
    parallelism: int = 1,
    allow_lossy: bool = True,
    max_level: int | None = None,
) -> CodecChoice:
    """Choose the candidate with the least fetch + decode time at ``bandwidth`` bytes/s.

    ``allow_lossy=False`` keeps only lossless candidates; ``max_level`` drops
    lossy levels above it (a quality cap). Ties go to the earlier candidate.
    Raises :class:`~tierkv.InputError` when no candidate is allowed or the
    bandwidth is not positive. Pure.
    """
    if not bandwidth > 0 or parallelism < 1:
        raise InputError(f"bandwidth must be > 0 and parallelism >= 1, got {bandwidth}, {parallelism}")
    allowed: list[CodecCandidate] = []
    excluded: list[str] = []
    for c in candidates:
        if c.lossy and (not allow_lossy or (max_level is not None and c.level > max_level)):
            excluded.append(c.label)
        else:
            allowed.append(c)
    if not allowed:
        raise InputError("no codec candidate is allowed (all lossy and lossy disallowed or above max_level)")
    costs = {c.label: fetch_decode_seconds(c, 1e6, bandwidth, parallelism) for c in allowed}
    chosen = min(allowed, key=lambda c: costs[c.label])
    baseline = next((c for c in allowed if not c.lossy), allowed[0])
    break_even = {c.label: break_even_bandwidth(c, baseline, parallelism) for c in allowed if c is not baseline}
    reason = (
        f"{chosen.label}: {costs[chosen.label] * 1e3:.3f} ms/MB at {bandwidth / 1e9:.3g} GB/s "
        f"(ratio {chosen.ratio:.2f}, decode {chosen.decode_mbps:.0f} MB/s x{parallelism}); "
        f"baseline {baseline.label}: {costs[baseline.label] * 1e3:.3f} ms/MB"
    )
    return CodecChoice(
        chosen=chosen,
        bandwidth=bandwidth,
        parallelism=parallelism,
        costs=costs,
        break_even=break_even,
        reason=reason,
        excluded=tuple(excluded),
    )


def _cg(level: int, entropy: str, ratio: float, dec: float, enc: float) -> CodecCandidate:
    return CodecCandidate("cachegen", {"level": level, "entropy": entropy}, ratio, dec, enc, True, level)


#: Measured by ``tierkv codec-eval`` (benchmarks/results/codec_eval.json) on SmolLM2-135M KV, fp16 blocks of
#: 128 tokens: ratio vs fp16 and MB/s of fp16 per core, medians of 5 runs on a shared 2-core machine. Lossy
#: candidates: the default ``profile`` scheme, levels 1-3, with its default (tuned) zstd parameters (its
#: blocks need only the built-in profile, which every reader has). The default candidates of ``TierCodec``;
#: with its default two decoding threads, level 2 beats raw below about 1.25 GB/s.
MEASURED_CANDIDATES: tuple[CodecCandidate, ...] = (
    CodecCandidate("raw", {}, 1.000, 3297.0, 2856.0),
    CodecCandidate("lz4", {}, 1.000, 486.0, 1443.0),
    CodecCandidate("zstd", {}, 1.168, 455.0, 592.0),
    _cg(1, "zstd", 5.54, 644.0, 165.0),
    _cg(2, "zstd", 7.03, 736.0, 168.0),
    _cg(3, "zstd", 8.94, 783.0, 188.0),
)
