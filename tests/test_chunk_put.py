"""Chunk-level put (``put(tokens, kv, start=n)``) and KV of any strides, through the public
API under asyncio, trio and the synchronous facade."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import anyio
import numpy as np
import pytest
from kvtest import BLOCK, BT, config, dram_tier, kv_for, smol_config

from tierkv import InputError, KVLayoutError, TierKV

pytestmark = pytest.mark.anyio

N = 6 * BT


def toks(n: int = N) -> list[int]:
    return list(range(7_000, 7_000 + n))


async def test_a_growing_prefix_stores_one_new_block_at_a_time(tmp_path: Path) -> None:
    full = kv_for(N, seed=3)
    async with await TierKV.open(config(tmp_path)) as kv:
        for b in range(1, N // BT + 1):
            m = b * BT
            # the newest block alone, as a strided view of the caller's whole cache
            r = await kv.put(toks(m), full[:, :, m - BT : m], start=m - BT)
            assert (r.new_blocks, r.existing_blocks, r.tokens) == (1, 0, m)
        assert (await kv.lookup(toks())).tokens == N
        got = await kv.get(toks())
        assert got.kv.tobytes() == full.tobytes()
        # the same prefix put whole finds every block there
        r = await kv.put(toks(), full)
        assert (r.new_blocks, r.existing_blocks) == (0, N // BT)


@pytest.mark.parametrize("policy", ["lru", "predictive"])
async def test_chunk_puts_count_each_block_once_and_keep_parents_first(tmp_path: Path, policy: str) -> None:
    """A growing prefix stored a block at a time is one access of each block (the earlier blocks
    are this request's own, not a reuse), and each parent stays more recent than its children."""
    full = kv_for(N, seed=5)
    async with await TierKV.open(config(tmp_path, scheduler={"policy": policy})) as kv:
        for b in range(1, N // BT + 1):
            await kv.put(toks(b * BT), full[:, :, (b - 1) * BT : b * BT], start=(b - 1) * BT)
        by_pos = sorted(kv._s.index.entries.values(), key=lambda e: e.pos)
        assert [e.count for e in by_pos] == [1] * (N // BT)
        assert all(p.t_last > c.t_last for p, c in pairwise(by_pos))
        if policy != "lru":
            assert all(p.rank >= c.rank for p, c in pairwise(by_pos))
        await kv.get(toks())  # a second request reuses every block
        assert [e.count for e in by_pos] == [2] * (N // BT)


async def test_missing_parents_are_not_stored_and_lookup_stops_at_the_gap(tmp_path: Path) -> None:
    full = kv_for(N, seed=4)
    async with await TierKV.open(config(tmp_path)) as kv:
        r = await kv.put(toks(), full[:, :, 2 * BT :], start=2 * BT)
        assert (r.new_blocks, r.tokens) == (N // BT - 2, 0)
        assert (await kv.lookup(toks())).tokens == 0
        r = await kv.put(toks(2 * BT), full[:, :, : 2 * BT])
        assert r.tokens == 2 * BT
        assert (await kv.lookup(toks())).tokens == N
        assert (await kv.get(toks())).kv.tobytes() == full.tobytes()


async def test_bad_start_is_a_typed_error_and_stores_nothing(tmp_path: Path) -> None:
    full = kv_for(N)
    async with await TierKV.open(config(tmp_path)) as kv:
        for bad in (BT // 2, -BT, N + BT, True, 1.0):
            with pytest.raises(InputError, match="start"):
                await kv.put(toks(), full[:, :, BT:], start=bad)  # type: ignore[arg-type]
        with pytest.raises(KVLayoutError, match="shape"):
            await kv.put(toks(), full, start=BT)  # KV for all tokens, not tokens[start:]
        assert all(s.blocks == 0 for s in kv.stats().values())
        assert (await kv.put(toks(), full[:, :, N:], start=N)).new_blocks == 0


async def test_strided_sources_and_destinations(tmp_path: Path) -> None:
    cache = np.zeros((30, 2, 4 * N, 3, 64), np.float16)  # a preallocated engine cache, longer than the prompt
    cache[:, :, :N] = kv_for(N, seed=5)
    want = np.ascontiguousarray(cache[:, :, :N])
    async with await TierKV.open(config(tmp_path)) as kv:
        await kv.put(toks(), cache[:, :, :N])  # a view: not C-contiguous
        out = np.zeros((30, 2, 2 * N, 3, 64), np.float16)[:, :, ::2]  # every other token slot
        assert not out.flags.c_contiguous
        g = await kv.get(toks(), out=out)
        assert g.tokens == N and out.tobytes() == want.tobytes()
        fortran = np.asfortranarray(kv_for(N, seed=6))
        await kv.put(toks(N)[::-1], fortran)
        assert (await kv.get(toks(N)[::-1])).kv.tobytes() == fortran.tobytes()


async def test_strided_torch_tensors(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    base = torch.from_numpy(kv_for(2 * N, seed=7))
    view = base[:, :, ::2]  # non-contiguous tensor of N tokens
    assert not view.is_contiguous()
    async with await TierKV.open(config(tmp_path)) as kv:
        await kv.put(toks(), view)
        out = torch.zeros((30, 2, 2 * N, 3, 64), dtype=torch.float16)[:, :, 1::2]
        g = await kv.get(toks(), out=out)
        assert g.tokens == N and torch.equal(out, view)


def test_chunk_put_through_the_sync_facade(tmp_path: Path) -> None:
    full = kv_for(N, seed=8)
    with TierKV.open_sync(config(tmp_path)) as kv:
        for b in range(N // BT):
            kv.put(toks((b + 1) * BT), full[:, :, b * BT : (b + 1) * BT], start=b * BT)
        assert kv.get(toks()).kv.tobytes() == full.tobytes()
        with pytest.raises(InputError, match="start"):
            kv.put(toks(), full, start=3)


def _evicted_after_parent(kv: TierKV) -> list[str]:
    """Blocks the tier would evict after their parent (every stored parent/child pair)."""
    kv._s.mover.refresh_ranking()
    victims = [e.key for e in kv._s.mover.pick_victims(0, 1 << 62)]
    at = {k: i for i, k in enumerate(victims)}
    ix = kv._s.index.entries
    return [
        e.key for e in ix.values() if e.pos and (p := bytes(e.parent).hex()) in at and e.key in at and at[e.key] > at[p]
    ]


@pytest.mark.parametrize("policy", ["lru", "predictive", "adaptive"])
async def test_chunk_puts_between_other_requests_leave_children_first(policy: str) -> None:
    """A growing prefix stored a block at a time while other requests come and go: each new block
    is placed just below its parent (not walked again: the parent was accessed just now), so the
    tier still evicts every chain deepest first (equal keys too: a fresh store ranks everything
    alike), under pressure too (a block stored after a gap,
    ``start`` past an evicted parent, is stored as documented but never found)."""
    n_blocks = 10
    full = kv_for(n_blocks * BT, seed=6)
    other = kv_for(2 * BT, seed=7)
    cap = 8 * full[:, :, :BT].nbytes  # 8 blocks: the chain and the others cannot all stay
    cfg = smol_config([dram_tier(cap)], scheduler={"policy": policy})
    async with await TierKV.open(cfg) as kv:
        seq = list(range(1, 1 + n_blocks * BT))
        _, keys, _ = kv._s.keys(seq, None)
        chain = [k.hex() for k in keys]
        for b in range(1, n_blocks + 1):
            m = b * BT
            await kv.put(seq[:m], full[:, :, m - BT : m], start=m - BT)
            assert _evicted_after_parent(kv) == []
            await kv.put([b * 100_000 + i for i in range(2 * BT)], other)  # another request between
            assert _evicted_after_parent(kv) == []
            assert kv.invariant_violations() == []
            stored = [k in kv._s.index.entries for k in chain[:b]]
            lead = stored.index(False) if False in stored else b
            assert (await kv.lookup(seq[:m])).tokens == lead * BT


async def test_a_chunk_put_after_a_pause_refreshes_the_whole_prefix(tmp_path: Path) -> None:
    """When the parent block was last accessed longer ago than ``CHUNK_REFRESH_S``, a chunk put
    refreshes every earlier block (the request is accessing them again), as a whole put would."""
    full = kv_for(N, seed=8)
    async with await TierKV.open(config(tmp_path)) as kv:
        clock = [100.0]
        kv._sched.now = lambda: clock[0]  # type: ignore[method-assign]
        await kv.put(toks(3 * BT), full[:, :, : 3 * BT])
        by_pos = sorted(kv._s.index.entries.values(), key=lambda e: e.pos)
        clock[0] += 0.5 * kv._s.reader.CHUNK_REFRESH_S  # soon after: the prefix is not touched again
        await kv.put(toks(4 * BT), full[:, :, 3 * BT : 4 * BT], start=3 * BT)
        assert [round(e.t_last) for e in by_pos] == [100] * 3
        new = kv._s.index.entries[max(kv._s.index.entries.values(), key=lambda e: e.pos).key]
        assert new.t_last < by_pos[-1].t_last  # placed below its parent
        clock[0] += 2 * kv._s.reader.CHUNK_REFRESH_S  # after a pause: every earlier block refreshed
        await kv.put(toks(5 * BT), full[:, :, 4 * BT : 5 * BT], start=4 * BT)
        by_pos = sorted(kv._s.index.entries.values(), key=lambda e: e.pos)
        assert all(e.t_last >= clock[0] for e in by_pos)
        assert all(p.t_last > c.t_last for p, c in pairwise(by_pos))
        assert [e.count for e in by_pos] == [1] * 5


def _orphans(kv: TierKV) -> list[str]:
    """Indexed blocks whose parent is not indexed (a lookup can never reach them)."""
    ix = kv._s.index.entries
    return [e.key for e in ix.values() if e.pos and bytes(e.parent).hex() not in ix]


@pytest.mark.parametrize("policy", ["lru", "predictive", "adaptive"])
async def test_whole_puts_into_a_full_tier_never_break_a_prefix(policy: str) -> None:
    """Whole puts of random sequences sharing prefixes, into one small tier: a put never evicts its
    own earlier blocks (they rank on top until it records its access), so every stored block's
    parent is stored (the stored part of every sequence is one prefix: block hits are prefix
    hits)."""
    import random

    rnd = random.Random(11)
    blk = kv_for(BT, seed=1)
    cfg = smol_config([dram_tier(12 * blk.nbytes)], scheduler={"policy": policy})
    docs = [[d * 100_000 + i for i in range(BT * rnd.randint(2, 6))] for d in range(12)]
    async with await TierKV.open(cfg) as kv:
        for _ in range(80):
            a = rnd.choice(docs)
            seq = a + [rnd.randrange(10**6, 10**7) for _ in range(BT * rnd.randint(0, 3))]  # a new tail
            n = len(seq) // BT * BT
            r = await kv.put(seq[:n], kv_for(n, seed=2))
            assert r.tokens % BT == 0 and r.tokens <= n
            assert _orphans(kv) == []
            stored = [k.hex() in kv._s.index.entries for k in kv._s.keys(seq[:n], None)[1]]
            lead = stored.index(False) if False in stored else len(stored)
            assert not any(stored[lead:])  # what is stored of this sequence is one prefix
        assert kv.invariant_violations() == []


@pytest.mark.parametrize("dram_blocks", [64, 20])
async def test_a_batched_put_cancelled_anywhere_stores_a_sound_prefix(tmp_path: Path, dram_blocks: int) -> None:
    """A put of more than 16 MiB goes to the DRAM tier in batches (copied on two threads); cancelled
    at any point it stores a whole prefix of right bytes or nothing, and leaves the index, the tiers'
    used bytes and the pins sound (a DRAM tier smaller than the put: the batch stops where it is full
    and the rest goes block by block, demoting to pfs)."""
    n = 48 * BT
    full = kv_for(n, seed=9)
    assert full.nbytes >= 16 << 20
    cfg = config(tmp_path, dram=dram_blocks * full[:, :, :BT].nbytes, pfs="64MiB")
    async with await TierKV.open(cfg) as kv:
        for i, delay in enumerate((0.0, 0.0005, 0.002, 0.008, 0.03, None)):
            toks = [i * 1_000_000 + t for t in range(n)]
            if delay is None:
                r = await kv.put(toks, full)
                assert r.tokens == n and r.new_blocks == 48
            else:
                with anyio.move_on_after(delay):
                    await kv.put(toks, full)
            await kv.drain()
            assert kv.invariant_violations() == []
            got = await kv.get(toks)
            assert got.tokens % BT == 0
            if got.tokens:
                assert got.kv.tobytes() == full[:, :, : got.tokens].tobytes()
            stored = [k.hex() in kv._s.index.entries for k in kv._s.keys(toks, None)[1]]
            lead = stored.index(False) if False in stored else len(stored)
            assert got.tokens == lead * BT and not any(stored[lead:])


async def test_a_put_cancelled_before_it_starts_sheds_nothing_for_its_batches(tmp_path: Path) -> None:
    """A full single-tier store and a put of 48 new blocks under a cancel that is already pending: the
    put neither stores a block nor sheds any of the 64 stored ones to make room for its batch."""
    kv_blocks = 64
    async with await TierKV.open(config(tmp_path, dram=kv_blocks * BLOCK, pfs=None)) as kv:
        first = list(range(kv_blocks * BT))
        await kv.put(first, kv_for(kv_blocks * BT, seed=1))
        await kv.drain()  # (the tier sheds down to its low watermark)
        before = (await kv.lookup(first)).tokens
        assert before >= kv_blocks * BT // 2
        other = [10**6 + t for t in range(48 * BT)]
        with anyio.CancelScope() as scope:
            scope.cancel()
            await kv.put(other, kv_for(48 * BT, seed=2))
        await kv.drain()
        assert kv.invariant_violations() == []
        assert not any(k.hex() in kv._s.index.entries for k in kv._s.keys(other, None)[1])
        assert (await kv.lookup(first)).tokens == before  # nothing was shed for the put


async def test_a_put_keeps_no_reference_to_the_callers_kv_once_it_returns(tmp_path: Path) -> None:
    """The DRAM tier's copy helper thread, idle after a split copy, holds no piece of the caller's
    memory: the KV given to a put (and a get's ``out=``) is freed when the caller drops it."""
    import gc
    import weakref

    n = 48 * BT
    async with await TierKV.open(config(tmp_path, dram=4 * n // BT * BLOCK, pfs=None)) as kv:
        full = kv_for(n, seed=3)
        assert full.nbytes >= 16 << 20  # copied on two threads (the DRAM tier's split copies)
        ref = weakref.ref(full)
        await kv.put(list(range(n)), full)
        out = np.zeros_like(full)
        ref_out = weakref.ref(out)
        assert (await kv.get(list(range(n)), out=out)).tokens == n
        del full, out
        for _ in range(50):
            gc.collect()
            if ref() is None and ref_out() is None:
                break
            await anyio.sleep(0.01)
        assert ref() is None and ref_out() is None


async def test_a_large_get_cancelled_anywhere_writes_nothing_after_it_returns(tmp_path: Path) -> None:
    """A get(out=) of more than 16 MiB from the DRAM tier (copied on the loop's thread and the tier's
    copy helper at once), cancelled at random points with the scheduler service running: once it
    returns, nothing more is written into ``out``, no pin is left, the index and the tiers agree,
    and a get afterwards returns every byte."""
    n = 48 * BT
    full = kv_for(n, seed=11)
    assert full.nbytes >= 16 << 20
    toks = list(range(n))
    rng = np.random.default_rng(5)
    async with await TierKV.open(config(tmp_path, dram=64 * full[:, :, :BT].nbytes, pfs=None)) as kv:
        await kv.put(toks, full)
        for delay in [0.0, *rng.uniform(0, 0.01, size=7)]:
            out = np.zeros_like(full)
            with anyio.move_on_after(float(delay)):
                await kv.get(toks, out=out)
            snap = out.copy()
            await anyio.sleep(0.02)  # a copy still running would change ``out`` meanwhile
            assert np.array_equal(out, snap)
            assert kv.invariant_violations() == []
        out = np.zeros_like(full)
        assert (await kv.get(toks, out=out)).tokens == n
        assert out.tobytes() == full.tobytes()
