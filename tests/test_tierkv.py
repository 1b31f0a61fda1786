"""The public TierKV API on real DRAM and PFS tiers, under asyncio and trio."""

from __future__ import annotations

from pathlib import Path

import anyio
import numpy as np
import pytest
from kvtest import BLOCK, config, kv_for

from tierkv import (
    CapacityError,
    ClosedError,
    ConfigError,
    InputError,
    KVLayoutError,
    PluginNotFoundError,
    TierKV,
    TokensError,
)

pytestmark = pytest.mark.anyio

SHAPE = (30, 2, None, 3, 64)


async def test_round_trip_bit_exact(tmp_path: Path) -> None:
    async with await TierKV.open(config(tmp_path)) as kv:
        toks = list(range(1000, 1100))
        data = kv_for(100)
        r = await kv.put(toks, data)
        assert (r.tokens, r.new_blocks, r.tail_tokens) == (96, 6, 4)
        lk = await kv.lookup(toks)
        assert lk.tokens == 96 and lk.tiers == ("dram",)
        g = await kv.get(toks)
        assert g.tokens == 96 and g.tiers == ("dram",)
        assert g.kv.tobytes() == data[:, :, :96].tobytes()
        # a longer query shares the prefix; a diverging one shares only the blocks before it
        assert (await kv.lookup([*toks, 1, 2, 3])).tokens == 96
        other = list(toks)
        other[40] = 7
        assert (await kv.lookup(other)).tokens == 32
        # put again: nothing new
        r2 = await kv.put(toks, data)
        assert r2.new_blocks == 0 and r2.existing_blocks == 6


async def test_get_into_caller_buffer_and_torch(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    async with await TierKV.open(config(tmp_path)) as kv:
        toks = list(range(64))
        t = torch.randn(30, 2, 64, 3, 64, dtype=torch.float16)
        await kv.put(torch.tensor(toks), t)
        out = torch.zeros(30, 2, 80, 3, 64, dtype=torch.float16)
        g = await kv.get(toks, out=out)
        assert g.kv is out and g.tokens == 64
        assert torch.equal(out[:, :, :64], t)
        assert torch.count_nonzero(out[:, :, 64:]) == 0
        with pytest.raises(KVLayoutError, match="out shape"):
            await kv.get(toks, out=torch.zeros(30, 2, 10, 3, 64, dtype=torch.float16))


async def test_bfloat16_and_float32(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    async with await TierKV.open(config(tmp_path, kv_dtype="bfloat16")) as kv:
        t = torch.randn(30, 2, 32, 3, 64, dtype=torch.bfloat16)
        await kv.put(list(range(32)), t)
        g = await kv.get(list(range(32)))
        assert torch.equal(torch.from_numpy(g.kv).view(torch.bfloat16), t)
    async with await TierKV.open(config(tmp_path / "b", kv_dtype="float32")) as kv:
        a = kv_for(32, dtype=np.float32)
        await kv.put(list(range(32)), a)
        assert np.array_equal((await kv.get(list(range(32)))).kv, a)


async def test_bad_inputs_are_typed_and_store_intact(tmp_path: Path) -> None:
    async with await TierKV.open(config(tmp_path)) as kv:
        toks = list(range(32))
        data = kv_for(32)
        await kv.put(toks, data)
        with pytest.raises(KVLayoutError, match="shape"):
            await kv.put(toks, kv_for(31))
        with pytest.raises(KVLayoutError, match="dtype"):
            await kv.put(toks, kv_for(32, dtype=np.float32))
        with pytest.raises(KVLayoutError, match="type"):
            await kv.put(toks, [[1.0]])
        with pytest.raises(TokensError):
            await kv.put([0.5] * 32, data)
        with pytest.raises(TokensError):
            await kv.lookup("hello")
        with pytest.raises(InputError, match="tenant"):
            await kv.put(toks, data, tenant="x" * 1000)
        assert (await kv.lookup([])).tokens == 0
        assert (await kv.get([])).kv is None
        g = await kv.get(toks)
        assert g.kv.tobytes() == data.tobytes()


async def test_tenants_never_share_unless_configured(tmp_path: Path) -> None:
    async with await TierKV.open(config(tmp_path)) as kv:
        toks = list(range(32))
        await kv.put(toks, kv_for(32), tenant="alice")
        assert (await kv.lookup(toks, tenant="alice")).tokens == 32
        assert (await kv.lookup(toks, tenant="bob")).tokens == 0
        assert (await kv.lookup(toks)).tokens == 0
    async with await TierKV.open(config(tmp_path / "shared", share_across_tenants=True)) as kv:
        await kv.put(toks, kv_for(32), tenant="alice")
        assert (await kv.lookup(toks, tenant="bob")).tokens == 32


async def test_invalidate_by_tenant_and_scope(tmp_path: Path) -> None:
    async with await TierKV.open(config(tmp_path)) as kv:
        a, b = list(range(32)), list(range(100, 132))
        await kv.put(a, kv_for(32), tenant="alice")
        await kv.put(b, kv_for(32, 1), tenant="bob")
        assert await kv.invalidate(tenant="alice") == 2
        assert (await kv.lookup(a, tenant="alice")).tokens == 0
        assert (await kv.lookup(b, tenant="bob")).tokens == 32
        assert await kv.invalidate(all_tenants=True, scope=kv.scope()) == 2
        assert kv.stats()["dram"].blocks == 0


async def test_demotion_to_pfs_and_hit_served_from_pfs(tmp_path: Path) -> None:
    async with await TierKV.open(config(tmp_path, dram=str(BLOCK * 4))) as kv:
        seqs = [list(range(i * 1000, i * 1000 + 32)) for i in range(6)]
        datas = [kv_for(32, i) for i in range(6)]
        for s, d in zip(seqs, datas, strict=True):
            await kv.put(s, d)
        # the scheduler service (started by ``async with``) rebalances in the background:
        # drain() waits for it, after which nothing is in flight
        with anyio.fail_after(10):
            await kv.drain()
        st = kv.stats()
        assert st["dram"].used_bytes <= 0.9 * st["dram"].capacity_bytes
        assert kv.invariant_violations() == []
        assert st["pfs"].blocks >= 8 and st["dram"].demotions > 0
        # the oldest sequence now lives in PFS and is served from there, bit-exact
        lk = await kv.lookup(seqs[0])
        assert lk.tokens == 32 and "pfs" in lk.tiers
        g = await kv.get(seqs[0])
        assert g.kv.tobytes() == datas[0].tobytes() and "pfs" in g.tiers
        for s, d in zip(seqs, datas, strict=True):
            assert (await kv.get(s)).kv.tobytes() == d.tobytes()


async def test_warm_start_from_pfs(tmp_path: Path) -> None:
    toks = list(range(48))
    data = kv_for(48)
    async with await TierKV.open(config(tmp_path, dram=str(BLOCK))) as kv:
        await kv.put(toks, data)
        assert kv.stats()["pfs"].blocks >= 2
    async with await TierKV.open(config(tmp_path, dram=None)) as kv2:
        lk = await kv2.lookup(toks)
        g = await kv2.get(toks)
        assert lk.tokens == g.tokens
        assert g.tokens >= 32
        assert g.kv.tobytes() == data[:, :, : g.tokens].tobytes()


def content_files(tmp_path: Path) -> list[Path]:
    """The PFS tier's block content files (records are hard links to them: flipping both would cancel out)."""
    return sorted(p for p in (tmp_path / "pfs" / "objects").rglob("*") if p.is_file() and p.stat().st_size > 100_000)


def flip_a_byte(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[1000] ^= 0xFF
    path.write_bytes(bytes(raw))


async def test_corrupted_pfs_block_is_never_served(tmp_path: Path) -> None:
    async with await TierKV.open(config(tmp_path, dram=None)) as kv:
        toks = list(range(48))
        data = kv_for(48)
        await kv.put(toks, data)
        files = content_files(tmp_path)
        assert files
        flip_a_byte(files[0])
        g = await kv.get(toks)
        assert g.tokens < 48 and g.miss_reason == "integrity"
        if g.tokens:
            assert g.kv.tobytes() == data[:, :, : g.tokens].tobytes()
        g2 = await kv.get(toks)
        assert g2.tokens == g.tokens  # never served afterwards


async def test_every_corrupt_block_of_a_read_leaves_the_index(tmp_path: Path) -> None:
    """A batch read that meets several corrupt blocks quarantines them all; every one must leave
    the index (not only the first), so that a later put stores them again instead of skipping
    them as existing (found by the corruption fuzz test)."""
    async with await TierKV.open(config(tmp_path, dram=None)) as kv:
        toks = list(range(48))
        data = kv_for(48)
        await kv.put(toks, data)
        files = content_files(tmp_path)
        assert len(files) >= 2
        for victim in files:
            flip_a_byte(victim)
        g = await kv.get(toks)
        assert g.tokens == 0 and g.miss_reason == "integrity"
        r = await kv.put(toks, data)
        assert r.existing_blocks == 0 and r.new_blocks == len(files)
        g2 = await kv.get(toks)
        assert g2.tokens == 48 and g2.kv.tobytes() == data.tobytes()


async def test_capacity_error_when_nothing_fits(tmp_path: Path) -> None:
    async with await TierKV.open(config(tmp_path, dram="1KiB", pfs=None)) as kv:
        with pytest.raises(CapacityError):
            await kv.put(list(range(16)), kv_for(16))
        assert kv.stats()["dram"].used_bytes == 0


async def test_lru_eviction_at_bottom(tmp_path: Path) -> None:
    async with await TierKV.open(config(tmp_path, dram=str(BLOCK * 3), pfs=None)) as kv:
        for i in range(5):
            await kv.put(list(range(i * 100, i * 100 + 16)), kv_for(16, i))
        st = kv.stats()["dram"]
        assert st.used_bytes <= st.capacity_bytes
        assert (await kv.lookup(list(range(400, 416)))).tokens == 16  # newest kept
        assert (await kv.lookup(list(range(0, 16)))).tokens == 0  # oldest dropped


async def test_cancelled_put_leaves_consistent_state(tmp_path: Path) -> None:
    async with await TierKV.open(config(tmp_path)) as kv:
        toks = list(range(160))
        data = kv_for(160)
        for delay in (0.0, 0.0005, 0.001, 0.003):
            with anyio.move_on_after(delay):
                await kv.put(toks, data)
            lk = await kv.lookup(toks)
            g = await kv.get(toks)
            assert g.tokens == lk.tokens
            if g.tokens:
                assert g.kv.tobytes() == data[:, :, : g.tokens].tobytes()
        st = kv.stats()
        assert st["dram"].blocks * BLOCK == st["dram"].used_bytes
        await kv.put(toks, data)
        assert (await kv.get(toks)).kv.tobytes() == data.tobytes()


async def test_concurrent_clients(tmp_path: Path) -> None:
    async with await TierKV.open(config(tmp_path)) as kv:
        datas = {i: kv_for(32, i) for i in range(8)}

        async def client(i: int) -> None:
            toks = list(range(i * 1000, i * 1000 + 32))
            for _ in range(3):
                await kv.put(toks, datas[i])
                g = await kv.get(toks)
                assert g.kv.tobytes() == datas[i].tobytes()

        async with anyio.create_task_group() as tg:
            for i in range(8):
                tg.start_soon(client, i)
        assert kv.stats()["dram"].blocks == 16


async def test_closed_and_open_errors(tmp_path: Path) -> None:
    kv = await TierKV.open(config(tmp_path))
    await kv.aclose()
    await kv.aclose()
    with pytest.raises(ClosedError):
        await kv.lookup([1, 2])
    bad = config(tmp_path)
    bad["tiers"][0]["backend"] = "nosuch"
    with pytest.raises(PluginNotFoundError):
        await TierKV.open(bad)
    bad = config(tmp_path)
    bad["tiers"][0]["capacity"] = "lots"
    with pytest.raises(ConfigError, match="capacity"):
        await TierKV.open(bad)


async def test_concurrent_durable_puts_of_one_prefix_return_only_once_stored(tmp_path: Path) -> None:
    """When another task holds the reservation of a block, put(durable=True) waits for it:
    on return the whole prefix is indexed and durable (the 64-client load test found puts that
    returned while a concurrent put of the same block was still writing it)."""
    # pfs only: every write is a thread hop, so the puts overlap
    async with await TierKV.open(config(tmp_path, dram=None)) as kv:
        problems: list[str] = []

        async def client(c: int) -> None:
            for r in range(4):
                toks = list(range(1000 * r, 1000 * r + 48))
                await kv.put(toks, kv_for(48, seed=r), durable=True)
                look = await kv.lookup(toks)
                entries = [kv._index.get(k.hex()) for k in kv._s.keys(toks, None)[1]]
                if look.tokens != 48 or any(e is None or e.backing < 0 for e in entries):
                    problems.append(f"client {c} round {r}: {look.tokens} tokens after a durable put")

        async with anyio.create_task_group() as tg:
            for c in range(8):
                tg.start_soon(client, c)
        assert problems == []
