"""ARC in the adaptive policy (tierkv.scheduler._arc, TauAdapter's ARC shadow, the tiers' ARC lists and
Mover's ARC victims): ARC's adaptation and ghost bounds, the shadow against the lab's independent ARC, and
a real TierKV whose full cache, on ARC, keeps a hot set through a burst of one-shot blocks that flushes it
under LRU."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tierkv.errors import ConfigError
from tierkv.lab.policies.library import LibraryPolicy, tokens_of
from tierkv.lab.replay import load_trace, make_policy, replay
from tierkv.lab.synth import write_synthetic
from tierkv.scheduler._arc import ArcShadow, ArcTarget


def test_target_adapts_toward_the_list_a_returning_block_left() -> None:
    t = ArcTarget(10)
    assert not t.returning(1)  # never seen: the recent list, p unchanged
    assert t.p == 0.0
    for b in (1, 2, 3, 4):
        t.lost(b, False, 5)  # evicted from the recent list: B1
    t.lost(9, True, 5)  # from the frequent list: B2
    assert t.ghosts() == (4, 1)
    assert t.returning(2)  # a B1 hit: the recent list was too small, p grows by max(|B2|/|B1|, 1)
    assert t.p == 1.0 and t.ghosts() == (3, 1)
    assert t.returning(9)  # a B2 hit: p shrinks by max(|B1|/|B2|, 1) = 3 (clipped at 0)
    assert t.p == 0.0 and t.ghosts() == (3, 0)
    t.p = 4.0
    assert t.evict_recent(5) and not t.evict_recent(4) and not t.evict_recent(0)


def test_target_ghosts_stay_within_arcs_bounds() -> None:
    t = ArcTarget(8)
    rnd = random.Random(1)
    for b in range(1_000):
        recent = rnd.randrange(9)
        t.lost(b, rnd.random() < 0.5, recent)
        b1, b2 = t.ghosts()
        # |T1| + |B1| <= c (counting the block that comes in) and |B1| + |B2| <= c
        assert b1 <= max(0, 8 - recent - 1) and b1 + b2 <= 8
    t.p = 8.0
    t.resize(3)
    assert t.p == 3.0 and sum(t.ghosts()) <= 3
    with pytest.raises(ConfigError):
        ArcTarget(0)


def test_shadow_scores_as_the_labs_independent_arc(tmp_path: Path) -> None:
    """Full-size (unsampled) ArcShadow and the lab's ARC baseline replay the same chat trace to
    within a point of prefix hit rate (they differ only in how a request's missing blocks are
    placed: the shadow places them as the library's put does)."""
    path = tmp_path / "chat.jsonl"
    write_synthetic(path, "chat", seed=3, sessions=400)
    tr = load_trace(str(path))
    cap = max(8, round(0.05 * tr.distinct))

    class Shadow:
        name = "arc-shadow"

        def __init__(self) -> None:
            self.a = ArcShadow(cap)

        def request(self, ids: list[int], now: float, tail: bool) -> tuple[int, int]:
            lead = next((i for i, b in enumerate(ids) if b not in self.a), len(ids))
            return lead, self.a.request(ids)

    ours = replay(tr, Shadow(), split_time=0.0)  # type: ignore[arg-type]
    ref = replay(tr, make_policy("arc", cap, tr), split_time=0.0)
    rate = sum(ours["leads"]) / ours["accesses"]
    want = sum(ref["leads"]) / ref["accesses"]
    assert want > 0.05
    assert abs(rate - want) < 0.01, (rate, want)
    assert len(Shadow().a) == 0


def _held(pol: LibraryPolicy, ids: list[int]) -> int:
    """How many of ``ids`` (one-block requests) the store holds, without an access."""
    kv = pol.kv
    n = 0
    for b in ids:
        _, keys, _ = kv._s.keys(tokens_of([b]), None)
        n += keys[0].hex() in kv._index
    return n


def _on_arc(pol: LibraryPolicy) -> LibraryPolicy:
    """``pol``'s adaptive policy held on recency, on ARC."""
    sched = pol.kv._sched
    ad = sched.tau_adapter
    assert ad is not None
    ad.recency_mode = sched.recency = ad.arc_mode = True
    return pol


@pytest.mark.parametrize("arc", [True, False])
def test_a_full_store_on_arc_keeps_its_hot_set_through_a_burst(arc: bool) -> None:
    """A real TierKV of 8 blocks held on recency: 4 hot blocks used by two requests each are in ARC's
    frequent list; a burst of 12 one-shot blocks then leaves them in place on ARC (victims come from
    the recent list while it holds more than ARC's target, here 0) and flushes them under LRU. A
    one-shot block ARC evicted and that comes back is stored in the frequent list (a ghost hit), and
    ARC's target for the recent list grows."""
    pol = LibraryPolicy(8, policy="adaptive", name="adaptive")
    try:
        kv = pol.kv
        sched = kv._sched
        ad = sched.tau_adapter
        assert ad is not None and sched.arc_target is not None
        ad.recency_mode = sched.recency = True
        ad.arc_mode = arc
        assert sched.arc == arc
        t = 0.0
        for _ in range(2):
            for b in (1, 2, 3, 4):
                t += 1.0
                pol.request([b], t, False)
        tier = kv._s.tiers[0]
        assert len(tier.arc[1]) == 4 and len(tier.arc[0]) == 0
        for b in range(100, 112):
            t += 1.0
            pol.request([b], t, False)
        assert _held(pol, [1, 2, 3, 4]) == (4 if arc else 0)
        assert _held(pol, list(range(100, 112))) == (4 if arc else 8)
        assert kv.invariant_violations() == []
        if arc:
            # ARC evicted 100..107 from its recent list and remembers the last 4 (|T1| + |B1| <= c)
            assert sched.arc_target.ghosts() == (4, 0)
            t += 1.0
            pol.request([107], t, False)  # evicted by ARC, remembered: back in the frequent list
            row = kv._s.index.cols.find(kv._s.keys(tokens_of([107]), None)[1][0].hex())
            assert row >= 0 and kv._s.index.cols.arc[row] == 1
            assert sched.arc_target.p == 1.0
            assert _held(pol, [1, 2, 3, 4]) == 4  # (the victim came from the recent list)
            assert kv.invariant_violations() == []
    finally:
        pol.close()


def test_a_put_on_arc_does_not_pass_over_its_own_blocks_once_per_block(monkeypatch: pytest.MonkeyPatch) -> None:
    """A store whose blocks are all in ARC's frequent list (ARC's target for the recent list: 0) takes
    a put of 200 new blocks. The first one takes a frequent block's place; from then on the recent
    list is over its target and its least recent block is the put's own: ARC would evict it (a scan
    does not flush the frequent list), and the prefix equivalent is that the put stops there (its later
    blocks would be unreachable without its first), the frequent list kept. Each victim search
    leaves the recent list at the put's own (kept) blocks, so the put costs O(blocks) victim checks,
    not O(blocks^2). The sampled ARC shadow serves the same requests alike."""
    from tierkv.scheduler import TauAdapter

    monkeypatch.setattr(TauAdapter, "_choose_mode", lambda self, now, cur: None)  # held on ARC
    monkeypatch.setattr(TauAdapter, "_choose_recency", lambda self: None)
    cap = 300
    pol = _on_arc(LibraryPolicy(cap, policy="adaptive", name="adaptive"))
    shadow = ArcShadow(cap)
    try:
        kv = pol.kv
        sched = kv._sched
        t = 0.0
        for _ in range(2):
            for b in range(cap):
                t += 1.0
                pol.request([b], t, False)
                shadow.request([b])
        tier = kv._s.tiers[0]
        assert (len(tier.arc[0]), len(tier.arc[1])) == (0, cap) == shadow.sizes()
        index = kv._s.index
        calls = [0]
        evictable = index.evictable

        def counting(*args: object, **kw: bool) -> int | None:
            calls[0] += 1
            return evictable(*args, **kw)  # type: ignore[arg-type]

        index.evictable = counting  # type: ignore[method-assign]
        new = list(range(10_000, 10_200))
        pol.request(new, t + 1.0, False)
        shadow.request(new)
        _, keys, _ = kv._s.keys(tokens_of(new), None)
        stored = [k.hex() in kv._index for k in keys]
        assert stored == [True] + [False] * 199  # the first block only: then the put's own would go
        assert (len(tier.arc[0]), len(tier.arc[1])) == (1, cap - 1) == shadow.sizes()
        assert sum(b in shadow for b in new) == 1 and new[0] in shadow
        assert sched.arc
        assert calls[0] <= 3 * 200, calls[0]
        assert kv.invariant_violations() == []
        # the prompt again: its stored first block was used by another request, so it joins the
        # frequent list before the new blocks are stored (as ARC serves a request, and the shadow);
        # the next block then takes a frequent block's place and the put stops at the one after
        pol.request(new, t + 2.0, False)
        shadow.request(new)
        stored = [k.hex() in kv._index for k in keys]
        assert stored == [True, True] + [False] * 198 == [b in shadow for b in new]
        assert (len(tier.arc[0]), len(tier.arc[1])) == (1, cap - 1) == shadow.sizes()
        row = kv._s.index.cols.find(keys[0].hex())
        assert row >= 0 and kv._s.index.cols.arc[row] == 1  # the first block: frequent
        assert kv.invariant_violations() == []
    finally:
        pol.close()


def test_on_arc_a_put_over_the_recent_target_evicts_older_recent_blocks_first() -> None:
    """While ARC's recent list holds older blocks, a put over the recent list's target takes its
    victims from them (ARC's least recent first), not from the frequent list, and stores every block:
    the stop above applies only once the put's own blocks are all the recent list has left."""
    pol = _on_arc(LibraryPolicy(8, policy="adaptive", name="adaptive"))
    try:
        kv = pol.kv
        t = 0.0
        for _ in range(2):
            for b in (1, 2, 3, 4):
                t += 1.0
                pol.request([b], t, False)  # the frequent list: 1..4
        for b in (5, 6, 7, 8):
            t += 1.0
            pol.request([b], t, False)  # the recent list: 5..8 (over ARC's target, 0)
        t += 1.0
        pol.request([20, 21], t, False)  # a two-block prefix: victims 5 and 6
        assert _held(pol, [1, 2, 3, 4]) == 4 and _held(pol, [5, 6, 7, 8]) == 2
        _, keys, _ = kv._s.keys(tokens_of([20, 21]), None)
        assert all(k.hex() in kv._index for k in keys)
        assert kv.invariant_violations() == []
    finally:
        pol.close()


def test_on_arc_a_put_under_its_tenants_quota_does_not_stop_at_its_own_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ARC stop is for a put's own victim search over the store: under a tenant's quota the search
    sees only that tenant's blocks, while ARC's target is store-wide (the least recent block of the
    recent list may be another tenant's). A tenant at its quota whose blocks are all frequent stores
    a new 4-block prompt whole, evicting its own frequent blocks (it stored 1 of 4 with the stop)."""
    import anyio
    from kvtest import BLOCK, BT, dram_tier, kv_for, smol_config

    from tierkv import TierKV
    from tierkv.scheduler import TauAdapter

    monkeypatch.setattr(TauAdapter, "_choose_mode", lambda self, now, cur: None)  # held on ARC
    monkeypatch.setattr(TauAdapter, "_choose_recency", lambda self: None)

    def prompt(owner: int, i: int, n: int = 1) -> list[int]:
        return [owner * 1_000_000 + i * 1000 + t for t in range(n * BT)]

    async def main() -> None:
        cfg = smol_config([dram_tier(40 * BLOCK)], tenants={"bob": {"quota": {"dram": 8 * BLOCK}}})
        cfg["scheduler"] = {"policy": "adaptive"}
        kv = await TierKV.open(cfg)
        try:
            sched = kv._sched
            ad = sched.tau_adapter
            assert ad is not None
            ad.recency_mode = sched.recency = ad.arc_mode = True
            for i in range(20):  # the default tenant: 20 one-shot blocks in the recent list (over p = 0)
                await kv.put(prompt(1, i), kv_for(BT, i))
            for _ in range(2):  # bob: 8 blocks used twice (frequent), at his quota
                for i in range(8):
                    await kv.get(prompt(2, i), tenant="bob")
                    await kv.put(prompt(2, i), kv_for(BT, 100 + i), tenant="bob")
            assert sched.arc
            r = await kv.put(prompt(3, 0, 4), kv_for(4 * BT, 7), tenant="bob")
            assert r.tokens == 4 * BT
            assert kv.invariant_violations() == []
        finally:
            await kv.aclose()

    anyio.run(main)
