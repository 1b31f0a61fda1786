"""``lookup(layout=)``: the blocks a ``put_paged`` stored in one layout are found by a lookup in
that layout only (what an engine's scheduler asks before it allocates blocks to load into)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from kvtest import BT, config, kv_for
from test_paged import NB, empty_caches, fill, toks

from tierkv import InputError, PagedLayout, TierKV

pytestmark = pytest.mark.anyio

N = 3 * BT + 5


async def test_lookup_in_a_layout_sees_only_that_layouts_blocks(tmp_path: Path) -> None:
    kv = kv_for(N, seed=3)
    layout = PagedLayout.named("vllm-cpu", BT // 2)
    other = PagedLayout.named("vllm-cpu", BT)
    table = np.random.default_rng(0).permutation(NB)
    caches = empty_caches(30, layout, kv)
    fill(caches, kv, table, layout, N)
    async with await TierKV.open(config(tmp_path)) as store:
        await store.put_paged(toks(N), caches, table, layout=layout)
        hit = await store.lookup(toks(N), layout=layout)
        assert (hit.tokens, hit.blocks) == (3 * BT, 3)
        assert hit.block_tiers == ("dram",) * 3
        assert (await store.lookup(toks(N), layout=other)).tokens == 0
        assert (await store.lookup(toks(N))).tokens == 0  # the canonical layout never sees them
        assert (await store.lookup(toks(N)[: 2 * BT + 1], layout=layout)).tokens == 2 * BT
        with pytest.raises(InputError, match="layout"):
            await store.lookup(toks(N), layout="vllm-cpu")  # type: ignore[arg-type]


def test_sync_facade_lookup_takes_the_layout(tmp_path: Path) -> None:
    kv = kv_for(N, seed=4)
    layout = PagedLayout.named("vllm-cpu", BT)
    table = np.arange(NB)
    caches = empty_caches(30, layout, kv)
    fill(caches, kv, table, layout, N)
    with TierKV.open_sync(config(tmp_path)) as store:
        store.put_paged(toks(N), caches, table, layout=layout)
        assert store.lookup(toks(N), layout=layout).tokens == 3 * BT
        assert store.lookup(toks(N)).tokens == 0
