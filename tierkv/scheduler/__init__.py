"""Predictive scheduler: the pure decision logic (no I/O).

* :class:`ReusePredictor` -- Beta posteriors per (block type x transition) with per-block evidence.
* :class:`ResponseModel` -- per answer-length class calibration, applied when a request completes.
* :class:`TauAdapter` -- online choice of the ranking's recency time constant by sampled shadow caches, and
  (adaptive policy) of recency, recency with frequency admission, or the predictor.
* :class:`SessionPolicy` -- conversations as renewal processes ranked by learned hit density: the lab's
  ``lab-tierkv-session`` and the adaptive policy's session shadow (:class:`SessionOptions`).
* :class:`FrequencySketch` -- recent access counts per block (TinyLFU's history) for the admission filter.
* :class:`HeadImportance` -- head-granular EMA attention importance (GQA max, MLA per layer).
* :class:`PrefetchPlanner` -- RoPE-aware prefetch plan per layer class (sliding/global, sinks, importance);
  :class:`PrefetchWindow` the span EMA per class (and the old readahead).
* :class:`ToolChain` -- agentic Markov chain over tools with KV size profiles; session classes.
* :func:`gate` -- fetch-vs-recompute decision; :class:`TierEstimator` EWMA of tier latency/bandwidth,
  :class:`RateEstimator` (codec decode rate), :class:`ProbeSchedule` (bounded re-measuring of gated tiers).
* :class:`CircuitBreaker` -- per-tier health (closed / open / half-open) with an injectable clock.
* :func:`placement_value`, :func:`choose_tier` -- dollar value per block and tier, hysteresis.

Importing this package does no I/O and imports neither matplotlib nor torch. The trace-replay lab that
measures these decisions offline is :mod:`tierkv.lab` (it imports this package; this package never imports it).
"""

from ._admission import FrequencySketch
from ._breaker import BreakerState, CircuitBreaker
from ._gate import (
    UNMEASURED_PESSIMISM,
    GateDecision,
    LoadFailurePolicy,
    ProbeSchedule,
    RateEstimator,
    TierEstimator,
    fetch_seconds,
    gate,
    parse_load_failure_policy,
    recompute_seconds,
)
from ._importance import HeadImportance
from ._markov import SessionClass, SizeProfile, ToolChain, classify_session
from ._placement import (
    DEFAULT_TIER_USD_PER_GB_HOUR,
    PlacementConfig,
    choose_tier,
    is_protected,
    placement_value,
    should_move,
)
from ._predictor import (
    BLOCK_TYPES,
    TRANSITIONS,
    PredictorConfig,
    ReusePredictor,
    beta_mean,
    blend,
    cell_index,
    confidence,
    count_bucket,
    derive_block_type,
    derive_transition,
    fanout_bucket,
    size_bucket,
)
from ._prefetch import LayerClass, PrefetchPlan, PrefetchPlanner, PrefetchWindow, attention_span, layer_classes
from ._response import ResponseModel, completion_time, response_class
from ._session import SessionOptions, SessionPolicy, session_class
from ._survival import RenewalHazard, age_bin, bin_lower_edges, hit_density, km_survival
from ._tau import TauAdapter

__all__ = [
    "BLOCK_TYPES",
    "DEFAULT_TIER_USD_PER_GB_HOUR",
    "TRANSITIONS",
    "UNMEASURED_PESSIMISM",
    "BreakerState",
    "SessionOptions",
    "SessionPolicy",
    "CircuitBreaker",
    "FrequencySketch",
    "GateDecision",
    "HeadImportance",
    "LayerClass",
    "LoadFailurePolicy",
    "PlacementConfig",
    "PredictorConfig",
    "PrefetchPlan",
    "PrefetchPlanner",
    "PrefetchWindow",
    "ProbeSchedule",
    "RateEstimator",
    "RenewalHazard",
    "ResponseModel",
    "ReusePredictor",
    "SessionClass",
    "SizeProfile",
    "TauAdapter",
    "TierEstimator",
    "ToolChain",
    "age_bin",
    "attention_span",
    "bin_lower_edges",
    "beta_mean",
    "blend",
    "cell_index",
    "choose_tier",
    "classify_session",
    "completion_time",
    "confidence",
    "count_bucket",
    "derive_block_type",
    "derive_transition",
    "fanout_bucket",
    "fetch_seconds",
    "gate",
    "hit_density",
    "km_survival",
    "session_class",
    "layer_classes",
    "is_protected",
    "parse_load_failure_policy",
    "placement_value",
    "recompute_seconds",
    "response_class",
    "should_move",
    "size_bucket",
]
