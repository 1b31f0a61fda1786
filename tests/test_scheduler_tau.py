"""The adaptive tau (tierkv.scheduler._tau.TauAdapter), its replay policy and its library mirror."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kvtest import BLOCK, dram_tier, kv_for, smol_config

from tierkv import ConfigError, TierKV
from tierkv._scheduling import SchedulerState
from tierkv.lab.policies import LruPolicy, TierKVOptions, TierKVPolicy
from tierkv.lab.replay import ABLATIONS
from tierkv.lab.synth import synthetic_requests
from tierkv.scheduler import TauAdapter


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"taus": ()}, "tau_candidates_s"),
        ({"taus": (30.0, -1.0)}, "tau_candidates_s"),
        ({"taus": (math.inf,)}, "tau_candidates_s"),
        ({"start": 0.0}, "tau_s"),
        ({"capacity_blocks": 0}, "capacity_blocks"),
        ({"sample_blocks": 0}, "sample_blocks"),
        ({"every": 0}, "every"),
        ({"margin": -0.1}, "margin"),
        ({"decay": 0.0}, "decay"),
        ({"decay": 1.5}, "decay"),
    ],
)
def test_bad_parameters_name_the_field(kwargs: dict[str, object], field: str) -> None:
    args: dict[str, object] = {"taus": (30.0, 300.0), "start": 300.0, "capacity_blocks": 100}
    args.update(kwargs)
    with pytest.raises(ConfigError, match=field):
        TauAdapter(**args)  # type: ignore[arg-type]


@given(cap=st.integers(1, 1_000_000), sample=st.integers(1, 4096))
@settings(max_examples=40, deadline=None)
def test_sample_rate_follows_capacity(cap: int, sample: int) -> None:
    ad = TauAdapter((30.0, 300.0), 300.0, cap, sample_blocks=sample)
    n = 20_000
    frac = sum(ad.sampled(b) for b in range(n)) / n
    want = min(1.0, sample / cap)
    assert abs(frac - want) <= max(0.01, 0.1 * want), (frac, want)


def _drive(ad: TauAdapter, reqs: list[tuple[float, list[tuple[int, float]]]]) -> list[float | None]:
    out = []
    for t, blocks in reqs:
        for b, v in blocks:
            if ad.sampled(b):
                ad.add(b, v, t)
        out.append(ad.request(t))
    return out


def _recency_world(n_req: int) -> list[tuple[float, list[tuple[int, float]]]]:
    """Blocks with a high value are never reused; two low-value blocks come back every other
    request. Recency (a short tau) is right; a long tau keeps the useless high-value blocks."""
    reqs = []
    nxt = 10_000
    for i in range(n_req):
        t = float(i)
        blocks = [(nxt, 2.0), (nxt + 1, 2.0)]  # one-shot, "valuable"
        nxt += 2
        blocks.append((i % 2, -2.0))  # returning, "cheap"
        reqs.append((t, blocks))
    return reqs


def test_switches_to_a_short_tau_when_recency_wins() -> None:
    ad = TauAdapter((0.1, 1000.0), 1000.0, 8, every=4)
    switches = _drive(ad, _recency_world(400))
    assert ad.tau == 0.1 and 0.1 in switches
    assert ad.trace and ad.trace[0][1] == 0.1
    assert ad.hits[0] > ad.hits[1]


def test_keeps_a_long_tau_when_value_wins() -> None:
    """High-value blocks come back after a long gap, cheap ones never: a short tau forgets them."""
    reqs = []
    nxt = 10_000
    for i in range(600):
        blocks = [(i % 12, 2.0)]  # valuable, reused every 12 requests
        blocks += [(nxt + k, -2.0) for k in range(3)]  # cheap one-shots
        nxt += 3
        reqs.append((float(i), blocks))
    ad = TauAdapter((1.0, 1000.0), 1.0, 12, every=4)
    _drive(ad, reqs)
    assert ad.tau == 1000.0


def test_decides_only_every_n_requests_and_with_a_margin() -> None:
    ad = TauAdapter((0.1, 1000.0), 1000.0, 8, every=10)
    world = _recency_world(9)
    assert _drive(ad, world) == [None] * 9  # no decision before the 10th request
    # equal scores never switch: a world where both candidates hit alike (everything fits)
    ad2 = TauAdapter((1.0, 1000.0), 1000.0, 1000, every=2, margin=0.05)
    _drive(ad2, [(float(i), [(i % 3, 0.0)]) for i in range(200)])
    assert ad2.tau == 1000.0 and ad2.trace == []


def test_resize_resets_the_shadow_caches() -> None:
    ad = TauAdapter((0.1, 1000.0), 1000.0, 8, every=4)
    _drive(ad, _recency_world(40))
    assert any(ad.hits)
    ad.resize(8)  # same size: nothing changes
    assert any(ad.hits)
    ad.resize(64)
    assert ad.hits == (0.0, 0.0)
    with pytest.raises(ConfigError):
        ad.resize(0)


# ------------------------------------------------------------------ replay policy
def _score(pol: object, rows: list[dict[str, int | list[int]]]) -> float:
    times = [r["timestamp"] / 1000 for r in rows]  # type: ignore[operator]
    split = times[int(0.4 * len(times))]
    lead = acc = 0
    for r, t in zip(rows, times, strict=True):
        ids = r["hash_ids"]
        lo, _ = pol.request(ids, t, r["input_length"] % 512 != 0)  # type: ignore[attr-defined,operator]
        if t >= split:
            lead += lo
            acc += len(ids)  # type: ignore[arg-type]
    return lead / acc


def test_replay_policy_adapts_tau_on_the_mixed_shape() -> None:
    rows = synthetic_requests("mixed", seed=7, sessions=1500)
    distinct = len({b for r in rows for b in r["hash_ids"]})  # type: ignore[union-attr]
    cap = max(8, round(0.01 * distinct))
    adaptive = TierKVPolicy(cap)
    fixed = TierKVPolicy(cap, ABLATIONS["lab-tierkv-fixed-tau"])  # type: ignore[arg-type]
    lru = LruPolicy(cap)
    s_ad, s_fx, s_lru = _score(adaptive, rows), _score(fixed, rows), _score(lru, rows)
    assert adaptive.tau_trace and adaptive.tau < 300.0  # moved to a shorter tau on this shape
    assert fixed.tau_trace == [] and fixed.tau == 300.0
    assert s_ad > s_fx and s_ad >= s_lru, (s_ad, s_fx, s_lru)


def test_fixed_tau_ablation_is_the_policy_without_shadows() -> None:
    assert ABLATIONS["lab-tierkv-fixed-tau"] == TierKVOptions(shadow_taus=())
    rows = synthetic_requests("chat", seed=2, sessions=300)
    a = TierKVPolicy(40, TierKVOptions(shadow_taus=()))
    b = TierKVPolicy(40, TierKVOptions(shadow_taus=(300.0,)))  # one candidate: never switches
    assert _score(a, rows) == _score(b, rows)
    with pytest.raises(ConfigError, match="shadow_taus"):
        TierKVOptions(shadow_taus=(0.0,))


# ---------------------------------------------------------------- library mirror
def test_scheduler_state_adapts_tau_and_ranks_with_it() -> None:
    s = SchedulerState({"policy": "predictive", "tau_s": 1000.0, "tau_candidates_s": [0.1, 1000.0]}, ["dram"], ["dram"])
    assert s.tau_adapter is None  # made once the capacity is known
    s.set_capacity_blocks(8)
    ad = s.tau_adapter
    assert ad is not None
    ad._every = 4  # decide often in this small world
    cell = 0
    switched = None
    for t, blocks in _recency_world(400):
        for b, v in blocks:
            if ad.sampled(b):
                ad.add(b, v, t)
        got = s.end_request(t)
        switched = switched or got
    assert switched == 0.1 and s.tau_s == 0.1
    lt = s.predictor.log_table[cell]
    assert s.priority(cell, 50.0) == pytest.approx(lt + 500.0)


def test_scheduler_state_fixed_tau_and_lru_have_no_adapter() -> None:
    s = SchedulerState({"policy": "predictive", "tau_candidates_s": []}, ["dram"], ["dram"])
    s.set_capacity_blocks(100)
    assert s.tau_adapter is None and s.end_request(1.0) is None and s.tau_s == 300.0
    s2 = SchedulerState({"policy": "lru"}, ["dram"], ["dram"])
    s2.set_capacity_blocks(100)
    assert s2.tau_adapter is None


@pytest.mark.parametrize("bad", ["30", [30, "x"], [0], [math.nan], [True]])
def test_scheduler_tau_candidates_are_checked(bad: object) -> None:
    with pytest.raises(ConfigError, match=r"scheduler\.tau_candidates_s"):
        SchedulerState({"tau_candidates_s": bad}, ["dram"], ["dram"])


def test_response_delta_follows_the_current_tau() -> None:
    s = SchedulerState({"tau_candidates_s": []}, ["dram"], ["dram"])
    s._resp_start.append(10.0)
    s._resp_end.append(10.001)
    s._resp_adj.append(0.5)
    s._resp_dt.append(20.0)
    assert s._response_delta(10.0005) == pytest.approx(0.5 + 20.0 / 300.0)
    s.tau_s = 30.0
    assert s._response_delta(10.0005) == pytest.approx(0.5 + 20.0 / 30.0)
    assert s._response_delta(11.0) == 0.0


@pytest.mark.anyio
async def test_tierkv_feeds_the_adaptive_tau(tmp_path: Path) -> None:
    # the adaptive tau belongs to the predictive ranking
    cfg = smol_config([dram_tier()], scheduler={"policy": "predictive"})
    async with await TierKV.open(cfg) as kv:
        ad = kv._sched.tau_adapter
        assert ad is not None and ad.tau == 300.0
        assert ad._cap == min(1024, (64 << 20) // BLOCK)
        kv_data = kv_for(48)
        for i in range(5):
            await kv.put(list(range(1000 * i, 1000 * i + 48)), kv_data)
            await kv.get(list(range(1000 * i, 1000 * i + 48)))
        assert ad._requests >= 5 and len(ad._buf_b) > 0
    async with await TierKV.open({**cfg, "scheduler": {"policy": "predictive", "tau_candidates_s": []}}) as kv:
        assert kv._sched.tau_adapter is None
