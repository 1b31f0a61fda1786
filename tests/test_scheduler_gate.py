from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tierkv import ConfigError
from tierkv._scheduling import SchedulerState
from tierkv.scheduler import (
    UNMEASURED_PESSIMISM,
    LoadFailurePolicy,
    ProbeSchedule,
    RateEstimator,
    TierEstimator,
    gate,
    parse_load_failure_policy,
)

LLAMA70_FP16 = 327_680  # bytes of KV per token (80 layers x 8 KV heads x 128 x 2 x 2 B)
PREFILL = 5_000.0
CTX = 8_192


def gbps(x: float) -> float:
    return x * 1e9 / 8


@pytest.mark.parametrize(
    ("bandwidth", "rtt", "ratio", "fetch"),
    [
        (gbps(100), 1e-3, 1.0, True),
        (gbps(1), 20e-3, 1.0, False),
        (gbps(5), 1e-3, 1.0, False),
        (gbps(5), 1e-3, 3.5, True),
    ],
)
def test_seed_table(bandwidth: float, rtt: float, ratio: float, fetch: bool) -> None:
    d = gate(CTX, LLAMA70_FP16, bandwidth, rtt, PREFILL, compression_ratio=ratio)
    assert d.fetch is fetch
    assert d.recompute_s == pytest.approx(CTX / PREFILL)


def test_seed_numbers() -> None:
    d = gate(CTX, LLAMA70_FP16, gbps(5), 0.0, PREFILL)
    assert d.fetch_s == pytest.approx(4.29, abs=0.01)
    d = gate(CTX, LLAMA70_FP16, gbps(5), 0.0, PREFILL, compression_ratio=3.5)
    assert d.fetch_s == pytest.approx(1.227, abs=0.01)


def test_zero_length_prefix_never_fetched() -> None:
    d = gate(0, LLAMA70_FP16, 1e15, 0.0, PREFILL)
    assert not d.fetch and d.reason == "empty prefix"


def test_fail_closed_when_recompute_beats_round_trip() -> None:
    # 10 tokens recompute in 2 ms; the round trip alone is 5 ms -> never fetch, whatever the bandwidth
    d = gate(10, 1.0, 1e18, 5e-3, PREFILL)
    assert not d.fetch and "fail closed" in d.reason


@given(
    st.integers(1, 200_000),
    st.floats(1e6, 1e12),
    st.floats(0, 0.1),
    st.floats(100, 1e6),
    st.floats(1.0, 10.0),
)
def test_gate_consistent_with_estimates(tokens: int, bw: float, lat: float, rate: float, ratio: float) -> None:
    d = gate(tokens, 131_072, bw, lat, rate, compression_ratio=ratio)
    if d.fetch:
        assert d.fetch_s < d.recompute_s and d.recompute_s > lat
    else:
        assert d.fetch_s >= d.recompute_s or d.recompute_s <= lat


def test_bad_inputs() -> None:
    with pytest.raises(ConfigError):
        gate(10, 1.0, 0.0, 0.0, PREFILL)
    with pytest.raises(ConfigError):
        gate(-1, 1.0, 1.0, 0.0, PREFILL)
    with pytest.raises(ConfigError):
        gate(10, 1.0, 1.0, 0.0, 0.0)


def test_load_failure_policy() -> None:
    assert parse_load_failure_policy("recompute") is LoadFailurePolicy.RECOMPUTE
    assert parse_load_failure_policy("fail") is LoadFailurePolicy.FAIL
    with pytest.raises(ConfigError):
        parse_load_failure_policy("retry")


def test_estimator_ewma() -> None:
    est = TierEstimator(latency_s=1e-3, bandwidth_Bps=1e9, weight=0.5)
    est.observe(100, 3e-3)  # small: latency sample
    assert est.latency_s == pytest.approx(2e-3)
    est.observe(10**9, 0.002 + 0.25)  # 4 GB/s after subtracting latency
    assert est.bandwidth_Bps == pytest.approx(0.5 * 1e9 + 0.5 * 4e9)
    est.observe(10**9, -1.0)  # ignored
    assert est.samples == 2
    with pytest.raises(ConfigError):
        TierEstimator(0.0, 0.0)


# ------------------------------------------------- SchedulerState.gate (issue 18 item 20)

TOKENS = 1024
BPT = 100_000  # raw KV bytes per token: the prefix is 102.4 MB
RAW = TOKENS * BPT
RATE = TOKENS / 0.020  # recompute takes 20 ms
# DRAM seeds (DEFAULT_TIER_PERFORMANCE): 5 us, 20 GB/s -> 5.1 ms; an unmeasured tier is taken 10x slower: 51 ms


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def state(clock: Clock, **opts: object) -> SchedulerState:
    return SchedulerState({"prefill_tokens_per_s": RATE, **opts}, ["dram"], ["dram"], clock=clock)


def measure(s: SchedulerState, seconds_per_raw: float, n: int = 30) -> None:
    """``n`` transfers of the whole prefix, each taking ``seconds_per_raw`` (plus the seed latency)."""
    est = s.estimators[0]
    for _ in range(n):
        est.observe(RAW, est.latency_s + seconds_per_raw)


def test_unmeasured_tier_is_not_trusted() -> None:
    clock = Clock()
    s = state(clock)
    assert not s.estimators[0].measured
    d = s.gate(TOKENS, {0: RAW})
    assert d is not None and not d.fetch and not d.probe
    lat, bw = s.estimators[0].trusted()
    assert lat == pytest.approx(5e-6 * UNMEASURED_PESSIMISM) and bw == pytest.approx(2e10 / UNMEASURED_PESSIMISM)
    assert d.fetch_s == pytest.approx(lat + RAW / bw)
    measure(s, RAW / 2e10, n=1)  # one transfer at the seed bandwidth: now it is measured and trusted
    d = s.gate(TOKENS, {0: RAW})
    assert d is not None and d.fetch and d.fetch_s == pytest.approx(5e-6 + RAW / 2e10, rel=1e-3)


def test_decode_time_from_the_tiers_codec() -> None:
    clock = Clock()
    s = state(clock)
    measure(s, RAW / 2e10)
    assert s.gate(TOKENS, {0: RAW}).fetch  # type: ignore[union-attr]
    # a codec decoding 1 GB/s: 102 ms of decode loses to 20 ms of recompute
    s.set_codec(0, ratio=1.0, decode_Bps=1e9)
    d = s.gate(TOKENS, {0: RAW})
    assert d is not None and not d.fetch
    assert d.fetch_s == pytest.approx(5e-6 + RAW / 2e10 + RAW / 1e9, rel=1e-3)
    # measured decodes at 50 GB/s bring it back (and a ratio of 4 divides the transfer)
    for _ in range(40):
        s.observe_decode(0, RAW, RAW / 50e9)
    s.set_codec(0, ratio=4.0, decode_Bps=1e9)  # re-chosen: the measured decode rate is kept
    d = s.gate(TOKENS, {0: RAW})
    assert d is not None and d.fetch
    assert d.fetch_s == pytest.approx(5e-6 + RAW / 4 / 2e10 + RAW / s.codecs[0][1].rate_Bps, rel=1e-3)  # type: ignore[index]
    s.set_codec(0, None)
    assert s.decode_seconds({0: RAW}) == 0.0


def test_decode_time_passed_by_the_caller() -> None:
    s = state(Clock())
    measure(s, RAW / 2e10)
    assert not s.gate(TOKENS, {0: RAW}, decode_s=0.05).fetch  # type: ignore[union-attr]
    assert not s.gate(TOKENS, {0: RAW}, decode_s={0: 0.05}).fetch  # type: ignore[union-attr]
    assert s.gate(TOKENS, {0: RAW}, decode_s={0: 0.001}).fetch  # type: ignore[union-attr]


def test_gated_tier_is_probed_at_a_bounded_rate() -> None:
    clock = Clock()
    s = state(clock, gate_probe_interval_s=10.0)
    measure(s, 1.0)  # a slow tier: ~1 s per prefix
    decisions = []
    for t in range(0, 35):  # one request per second of the clock
        clock.t = float(t)
        d = s.gate(TOKENS, {0: RAW})
        assert d is not None
        decisions.append(d)
        if d.probe:
            assert d.fetch and "probe" in d.reason
    probes = [t for t, d in enumerate(decisions) if d.probe]
    assert probes == [10, 20, 30]  # never in the first interval, then one per interval
    assert all(not d.fetch for t, d in enumerate(decisions) if t not in probes)
    assert s.gate_decisions == {"fetch": 3, "recompute": 32, "probe": 3}
    # the tier got faster: the probes' measurements change the gate's mind
    measure(s, RAW / 2e10)
    clock.t = 31.0
    d = s.gate(TOKENS, {0: RAW})
    assert d is not None and d.fetch and not d.probe


def test_probe_schedule_rule() -> None:
    p = ProbeSchedule(5.0, start=100.0)
    assert not p.due(104.9) and p.due(105.0)
    p.take(105.0)
    assert not p.due(109.0) and p.due(110.0) and p.taken == 1
    with pytest.raises(ConfigError):
        ProbeSchedule(0.0)


def test_rate_estimator() -> None:
    r = RateEstimator(1e9, weight=0.5)
    r.observe(4_000_000_000, 1.0)
    assert r.rate_Bps == pytest.approx(2.5e9) and r.samples == 1
    r.observe(10, 0.0)  # ignored
    r.observe(-1, 1.0)  # ignored
    assert r.samples == 1 and r.seconds_for(5_000_000_000) == pytest.approx(2.0)
    with pytest.raises(ConfigError):
        RateEstimator(0.0)


def test_probe_interval_config() -> None:
    with pytest.raises(ConfigError, match="gate_probe_interval_s"):
        SchedulerState({"gate_probe_interval_s": 0}, ["dram"], ["dram"])
    with pytest.raises(ConfigError):
        state(Clock()).set_codec(0, ratio=0.0, decode_Bps=1e9)
