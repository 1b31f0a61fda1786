"""Durable puts never acknowledge a corrupt copy; tags are checked against the chain
being walked; ``hint`` rejects bad arguments. Through the public API (asyncio and trio)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

import tierkv._engine._tierkv as core
from tierkv import InputError, TierKV
from tierkv._registry import load_backend_class
from tierkv.backend import Backend

sys.path.insert(0, str(Path(__file__).parent))
from conformance_ref import RefFileBackend
from kvtest import BT, dram_tier, kv_for, pfs_tier, smol_config

pytestmark = pytest.mark.anyio


def config(tiers: list[dict[str, Any]]) -> dict[str, Any]:
    return smol_config(tiers, revision="r1")


async def test_durable_put_replaces_a_corrupt_existing_record(tmp_path: Path) -> None:
    """Another process committed the block to the shared pfs tier, then its bytes rotted:
    a durable put that finds it must verify it and replace it, not adopt it."""
    pfs = pfs_tier(tmp_path, "64MiB")
    toks = list(range(2 * BT))
    data = kv_for(2 * BT, 1)
    kv1 = await TierKV.open(config([dram_tier(), pfs]))
    try:
        await kv1.put(toks, data)  # DRAM only
        async with await TierKV.open(config([pfs])) as kv2:
            await kv2.put(toks, data, durable=True)  # the other process's records
        by_inode = {p.stat().st_ino: p for p in (tmp_path / "pfs").rglob("*") if p.is_file()}
        files = [p for p in by_inode.values() if p.stat().st_size >= data.nbytes // 2]
        assert len(files) == 2
        for f in files:  # rot every stored content in place (once per inode: records are hard links)
            raw = bytearray(f.read_bytes())
            raw[len(raw) // 2] ^= 0xFF
            f.write_bytes(bytes(raw))
        r = await kv1.put(toks, data, durable=True)
        assert r.tokens == 2 * BT
    finally:
        await kv1.aclose()
    async with await TierKV.open(config([pfs])) as kv3:
        g = await kv3.get(toks)
        assert g.tokens == 2 * BT, f"acknowledged as durable, lost after restart: {g.miss_reason}"
        assert g.kv.tobytes() == data.tobytes()


@pytest.fixture
def reffile(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the reference file backend (one ``KEY.blk`` file per block) loadable as ``reffile``."""

    def load(name: str) -> type[Backend]:
        return RefFileBackend if name == "reffile" else load_backend_class(name)

    monkeypatch.setattr(core, "load_backend_class", load)


async def test_a_record_renamed_into_another_chain_is_never_served(tmp_path: Path, reffile: None) -> None:
    """A block file renamed to the key of another sequence's block carries a tag naming
    another parent: the walk ends there (``integrity``), the forged block is removed, and
    the bytes returned are the requested sequence's own."""
    cfg = config([{"name": "ref", "backend": "reffile", "path": str(tmp_path / "ref"), "capacity": "64MiB"}])
    a, b = list(range(2 * BT)), list(range(5000, 5000 + 2 * BT))
    da, db = kv_for(2 * BT, 1), kv_for(2 * BT, 2)
    async with await TierKV.open(cfg) as kv:
        await kv.put(a, da)
        await kv.put(b, db)
        from tierkv._keys import block_keys, to_token_array

        digest = kv.scope().digest()
        ka = block_keys(digest, to_token_array(a), BT)[1].hex()
        kb = block_keys(digest, to_token_array(b), BT)[1].hex()
    d = tmp_path / "ref"
    os.replace(d / f"{kb}.blk", d / f"{ka}.blk")  # b's second block now sits under a's key
    async with await TierKV.open(cfg) as kv:
        g = await kv.get(a)
        assert g.tokens == BT and g.miss_reason == "integrity"
        assert g.kv.tobytes() == da[:, :, :BT].tobytes()
        assert (await kv.lookup(a)).tokens == BT  # removed: not offered again
        await kv.drain()  # the scheduler service (async with) may still be rebalancing
        assert kv.invariant_violations() == []


async def test_durable_put_never_adopts_a_truncated_record(tmp_path: Path, reffile: None) -> None:
    """A record whose stored length disagrees with its tag is not indexed at restart; a
    durable put that then meets it (BlockExistsError) must not acknowledge it."""
    ref = {"name": "ref", "backend": "reffile", "path": str(tmp_path / "ref"), "capacity": "64MiB"}
    cfg = config([dram_tier(), ref])
    toks = list(range(2 * BT))
    data = kv_for(2 * BT, 3)
    async with await TierKV.open(cfg) as kv:
        await kv.put(toks, data, durable=True)
    for f in (tmp_path / "ref").glob("*.blk"):
        os.truncate(f, f.stat().st_size - 100)
    async with await TierKV.open(cfg) as kv:
        assert (await kv.lookup(toks)).tokens == 0
        assert (await kv.put(toks, data, durable=True)).tokens == 2 * BT
        await kv.drain()  # the scheduler service (async with) may still be rebalancing
        assert kv.invariant_violations() == []
    async with await TierKV.open(cfg) as kv:
        g = await kv.get(toks)
        assert g.tokens == 2 * BT, f"acknowledged as durable, lost after restart: {g.miss_reason}"
        assert g.kv.tobytes() == data.tobytes()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"tool": 5},
        {"tool": ""},
        {"transition": 3},
        {"decode_position": -1, "tokens": [1, 2]},
        {"decode_position": True, "tokens": [1, 2]},
        {"decode_position": 4},
        {"tokens": [1, 2, 3]},
        {"response_tokens": -2},
        {"response_tokens": 1.5},
        {"tenant": 7},
    ],
)
async def test_hint_rejects_bad_arguments(tmp_path: Path, kwargs: dict[str, Any]) -> None:
    async with await TierKV.open(config([dram_tier("16MiB")])) as kv:
        with pytest.raises(InputError):
            kv.hint(**kwargs)
