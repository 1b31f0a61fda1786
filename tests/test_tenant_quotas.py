"""Per-tenant quotas (``[tenants.NAME] quota``): a tenant at its quota evicts its own
blocks, never another tenant's; per-tier and total quotas; ``tenant_stats()``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kvtest import BLOCK, BT, dram_tier, kv_for, pfs_tier, smol_config

from tierkv import CapacityError, ConfigError, TierKV

pytestmark = pytest.mark.anyio


def config(tmp_path: Path, tenants: dict[str, Any], *, pfs: bool = False) -> dict[str, Any]:
    tiers = [dram_tier(40 * BLOCK)] + ([pfs_tier(tmp_path, 80 * BLOCK)] if pfs else [])
    return smol_config(tiers, tenants=tenants)


def prompt(tenant: int, i: int) -> list[int]:
    return [tenant * 1_000_000 + i * 1000 + t for t in range(2 * BT)]


async def test_a_flooding_tenant_evicts_only_its_own_blocks(tmp_path: Path) -> None:
    cfg = config(tmp_path, {"mallory": {"quota": 8 * BLOCK}, "default": {"quota": 16 * BLOCK}})
    async with await TierKV.open(cfg) as kv:
        for i in range(5):  # alice: 10 blocks, within her default quota
            await kv.put(prompt(1, i), kv_for(2 * BT, i), tenant="alice")
        for i in range(40):  # mallory floods with 80 blocks against a quota of 8
            r = await kv.put(prompt(2, i), kv_for(2 * BT, 100 + i), tenant="mallory")
            assert r.tokens == 2 * BT
            assert kv.tenant_usage("mallory")["dram"] <= 8 * BLOCK
        for i in range(5):  # none of alice's blocks was touched
            g = await kv.get(prompt(1, i), tenant="alice")
            assert g.tokens == 2 * BT and g.kv.tobytes() == kv_for(2 * BT, i).tobytes()
        # mallory keeps her most recent blocks
        assert (await kv.lookup(prompt(2, 39), tenant="mallory")).tokens == 2 * BT
        assert (await kv.lookup(prompt(2, 0), tenant="mallory")).tokens == 0
        st = kv.tenant_stats()
        assert st["mallory"].used_bytes == 8 * BLOCK and st["mallory"].quota_bytes == 8 * BLOCK
        assert st["alice"].used_bytes == 10 * BLOCK and st["alice"].quota_bytes == 16 * BLOCK
        await kv.drain()  # the scheduler service (async with) may still be rebalancing
        assert kv.invariant_violations() == []


async def test_per_tier_quota_falls_to_the_next_tier(tmp_path: Path) -> None:
    cfg = config(tmp_path, {"bob": {"quota": {"dram": 4 * BLOCK}}}, pfs=True)
    kv = await TierKV.open(cfg)  # no service: placement runs inline
    try:
        for i in range(6):
            await kv.put(prompt(3, i), kv_for(2 * BT, i), tenant="bob")
            assert kv.tenant_usage("bob")["dram"] <= 4 * BLOCK
        use = kv.tenant_usage("bob")
        assert use["dram"] <= 4 * BLOCK and use["dram"] + use["pfs"] == 12 * BLOCK
        for i in range(6):  # all still stored: bob's own blocks moved down, none lost
            g = await kv.get(prompt(3, i), tenant="bob")
            assert g.tokens == 2 * BT and g.kv.tobytes() == kv_for(2 * BT, i).tobytes()
        assert kv.tenant_stats()["bob"].quota_bytes_by_tier == {"dram": 4 * BLOCK}
        await kv.drain()  # the scheduler service (async with) may still be rebalancing
        assert kv.invariant_violations() == []
    finally:
        await kv.aclose()


async def test_a_block_larger_than_the_quota_is_a_capacity_error(tmp_path: Path) -> None:
    cfg = config(tmp_path, {"tiny": {"quota": BLOCK // 2}})
    async with await TierKV.open(cfg) as kv:
        with pytest.raises(CapacityError, match="quota"):
            await kv.put(prompt(4, 0), kv_for(2 * BT, 0), tenant="tiny")
        assert kv.tenant_usage("tiny")["dram"] == 0
        await kv.put(prompt(4, 0), kv_for(2 * BT, 0), tenant="other")  # others are not limited


@pytest.mark.parametrize(
    ("tenants", "field"),
    [
        ({"a": {"quota": 0}}, "tenants.a.quota"),
        ({"a": {"quota": {"nvme": "1GiB"}}}, "tenants.a.quota.nvme"),
        ({"a": {"quta": "1GiB"}}, "tenants.a.quta"),
        ({"a": "1GiB"}, "tenants.a"),
    ],
)
async def test_bad_quota_config_names_the_field(tmp_path: Path, tenants: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as ei:
        await TierKV.open(config(tmp_path, tenants))
    assert ei.value.field == field
