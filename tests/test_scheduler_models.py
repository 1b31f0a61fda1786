"""Markov chain, head importance, prefetch window and placement (pure functions)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tierkv import ConfigError, InputError
from tierkv.scheduler import (
    HeadImportance,
    PlacementConfig,
    PrefetchWindow,
    SessionClass,
    ToolChain,
    attention_span,
    choose_tier,
    classify_session,
    is_protected,
    placement_value,
    should_move,
)

GiB = 1 << 30


def test_markov_counts_and_prediction() -> None:
    ch = ToolChain()
    ch.observe_sequence(["search", "read", "search", "read", "search", "write"])
    assert ch.count("search", "read") == 2
    assert ch.probability("search", "read") == pytest.approx(2 / 3)
    assert ch.predict("search") == ("read", pytest.approx(2 / 3))
    assert ch.predict("write") is None
    assert ch.probability("nope", "read") == 0.0


@given(st.lists(st.sampled_from("abcd"), min_size=2, max_size=50))
def test_markov_rows_sum_to_one(seq: list[str]) -> None:
    ch = ToolChain()
    ch.observe_sequence(seq)
    for prev in set(seq[:-1]):
        assert sum(ch.probability(prev, n) for n in "abcd") == pytest.approx(1.0)


def test_size_profile_ewma() -> None:
    ch = ToolChain(weight=0.5)
    ch.observe_size("t", 100)
    p = ch.observe_size("t", 300)
    assert p.mean == pytest.approx(200.0)
    assert p.var == pytest.approx(0.5 * (0 + 0.5 * 200**2))
    assert p.peak == 300 and p.n == 2
    ch.observe_transition("s", "t")
    assert 0 < ch.reservation("s") <= 300


@given(st.lists(st.integers(0, 10**9), min_size=1, max_size=40), st.floats(0.01, 1.0))
def test_size_profile_bounds(sizes: list[int], w: float) -> None:
    ch = ToolChain(weight=w)
    for s in sizes:
        p = ch.observe_size("x", s)
    assert min(sizes) - 1e-6 <= p.mean <= max(sizes) + 1e-6
    assert p.var >= 0 and p.peak == max(sizes)


def test_session_classes() -> None:
    assert classify_session(0) is SessionClass.LIGHT
    assert classify_session(GiB) is SessionClass.MEDIUM
    assert classify_session(8 * GiB) is SessionClass.HEAVY
    assert classify_session(32 * GiB) is SessionClass.EXTREME
    with pytest.raises(ConfigError):
        classify_session(1, (3, 2, 1))


def test_head_importance_gqa_max_and_scores() -> None:
    imp = HeadImportance(layers=1, query_heads=4, kv_heads=2, block_tokens=2, max_blocks=4, weight=1.0)
    scores = np.array(
        [
            [1.0, 0.0, 0.0, 0.0],  # q0 (group 0) looks at pos 0
            [0.0, 0.0, 1.0, 0.0],  # q1 (group 0) looks at pos 2
            [0.0, 0.0, 0.0, 1.0],  # q2 (group 1)
            [0.0, 0.0, 0.0, 1.0],  # q3 (group 1)
        ]
    )
    imp.report_attention(0, scores, np.arange(4), query_pos=4)
    assert imp.importance(0, 0, 0) == 1.0 and imp.importance(0, 0, 1) == 1.0  # max over the group
    assert imp.importance(0, 1, 1) == 1.0 and imp.importance(0, 1, 0) == 0.0
    assert list(imp.block_scores()) == [1.0, 2.0, 0.0, 0.0]
    imp.set_multipliers(np.array([[0.0, 1.0]]))
    assert list(imp.block_scores()) == [0.0, 1.0, 0.0, 0.0]
    with pytest.raises(InputError):
        imp.report_attention(0, scores[:3], np.arange(4), query_pos=4)


def test_head_importance_mla_and_distance_decay() -> None:
    imp = HeadImportance(
        layers=2, query_heads=4, kv_heads=4, block_tokens=1, max_blocks=8, weight=0.5, distance_scale=2.0, mla=True
    )
    s = np.ones((4, 4))
    imp.report_attention(1, s, np.arange(4), query_pos=4)
    assert imp.kv_heads == 1
    near, far = imp.importance(1, 0, 3), imp.importance(1, 0, 0)
    assert near > far > 0
    before = imp.importance(1, 0, 3)
    imp.report_attention(1, np.zeros((4, 4)), np.arange(4), query_pos=5)
    assert imp.importance(1, 0, 3) == pytest.approx(before * 0.5)  # EMA decays without fresh mass


def test_attention_span_and_prefetch_window() -> None:
    pos = np.arange(100)
    local = np.where(pos >= 90, 1.0, 0.0)
    assert attention_span(local, pos, query_pos=100, coverage=0.9) <= 10
    glob = np.ones(100)
    assert attention_span(glob, pos, query_pos=100, coverage=0.9) >= 85
    pw = PrefetchWindow(block_tokens=16, max_window=4096)
    pw.observe_span("local", 32)
    pw.observe_span("global", 1000)
    assert pw.window("local") == 32
    assert pw.window() == 1000
    assert pw.blocks(100, "local") == [6, 7, 8]
    assert pw.blocks(100, total_blocks=10)[-1] == 9
    with pytest.raises(InputError):
        pw.blocks(-1)


def test_placement_value_and_hysteresis() -> None:
    cfg = PlacementConfig()
    hot = placement_value(0.9, 8192, 8192 * 131072, "dram", fetch_s=0.05, prefill_tokens_per_s=5000, config=cfg)
    cold = placement_value(0.0, 8192, 8192 * 131072, "dram", fetch_s=0.05, prefill_tokens_per_s=5000, config=cfg)
    assert hot > 0 > cold
    hbm = placement_value(0.01, 512, 512 * 131072, "hbm", 0.0, 5000, cfg)
    nvme = placement_value(0.01, 512, 512 * 131072, "nvme", 0.01, 5000, cfg)
    assert nvme > hbm  # a rarely used block is cheaper on NVMe
    assert not should_move(1.0, 1.1, cfg)  # within 20%
    assert should_move(1.0, 1.3, cfg)
    assert choose_tier({"hbm": 1.0, "dram": 1.1}, "hbm", cfg) == "hbm"
    assert choose_tier({"hbm": 1.0, "dram": 2.0}, "hbm", cfg) == "dram"
    assert choose_tier({"hbm": -1.0, "dram": -0.5}, "hbm", cfg) is None
    assert choose_tier({"hbm": -1.0, "dram": 0.5}, None, cfg) == "dram"
    assert is_protected(4, cfg) and not is_protected(3, cfg)
    with pytest.raises(ConfigError):
        placement_value(1.5, 1, 1, "dram", 0.0, 1.0, cfg)
    with pytest.raises(ConfigError):
        PlacementConfig(rel=-1.0)


@given(st.floats(0, 1), st.floats(0, 1))
def test_placement_value_monotone_in_p(p: float, q: float) -> None:
    cfg = PlacementConfig()
    a = placement_value(min(p, q), 1024, 10**8, "dram", 0.01, 5000, cfg)
    b = placement_value(max(p, q), 1024, 10**8, "dram", 0.01, 5000, cfg)
    assert b >= a
