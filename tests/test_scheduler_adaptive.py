"""The adaptive eviction policy (``scheduler.policy = "adaptive"``): recency or the predictor, whichever
scores more hits on sampled shadow caches of both (tierkv.scheduler._tau.TauAdapter with recency=True)."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from tierkv._scheduling import SchedulerState
from tierkv.errors import ConfigError
from tierkv.lab.policies.library import LibraryPolicy, tokens_of
from tierkv.lab.replay import load_trace, replay, truncate
from tierkv.lab.synth import write_synthetic
from tierkv.scheduler import TauAdapter


def _drive(ad: TauAdapter, reqs: list[tuple[float, list[tuple[int, float]]]]) -> list[bool]:
    """Feed requests (leaf first) to the adapter; return its mode after each request (True: recency).
    The "real cache" is the shadow of the mode in force (as served at the last decision)."""
    modes = []
    for t, blocks in reqs:
        real = ad._rec if ad.recency_mode else ad._caches[ad.taus.index(ad.tau)][0]
        for b, v in reversed(blocks):
            if ad.sampled(b):
                ad.add(b, v, t, hit=b in real)
        ad.request(t)
        modes.append(ad.recency_mode)
    return modes


def _scan_world(n_req: int, seed: int = 1) -> list[tuple[float, list[tuple[int, float]]]]:
    """16 hot blocks (value +2) come back every few requests between one-shot scan blocks (value -2):
    an LRU of 24 blocks is flushed by the scans, the predictor's ranking keeps the hot set."""
    rnd = random.Random(seed)
    reqs: list[tuple[float, list[tuple[int, float]]]] = []
    nxt = 1_000_000
    for i in range(n_req):
        blocks = [(rnd.randrange(16), 2.0)]
        blocks += [(nxt + k, -2.0) for k in range(6)]
        nxt += 6
        reqs.append((float(i), blocks))
    return reqs


def _noise_world(n_req: int, seed: int = 2) -> list[tuple[float, list[tuple[int, float]]]]:
    """Uniform independent reuse of 200 blocks with values drawn at random: no signal in the values."""
    rnd = random.Random(seed)
    return [(float(i), [(rnd.randrange(200), rnd.gauss(0.0, 1.0)) for _ in range(3)]) for i in range(n_req)]


def test_adapter_keeps_the_predictor_while_it_wins() -> None:
    ad = TauAdapter((30.0, 300.0), 300.0, 24, every=8, recency=True, bypass=False)
    modes = _drive(ad, _scan_world(2000))
    assert not modes[-1]
    assert sum(not m for m in modes) > 0.9 * len(modes)  # (nearly) the whole run on the predictor
    assert min(ad.hits) > 2 * ad.recency_hits  # it did win: the LRU shadow is flushed by the scans


def _flipped(n: int, t0: float) -> list[tuple[float, list[tuple[int, float]]]]:
    """The scan world with lying values: the one-shot blocks "valuable", the returning ones "cheap"."""
    return [(t + t0, [(b, -v) for b, v in blocks]) for t, blocks in _scan_world(n, seed=3)]


def test_adapter_goes_back_to_recency_when_the_predictor_stops_winning() -> None:
    ad = TauAdapter((300.0,), 300.0, 24, every=8, recency=True, bypass=False)
    _drive(ad, _scan_world(1000))
    assert not ad.recency_mode
    modes = _drive(ad, _flipped(4000, 1000.0))
    assert any(t == math.inf for _, t in ad.trace)
    late = modes[1000:]
    # failed trials of the predictor wait longer and longer: most of the run is on recency
    assert sum(late) > 0.8 * len(late), sum(late) / len(late)
    assert ad.recency_hits > 2 * ad.hits[0]


def _returns_world(
    n: int, gap: int, conv: float, noise: float, t0: float = 0.0, first: int = 0
) -> list[tuple[float, list[tuple[int, float]]]]:
    """Per request a new block (value ``conv``), the return of the block new ``gap`` requests before,
    and 6 one-shot blocks (value ``noise``). With ``gap`` 10 a block comes back after ~70 accesses:
    no recency (LRU, ARC, admission) of 24 blocks keeps it, a predictor that trusts the values does.
    With ``gap`` 2 and lying values (the returning blocks "cheap"), LRU and ARC keep them and the
    predictor evicts them first."""
    reqs: list[tuple[float, list[tuple[int, float]]]] = []
    nxt = 10_000_000 + 100 * first
    for i in range(n):
        k = first + i
        blocks = ([(k - gap, conv)] if i >= gap else []) + [(k, conv)]  # root first: the return leads
        blocks += [(nxt + j, noise) for j in range(6)]
        nxt += 6
        reqs.append((t0 + i, blocks))
    return reqs


def _requests_to_recency(ad: TauAdapter, warm: int) -> int:
    """Requests until the adapter goes to recency in a world where recency wins, after ``warm``
    requests of one where every recency loses to the predictor."""
    _drive(ad, _returns_world(warm, 10, 2.0, -2.0))
    assert not ad.recency_mode and ad._recency_best() < 0.2 * ad.hits[0]
    modes = _drive(ad, _returns_world(4000, 2, -2.0, 2.0, float(warm), warm + 100))
    return modes.index(True) if True in modes else len(modes)


@pytest.mark.parametrize("warm", [1000, 6000])
def test_adapter_follows_a_phase_change_whatever_the_predictor_won_before(warm: int) -> None:
    """A lead the predictor banked in an earlier phase does not hold the cache through a phase where
    recency wins: the mode's counts decay fast (``mode_decay``) and the real cache's lead is capped
    (``lead_cap``), so the switch comes within a few decisions however long the first phase was;
    with the tau candidates' slow decay and no cap it waits dozens of times longer."""
    capped = _requests_to_recency(TauAdapter((300.0,), 300.0, 24, every=8, recency=True, bypass=False), warm)
    slow = TauAdapter((300.0,), 300.0, 24, every=8, recency=True, bypass=False, mode_decay=0.98, lead_cap=1e9)
    uncapped = _requests_to_recency(slow, warm)
    assert capped <= 8 * 8, capped  # 8 decisions of 8 requests (measured: 15 and 7 requests)
    assert uncapped >= 5 * capped, (capped, uncapped)  # (measured: 287, 303)


class _FullGrace(TauAdapter):
    """The adapter whose grace only its length ends (and no change point is ever undone)."""

    _UNDO_Z = math.inf


@pytest.mark.parametrize("every", [8, 32])
def test_a_clear_lead_of_recency_ends_the_predictors_grace(every: int) -> None:
    """The cache starts on the predictor in its grace; where recency wins from the first request, a
    lead past the undo threshold hands the cache to recency within the grace (the full grace
    waits ``_GRACE`` decisions: a third of a 900-request trace at 32 requests per decision). The
    harness's real cache is the shadow as served at the last decision, so in this world (a block
    returns within a decision) it scores nothing and the first decision ends the stay: this checks
    that a lead ends the grace at all; where the threshold lies is the next test's."""
    world = _returns_world(2000, 2, -2.0, 2.0)  # lying values: recency keeps the returns, the predictor not
    early = _drive(TauAdapter((300.0,), 300.0, 24, every=every, recency=True, bypass=False), world)
    full = _drive(_FullGrace((300.0,), 300.0, 24, every=every, recency=True, bypass=False), world)
    grace = (TauAdapter._GRACE + 1) * every  # the request whose decision ends the grace
    assert full.index(True) == grace - 1
    assert early.index(True) < grace // 2, early.index(True)  # (measured: the first decision)
    assert all(early[early.index(True) :])  # and it stays there


@pytest.mark.parametrize(("excess", "age", "to_recency"), [(1.0, 1, True), (-1.0, 1, False), (-1.0, 9, True)])
def test_in_the_grace_only_a_lead_past_the_undo_threshold_counts(excess: float, age: int, to_recency: bool) -> None:
    """In the grace (``age`` decisions after the switch to the predictor) recency takes the cache
    only when its best shadow leads the real cache by more than ``_UNDO_Z`` standard deviations of
    the two counts (the stay is provisional, as a change point in its window); past the grace, any
    lead does."""
    ad = TauAdapter((300.0,), 300.0, 64, every=32, recency=True, bypass=False)
    assert not ad.recency_mode
    live, z = 400.0, ad._UNDO_Z
    d = (z * z + math.sqrt(z**4 + 8 * z * z * live)) / 2  # d = z * sqrt(live + (live + d)): the threshold
    ad._age = age - 1  # (the decision counts itself)
    ad._live_hits = live
    ad._hits[0] = live  # the predictor's shadow
    ad._set_fast_counts([live + d + excess, 0.0, 0.0, 0.0, 0.0, 0.0])  # the LRU shadow leads
    got = ad._choose_mode(0.0, 0)
    assert (got == math.inf) is to_recency
    assert ad.recency_mode is to_recency


def test_adapter_rejects_bad_mode_parameters() -> None:
    for kw in ({"mode_decay": 0.0}, {"mode_decay": 1.5}, {"lead_cap": -1.0}, {"lead_cap": math.inf}):
        with pytest.raises(ConfigError) as err:
            TauAdapter((300.0,), 300.0, 24, recency=True, **kw)  # type: ignore[arg-type]
        assert next(iter(kw)) in str(err.value)


def test_adapter_trials_cost_about_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where prediction misleads, the predictor's stays cost about the exploration budget (1% of
    recency's sampled leading hits) plus one stay, and far less than backing off alone allowed
    (trials on: they are off by default)."""
    monkeypatch.setattr(TauAdapter, "_TRIALS", True)
    ad = TauAdapter((300.0,), 300.0, 24, every=8, recency=True, bypass=False)
    _drive(ad, _flipped(8000, 0.0))
    trials = sum(1 for _, t in ad.trace if t != math.inf)
    assert trials <= 8  # a doubling wait: log2 of the run's decisions, not one per wait
    assert 0 < ad._cost and 0 < ad._loss <= ad._REGRET * ad._rec_total + ad._cost, (ad._loss, ad._rec_total)
    monkeypatch.setattr(TauAdapter, "_REGRET", math.inf)  # no budget: the doubling wait alone
    unbudgeted = TauAdapter((300.0,), 300.0, 24, every=8, recency=True, bypass=False)
    _drive(unbudgeted, _flipped(8000, 0.0))
    assert sum(1 for _, t in unbudgeted.trace if t != math.inf) > trials
    assert ad._loss < 0.5 * unbudgeted._loss, (ad._loss, unbudgeted._loss)  # (measured: 97 vs 351)


@pytest.mark.parametrize("trials", [False, True])
def test_without_trials_only_the_predictors_shadow_lead_hands_it_the_cache(
    trials: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On recency, the wait over and the budget unspent, a predictor's shadow level with recency's best
    (no lead) starts a trial only with trials on (off by default); a lead by the margin hands the
    predictor the cache either way."""
    monkeypatch.setattr(TauAdapter, "_TRIALS", trials)
    for lead in (1.0, 1.5):
        ad = TauAdapter((300.0,), 300.0, 24, every=8, recency=True, bypass=False)
        ad.recency_mode = True
        ad._wait, ad._loss, ad._cost, ad._rec_total = 1, 0.0, 0.0, 1000.0
        ad._rec_hits, ad._adm_slow, ad._slru.slow, ad._arc_slow = 10.0, 0.0, 0.0, 0.0
        ad._hits[0] = 10.0 * lead
        got = ad._choose_mode(0.0, 0)
        assert (got == 300.0) == (trials or lead > 1.0), (lead, got)
        assert ad.recency_mode == (got is None)


def test_adapter_without_signal_scores_alike() -> None:
    ad = TauAdapter((30.0, 300.0), 300.0, 60, every=8, recency=True, bypass=False)
    _drive(ad, _noise_world(4000))
    rec = ad.recency_hits
    assert rec > 0
    # no ranking beats another by much on independent reuse: either mode serves like recency
    assert all(abs(h - rec) <= 0.1 * rec for h in ad.hits)


def test_scheduler_state_adaptive_follows_the_adapter() -> None:
    s = SchedulerState({"policy": "adaptive", "tau_candidates_s": []}, ["dram", "nvme"], ["dram", "nvme"])
    s.set_capacity_blocks(24)
    ad = s.tau_adapter
    assert ad is not None and ad.recency and ad.taus == (300.0,)
    ad._every = 8
    seen: set[float] = set()
    # (a put never evicts its own blocks, in the shadows as in the library: with lying values the
    # predictor still keeps each request's hot block until the next request, so it loses slowly)
    for t, blocks in [*_scan_world(600), *_flipped(1200, 600.0)]:
        real = ad._rec if ad.recency_mode else ad._caches[0][0]
        for b, v in reversed(blocks):
            if ad.sampled(b):
                ad.add(b, v, t, hit=b in real)
        got = s.end_request(t)
        if got is not None:
            seen.add(got)
        assert s.recency == ad.recency_mode
    assert math.inf in seen  # it went to recency once the values lied
    if s.recency:
        assert s.promotion_target(0, 16, 4096, 1, [True, True], hits=2) == 0  # recency: promote on 2 hits
    # the ranked queue's key is the predictive one in both modes (so that a switch costs nothing)
    assert s.priority(0, 50.0) == pytest.approx(s.predictor.log_table[0] + 50.0 / 300.0)


def test_lru_and_predictive_policies_keep_their_mode() -> None:
    assert SchedulerState({"policy": "lru"}, ["dram"], ["dram"]).recency
    assert not SchedulerState({"policy": "predictive"}, ["dram"], ["dram"]).recency


# ------------------------------------------------------------------ the library, driven through its API
def _prefix_rate(trace_path: str, capacity: int, policy: str, *, session: bool = True) -> float:
    tr = load_trace(trace_path)
    pol = LibraryPolicy(capacity, policy=policy, name=policy)
    if not session:  # as ``scheduler.session_shadow = false`` (the shadow is made with the capacity)
        pol.kv._sched.session = None
    try:
        raw = replay(tr, pol, split_time=tr.times[0] + 0.4 * (tr.times[-1] - tr.times[0]))
    finally:
        pol.close()
    return sum(raw["leads"]) / max(1, raw["accesses"])


@pytest.mark.parametrize("capacity", [100, 300])
def test_library_adaptive_converges_to_recency_without_signal(tmp_path: object, capacity: int) -> None:
    """Documents picked uniformly at random (no feature says anything about the next use): without the
    session shadow the adaptive policy scores as LRU (within a point). With it (the default) it is at
    least LRU's: the session shadow keeps documents' leading blocks (it evicts leaves of the prefix tree
    first), which under the prefix hit rate is worth more than their later blocks, and at 300 blocks
    it leads (the lab's ``lab-tierkv-session`` 0.311 against LRU's 0.260, ARC's 0.279)."""
    path = f"{tmp_path}/noise.jsonl"
    write_synthetic(path, "noise", seed=5, sessions=150)  # 600 requests, ~1,500 block accesses
    lru = _prefix_rate(path, capacity, "lru")
    four = _prefix_rate(path, capacity, "adaptive", session=False)
    ada = _prefix_rate(path, capacity, "adaptive")
    assert lru > 0.05
    assert abs(four - lru) <= 0.01, (four, lru)
    assert ada >= lru - 0.01, (ada, lru)


def test_library_adaptive_parent_before_child() -> None:
    """A parent never ranks below its descendants in a request (the ranked queue, kept in either mode;
    in recency mode the request is touched leaf first, so a parent is the more recent)."""
    rnd = random.Random(9)
    pol = LibraryPolicy(30, policy="adaptive", name="adaptive")
    try:
        kv = pol.kv
        roots = [[rnd.randrange(1 << 30)] for _ in range(6)]
        for i in range(300):
            chain = list(roots[rnd.randrange(len(roots))])
            chain += [rnd.randrange(1 << 30) for _ in range(rnd.randint(0, 5))]
            if rnd.random() < 0.3:
                roots.append(chain[: rnd.randint(1, len(chain))])
            pol.request(chain, float(i), False)
            _, keys, _ = kv._s.keys(tokens_of(chain), None)
            entries = [kv._index.get(k.hex()) for k in keys]
            ranks = [e.rank for e in entries if e is not None]
            assert ranks == sorted(ranks, reverse=True), ranks
    finally:
        pol.close()


@pytest.mark.slow
def test_library_adaptive_keeps_the_predictors_gain(tmp_path: object) -> None:
    """On the synthetic chat trace (seed 7, first half of its time, 10%) the library's predictor beats
    recency; the adaptive policy keeps at least half of that gain (measured: lru 0.331, predictive 0.367,
    adaptive 0.369)."""
    path = f"{tmp_path}/chat.jsonl"
    write_synthetic(path, "chat", seed=7, sessions=1500)
    tr = truncate(load_trace(path), 0.5)
    cap = round(0.10 * tr.distinct)
    split = tr.times[0] + 0.4 * (tr.times[-1] - tr.times[0])
    rates = {}
    for policy in ("lru", "predictive", "adaptive"):
        pol = LibraryPolicy(cap, policy=policy, name=policy)
        try:
            raw = replay(tr, pol, split_time=split)
        finally:
            pol.close()
        rates[policy] = sum(raw["leads"]) / raw["accesses"]
    gain = rates["predictive"] - rates["lru"]
    assert gain > 0.005, rates  # the precondition: prediction wins on this trace
    assert rates["adaptive"] >= rates["lru"] + 0.5 * gain, rates


def test_adapter_counts_leading_hits_only() -> None:
    """A prefix cache serves a request only up to its first miss: the shadows and the real cache are
    scored on each request's leading run of held blocks, not on every held block."""
    ad = TauAdapter((300.0,), 300.0, 64, sample_blocks=64, every=1, recency=True, bypass=False)

    def request(t: float, blocks: list[int], held: set[int]) -> None:
        for b in reversed(blocks):  # leaf first
            assert ad.sampled(b)  # (sample rate 1)
            ad.add(b, 0.0, t, hit=b in held)
        ad.request(t)

    request(0.0, [1, 2, 3], set())
    assert ad.recency_hits == 0
    request(1.0, [99, 2, 3], {2, 3})  # 2 and 3 held, behind a missed root: nothing served
    assert ad.recency_hits == 0 and ad._live_hits == 0
    request(2.0, [1, 2, 3, 4], {1, 2, 3})  # 1, 2, 3 lead: three served
    assert ad.recency_hits == pytest.approx(3 * 0.98)  # (decayed once, at its decision)
    assert ad._live_hits == pytest.approx(3 * 0.95)  # the real cache's three leading hits (mode_decay)


def test_adapter_resize_drops_staged_accesses() -> None:
    """A resize empties what was staged for the old size: accesses staged before it are not served
    (or counted) after it."""
    ad = TauAdapter((300.0,), 300.0, 64, sample_blocks=64, every=4, recency=True, bypass=False)
    for b in (3, 2, 1):  # leaf first, all "held" by the real cache
        ad.add(b, 0.0, 0.0, hit=True)
    ad.request(0.0)
    ad.resize(128)
    ad.add(7, 0.0, 1.0, hit=False)
    for t in (1.0, 2.0, 3.0, 4.0):  # reaches a decision: serves only what came after the resize
        ad.request(t)
    assert ad._live_hits == 0 and ad.recency_hits == 0


def test_adapter_charges_the_recovery_after_a_stay_on_the_predictor() -> None:
    """A stay on the predictor costs more than its own decisions: back on recency, the real cache
    still holds what the predictor kept. The next ``_RECOVER`` decisions are charged to the budget
    and to the failed trial's cost (the estimate of the next one's); the decisions after them are not."""
    ad = TauAdapter((300.0,), 300.0, 24, every=8, recency=True, bypass=False)
    reqs = _flipped(8000, 0.0)
    i = 0
    while not (ad.recency_mode and ad.trace and ad.trace[-1][1] == math.inf):  # the first stay ends
        _drive(ad, reqs[i : i + 1])
        i += 1
    assert ad._recover == ad._RECOVER and ad._recover_cost
    losses, costs = [ad._loss], [ad._cost]
    while ad.recency_mode and len(losses) <= ad._RECOVER + 8:  # a real cache that recovers nothing
        for t, blocks in reqs[i : i + 8]:
            for b, v in reversed(blocks):
                if ad.sampled(b):
                    ad.add(b, v, t, hit=False)
            ad.request(t)
        i += 8
        losses.append(ad._loss)
        costs.append(ad._cost)
    assert len(losses) == ad._RECOVER + 9, "a trial came back within the recovery"
    steps = [b - a for a, b in itertools.pairwise(losses)]
    assert all(s >= 0 for s in steps[: ad._RECOVER]) and sum(steps[: ad._RECOVER]) > 0, steps
    assert steps[ad._RECOVER :] == [0.0] * 8, steps  # recovered: no longer the predictor's
    assert costs[ad._RECOVER] == pytest.approx(costs[0] + sum(steps[: ad._RECOVER]))
