"""Chunk-level put (``put(tokens, kv, start=n)``) and KV of any strides, through the public
API under asyncio, trio and the synchronous facade."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest
from kvtest import BT, config, kv_for

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
