"""Placement value per block and tier, thresholds and hysteresis (pure functions).

Value of holding a block on a tier for the next ``hold_s`` seconds, in US dollars::

    value = P(reuse) x (recompute_s - fetch_s(tier)) x gpu_usd_per_s  -  bytes x hold_s x storage_usd_per_byte_s(tier)

``recompute_s = tokens / prefill_rate`` is the GPU time a hit saves, minus the time to fetch from that tier.
A block is worth keeping on a tier when its value is positive; it moves to another tier only when the other
tier's value beats the current one by the hysteresis margin (relative ``rel`` of ``|current|`` plus an
absolute ``abs_usd``), so placements do not flap. Blocks with a prefix fanout of at least
``protect_fanout`` are protected: never evicted, only demoted.

Default tier costs, $/GB/hour (assumptions, 2024-2025 public list prices divided by capacity):

========  ========  ==========================================================================
tier      $/GB/h    source of the assumption
========  ========  ==========================================================================
hbm       0.04      H100 80 GB at ~$3/h per GPU on demand, all of it attributed to memory
dram      0.005     memory-optimised cloud VM (e.g. r7i: ~$0.13/h per 16 GiB incl. vCPUs)
cxl       0.003     CXL expander memory priced ~40% below DIMM DRAM
rdma      0.006     pooled remote DRAM: DRAM plus NIC/network share
nvme      0.0002    local NVMe of storage-optimised VMs (e.g. i4i: ~$0.17/h per 468 GB)
pfs       0.0002    parallel/network filesystem (e.g. FSx for Lustre ~$0.14/GB-month)
========  ========  ==========================================================================

GPU time is priced at ``gpu_usd_per_hour`` (default 3.0). All values are configurable.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..errors import ConfigError

__all__ = [
    "DEFAULT_TIER_USD_PER_GB_HOUR",
    "PlacementConfig",
    "choose_tier",
    "is_protected",
    "placement_value",
    "should_move",
]

DEFAULT_TIER_USD_PER_GB_HOUR: dict[str, float] = {
    "hbm": 0.04,
    "dram": 0.005,
    "cxl": 0.003,
    "rdma": 0.006,
    "nvme": 0.0002,
    "pfs": 0.0002,
}


@dataclass(frozen=True, slots=True)
class PlacementConfig:
    """Prices and margins; ``ConfigError`` on negative or non-finite numbers."""

    tier_usd_per_gb_hour: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_TIER_USD_PER_GB_HOUR))
    gpu_usd_per_hour: float = 3.0
    hold_s: float = 300.0
    rel: float = 0.2
    abs_usd: float = 1e-7
    protect_fanout: int = 4

    def __post_init__(self) -> None:
        for name in ("gpu_usd_per_hour", "hold_s", "rel", "abs_usd"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ConfigError(f"scheduler.placement.{name}", v, "a finite number >= 0")
        for tier, v in self.tier_usd_per_gb_hour.items():
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ConfigError(f"scheduler.placement.tier_usd_per_gb_hour.{tier}", v, "a finite number >= 0")
        if isinstance(self.protect_fanout, bool) or not isinstance(self.protect_fanout, int) or self.protect_fanout < 1:
            raise ConfigError("scheduler.placement.protect_fanout", self.protect_fanout, "an integer >= 1")


def placement_value(
    p_reuse: float,
    tokens: int,
    nbytes: int,
    tier: str,
    fetch_s: float,
    prefill_tokens_per_s: float,
    config: PlacementConfig,
) -> float:
    """Dollar value of holding the block on ``tier`` for ``config.hold_s`` (see the module docstring)."""
    if not 0.0 <= p_reuse <= 1.0:
        raise ConfigError("p_reuse", p_reuse, "a probability in [0, 1]")
    if tier not in config.tier_usd_per_gb_hour:
        raise ConfigError("tier", tier, "one of " + ", ".join(config.tier_usd_per_gb_hour))
    if prefill_tokens_per_s <= 0:
        raise ConfigError("prefill_tokens_per_s", prefill_tokens_per_s, "a number > 0")
    saved_s = max(0.0, tokens / prefill_tokens_per_s - fetch_s)
    gain = p_reuse * saved_s * config.gpu_usd_per_hour / 3600.0
    storage = nbytes / 1e9 * config.tier_usd_per_gb_hour[tier] * config.hold_s / 3600.0
    return gain - storage


def should_move(current_value: float, candidate_value: float, config: PlacementConfig) -> bool:
    """True iff the candidate beats the current placement by the hysteresis margin."""
    return candidate_value > current_value + config.rel * abs(current_value) + config.abs_usd


def choose_tier(values: Mapping[str, float], current: str | None, config: PlacementConfig) -> str | None:
    """Where the block should live: the best-valued tier if it clears hysteresis, else ``current``.

    ``current is None`` means not resident (admission: best tier if its value > 0). Returns None when the
    block should be dropped: every value <= 0 (the caller applies :func:`is_protected` first).
    """
    if not values:
        return None
    best = max(values, key=lambda t: values[t])
    if current is None or current not in values:
        return best if values[best] > 0 else None
    if values[current] <= 0 and values[best] <= 0:
        return None
    if best != current and should_move(values[current], values[best], config):
        return best
    return current


def is_protected(fanout: int, config: PlacementConfig) -> bool:
    """High-fanout prefixes (shared by ``protect_fanout`` sessions or more) are never evicted."""
    return fanout >= config.protect_fanout
