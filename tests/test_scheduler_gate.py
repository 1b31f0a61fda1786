from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tierkv import ConfigError
from tierkv.scheduler import LoadFailurePolicy, TierEstimator, gate, parse_load_failure_policy

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
