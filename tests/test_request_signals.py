"""Per-request signals: attention reports, answer lengths and transition labels tied to the request
they are about (``tokens=``), head importance per stored block, parents never below their children."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kvtest import BT, config, dram_tier, kv_for, smol_config

from tierkv import InputError, TierKV
from tierkv.scheduler import TRANSITIONS, HeadImportance
from tierkv.scheduler._importance import BlockImportance
from tierkv.scheduler._predictor import N_COUNT_BUCKETS, N_FANOUT_BUCKETS, N_SIZE_BUCKETS

pytestmark = pytest.mark.anyio

QH = 9  # SmolLM2-135M: 9 query heads over 3 KV heads (GQA groups of 3), 30 layers


def toks(fam: int, n_blocks: int) -> list[int]:
    return [fam * 10_000 + i for i in range(n_blocks * BT)]


def scores_on(block: int, n_blocks: int, heads: int = QH) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Attention of every query head on block ``block`` only (positions 0 .. n_blocks * BT - 1)."""
    s = np.zeros((heads, n_blocks * BT))
    s[:, block * BT : (block + 1) * BT] = 1.0
    return s, np.arange(n_blocks * BT)


def predictive() -> dict[str, Any]:
    return smol_config([dram_tier()], scheduler={"policy": "predictive"})


def transition_of(cell: int) -> str:
    return TRANSITIONS[(cell // (N_COUNT_BUCKETS * N_FANOUT_BUCKETS * N_SIZE_BUCKETS)) % len(TRANSITIONS)]


def chain_keys(kv: TierKV, tokens: list[int]) -> list[str]:
    _, keys, _ = kv._s.keys(tokens, None)
    return [k.hex() for k in keys]


def ranks(kv: TierKV, keys: list[str]) -> list[int]:
    kv._s.mover.refresh_ranking()
    return [kv._index[k].rank for k in keys]


def parent_violations(kv: TierKV) -> list[str]:
    """Indexed blocks ranked above their parent."""
    out = []
    for e in kv._index.values():
        p = kv._index.get(bytes(e.parent).hex())
        if p is not None and p.rank < e.rank:
            out.append(e.key)
    return out


async def test_attention_on_one_sequence_leaves_the_other_alone() -> None:
    async with await TierKV.open(predictive()) as kv:
        a, b = toks(1, 3), toks(2, 3)
        await kv.put(a, kv_for(len(a), 1))
        await kv.put(b, kv_for(len(b), 2))
        ka, kb = chain_keys(kv, a), chain_keys(kv, b)
        before_a, before_b = ranks(kv, ka), ranks(kv, kb)
        s, pos = scores_on(1, 3)
        for layer in range(4):
            kv.report_attention(layer, s, pos, query_pos=len(a), tokens=a)
        after_a, after_b = ranks(kv, ka), ranks(kv, kb)
        assert after_b == before_b  # the other sequence's ranking does not move
        # the attended block and its parent rise; the unattended leaf below them does not
        assert after_a[0] > before_a[0] and after_a[1] > before_a[1] and after_a[2] == before_a[2]
        imp = kv._sched.block_importance
        assert imp is not None and all(k not in imp for k in kb)
        victims = [e.key for e in kv._s.mover.pick_victims(0, 6 * 10**9)]
        # every block of B leaves before A's attended block and its parent
        assert max(victims.index(k) for k in kb) < min(victims.index(k) for k in ka[:2])
        assert parent_violations(kv) == []


async def test_untied_report_applies_to_the_most_recent_request_only() -> None:
    async with await TierKV.open(predictive()) as kv:
        a, b = toks(1, 2), toks(2, 2)
        s, pos = scores_on(0, 2)
        kv.report_attention(0, s, pos, query_pos=2 * BT)  # no request yet: only the prefetch window
        assert kv._sched.block_importance is None
        await kv.put(a, kv_for(len(a), 1))
        await kv.put(b, kv_for(len(b), 2))
        kv.report_attention(0, s, pos, query_pos=2 * BT)
        imp = kv._sched.block_importance
        assert imp is not None
        assert all(k in imp for k in chain_keys(kv, b)) and all(k not in imp for k in chain_keys(kv, a))


async def test_a_remembered_request_keeps_its_leaf_not_its_chain() -> None:
    """The untied report finds the most recent request's blocks from its deepest block by parent
    links; a remembered request holds no key list, and a chain broken meanwhile gets nothing."""
    async with await TierKV.open(predictive()) as kv:
        a = toks(1, 4)
        await kv.put(a, kv_for(len(a), 1))
        ka = chain_keys(kv, a)
        rec = kv._sched.requests[ka[-1]]
        assert (rec.leaf, rec.blocks) == (ka[-1], 4)
        assert not any(isinstance(getattr(rec, f.name), (tuple, list)) for f in dataclasses.fields(rec))
        assert [e.key for e in kv._s.index.chain_to(ka[-1], 4)] == ka
        assert [e.key for e in kv._s.index.chain_to(ka[-1], 2)] == []  # not a whole chain within 2
        assert [e.key for e in kv._s.index.chain_to(ka[1], 4)] == ka[:2]
        del kv._index[ka[1]]  # a middle block gone: the leaf's chain is broken
        assert kv._s.index.chain_to(ka[-1], 4) == []
        s, pos = scores_on(0, 4)
        kv.report_attention(0, s, pos, query_pos=len(a))  # untied: applies to no block
        imp = kv._sched.block_importance
        assert imp is None or all(k not in imp for k in ka)


async def test_a_parent_never_ranks_below_its_attended_child() -> None:
    async with await TierKV.open(predictive()) as kv:
        a = toks(1, 4)
        # c shares a's first two blocks, then goes its own way
        c = a[: 2 * BT] + [77_000 + i for i in range(2 * BT)]
        await kv.put(a, kv_for(len(a), 1))
        await kv.put(c, kv_for(len(c), 3))
        ka, kc = chain_keys(kv, a), chain_keys(kv, c)
        s, pos = scores_on(3, 4)  # all the mass on a's deepest block
        for layer in range(6):
            kv.report_attention(layer, s, pos, query_pos=len(a), tokens=a)
        imp = kv._sched.block_importance
        assert imp is not None
        own = [imp.own(k) for k in ka]
        assert all(o is not None for o in own)
        assert float(np.sum(own[3])) > 0 and float(np.sum(own[0])) == 0.0  # the child was attended
        assert [imp.score(k) for k in ka] == sorted((imp.score(k) for k in ka), reverse=True)
        r = ranks(kv, ka)
        assert r == sorted(r, reverse=True)  # parent >= child all the way down
        assert parent_violations(kv) == []
        # eviction never takes a parent before its child
        order = [e.key for e in kv._s.mover.pick_victims(0, 10 * 10**9)]
        at = [order.index(k) for k in ka]
        assert at == sorted(at, reverse=True)
        # c's own blocks were not attended: below the shared parents they hang from
        assert kv._index[kc[2]].rank <= kv._index[ka[1]].rank


def test_block_importance_propagates_the_max_to_ancestors_and_back_down() -> None:
    heads = HeadImportance(2, 4, 2, block_tokens=2, weight=1.0)
    imp = BlockImportance(heads)
    one = np.array([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    imp.report(0, one, ["r", "m", "leaf"])
    assert imp.score("leaf") == imp.score("m") == imp.score("r") == 1.0
    imp.report(0, np.array([[0.0, 0.5], [0.0, 0.0]]), ["r", "other"])  # a sibling chain
    assert imp.score("other") == 0.5 and imp.score("r") == 1.0  # still the max over its subtree
    imp.report(0, np.zeros((2, 3)), ["r", "m", "leaf"])  # weight 1: the leaf's attention is gone
    assert imp.score("leaf") == 0.0 and imp.score("m") == 0.0
    assert imp.score("r") == 0.5  # the sibling's is what remains under the root
    v = imp.version
    with pytest.raises(InputError):
        imp.report(0, np.zeros((2, 2)), ["r", "m", "leaf"])
    with pytest.raises(InputError):
        imp.report(5, np.zeros((2, 3)), ["r", "m", "leaf"])
    assert imp.version == v and imp.score("r") == 0.5
    small = BlockImportance(heads, max_keys=2)
    small.report(0, one, ["r", "m", "leaf"])
    assert len(small) == 2 and "r" not in small  # the least recently reported goes first


def test_mla_and_gqa_aggregation_is_reused() -> None:
    gqa = HeadImportance(1, 4, 2, block_tokens=2)
    s = np.zeros((4, 4))
    s[0, 0] = s[1, 2] = 1.0  # two query heads of KV head 0, on different blocks
    s[3, 3] = 1.0
    m = gqa.mass(s, np.arange(4), 4, 2)
    assert m.shape == (2, 2) and list(m[0]) == [1.0, 1.0] and list(m[1]) == [0.0, 1.0]  # max over the group
    mla = HeadImportance(1, 4, 2, block_tokens=2, mla=True)
    assert mla.mass(s, np.arange(4), 4, 2).shape == (1, 2)


async def test_response_tokens_tied_to_a_request_reweight_that_request() -> None:
    async with await TierKV.open(predictive()) as kv:
        sched = kv._sched
        a, b = toks(1, 3), toks(2, 3)
        await kv.put(a, kv_for(len(a), 1))
        await kv.put(b, kv_for(len(b), 2))  # b is the most recent request
        ka, kb = chain_keys(kv, a), chain_keys(kv, b)

        def prio(keys: list[str]) -> list[float]:
            return [sched.priority(kv._index[k].cell, kv._index[k].t_last) for k in keys]

        pa, pb = prio(ka), prio(kb)
        sched.response.adjust = [-1.0, 0.0, 0.0, 0.0, 0.5]  # as if learned
        kv.hint(response_tokens=3, tokens=a)
        for x, y in zip(prio(ka), pa, strict=True):
            assert x == pytest.approx(y - 1.0, abs=1e-2)  # plus (t_done - t_request) / tau
        assert prio(kb) == pb  # b's blocks are untouched
        kv.hint(response_tokens=900, tokens=a)  # a's access again: ignored
        assert len(sched._resp_start) == 1
        kv.hint(response_tokens=900)  # untied: the most recent request, b
        for x, y in zip(prio(kb), pb, strict=True):
            assert x == pytest.approx(y + 0.5, abs=1e-2)
        kv.hint(response_tokens=3, tokens=b)  # b was answered (untied): ignored
        assert len(sched._resp_start) == 2 and sched._resp_start == sorted(sched._resp_start)


async def test_transition_tied_to_a_request_labels_that_request_only() -> None:
    async with await TierKV.open(predictive()) as kv:
        a, b, c = toks(1, 2), toks(2, 2), toks(3, 2)
        kv.hint(transition="tool_switch", tokens=a)  # a is not stored yet: the label waits for it
        await kv.put(b, kv_for(len(b), 2))  # an unrelated request
        assert {transition_of(kv._index[k].cell) for k in chain_keys(kv, b)} == {"agent_handoff"}
        await kv.put(a, kv_for(len(a), 1))
        assert {transition_of(kv._index[k].cell) for k in chain_keys(kv, a)} == {"tool_switch"}
        assert kv._sched.transitions_for == {}
        await kv.get(a)  # consumed: a's next access is derived again
        assert {transition_of(kv._index[k].cell) for k in chain_keys(kv, a)} == {"same_tool_repeat"}
        # untied: the next request (a get here), and not the ones after it
        kv.hint(transition="reasoning_step")
        await kv.get(b)
        assert {transition_of(kv._index[k].cell) for k in chain_keys(kv, b)} == {"reasoning_step"}
        await kv.put(c, kv_for(len(c), 3))
        assert {transition_of(kv._index[k].cell) for k in chain_keys(kv, c)} == {"agent_handoff"}


async def test_bad_request_signals_raise_and_change_nothing() -> None:
    async with await TierKV.open(predictive()) as kv:
        a = toks(1, 2)
        await kv.put(a, kv_for(len(a), 1))
        s, pos = scores_on(0, 2)
        kv.report_attention(0, s, pos, query_pos=len(a), tokens=a)
        sched = kv._sched
        imp = sched.block_importance
        assert imp is not None
        version, before = imp.version, ranks(kv, chain_keys(kv, a))
        window = dict(sched.prefetch_planner.spans._span) if sched.prefetch_planner is not None else None
        unknown = toks(9, 2)
        bad: list[tuple[tuple[Any, ...], dict[str, Any], str]] = [
            ((0, s, pos, len(a)), {"tokens": unknown}, "unknown request"),
            ((0, s[:8], pos, len(a)), {"tokens": a}, "head_scores"),  # 8 query heads, not 9
            ((0, s, pos[:-1], len(a)), {"tokens": a}, "head_scores"),  # positions of another length
            ((0, s, pos + 5, len(a)), {"tokens": a}, "past the request"),
            ((30, s, pos, len(a)), {"tokens": a}, "layer"),
            ((0, -s, pos, len(a)), {"tokens": a}, ">= 0"),
            ((0, s, pos, -1), {"tokens": a}, "query_pos"),
            ((0, s, pos, len(a)), {"tokens": a, "layer_class": ""}, "layer_class"),
        ]
        for args, kw, match in bad:
            with pytest.raises(InputError, match=match):
                kv.report_attention(*args, **kw)
        assert imp.version == version and ranks(kv, chain_keys(kv, a)) == before
        assert (dict(sched.prefetch_planner.spans._span) if sched.prefetch_planner is not None else None) == window
        with pytest.raises(InputError, match="unknown request"):
            kv.hint(response_tokens=3, tokens=unknown)
        with pytest.raises(InputError, match="shorter than one block"):
            kv.hint(response_tokens=3, tokens=[1, 2, 3])
        with pytest.raises(InputError, match="transition"):
            kv.hint(transition="teleport", tokens=a)
        with pytest.raises(InputError, match="unknown request"):  # the valid label is not tied either
            kv.hint(transition="tool_switch", response_tokens=3, tokens=unknown)
        with pytest.raises(InputError, match="tokens"):
            kv.hint(tokens=a)  # nothing to tie
        assert sched._resp_start == [] and sched.transitions_for == {} and sched.transition is None
        assert not any(r.answered for r in sched.requests.values())


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_tied_signals_through_the_sync_facade(tmp_path: Path, backend: str) -> None:
    cfg = config(tmp_path, pfs=None, scheduler={"policy": "adaptive"})
    with TierKV.open_sync(cfg, backend=backend) as kv:  # type: ignore[arg-type]
        a, b = toks(1, 2), toks(2, 2)
        kv.put(a, kv_for(len(a), 1))
        kv.put(b, kv_for(len(b), 2))
        s, pos = scores_on(1, 2)
        kv.report_attention(0, s, pos, len(a), tokens=a)
        kv.hint(response_tokens=4, tokens=a)
        kv.hint(transition="tool_switch", tokens=toks(3, 2))
        with pytest.raises(InputError, match="unknown request"):
            kv.report_attention(0, s, pos, len(a), tokens=toks(4, 2))
        sched = kv.aio._sched
        imp = sched.block_importance
        assert imp is not None
        assert all(k in imp for k in chain_keys(kv.aio, a)) and all(k not in imp for k in chain_keys(kv.aio, b))
        assert sched.requests[chain_keys(kv.aio, a)[-1]].answered
        assert not sched.requests[chain_keys(kv.aio, b)[-1]].answered
        assert list(sched.transitions_for) == [chain_keys(kv.aio, toks(3, 2))[-1]]


async def test_an_attention_report_re_keys_only_the_reported_chain() -> None:
    """After a report, the next refresh re-keys the blocks whose importance changed (and raises
    their ancestors), not every indexed block; a switch of ``tau`` still re-keys them all."""
    async with await TierKV.open(predictive()) as kv:
        for fam in range(1, 11):
            t = toks(fam, 4)
            await kv.put(t, kv_for(len(t), fam))
        a = toks(1, 4)
        mover = kv._s.mover
        mover.refresh_ranking()
        calls = [0]
        rank_of = mover.rank_of

        def counting(e: Any) -> int:
            calls[0] += 1
            return rank_of(e)

        mover.rank_of = counting  # type: ignore[method-assign]
        s, pos = scores_on(3, 4)
        kv.report_attention(0, s, pos, query_pos=len(a), tokens=a)
        mover.refresh_ranking()
        assert 0 < calls[0] <= 4  # the reported chain only, of 40 indexed blocks
        r = [kv._index[k].rank for k in chain_keys(kv, a)]
        assert r == sorted(r, reverse=True) and parent_violations(kv) == []
        calls[0] = 0
        kv._sched.tau_s /= 2  # what a switch of the adaptive tau does
        mover.refresh_ranking()
        assert calls[0] == 0  # (every block at once, on the index's arrays: tests/test_rekey.py)
        mover.rank_of = rank_of  # type: ignore[method-assign]
        fresh = {e.key: rank_of(e) for e in kv._index.values()}
        assert len(fresh) == 40 and all(kv._index[k].rank >= v for k, v in fresh.items())  # all re-keyed
        assert sum(kv._index[k].rank == v for k, v in fresh.items()) >= 30
