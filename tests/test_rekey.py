"""The re-key of every indexed block after a switch of the adaptive ``tau`` (``Mover.refresh_ranking``):
the array path (``Mover._rekey_all``, ``RankQueue.rebuild``) leaves exactly the ranks and eviction order
the per-entry path (``Mover._rekey_all_by_entry``) does, on a store with shared prefixes, protected
fanouts, attention reports, answer lengths and two tiers."""

from __future__ import annotations

import random

import numpy as np
import pytest
from kvtest import BT, dram_tier, kv_for, smol_config

from tierkv import TierKV
from tierkv._engine._mover import Mover

pytestmark = pytest.mark.anyio


async def _scenario(kv: TierKV, seed: int) -> None:
    rnd = random.Random(seed)
    clock = [1000.0]
    kv._sched.now = lambda: clock[0]  # type: ignore[method-assign]
    roots = [[r * 100_000 + i for i in range(BT * rnd.randint(1, 3))] for r in range(6)]
    for i in range(70):
        clock[0] += rnd.expovariate(1 / 7.0)
        root = rnd.choice(roots)
        tail = [10_000_000 + i * 1000 + j for j in range(BT * rnd.randint(1, 5))]
        toks = root + tail
        await kv.lookup(toks)
        await kv.put(toks, kv_for(len(toks), i))
        if i % 9 == 0:
            n = len(toks) // BT
            s = np.zeros((9, n * BT))
            s[:, rnd.randrange(n) * BT :][:, :BT] = 1.0
            kv.report_attention(0, s, np.arange(n * BT), query_pos=n * BT, tokens=toks)
        if i % 5 == 0:
            kv.hint(response_tokens=rnd.randint(10, 400), tokens=toks)


def _state(kv: TierKV) -> tuple[dict[str, int], list[list[str]]]:
    c = kv._s.index.cols
    ranks = {e.key: e.rank for e in kv._index.values()}
    orders = []
    for t in kv._s.tiers:
        rows = t.queue.pick(lambda r: 1, t.queue.n)  # every queued row, lowest rank first (restored after)
        orders.append([c.key_of(r) for r in rows])
    return ranks, orders


@pytest.mark.parametrize("policy", ["adaptive", "predictive"])
@pytest.mark.parametrize("seed", [1, 2])
async def test_the_array_rekey_matches_the_per_entry_one(
    policy: str, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = smol_config([dram_tier("6MiB", "fast"), dram_tier("40MiB", "slow")], scheduler={"policy": policy})
    states = []
    for slow in (False, True):
        with monkeypatch.context() as m:
            if slow:
                m.setattr(Mover, "_rekey_all", lambda self: False)
            kv = await TierKV.open(cfg)  # no scheduler service: both stores see the same history
            try:
                await _scenario(kv, seed)
                mover = kv._s.mover
                mover.refresh_ranking()
                assert kv._s.tiers[1].queue.n > 0 and kv._s.tiers[0].queue.n > 0  # both tiers ranked
                for tau in (30.0, 300.0, 45.0):  # what switches of the adaptive tau do
                    kv._sched.tau_s = tau
                    mover.refresh_ranking()
                    states.append(_state(kv))
            finally:
                await kv.aclose()
    fast, slow_ = states[:3], states[3:]
    for (fr, fo), (sr, so) in zip(fast, slow_, strict=True):
        assert fr == sr
        assert fo == so
    assert len(fast[0][0]) > 50 and len({*fast[0][0].values()}) > 10  # a real ranking, not a trivial one


async def test_the_array_rekey_keeps_parents_at_or_above_children() -> None:
    cfg = smol_config([dram_tier("40MiB")], scheduler={"policy": "predictive"})
    async with await TierKV.open(cfg) as kv:
        await _scenario(kv, 3)
        mover = kv._s.mover
        assert mover._rekey_all()  # the array path handles this store
        idx = kv._index
        bad = [e.key for e in idx.values() if (p := idx.get(bytes(e.parent).hex())) is not None and p.rank < e.rank]
        assert bad == []
        expect = {e.key: mover.rank_of(e) for e in idx.values()}
        got = {e.key: e.rank for e in idx.values()}
        assert all(got[k] >= v for k, v in expect.items())  # raised, never lowered
        assert sum(got[k] == v for k, v in expect.items()) > 0.5 * len(expect)
