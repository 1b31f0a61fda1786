from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierkv import ConfigError
from tierkv.scheduler import (
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
from tierkv.scheduler._predictor import N_CELLS

pos = st.floats(min_value=1e-3, max_value=1e6, allow_nan=False, allow_infinity=False)


@given(pos, pos)
def test_beta_mean_in_unit_interval_and_symmetric(a: float, b: float) -> None:
    m = beta_mean(a, b)
    assert 0.0 < m < 1.0
    assert math.isclose(m + beta_mean(b, a), 1.0, rel_tol=1e-9)


def test_beta_mean_uniform_prior_is_half() -> None:
    assert beta_mean(1.0, 1.0) == 0.5
    assert beta_mean(3.0, 1.0) == 0.75


@given(st.floats(min_value=0, max_value=1e9), st.floats(min_value=1e-3, max_value=1e6))
def test_confidence_saturates_monotonically(n: float, k: float) -> None:
    c = confidence(n, k)
    assert 0.0 <= c < 1.0
    assert confidence(n + 1.0, k) >= c
    assert confidence(0, k) == 0.0


def test_confidence_half_at_k() -> None:
    assert confidence(32, 32) == 0.5


@given(st.floats(0, 1), st.floats(0, 1), st.floats(0, 1))
def test_blend_is_convex_combination(p: float, q: float, c: float) -> None:
    v = blend(p, q, c)
    assert min(p, q) - 1e-12 <= v <= max(p, q) + 1e-12
    assert blend(p, q, 0.0) == p
    assert math.isclose(blend(p, q, 1.0), q)


def test_buckets_and_labels() -> None:
    assert [count_bucket(i) for i in range(8)] == [0, 1, 2, 3, 4, 5, 5, 5]
    assert [fanout_bucket(i) for i in range(6)] == [0, 1, 2, 2, 3, 3]
    assert size_bucket(1, 0) == 0 and size_bucket(1000, 1000) == 48
    assert all(0 <= size_bucket(n, j) < 49 for n in range(1, 200) for j in range(n))
    assert BLOCK_TYPES[derive_block_type(0, False, 0)] == "system_prompt"
    assert BLOCK_TYPES[derive_block_type(5, False, 3)] == "system_prompt"
    assert BLOCK_TYPES[derive_block_type(5, True, 0)] == "intermediate_reasoning"
    assert BLOCK_TYPES[derive_block_type(5, False, 1)] == "user_context"
    assert TRANSITIONS[derive_transition(4)] == "same_tool_repeat"
    assert TRANSITIONS[derive_transition(1)] == "agent_handoff"
    assert TRANSITIONS[derive_transition(4, 10.0)] == "reasoning_step"
    assert TRANSITIONS[derive_transition(4, 100.0)] == "same_tool_repeat"
    assert cell_index(15, 5, 3, 48) == N_CELLS - 1


def test_config_validation() -> None:
    with pytest.raises(ConfigError):
        PredictorConfig(alpha0=0)
    with pytest.raises(ConfigError):
        PredictorConfig(window=0)
    with pytest.raises(ConfigError):
        ReusePredictor.context("nope", "tool_switch")


def test_outcome_resolved_only_after_horizon() -> None:
    pr = ReusePredictor(PredictorConfig(horizon_s=10.0, refresh_every=1))
    ctx = pr.context("user_context", "same_tool_repeat")
    cell = cell_index(ctx, 0, 0, 0)
    pr.observe(0.0, 7, cell)
    pr.observe(5.0, 7, cell)  # reuse of block 7 within the horizon
    assert pr.advance(9.9) == 0  # nothing resolved before t + horizon
    assert pr.posterior("user_context", "same_tool_repeat") == (1.0, 1.0)
    assert pr.advance(10.0) == 1  # first observation: reused
    assert pr.posterior("user_context", "same_tool_repeat") == (2.0, 1.0)
    assert pr.advance(15.0) == 1  # second: not reused
    assert pr.posterior("user_context", "same_tool_repeat") == (2.0, 2.0)
    assert pr.pending == 0


def test_reuse_after_horizon_is_not_counted() -> None:
    pr = ReusePredictor(PredictorConfig(horizon_s=10.0, refresh_every=1))
    cell = cell_index(0, 0, 0, 0)
    pr.observe(0.0, 1, cell)
    pr.advance(10.0)
    pr.observe(11.0, 1, cell)  # too late
    assert pr.posterior("system_prompt", "same_tool_repeat") == (1.0, 2.0)


def test_credit_controls_what_counts_as_reuse() -> None:
    pr = ReusePredictor(PredictorConfig(horizon_s=10.0, refresh_every=1))
    cell = cell_index(0, 0, 0, 0)
    pr.observe_many(0.0, [1, 2], [cell, cell])
    pr.observe_many(1.0, [1, 2], [cell, cell], credit=[True, False])
    pr.advance(10.5)
    assert pr.posterior("system_prompt", "same_tool_repeat") == (2.0, 2.0)


def test_probability_learns_the_context_rate() -> None:
    pr = ReusePredictor(PredictorConfig(horizon_s=1.0, refresh_every=16))
    hot = cell_index(pr.context("system_prompt", "same_tool_repeat"), 1, 0, 3)
    cold = cell_index(pr.context("user_context", "agent_handoff"), 1, 0, 3)
    t = 0.0
    for i in range(400):
        pr.observe(t, 10**6 + i, cold)  # never reused
        pr.observe(t, 5, hot)  # reused every step
        t += 0.5
        pr.advance(t)
    assert pr.probability(hot) > 0.9
    assert pr.probability(cold) < 0.1
    assert 0.9 < pr.context_estimate("system_prompt", "same_tool_repeat") <= 1.0


@settings(deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.booleans()), min_size=1, max_size=60))
def test_table_is_always_a_probability(events: list[tuple[int, bool]]) -> None:
    pr = ReusePredictor(PredictorConfig(horizon_s=2.0, refresh_every=3))
    for t, (block, _) in enumerate(events):
        pr.observe(float(t), block, cell_index(t % 16, block, 0, t % 49))
        pr.advance(float(t))
    pr.refresh()
    assert all(0.0 <= p <= 1.0 for p in pr.table)
    assert len(pr.table) == N_CELLS
