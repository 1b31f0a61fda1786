"""Tests of the renewal-process survival model and the experimental session policy (tierkv-session)."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierkv.errors import ConfigError
from tierkv.lab.policies import LruPolicy, SessionOptions, SessionPolicy, session_class
from tierkv.scheduler._survival import RenewalHazard, age_bin, bin_lower_edges, hit_density, km_survival


def test_age_bin_is_log_scaled_and_clipped() -> None:
    assert age_bin(0.0, 4, 64) == 0
    assert age_bin(1.0, 4, 64) == 4  # log2(2) * 4
    assert age_bin(3.0, 4, 64) == 8
    assert age_bin(1e12, 4, 64) == 63
    edges = bin_lower_edges(4, 64)
    for k in (1, 5, 20):
        assert age_bin(float(edges[k]) * (1 + 1e-9) + 1e-9, 4, 64) == k


@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=30))
def test_km_survival_is_monotone_from_one(h: list[float]) -> None:
    s = km_survival(np.asarray(h))
    assert s[0] == 1.0 and len(s) == len(h) + 1
    assert all(s[i + 1] <= s[i] + 1e-12 for i in range(len(h)))
    assert s[-1] == pytest.approx(math.prod(1 - x for x in h))


def test_hit_density_exponential_matches_rate() -> None:
    # constant hazard on a fine linear grid: S(a) = exp(-lam a) -> density (1 - e^{-lam H}) / integral = lam
    lam, dx = 0.01, 0.5
    edges = np.arange(0.0, 5000.0, dx)
    surv = np.exp(-lam * edges)
    d = hit_density(edges, surv, np.asarray([0.0, 100.0, 1000.0]), 50.0)
    assert d == pytest.approx([lam] * 3, rel=1e-3)
    p = hit_density(edges, surv, np.asarray([0.0]), 50.0, per_time=False)
    assert p[0] == pytest.approx(1 - math.exp(-lam * 50.0), rel=1e-3)
    with pytest.raises(ValueError):
        hit_density(edges, surv, np.asarray([0.0]), 0.0)


def test_hit_density_zero_when_nothing_comes_back() -> None:
    edges = bin_lower_edges(4, 16)
    d = hit_density(edges, np.ones(17), np.asarray([0.0, 10.0]), 30.0)
    assert list(d) == [0.0, 0.0]


def test_counts_censor_pending_periods() -> None:
    h = RenewalHazard([0, 1])
    for i in range(10):
        h.start(float(i), 0)
    pid = h.start(0.0, 1)
    assert h.event(pid, 3.0) and not h.event(pid, 4.0)  # one event per period
    assert not h.event(10_000, 5.0)
    ev, risk = h.counts(9.0)
    b3 = age_bin(3.0, 4, 64)
    assert ev[1].sum() == 1 and ev[1, b3] == 1
    assert risk[1, b3] == 1 and risk[1, b3 + 1] == 0
    # the period started at 9.0 has age 0: at risk nowhere; the one started at 0 completed bins < bin(9)
    assert risk[0, 0] == 9 and risk[0, age_bin(9.0, 4, 64)] == 0


def test_learned_table_ranks_the_quick_class_first() -> None:
    rnd = random.Random(0)
    h = RenewalHazard([0, 0], prior_strength=5.0)
    t = 0.0
    for _ in range(2000):
        t += 1.0
        q = h.start(t, 0)  # comes back after ~20 s, always
        s = h.start(t, 1)  # comes back 10% of the time, after ~20 s
        h.event(q, t + rnd.expovariate(1 / 20))
        if rnd.random() < 0.1:
            h.event(s, t + rnd.expovariate(1 / 20))
    h.refresh(t + 10_000.0, 30.0)
    assert h.table[0][0] > 3 * h.table[1][0] > 0


def test_config_errors() -> None:
    with pytest.raises(ConfigError):
        RenewalHazard([])
    with pytest.raises(ConfigError):
        RenewalHazard([0], bins_per_octave=0)
    with pytest.raises(ConfigError):
        RenewalHazard([0], prior_strength=-1.0)
    with pytest.raises(ConfigError):
        SessionOptions(fanout_protect=1)
    with pytest.raises(ConfigError):
        SessionOptions(horizon_s=math.inf)


def test_session_class_buckets() -> None:
    assert session_class(1, 3) == 0 and session_class(1, 100) == 3
    assert session_class(2, 10, 5.0) == 4
    assert session_class(2, 10, 1000.0) == 7
    assert session_class(9, 10, 60.0) == 4 + 8 + 1
    assert len({session_class(t, 10, g) for t in (2, 3, 5) for g in (1.0, 60.0, 200.0, 900.0)}) == 12


@settings(deadline=None, max_examples=40)
@given(st.lists(st.lists(st.integers(0, 30), min_size=1, max_size=6), min_size=1, max_size=60), st.integers(1, 12))
def test_session_policy_sane_on_arbitrary_requests(reqs: list[list[int]], cap: int) -> None:
    for opts in (SessionOptions(), SessionOptions(prefix_tree=False, tail=False)):
        pol = SessionPolicy(cap, opts)
        for i, r in enumerate(reqs):
            lead, hits = pol.request(r, float(i), i % 2 == 0)
            assert 0 <= lead <= hits <= len(r)
            assert len(pol.cache) <= cap


def test_session_policy_keeps_shared_prefix() -> None:
    reqs = [[0, 1000 + 10 * i, 1001 + 10 * i, 1002 + 10 * i] for i in range(300)]
    pol = SessionPolicy(4)
    out = [pol.request(r, float(i), True) for i, r in enumerate(reqs)]
    assert sum(lead for lead, _ in out[100:]) >= 190


def synthetic_multiturn(seed: int, gap: str, n_sessions: int = 1500) -> list[tuple[float, list[int], bool]]:
    """Conversations on a shared 1-block system prompt: each turn re-uses the previous prompt (minus its
    partial tail) and appends new blocks. Sessions arrive as a Poisson process; a session continues with
    probability 0.6 per turn (at most 8 turns); inter-turn gaps follow ``gap``: exponential, lognormal,
    bimodal (agent loop vs human) or pareto (heavy tail)."""
    rnd = random.Random(seed)
    next_id = 1
    events: list[tuple[float, list[int], bool]] = []
    t = 0.0
    for _ in range(n_sessions):
        t += rnd.expovariate(1.0)
        prompt = [0]
        ts = t
        for _turn in range(8):
            new = rnd.randrange(2, 12)
            prompt = prompt[:-1] if len(prompt) > 1 else prompt
            prompt = prompt + list(range(next_id, next_id + new))
            next_id += new
            events.append((ts, list(prompt), True))
            if rnd.random() > 0.6:
                break
            if gap == "exponential":
                d = rnd.expovariate(1 / 60)
            elif gap == "lognormal":
                d = rnd.lognormvariate(math.log(40), 1.2)
            elif gap == "bimodal":
                d = rnd.expovariate(1 / 5) if rnd.random() < 0.5 else rnd.expovariate(1 / 400)
            else:
                d = 10 * rnd.paretovariate(1.2)
            ts += d
    events.sort(key=lambda e: e[0])
    return events


@pytest.mark.slow
@pytest.mark.parametrize("gap", ["exponential", "lognormal", "bimodal", "pareto"])
def test_session_policy_not_below_lru_on_synthetic_multiturn(gap: str) -> None:
    events = synthetic_multiturn(7, gap)
    distinct = len({b for _, r, _ in events for b in r})
    split = events[int(0.4 * len(events))][0]
    for frac in (0.01, 0.05):
        cap = max(8, round(frac * distinct))
        scores = {}
        for pol in (LruPolicy(cap), SessionPolicy(cap)):
            lead = acc = 0
            for t, r, tail in events:
                lo, _ = pol.request(r, t, tail)
                if t >= split:
                    lead += lo
                    acc += len(r)
            scores[pol.name] = lead / acc
        assert scores["lab-tierkv-session"] >= 0.95 * scores["lru"], (gap, frac, scores)
