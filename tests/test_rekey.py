"""The re-key of every indexed block after a switch of the adaptive ``tau`` (``Mover.refresh_ranking``):
the array path (``Mover._rekey_all``, ``RankQueue.rebuild``) leaves exactly the ranks and eviction order
the per-entry path (``Mover._rekey_all_by_entry``) does, after random histories of puts extending earlier
prompts, gets, a tenant's invalidation, attention reports and answer lengths over two and three tiers,
with switches in the middle of them."""

from __future__ import annotations

import contextlib
import random

import numpy as np
import pytest
from kvtest import BT, dram_tier, kv_for, smol_config

from tierkv import InputError, TierKV
from tierkv._engine._mover import Mover

pytestmark = pytest.mark.anyio


State = tuple[dict[str, int], list[list[tuple[str, int]]]]


async def _history(kv: TierKV, seed: int, switches: bool) -> list[State]:
    """A random history (puts extending earlier prompts, gets, a tenant's invalidation, attention
    reports, answer lengths) with, when ``switches``, switches of ``tau`` in the middle of it; the
    ranks, every tier's eviction order (with the queued keys) and the invariants after each switch."""
    rnd = random.Random(seed)
    clock = [1000.0]
    kv._sched.now = lambda: clock[0]  # type: ignore[method-assign]
    roots = [[r * 100_000 + i for i in range(BT * rnd.randint(1, 3))] for r in range(8)]
    hist: list[list[int]] = []
    out: list[State] = []
    for i in range(110):
        clock[0] += rnd.expovariate(1 / 7.0)
        op = rnd.random()
        if op < 0.55 or not hist:
            base = rnd.choice(hist) if hist and rnd.random() < 0.3 else rnd.choice(roots)
            toks = base + [10_000_000 + i * 1000 + j for j in range(BT * rnd.randint(1, 5))]
            tenant = rnd.choice([None, "b"])
            await kv.lookup(toks, tenant=tenant)
            await kv.put(toks, kv_for(len(toks), i), tenant=tenant)
            hist.append(toks)
        elif op < 0.8:
            await kv.get(rnd.choice(hist))
        elif op < 0.83:
            await kv.invalidate(tenant="b")
        else:
            toks = rnd.choice(hist)
            n = len(toks) // BT
            with contextlib.suppress(InputError):  # (a request whose blocks were invalidated is unknown)
                if rnd.random() < 0.5:
                    sc = np.zeros((9, n * BT))
                    sc[:, rnd.randrange(n) * BT :][:, :BT] = 1.0
                    kv.report_attention(0, sc, np.arange(n * BT), query_pos=n * BT, tokens=toks)
                else:
                    kv.hint(response_tokens=rnd.randint(10, 400), tokens=toks)
        if switches and rnd.random() < 0.15:
            kv._sched.tau_s = rnd.choice([5.0, 30.0, 45.0, 300.0, 1000.0])  # what the adaptive tau does
            kv._s.mover.refresh_ranking()
            out.append(_state(kv))
            assert kv.invariant_violations() == []
    return out


def _state(kv: TierKV) -> State:
    c = kv._s.index.cols
    ranks = {e.key: e.rank for e in kv._index.values()}
    orders = []
    for t in kv._s.tiers:
        rows = t.queue.pick(lambda r: 1, t.queue.n)  # every queued row, lowest rank first (restored after)
        orders.append([(c.key_of(r), c.qkey[r]) for r in rows])
    return ranks, orders


@pytest.mark.parametrize("policy", ["adaptive", "predictive"])
@pytest.mark.parametrize(("seed", "caps"), [(1, ("6MiB", "40MiB")), (2, ("2MiB", "4MiB", "30MiB"))])
async def test_the_array_rekey_matches_the_per_entry_one(
    policy: str, seed: int, caps: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = smol_config([dram_tier(cap, f"t{i}") for i, cap in enumerate(caps)], scheduler={"policy": policy})
    runs = []
    fast = [0]
    rekey_all = Mover._rekey_all

    def counted(self: Mover) -> bool:
        ok = rekey_all(self)
        fast[0] += ok
        return ok

    for slow in (False, True):
        with monkeypatch.context() as m:
            m.setattr(Mover, "_rekey_all", (lambda self: False) if slow else counted)
            kv = await TierKV.open(cfg)  # no scheduler service: both stores see the same history
            try:
                runs.append(await _history(kv, seed, switches=True))
                runs[-1].append(_state(kv))
            finally:
                await kv.aclose()
    assert runs[0] == runs[1]
    assert fast[0] >= 5  # the array path ran at every switch
    ranks, orders = runs[0][-1]
    assert len(ranks) > 40 and len({*ranks.values()}) > 10 and sum(len(o) for o in orders) > 40  # not trivial


async def test_the_array_rekey_keeps_parents_at_or_above_children() -> None:
    cfg = smol_config([dram_tier("40MiB")], scheduler={"policy": "predictive"})
    async with await TierKV.open(cfg) as kv:
        await _history(kv, 3, switches=False)
        mover = kv._s.mover
        kv._sched.tau_s = 45.0
        assert mover._rekey_all()  # the array path handles this store
        idx = kv._index
        bad = [e.key for e in idx.values() if (p := idx.get(bytes(e.parent).hex())) is not None and p.rank < e.rank]
        assert bad == []
        expect = {e.key: mover.rank_of(e) for e in idx.values()}
        got = {e.key: e.rank for e in idx.values()}
        assert all(got[k] >= v for k, v in expect.items())  # raised, never lowered
        assert sum(got[k] == v for k, v in expect.items()) > 0.5 * len(expect)
