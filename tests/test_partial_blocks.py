"""Partial last blocks (``partial_blocks = true``): ``put`` stores the trailing partial block (a
tail) under its own key, and ``lookup``/``get`` find the longest stored tail after the whole
blocks; through the public API under asyncio, trio and the synchronous facade."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kvtest import BLOCK, BT, config, dram_tier, kv_for, pfs_tier, smol_config

from tierkv import ConfigError, InputError, KVLayoutError, TierKV, TokensError
from tierkv._keys import block_keys, tail_key, to_token_array

pytestmark = pytest.mark.anyio


def toks(n: int, base: int = 5_000) -> list[int]:
    return list(range(base, base + n))


def on(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    return config(tmp_path, partial_blocks=True, **extra)


def blocks(kv: TierKV) -> int:
    return sum(s.blocks for s in kv.stats().values())


async def test_round_trip_of_a_tail(tmp_path: Path) -> None:
    n = 3 * BT + 5
    data = kv_for(n, seed=1)
    async with await TierKV.open(on(tmp_path)) as kv:
        r = await kv.put(toks(n), data)
        assert (r.tokens, r.new_blocks, r.existing_blocks, r.tail_tokens) == (n, 4, 0, 0)
        lk = await kv.lookup(toks(n))
        assert (lk.tokens, lk.blocks, lk.tail_tokens, len(lk.block_tiers)) == (n, 3, 5, 4)
        g = await kv.get(toks(n))
        assert g.tokens == n and g.miss_reason == ""
        assert g.kv.shape == (30, 2, n, 3, 64) and g.kv.tobytes() == data.tobytes()
        # out=: exactly the stored tokens are written, the slots after them are untouched
        out = np.full((30, 2, n + 7, 3, 64), 7.0, np.float16)
        g = await kv.get(toks(n), out=out)
        assert g.tokens == n and g.kv is out
        assert out[:, :, :n].tobytes() == data.tobytes()
        assert (out[:, :, n:] == 7.0).all()
        # the same put again writes nothing
        r = await kv.put(toks(n), data)
        assert (r.tokens, r.new_blocks, r.existing_blocks) == (n, 0, 4)
        assert kv.invariant_violations() == []


async def test_a_prompt_shorter_than_one_block(tmp_path: Path) -> None:
    data = kv_for(7, seed=2)
    async with await TierKV.open(on(tmp_path)) as kv:
        r = await kv.put(toks(7), data)
        assert (r.tokens, r.new_blocks, r.tail_tokens) == (7, 1, 0)
        g = await kv.get(toks(7 + 4))
        assert g.tokens == 7 and g.kv.tobytes() == data.tobytes()
        assert g.miss_reason == ""  # the request has no whole block: nothing it asked for is missing
        assert (await kv.lookup(toks(6))).tokens == 0  # a tail longer than the request never serves


async def test_a_follow_up_prompt_hits_the_whole_blocks_and_the_tail(tmp_path: Path) -> None:
    n, more = 2 * BT + 7, 3 * BT
    full = kv_for(n + more, seed=3)
    async with await TierKV.open(on(tmp_path)) as kv:
        await kv.put(toks(n), full[:, :, :n])
        follow = toks(n + more)  # extends the stored prompt
        lk = await kv.lookup(follow)
        assert (lk.tokens, lk.blocks, lk.tail_tokens) == (n, 2, 7)
        g = await kv.get(follow)
        assert g.tokens == n and g.kv.tobytes() == full[:, :, :n].tobytes()
        assert g.miss_reason == "never_stored"  # the rest of the follow-up is not stored
        # storing the follow-up stores its whole blocks; the tail is left (to eviction)
        r = await kv.put(follow, full)
        # 87 tokens: whole blocks 2..4 are new (0 and 1 were stored), and the new 7-token tail
        assert (r.tokens, r.new_blocks, r.existing_blocks) == (n + more, 4, 2)
        assert (await kv.lookup(follow)).tokens == n + more
        assert (await kv.lookup(toks(n))).tokens == n
        assert kv.invariant_violations() == []


async def test_a_prompt_that_diverges_inside_the_tail_stops_at_the_whole_blocks(tmp_path: Path) -> None:
    n = 2 * BT + 9
    data = kv_for(n, seed=4)
    async with await TierKV.open(on(tmp_path)) as kv:
        await kv.put(toks(n), data)
        other = toks(n + 5)
        other[2 * BT + 3] = 1  # differs at the tail's 4th token
        lk = await kv.lookup(other)
        assert (lk.tokens, lk.tail_tokens) == (2 * BT, 0)
        g = await kv.get(other)
        assert g.tokens == 2 * BT and g.kv.tobytes() == data[:, :, : 2 * BT].tobytes()
        # a divergence in a whole block ends the prefix there, tail or not
        other = toks(n)
        other[3] = 1
        assert (await kv.lookup(other)).tokens == 0


async def test_the_longest_matching_tail_under_a_parent_wins(tmp_path: Path) -> None:
    full = kv_for(3 * BT, seed=5)
    async with await TierKV.open(on(tmp_path)) as kv:
        await kv.put(toks(2 * BT + 4), full[:, :, : 2 * BT + 4])
        r = await kv.put(toks(2 * BT + 9), full[:, :, : 2 * BT + 9])
        assert (r.new_blocks, r.existing_blocks, r.tokens) == (1, 2, 2 * BT + 9)
        assert kv._s.index.tails_count() == 2
        g = await kv.get(toks(2 * BT + 12))
        assert g.tokens == 2 * BT + 9 and g.kv.tobytes() == full[:, :, : 2 * BT + 9].tobytes()
        # diverging after the 4th tail token: the 4-token tail still matches
        other = toks(2 * BT + 12)
        other[2 * BT + 6] = 3
        g = await kv.get(other)
        assert g.tokens == 2 * BT + 4 and g.kv.tobytes() == full[:, :, : 2 * BT + 4].tobytes()
        # a request ending inside the longer tail gets the shorter one
        assert (await kv.lookup(toks(2 * BT + 6))).tokens == 2 * BT + 4


def test_tail_keys_never_meet_block_keys_or_other_tails() -> None:
    seed = bytes(range(32))
    t = to_token_array(list(range(BT)))
    whole = block_keys(seed, t, BT)[0]
    assert tail_key(seed, t[: BT - 1]) != whole
    assert tail_key(seed, t[:3]) != tail_key(seed, t[:4])
    assert tail_key(seed, t[:3]) != tail_key(bytes(32), t[:3])  # another parent
    assert tail_key(seed, t[:3]) == tail_key(seed, t[:3].copy())
    with pytest.raises(ValueError):
        tail_key(b"short", t[:3])


async def test_tails_are_isolated_by_tenant_and_model_scope(tmp_path: Path) -> None:
    n = BT + 6
    data = kv_for(n, seed=6)
    async with await TierKV.open(on(tmp_path, dram=None)) as kv:
        await kv.put(toks(n), data, tenant="alice")
        assert (await kv.lookup(toks(n), tenant="alice")).tokens == n
        assert (await kv.lookup(toks(n), tenant="bob")).tokens == 0
        assert (await kv.lookup(toks(n))).tokens == 0
        g = await kv.get(toks(n), tenant="bob")
        assert g.tokens == 0
        await kv.put(toks(5), data[:, :, :5], tenant="alice")  # a tail at position 0: seeded by the tenant
        assert (await kv.lookup(toks(5), tenant="bob")).tokens == 0
        assert (await kv.lookup(toks(5), tenant="alice")).tokens == 5
    # another model revision over the same pfs directory sees none of it
    async with await TierKV.open(on(tmp_path, dram=None, revision="other")) as kv2:
        assert (await kv2.lookup(toks(n), tenant="alice")).tokens == 0
        assert (await kv2.lookup(toks(5), tenant="alice")).tokens == 0


async def test_a_tail_survives_a_restart_on_pfs(tmp_path: Path) -> None:
    n = 2 * BT + 11
    data = kv_for(n, seed=7)
    async with await TierKV.open(on(tmp_path)) as kv:
        r = await kv.put(toks(n), data, durable=True)
        assert r.tokens == n
        assert kv.invariant_violations() == []
    async with await TierKV.open(on(tmp_path)) as kv:  # a fresh store: the index rebuilt from pfs
        assert kv._s.index.tails_count() == 1
        lk = await kv.lookup(toks(n + 3))
        assert (lk.tokens, lk.tail_tokens, lk.block_tiers[-1]) == (n, 11, "pfs")
        g = await kv.get(toks(n + 3))
        assert g.tokens == n and g.kv.tobytes() == data.tobytes()
        assert kv.invariant_violations() == []


async def test_tails_move_between_tiers_and_are_verified(tmp_path: Path) -> None:
    """A dram tier of three blocks: tails and blocks are demoted to pfs as any block and come
    back exact; a tail corrupted on pfs is a miss (never wrong bytes), the whole blocks serve."""
    cfg = smol_config([dram_tier(3 * BLOCK), pfs_tier(tmp_path, 64 * BLOCK)], partial_blocks=True)
    datas = {f: kv_for(BT + 3 + f, seed=10 + f) for f in range(8)}
    async with await TierKV.open(cfg) as kv:
        for f, d in datas.items():
            await kv.put(toks(BT + 3 + f, base=f * 1000), d)
        await kv.drain()
        assert kv.stats()["pfs"].blocks > 0 and kv.invariant_violations() == []
        for f, d in datas.items():
            g = await kv.get(toks(BT + 3 + f, base=f * 1000))
            assert g.tokens == BT + 3 + f and g.kv.tobytes() == d.tobytes(), f
        await kv.drain()
        assert kv.invariant_violations() == []
        # corrupt one tail's pfs copy (the files of the pfs tier hold the raw bytes)
        s = kv._s
        key = tail_key(s.keys(toks(BT + 3, base=0), None)[1][0], to_token_array(toks(BT + 3, base=0))[BT:]).hex()
        e = s.index.entries[key]
        if e.tier == 0:
            await s.mover.shed(0, s.tiers[0].backend.stats().used_bytes)  # everything down to pfs
        assert s.index.entries[key].tier == 1
        (rec,) = [p for p in (tmp_path / "pfs" / "keys").iterdir() if p.name.partition("~")[0] == key]
        raw = bytearray(rec.read_bytes())  # flip the record's last content byte
        raw[-1] ^= 0xFF
        rec.write_bytes(bytes(raw))
        g = await kv.get(toks(BT + 3, base=0))
        assert g.tokens == BT and g.miss_reason == "integrity"
        assert g.kv.tobytes() == datas[0][:, :, :BT].tobytes()
        assert key not in s.index.entries and kv.invariant_violations() == []


async def test_option_off_keeps_whole_blocks_only(tmp_path: Path) -> None:
    n = 2 * BT + 5
    async with await TierKV.open(config(tmp_path)) as kv:
        assert kv.config.partial_blocks is False
        r = await kv.put(toks(n), kv_for(n))
        assert (r.tokens, r.new_blocks, r.tail_tokens) == (2 * BT, 2, 5)
        lk = await kv.lookup(toks(n))
        assert (lk.tokens, lk.tail_tokens) == (2 * BT, 0)
        assert (await kv.get(toks(n))).tokens == 2 * BT
        assert blocks(kv) == 2 and kv._s.index.tails == {}


async def test_chunk_puts_store_the_tail_of_the_newest_chunk(tmp_path: Path) -> None:
    n = 3 * BT + 2
    full = kv_for(n, seed=8)
    async with await TierKV.open(on(tmp_path)) as kv:
        r = await kv.put(toks(2 * BT), full[:, :, : 2 * BT])
        r = await kv.put(toks(n), full[:, :, 2 * BT :], start=2 * BT)
        assert (r.tokens, r.new_blocks) == (n, 2)
        assert (await kv.get(toks(n))).kv.tobytes() == full.tobytes()
        # a chunk after a gap: its tail could never be found, so it is not stored
        r = await kv.put(toks(n, base=9_000), full[:, :, 2 * BT :], start=2 * BT)
        assert (r.tokens, r.new_blocks, r.tail_tokens) == (0, 1, 2)


async def test_paged_puts_keep_whole_blocks_only(tmp_path: Path) -> None:
    from tierkv import PagedLayout

    layout = PagedLayout.named("vllm-cpu", BT)
    n = 2 * BT + 5
    caches = [np.zeros((4, 3, BT, 2 * 64), np.float16) for _ in range(30)]  # (block, head, tok, kvdim)
    async with await TierKV.open(on(tmp_path)) as kv:
        r = await kv.put_paged(toks(n), caches, [0, 1, 2], layout=layout)
        assert (r.tokens, r.new_blocks, r.tail_tokens) == (2 * BT, 2, 5)
        assert (await kv.lookup(toks(n), layout=layout)).tokens == 2 * BT
        g = await kv.get_paged(toks(n), caches, [3, 2, 1], layout=layout)
        assert g.tokens == 2 * BT
        assert kv._s.index.tails == {}


async def test_bad_input_is_typed_and_stores_nothing(tmp_path: Path) -> None:
    n = BT + 5
    async with await TierKV.open(on(tmp_path)) as kv:
        with pytest.raises(KVLayoutError):
            await kv.put(toks(n), kv_for(n - 1))  # KV one token short of the tail
        with pytest.raises(KVLayoutError):
            await kv.put(toks(n), kv_for(n, dtype=np.float32))
        with pytest.raises(TokensError):
            await kv.put([*toks(n - 1), -1], kv_for(n))
        with pytest.raises(TokensError):
            await kv.put([*toks(n - 1), 1.5], kv_for(n))
        with pytest.raises(InputError, match="start"):
            await kv.put(toks(n), kv_for(n - 3), start=3)
        with pytest.raises(InputError, match="tenant"):
            await kv.put(toks(n), kv_for(n), tenant="a\x00b")
        assert blocks(kv) == 0 and kv._s.index.tails == {}
        with pytest.raises(KVLayoutError):
            await kv.put(toks(n), kv_for(n))  # fine ...
            await kv.get(toks(n), out=np.zeros((30, 2, n - 1, 3, 64), np.float16))  # ... out one token short
        with pytest.raises(TokensError):
            await kv.lookup([1, 2, True])
    with pytest.raises(ConfigError, match="partial_blocks"):
        await TierKV.open(config(tmp_path, partial_blocks="yes"))


def test_sync_facade_round_trip_and_bad_input(tmp_path: Path) -> None:
    n = 2 * BT + 3
    data = kv_for(n, seed=11)
    with TierKV.open_sync(on(tmp_path)) as kv:
        r = kv.put(toks(n), data)
        assert (r.tokens, r.tail_tokens) == (n, 0)
        lk = kv.lookup(toks(n + 4))
        assert (lk.tokens, lk.tail_tokens) == (n, 3)
        g = kv.get(toks(n + 4))
        assert g.tokens == n and g.kv.tobytes() == data.tobytes()
        out = np.zeros((30, 2, n, 3, 64), np.float16)
        assert kv.get(toks(n), out=out).tokens == n and out.tobytes() == data.tobytes()
        with pytest.raises(KVLayoutError):
            kv.put(toks(5, base=1), kv_for(4))
        with pytest.raises(TokensError):
            kv.put([1, 2, "x"], kv_for(3))
        assert kv.lookup(toks(5, base=1)).tokens == 0
        assert kv.invariant_violations() == []


def test_sync_facade_on_trio(tmp_path: Path) -> None:
    n = BT + 9
    data = kv_for(n, seed=12)
    with TierKV.open_sync(on(tmp_path), backend="trio") as kv:
        assert kv.put(toks(n), data).tokens == n
        g = kv.get(toks(n))
        assert g.tokens == n and g.kv.tobytes() == data.tobytes()
