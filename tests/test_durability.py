"""Durable puts, rollout flush, checkpoints with delta and warm restore, speculative staging."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import kvtest
import numpy as np
import pytest
from kvtest import BLOCK, BT, kv_for

from tierkv import InputError, TierKV, TierUnavailableError

pytestmark = pytest.mark.anyio


def config(tmp_path: Path, *, revision: str = "r1", dram: int | None = 64 << 20) -> dict[str, Any]:
    """DRAM (``dram=None``: none, a fresh process reading only the durable tier) over a 512 MiB PFS."""
    return kvtest.config(tmp_path, dram=dram, pfs="512MiB", revision=revision)


async def test_durable_put_survives_a_fresh_process_view(tmp_path: Path) -> None:
    toks, data = list(range(64)), kv_for(64)
    async with await TierKV.open(config(tmp_path)) as kv:
        await kv.put(toks, data, durable=True)
        st = kv.stats()
        assert st["dram"].blocks == 4 and st["pfs"].blocks == 4  # served from DRAM, durable copy on PFS
        volatile = list(range(500, 532))
        await kv.put(volatile, kv_for(32, 1))  # not durable: DRAM only
        assert kv.stats()["pfs"].blocks == 4
    async with await TierKV.open(config(tmp_path, dram=None)) as kv2:
        g = await kv2.get(toks)
        assert g.tokens == 64 and g.kv.tobytes() == data.tobytes()
        assert (await kv2.lookup(volatile)).tokens == 0


async def test_durable_put_needs_a_persistent_tier(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    cfg["tiers"] = cfg["tiers"][:1]
    async with await TierKV.open(cfg) as kv:
        with pytest.raises(TierUnavailableError):
            await kv.put(list(range(16)), kv_for(16), durable=True)


async def test_demotion_of_a_durable_block_reuses_its_copy(tmp_path: Path) -> None:
    async with await TierKV.open(config(tmp_path, dram=BLOCK * 3)) as kv:
        await kv.put(list(range(32)), kv_for(32), durable=True)
        written_before = kv.stats()["pfs"].bytes_in
        for i in range(4):
            await kv.put(list(range(1000 * (i + 1), 1000 * (i + 1) + 16)), kv_for(16, i + 1))
        st = kv.stats()
        assert st["dram"].demotions >= 2
        assert (await kv.lookup(list(range(32)))).tiers == ("pfs",)
        # the durable blocks were not written to PFS a second time
        demoted_volatile = st["pfs"].blocks - 2
        assert st["pfs"].bytes_in - written_before == demoted_volatile * BLOCK


async def test_flush_reclaims_old_scope_on_every_tier(tmp_path: Path) -> None:
    toks = list(range(64))
    async with await TierKV.open(config(tmp_path, revision="old")) as kv:
        await kv.put(toks, kv_for(64), durable=True)
        old_scope = kv.scope()
    async with await TierKV.open(config(tmp_path, revision="new")) as kv:
        assert (await kv.lookup(toks)).tokens == 0  # old keys unreachable by scope
        await kv.put(toks, kv_for(64, 5), durable=True)
        assert kv.stats()["pfs"].blocks == 8
        removed = await kv.flush()  # every scope but the current one
        assert removed == 4
        assert kv.stats()["pfs"].blocks == 4
        assert (await kv.get(toks)).kv.tobytes() == kv_for(64, 5).tobytes()
        assert await kv.flush(old_scope) == 0
        assert await kv.flush(dataclasses.replace(kv.scope())) == 4
        assert kv.stats()["pfs"].blocks == 0 and kv.stats()["dram"].blocks == 0


async def test_checkpoint_delta_dedup_and_warm_restore(tmp_path: Path) -> None:
    system = list(range(10_000, 10_032))  # a shared system prompt of 2 blocks
    convs = [system + list(range(i * 100, i * 100 + 32)) for i in range(3)]
    datas = [np.concatenate([kv_for(32, 99), kv_for(32, i)], axis=2) for i in range(3)]
    async with await TierKV.open(config(tmp_path)) as kv:
        for c, d in zip(convs[:2], datas[:2], strict=True):
            await kv.put(c, d)
        first = await kv.checkpoint("one")
        assert first.blocks == 6 and first.copied_bytes == 6 * BLOCK
        await kv.put(convs[2], datas[2])
        second = await kv.checkpoint("two")
        assert second.blocks == 8
        assert second.copied_bytes == 2 * BLOCK  # only the new conversation's own blocks
        assert second.distinct_contents == 8
        with pytest.raises(InputError):
            await kv.checkpoint("bad name!")
    async with await TierKV.open(config(tmp_path), restore="two") as kv2:
        assert kv2.restored_blocks == 8
        st = kv2.stats()
        assert st["dram"].blocks == 8 and st["dram"].promotions == 8
        for c, d in zip(convs, datas, strict=True):
            g = await kv2.get(c)
            assert g.tiers == ("dram",) and g.kv.tobytes() == d.tobytes()
    with pytest.raises(InputError, match="no checkpoint"):
        await TierKV.open(config(tmp_path), restore="missing")


async def test_speculative_staging_never_leaks_unaccepted_tokens(tmp_path: Path) -> None:
    base = list(range(32))
    data = kv_for(96, 3)
    async with await TierKV.open(config(tmp_path)) as kv, await TierKV.open(config(tmp_path)) as other:
        seq = base
        accepted = 32
        await kv.put(seq, np.ascontiguousarray(data[:, :, :32]), durable=True)
        rng = np.random.default_rng(7)
        for step in range(8):
            draft = [int(x) for x in rng.integers(0, 50_000, 8)]
            full = [*seq, *draft]
            await kv.stage("req", full, np.ascontiguousarray(data[:, :, : len(full)]))
            # nothing staged is visible: not here, not to another instance sharing the PFS tier
            assert (await kv.lookup(full)).tokens == (accepted // BT) * BT
            assert (await other.lookup(full)).tokens <= (accepted // BT) * BT
            if step % 3 == 2:
                kv.rollback("req")  # the whole draft rejected
                continue
            n_ok = int(rng.integers(0, 9))
            res = await kv.commit("req", len(seq) + n_ok, durable=True)
            seq = full[: len(seq) + n_ok]
            accepted = len(seq)
            assert res.tokens == (accepted // BT) * BT
            g = await kv.get(full)
            assert g.tokens == (accepted // BT) * BT
            assert g.kv.tobytes() == data[:, :, : g.tokens].tobytes()
        with pytest.raises(InputError):
            await kv.commit("nope", 1)
        await kv.stage("r2", list(range(10)), kv_for(10))
        with pytest.raises(InputError):
            await kv.commit("r2", 11)
    # a fresh view of the durable tier holds exactly the accepted prefix
    async with await TierKV.open(config(tmp_path, dram=None)) as kv3:
        assert (await kv3.lookup(seq)).tokens == (len(seq) // BT) * BT
