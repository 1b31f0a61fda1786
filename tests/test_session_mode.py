"""The adaptive policy's session mode (``TauAdapter.session_mode``, ``SchedulerState.session_mode``): the
renewal-process cache (:class:`~tierkv.scheduler.SessionPolicy`) run as a whole shadow of the library's
cache, and the library following it."""

from __future__ import annotations

import random
from collections.abc import Hashable, Sequence
from pathlib import Path

import numpy as np
import pytest

from tierkv._keys import tail_key
from tierkv.lab.policies.library import LibraryPolicy, tokens_of
from tierkv.lab.replay import load_trace, replay
from tierkv.lab.synth import write_synthetic
from tierkv.scheduler import SessionPolicy, TauAdapter
from tierkv.scheduler._session import _CLS_TAIL


def _held_in_session(pol: LibraryPolicy) -> LibraryPolicy:
    """``pol``'s adaptive policy held on recency in the session mode."""
    kv = pol.kv
    ad = kv._sched.tau_adapter
    assert ad is not None
    ad._set_recency(4)
    ad.recency_mode = kv._sched.recency = True
    assert kv._sched.session_mode and not (kv._sched.admit or kv._sched.arc or kv._sched.slru)
    return pol


def test_the_session_cache_forgets_what_it_no_longer_holds_within_a_bound() -> None:
    """Every request a new conversation of fresh blocks: what the cache remembers of blocks it no longer
    holds (their sessions, fanouts, the leaves that identify a returning conversation) stays within its
    bound, and what it dropped stays within ``2 x capacity + 1024``, whatever the number of requests."""
    cap = 8
    pol = SessionPolicy(cap, track=True)
    limit = 2 * cap + 16384
    b = 0
    for i in range(40_000):
        ids = [b, b + 1, b + 2]
        b += 3
        pol.request(ids, float(i), False)
        assert len(pol.cache) <= cap
    assert len(pol.toucher) <= limit
    assert len(pol.s_start) <= limit + cap and len(pol.s_pid) == len(pol.s_start)
    assert len(pol.fanout) <= limit + cap
    assert len(pol.dropped) <= 2 * cap + 1024
    assert pol.hz.periods <= pol.hz.max_periods


def test_without_evictions_the_sessions_ranked_stay_as_many_as_the_held_blocks() -> None:
    """A cache larger than the working set never evicts: the sessions it ranks (their lists, rescored every
    second of the clock) stay at most the held blocks, not one per request, and so does the work."""
    pol = SessionPolicy(1000, track=True)
    rnd = random.Random(7)
    for i in range(20_000):
        n = rnd.randint(1, 8)
        pol.request([rnd.randrange(50) * 100 + k for k in range(n)], i * 0.5, False)
        assert len(pol.lists) <= len(pol.cache)
    assert len(pol.owned) <= len(pol.cache) and sum(pol.owned.values()) == len(pol.cache)
    assert len(pol.heap) <= 4 * len(pol.cache) + 64


def test_a_returning_conversation_continues_its_session_after_its_blocks_left() -> None:
    """A conversation whose blocks all left the cache comes back: its previous leaf (remembered) makes it
    the next turn of its session (a period event), not a new session; with ``continuation`` a chunk of
    the same turn joins the session without an event."""
    pol = SessionPolicy(4, track=True)
    pol.request([1, 2, 3], 0.0, False)
    sid = pol.toucher[3]
    for k in range(4):  # other conversations push 1..3 out
        pol.request([100 + 10 * k, 101 + 10 * k], 1.0 + k, False)
    assert not any(pol.holds(b) for b in (1, 2, 3))
    assert {1, 2, 3} <= set(pol.dropped)
    periods = pol.hz.periods
    pol.request([1, 2, 3, 4], 10.0, False)
    new = pol.toucher[4]
    assert new != sid and pol.s_turn[new] == pol.s_turn[sid] + 1  # the next turn of the same conversation
    assert pol.hz.periods == periods + 2  # the new turn's period and the old one's leftover
    pol.request([1, 2, 3, 4, 5], 10.5, False, continuation=True)
    assert pol.toucher[5] == new and pol.hz.periods == periods + 2  # same turn: no new period


def test_a_session_shadow_that_leads_takes_the_cache_and_gives_it_back_to_lru() -> None:
    """The session shadow's sampled leading hits are counted as the other recency shadows': leading LRU by
    more than the margin, it takes the cache on recency; once LRU's are at least its, LRU takes it back."""
    ad = TauAdapter((300.0,), 300.0, 64, every=32, recency=True, bypass=False)
    ad.recency_mode = True
    ad._rec_fast = ad._adm_hits = ad._slru.hits = ad._arc_hits = 100.0
    ad._ses_hits = 130.0
    ad._choose_recency()
    assert ad.session_mode and not (ad.admit_mode or ad.slru_mode or ad.arc_mode)
    ad._ses_hits = 99.0
    ad._choose_recency()
    assert not ad.session_mode
    ad.add_session(7)
    assert ad._ses_buf == 7
    ad.session_mode = True
    ad.resize(128)
    assert not ad.session_mode and ad._ses_buf == 0


@pytest.mark.parametrize("tails", [False, True])
def test_the_library_in_the_session_mode_holds_what_its_shadow_holds(
    tails: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real TierKV held in the session mode, driven request by request over conversations that return
    at random: after every request the store holds exactly the blocks its session shadow holds (a put
    stores only what the shadow kept, victims are what it dropped), and its index stays consistent.
    ``tails``: half the prompts end in a partial block, which the store keeps as a tail (its own key)
    only while the shadow does."""
    monkeypatch.setattr(TauAdapter, "_choose_mode", lambda self, now, cur: None)
    monkeypatch.setattr(TauAdapter, "_choose_recency", lambda self: None)
    rnd = random.Random(3)
    pol = _held_in_session(LibraryPolicy(24, policy="adaptive", name="adaptive"))
    try:
        kv = pol.kv
        ses = kv._sched.session
        assert ses is not None
        convs: list[list[int]] = []
        tails_held: list[bool] = []
        nxt = 10_000
        t = 0.0
        for _ in range(300):
            t += rnd.expovariate(1.0)
            if convs and rnd.random() < 0.6:
                c = rnd.choice(convs)
            else:
                c = [7]  # a shared one-block system prompt
                convs.append(c)
            c.extend(range(nxt, nxt + rnd.randint(1, 4)))
            nxt += 4
            tail = tails and rnd.random() < 0.5
            pol.request(list(c), t, tail)
            held = {k for k in kv._index}
            if tail:
                toks = tokens_of(c, True)
                _, keys, _ = kv._s.keys(toks, None)
                tails_held.append(tail_key(keys[-1], toks[len(keys) * 16 :]).hex() in held)
            assert held == {b.hex() for b in ses.cache if isinstance(b, bytes)}, (len(held), len(ses.cache))
        assert kv.invariant_violations() == []
        if tails:  # some tails were kept by the shadow (so stored), some not
            assert 0 < sum(tails_held) < len(tails_held), tails_held
    finally:
        pol.close()


@pytest.mark.parametrize("seed", [5, 6])
def test_the_library_in_the_session_mode_scores_as_the_labs_session_policy(
    seed: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The library held in the session mode against the lab's ``lab-tierkv-session`` (the same class) on the
    bursty synthetic shape at 5%: the same prefix hit rate within 0.2 points, and well above LRU (bursts
    of one-shot first turns pass through, the long conversations stay). A request's partial last block
    reaches the library as a tail (``partial_blocks``), which its session shadow classes as the lab does
    (told instead that every block is whole, the lab's policy scores otherwise: the comparison sees it)."""
    path = tmp_path / "bursty.jsonl"
    write_synthetic(path, "bursty", seed=seed, sessions=300)
    tr = load_trace(str(path))
    cap = max(8, round(0.05 * tr.distinct))
    split = tr.times[0] + 0.4 * (tr.times[-1] - tr.times[0])
    monkeypatch.setattr(TauAdapter, "_choose_mode", lambda self, now, cur: None)
    monkeypatch.setattr(TauAdapter, "_choose_recency", lambda self: None)
    from tierkv.lab.policies import LruPolicy

    def rate(p: object) -> float:
        raw = replay(tr, p, split_time=split)  # type: ignore[arg-type]
        return float(sum(raw["leads"]) / max(1, raw["accesses"]))

    class Whole(SessionPolicy):
        __slots__ = ()

        def request(self, ids: Sequence[Hashable], now: float, tail_partial: bool, **kw: bool) -> tuple[int, int]:
            return super().request(ids, now, False, **kw)

    lab = rate(SessionPolicy(cap))
    whole = rate(Whole(cap))
    lru = rate(LruPolicy(cap))
    pol = _held_in_session(LibraryPolicy(cap, policy="adaptive", name="adaptive"))
    try:
        lib = rate(pol)
    finally:
        pol.close()
    assert abs(lib - lab) < 0.002, (lib, lab, whole)
    assert abs(whole - lab) > 0.002, (whole, lab)
    assert lib > lru + 0.05, (lib, lru)


def test_session_shadow_false_runs_the_adaptive_policy_without_it() -> None:
    """``scheduler.session_shadow = false``: no shadow, no session mode, puts and victims as before; an
    unknown spelling is a typed error naming the key."""
    from tierkv import SyncTierKV
    from tierkv.errors import ConfigError
    from tierkv.lab.policies.library import library_config

    cfg = library_config(16, "adaptive")
    cfg["scheduler"]["session_shadow"] = False
    kv = SyncTierKV.open(cfg, scheduler=False)
    try:
        sched = kv.aio._sched
        sched.set_capacity_blocks(16)
        assert sched.session is None and not sched.session_mode
        kv.put(tokens_of([1, 2, 3]), np.zeros((1, 2, 48, 1, 64), dtype=np.float16))
        assert kv.lookup(tokens_of([1, 2, 3])).blocks == 3
    finally:
        kv.close()
    cfg["scheduler"]["session_shadow"] = "yes please"
    with pytest.raises(ConfigError, match="session_shadow"):
        SyncTierKV.open(cfg, scheduler=False)


def test_a_get_then_its_put_are_one_request_for_the_session_shadow(monkeypatch: pytest.MonkeyPatch) -> None:
    """An engine's get of the stored prefix then its put (``start`` or not) are one request: one turn,
    and the put counts only the blocks past what the get fed (its new blocks: no hit counted twice).
    A get of prompts nobody stored feeds the shadow nothing (another tenant's blocks stay in it)."""
    monkeypatch.setattr(TauAdapter, "_choose_mode", lambda self, now, cur: None)
    monkeypatch.setattr(TauAdapter, "_choose_recency", lambda self: None)
    counted: list[int] = []
    add = TauAdapter.add_session

    def recording(self: TauAdapter, leading: int) -> None:
        counted.append(leading)
        add(self, leading)

    monkeypatch.setattr(TauAdapter, "add_session", recording)
    pol = LibraryPolicy(64, policy="adaptive", name="adaptive")
    try:
        kv, sync = pol.kv, pol._sync
        ses = kv._sched.session
        assert ses is not None
        zeros = np.zeros((1, 2, 16 * 6, 1, 64), dtype=np.float16)
        b = 1000
        for i in range(200):  # 6-block prompts whose first 3 blocks an earlier, shorter request stored
            toks = tokens_of(list(range(b, b + 6)))
            pol._clock[0] = float(i)
            sync.put(toks[: 16 * 3], zeros[:, :, : 16 * 3])
            assert sync.get(toks).tokens == 16 * 3
            n = len(counted)
            if i % 2:  # an engine's put of what it computed past the loaded prefix
                sync.put(toks, zeros[:, :, 16 * 3 :], start=16 * 3)
            else:
                sync.put(toks, zeros)
            assert counted[n:] == [0]  # the put's own new blocks only: none held
            b += 6
        periods = ses.hz.periods
        # per prompt: the short request's period, the get's turn (its period and the leftover); a put
        # taken for a new turn would add two more
        assert periods <= 3 * 200 + 8, periods
        held = set(ses.cache)
        for i in range(50):  # gets of prompts nobody stored
            sync.get(tokens_of(list(range(10**6 + 10 * i, 10**6 + 10 * i + 4))))
        assert set(ses.cache) == held and ses.hz.periods == periods
    finally:
        pol.close()


def test_a_block_the_shadow_dropped_twice_is_one_victim(monkeypatch: pytest.MonkeyPatch) -> None:
    """A key can be in the shadow's drops twice (dropped, held again, dropped again): the victim search
    returns it once, and the store's bytes and index stay consistent."""
    monkeypatch.setattr(TauAdapter, "_choose_mode", lambda self, now, cur: None)
    monkeypatch.setattr(TauAdapter, "_choose_recency", lambda self: None)
    pol = _held_in_session(LibraryPolicy(8, policy="adaptive", name="adaptive"))
    try:
        kv = pol.kv
        ses = kv._sched.session
        assert ses is not None
        for i in range(8):
            pol.request([100 + i], float(i), False)
        key = next(iter(ses.cache))
        del ses.cache[key]  # (as if the shadow had dropped it, twice)
        ses.dropped.extend([key, key])
        ses.cache[key] = 0
        del ses.cache[key]
        victims = kv._s.mover.pick_victims(0, 3 * kv._s.block_nbytes)
        rows = [v.row for v in victims]
        assert len(rows) == len(set(rows)) == 3 and victims[0].key == key.hex()
        assert kv.invariant_violations() == []
    finally:
        pol.close()


def test_a_partial_last_block_reaches_the_session_shadow_as_the_requests_tail(monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``partial_blocks`` a put's trailing partial block is the last block of the request the session
    shadow sees, flagged partial (its own class, as in the lab: the next turn extends it under another
    key); a get that finds a stored tail after every whole block feeds it likewise, and the put of the
    same request then counts nothing again."""
    seen: list[tuple[list[Hashable], bool, bool]] = []
    leads: list[int] = []
    orig = SessionPolicy.request
    add = TauAdapter.add_session

    def recording(
        self: SessionPolicy, ids: Sequence[Hashable], now: float, tail_partial: bool, *, continuation: bool = False
    ) -> tuple[int, int]:
        seen.append((list(ids), tail_partial, continuation))
        return orig(self, ids, now, tail_partial, continuation=continuation)

    def counting(self: TauAdapter, leading: int) -> None:
        leads.append(leading)
        add(self, leading)

    monkeypatch.setattr(SessionPolicy, "request", recording)
    monkeypatch.setattr(TauAdapter, "add_session", counting)
    monkeypatch.setattr(TauAdapter, "sampled", lambda self, block: True)  # every block counted
    pol = LibraryPolicy(64, policy="adaptive", name="adaptive")
    try:
        kv, sync = pol.kv, pol._sync
        ses = kv._sched.session
        assert ses is not None and kv.config.partial_blocks
        toks = tokens_of([5, 6, 7], True)  # two whole blocks and 8 tokens of a third
        _, keys, _ = kv._s.keys(toks, None)
        tk = tail_key(keys[-1], toks[32:])
        pol.request([5, 6, 7], 1.0, True)
        assert seen[-1] == ([*keys, tk], True, False)
        assert tk in ses.cache and ses.s_cls[ses.cache[tk]] == _CLS_TAIL
        assert tk.hex() in kv._index  # stored (the cache has room)
        pol._clock[0] = 2.0
        assert sync.get(toks).tokens == 40  # the whole blocks and the tail
        assert seen[-1] == ([*keys, tk], True, False)
        assert leads[-1] == 3  # the get's leading hits: both whole blocks and the tail
        whole = ses.cache[keys[0]]
        assert ses.cache[keys[1]] == whole and ses.s_cls[whole] != _CLS_TAIL
        n = len(seen)
        sync.put(toks, np.zeros((1, 2, 40, 1, 64), dtype=np.float16))
        assert seen[n:] == [([*keys, tk], True, True)]  # the same request: a continuation
        assert leads[-1] == 0  # ... that counts nothing the get counted
        # the whole blocks stay in the request's session, the tail in a tail session of its own
        assert ses.cache[keys[0]] == ses.cache[keys[1]] == whole
        assert ses.s_cls[ses.cache[tk]] == _CLS_TAIL and ses.cache[tk] != whole
        # without partial blocks in the prompt nothing is flagged
        pol.request([8, 9], 3.0, False)
        assert seen[-1][1] is False and len(seen[-1][0]) == 2
    finally:
        pol.close()
