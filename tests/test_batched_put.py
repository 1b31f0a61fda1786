"""A put's new blocks go to the fastest tier in batches: one allocation, one shedding and one copy
per batch (``Durable.store_batch``, ``Mover.allocate_many_with_room``, ``Mover.drop_many``), also
for small puts into a full tier. Batching is only faster: request for request, the same blocks are
found, stored, moved down and evicted as when every block is stored one by one (the path a batch
falls back to, and the only one before)."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest

from tierkv import TierKV
from tierkv._engine._mover import Mover
from tierkv.lab.policies.library import _BLOCK_NBYTES, BLOCK_TOKENS, library_config

pytestmark = pytest.mark.anyio

CAP = 48  # blocks of the fastest tier


def workload(seed: int, n: int = 260) -> list[np.ndarray[Any, Any]]:
    """Prompts of 2-15 blocks: a shared system prefix, then one of 25 conversations, each turn
    the whole conversation so far plus 1-3 new blocks (a conversation ends past 10 blocks)."""
    rng = np.random.default_rng(seed)
    bt = BLOCK_TOKENS
    convs: list[list[int]] = [[] for _ in range(25)]
    out = []
    for _ in range(n):
        c = int(rng.integers(25)) if rng.random() < 0.8 else int(rng.integers(5))
        if len(convs[c]) > 10 * bt:
            convs[c] = []  # a new conversation in that slot
        convs[c] = convs[c] + list(rng.integers(1 << 20, 1 << 30, int(rng.integers(1, 4)) * bt))
        system = [7] * (bt * (1 + c % 2))
        out.append(np.asarray(system + convs[c], dtype=np.int64))
    return out


def cfg(policy: str, two_tiers: bool) -> dict[str, Any]:
    c = copy.deepcopy(library_config(CAP, policy if policy in ("lru", "predictive") else "adaptive"))
    if two_tiers:
        lower = dict(c["tiers"][0], name="dram2", capacity=2 * CAP * _BLOCK_NBYTES)
        c["tiers"].append(lower)
    return c


def _never_batch(m: pytest.MonkeyPatch) -> None:
    async def never(self: Mover, ti: int, items: list[tuple[str, int, bytes]]) -> list[Any]:
        return []  # every batch falls back to one block at a time

    m.setattr(Mover, "allocate_many_with_room", never)


def _zeros(toks: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    return np.zeros((1, 2, len(toks), 1, 64), dtype=np.float16)


async def drive(policy: str, two_tiers: bool, seed: int) -> tuple[list[int], list[tuple[str, int]], dict[str, int]]:
    """Per request (lookup then put): the prefix hit; at the end every block and its tier; and
    how often the fastest tier's backend was asked to allocate and to evict."""
    kv = await TierKV.open(cfg(policy, two_tiers))
    clock = [0.0]
    kv._sched.now = lambda: clock[0]  # type: ignore[method-assign]
    ad = kv._sched.tau_adapter
    if policy == "arc":  # the adaptive policy held on ARC (the caller keeps it from switching)
        assert ad is not None
        ad.arc_mode = ad.recency_mode = kv._sched.recency = True
    elif policy == "admission":  # held on recency with its frequency admission filter
        assert ad is not None
        ad.admit_mode = ad.recency_mode = kv._sched.recency = True
    elif policy == "segmented":  # the same filter in front of a segmented LRU
        assert ad is not None
        ad.slru_mode = ad.recency_mode = kv._sched.recency = True
    calls = {"allocate_many": 0, "evict_many": 0, "evict": 0}
    top = kv._s.tiers[0].backend
    for name in calls:
        real = getattr(top, name)

        def spy(*a: Any, _real: Any = real, _name: str = name, **k: Any) -> Any:
            calls[_name] += 1
            return _real(*a, **k)

        setattr(top, name, spy)
    leads = []
    try:
        for i, toks in enumerate(workload(seed)):
            clock[0] = float(i)
            leads.append((await kv.lookup(toks)).blocks)
            await kv.put(toks, _zeros(toks))
        assert kv.invariant_violations() == []
        placed = sorted((k, kv._index[k].tier) for k in list(kv._index.keys()))
    finally:
        await kv.aclose()
    return leads, placed, calls


@pytest.mark.parametrize("two_tiers", [False, True], ids=["one-tier", "dram-over-dram"])
@pytest.mark.parametrize("policy", ["lru", "predictive", "adaptive", "arc", "admission", "segmented"])
async def test_batched_puts_place_exactly_as_block_by_block(
    policy: str, two_tiers: bool, monkeypatch: pytest.MonkeyPatch, anyio_backend: str
) -> None:
    """``arc``/``admission``/``segmented``: the adaptive policy held in that mode."""
    if policy in ("arc", "admission", "segmented"):
        from tierkv.scheduler import TauAdapter

        monkeypatch.setattr(TauAdapter, "_choose_mode", lambda self, now, cur: None)
        monkeypatch.setattr(TauAdapter, "_choose_recency", lambda self: None)
    batched = await drive(policy, two_tiers, seed=3)
    with monkeypatch.context() as m:
        _never_batch(m)
        one_by_one = await drive(policy, two_tiers, seed=3)
    assert batched[0] == one_by_one[0]  # the same prefix hit, request for request
    assert batched[1] == one_by_one[1]  # the same blocks left, on the same tiers
    assert sum(batched[0]) > 0 and len(batched[1]) >= CAP  # the tier filled and prefixes were found
    stored = sum(len(t) // BLOCK_TOKENS for t in workload(3))  # an upper bound of blocks stored
    if policy not in ("arc", "segmented") and not two_tiers:
        # (a full tier above the bottom one, or on ARC or the segmented LRU, stores block by block)
        # batching did happen: far fewer allocations than blocks, evictions in groups
        assert batched[2]["allocate_many"] < one_by_one[2]["allocate_many"] / 2 < stored
        assert batched[2]["evict_many"] + batched[2]["evict"] < one_by_one[2]["evict_many"] + one_by_one[2]["evict"]


async def test_a_batch_that_cannot_fit_stores_what_fits_block_by_block(anyio_backend: str) -> None:
    """A put longer than the tier keeps its leading blocks (a put never drops its own chain)."""
    kv = await TierKV.open(library_config(CAP, "lru"))
    try:
        toks = np.arange((CAP + 10) * BLOCK_TOKENS, dtype=np.int64)
        res = await kv.put(toks, _zeros(toks))
        assert res.new_blocks == CAP
        assert (await kv.lookup(toks)).blocks == CAP
        other = np.arange(5 * BLOCK_TOKENS, dtype=np.int64) + 10**6
        res = await kv.put(other, _zeros(other))
        assert res.new_blocks == 5  # the tier sheds 5 of the first put's blocks at once
        assert (await kv.lookup(other)).blocks == 5
        assert kv.invariant_violations() == []
        assert kv._s.tiers[0].backend.stats().used_bytes == CAP * _BLOCK_NBYTES
    finally:
        await kv.aclose()


async def test_arc_ghosts_count_each_victim_of_a_shed_as_one_by_one(
    monkeypatch: pytest.MonkeyPatch, anyio_backend: str
) -> None:
    """A shed of several victims on ARC (watermarks below 1: the tier sheds to its low mark)
    counts ARC's recent list for each victim after the ones before it left, as dropping them one
    by one did: the figures are those of the block-by-block code (commit 2d63bcd)."""
    from tierkv.scheduler import TauAdapter

    monkeypatch.setattr(TauAdapter, "_choose_mode", lambda self, now, cur: None)
    monkeypatch.setattr(TauAdapter, "_choose_recency", lambda self: None)
    c = copy.deepcopy(library_config(CAP, "adaptive"))
    c["tiers"][0].update(high_watermark=0.9, low_watermark=0.6)
    kv = await TierKV.open(c)
    clock = [0.0]
    kv._sched.now = lambda: clock[0]  # type: ignore[method-assign]
    ad = kv._sched.tau_adapter
    assert ad is not None
    ad.arc_mode = ad.recency_mode = kv._sched.recency = True
    hits = 0
    try:
        for i, toks in enumerate(workload(3)):
            clock[0] = float(i)
            hits += (await kv.lookup(toks)).blocks
            await kv.put(toks, _zeros(toks))
        target = kv._sched.arc_target
        assert target is not None
        assert (hits, len(target._b1), len(target._b2)) == (583, 19, 29)
        assert kv.invariant_violations() == []
    finally:
        await kv.aclose()


@pytest.mark.parametrize("policy", ["lru", "predictive"])
async def test_partial_blocks_shed_as_one_by_one(
    policy: str, monkeypatch: pytest.MonkeyPatch, anyio_backend: str
) -> None:
    """A tail (half a block, a whole granule held) among the victims: the batch does not shed
    more than the blocks one by one would."""

    async def run() -> list[int]:
        c = copy.deepcopy(library_config(4, policy))
        c["partial_blocks"] = True
        kv = await TierKV.open(c)
        clock = [0.0]
        kv._sched.now = lambda: clock[0]  # type: ignore[method-assign]
        bt = BLOCK_TOKENS
        prompts = [np.arange(bt + bt // 2, dtype=np.int64) + 1000]
        prompts += [np.arange(2 * bt, dtype=np.int64) + 5000, np.arange(2 * bt, dtype=np.int64) + 9000]
        try:
            for i, toks in enumerate(prompts):
                clock[0] = float(i)
                await kv.put(toks, _zeros(toks))
            assert kv.invariant_violations() == []
            return [(await kv.lookup(t)).tokens for t in prompts]
        finally:
            await kv.aclose()

    batched = await run()
    with monkeypatch.context() as m:
        _never_batch(m)
        assert await run() == batched == [0, 32, 32]


async def test_a_put_longer_than_the_top_tier_keeps_the_same_blocks_there(
    monkeypatch: pytest.MonkeyPatch, anyio_backend: str
) -> None:
    """Predictive, DRAM over DRAM, one put of 1,500 blocks into a top tier of 1,024: block by
    block each new block pushes the one before it down, so the top tier keeps the leading
    1,023 blocks and the last; the batches keep the same ones (no gap in the middle)."""

    async def run() -> list[int]:
        c = copy.deepcopy(library_config(1024, "predictive"))
        c["tiers"].append(dict(c["tiers"][0], name="dram2", capacity=4096 * _BLOCK_NBYTES))
        kv = await TierKV.open(c)
        try:
            toks = np.arange(1500 * BLOCK_TOKENS, dtype=np.int64)
            await kv.put(toks, _zeros(toks))
            assert kv.invariant_violations() == []
            return sorted(kv._index[k].pos for k in list(kv._index.keys()) if kv._index[k].tier == 0)
        finally:
            await kv.aclose()

    batched = await run()
    with monkeypatch.context() as m:
        _never_batch(m)
        assert await run() == batched == [*range(1023), 1499]
