"""Every codec at every tier position, through the public API.

A lossless tier keeps ``get`` bit-exact; a lossy tier's blocks come back with
``exact=False``, close to what was put, and are verified against the codec block's own
checksum (never against the raw bytes' CRC, which a reconstruction cannot match). Positions:
the tier ``put`` writes (the only tier), a lower tier reached by demotion, the durable tier
of ``put(durable=True)``, and the durable tier read by a fresh process after a restart.
MLA models take lossless codecs only; a lossy one is a ConfigError at open.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kvtest import BT, HF, kv_shape, smooth_kv

from tierkv import ConfigError, TierKV

pytestmark = pytest.mark.anyio

DATA = Path(__file__).parent / "data" / "hf_configs"
# DeepSeek-V3's attention (MLA latent 512 + 64) on 2 layers: small blocks, the real layout
MLA = {**json.loads((DATA / "deepseek-v3.json").read_text()), "num_hidden_layers": 2, "first_k_dense_replace": 0}

LOSSLESS: list[dict[str, Any] | None] = [None, {"codec": "lz4"}, {"codec": "zstd"}]
LOSSY: list[dict[str, Any]] = [{"codec": "cachegen", "level": lv} for lv in (1, 2, 3)]
AUTO: dict[str, Any] = {"codec": "auto"}
ALL = [*LOSSLESS, *LOSSY, AUTO]


def cid(c: dict[str, Any] | None) -> str:
    return "none" if c is None else "-".join(str(v) for v in c.values())


def config(mla: bool, tiers: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    model = {"name": "mla" if mla else "smol", "revision": "r1", "hf_config": MLA if mla else HF}
    return {"model": model, "kv_dtype": "float16", "block_tokens": BT, "tiers": tiers, **extra}


def every_codec_and_model(test: Callable[..., Any]) -> Callable[..., Any]:
    """Run ``test`` for every codec in ``ALL`` on the GQA and the MLA model."""
    test = pytest.mark.parametrize("codec", ALL, ids=cid)(test)
    return pytest.mark.parametrize("mla", [False, True], ids=["gqa", "mla"])(test)


def shape_of(mla: bool, n: int) -> tuple[int, ...]:
    return (2, n, 576) if mla else kv_shape(n)


def prompts(mla: bool) -> list[tuple[list[int], np.ndarray]]:
    """Four two-block prompts and their KV."""
    return [(list(range(s * 1000, s * 1000 + 2 * BT)), smooth_kv(shape_of(mla, 2 * BT), s)) for s in range(4)]


async def rejected(cfg: dict[str, Any], mla: bool, codec: dict[str, Any] | None) -> bool:
    """An MLA model with a lossy codec is a ConfigError at open (True: the test ends there)."""
    if not (mla and codec in LOSSY):
        return False
    with pytest.raises(ConfigError, match="lossless codec"):
        await TierKV.open(cfg)
    return True


def tier(name: str, backend: str, tmp_path: Path, capacity: int | str, codec: dict[str, Any] | None) -> dict[str, Any]:
    t: dict[str, Any] = {"name": name, "backend": backend, "capacity": capacity}
    if backend == "pfs":
        t["path"] = str(tmp_path / name)
    if codec is not None:
        t["codec"] = codec
    return t


def check(got: Any, want: np.ndarray, exact: bool, lossless: bool) -> None:
    got = np.asarray(got)
    assert got.shape == want.shape
    if lossless:
        assert exact and got.tobytes() == want.tobytes()
    elif exact:
        assert got.tobytes() == want.tobytes()
    else:
        # a reconstruction of these values: far closer to them than to another block's
        # values of the same distribution (coarse levels are coarse, but never another block)
        other = smooth_kv(want.shape, seed=12345)
        g32 = got.astype(np.float32)
        err = np.abs(g32 - want.astype(np.float32)).mean()
        assert err < 0.5 * np.abs(g32 - other.astype(np.float32)).mean()


def is_lossless(kv: TierKV, name: str) -> bool:
    return kv.stats()[name].codec in ("raw", "lz4", "zstd")


async def check_restored(
    kv: TierKV, seqs: list[tuple[list[int], np.ndarray]], lossless: bool, tiers: tuple[str, ...]
) -> None:
    """Every prompt is found whole on ``tiers``, exact as the codec allows."""
    for toks, data in seqs:
        g = await kv.get(toks)
        assert g.tokens == 2 * BT, f"blocks lost, expected on {tiers}: {g.miss_reason}"
        assert g.exact == lossless and g.tiers == tiers
        check(g.kv, data, g.exact, lossless)


@every_codec_and_model
async def test_first_tier(tmp_path: Path, codec: dict[str, Any] | None, mla: bool) -> None:
    cfg = config(mla, [tier("dram", "dram", tmp_path, "64MiB", codec)])
    if await rejected(cfg, mla, codec):
        return
    toks = list(range(4 * BT))
    data = smooth_kv(shape_of(mla, 4 * BT))
    async with await TierKV.open(cfg) as kv:
        assert (await kv.put(toks, data)).tokens == 4 * BT
        g = await kv.get(toks)
        assert g.tokens == 4 * BT and g.miss_reason == ""
        check(g.kv, data, g.exact, is_lossless(kv, "dram"))
        assert g.exact == is_lossless(kv, "dram")
        await kv.drain()  # the scheduler service (async with) may still be rebalancing
        assert kv.invariant_violations() == []


@every_codec_and_model
async def test_lower_tier_by_demotion(tmp_path: Path, codec: dict[str, Any] | None, mla: bool) -> None:
    blk = int(np.prod(shape_of(mla, BT))) * 2
    tiers = [tier("dram", "dram", tmp_path, 3 * blk, None), tier("pfs", "pfs", tmp_path, "64MiB", codec)]
    cfg = config(mla, tiers, scheduler={"promote": False})
    if await rejected(cfg, mla, codec):
        return
    async with await TierKV.open(cfg) as kv:
        seqs = prompts(mla)
        for toks, data in seqs:
            await kv.put(toks, data)
        lossless = is_lossless(kv, "pfs")
        demoted = 0
        for toks, data in seqs:
            g = await kv.get(toks)
            assert g.tokens == 2 * BT, g.miss_reason
            check(g.kv, data, g.exact, lossless and g.exact)
            demoted += "pfs" in g.tiers
            if "pfs" in g.tiers:
                assert g.exact == lossless
        assert demoted > 0
        await kv.drain()  # the scheduler service (async with) may still be rebalancing
        assert kv.invariant_violations() == []


@every_codec_and_model
async def test_durable_only_tier_and_restart(tmp_path: Path, codec: dict[str, Any] | None, mla: bool) -> None:
    """The durable tier is the tier ``put`` writes: its copy is the only one."""
    cfg = config(mla, [tier("pfs", "pfs", tmp_path, "64MiB", codec)])
    if await rejected(cfg, mla, codec):
        return
    seqs = prompts(mla)
    async with await TierKV.open(cfg) as kv:
        for toks, data in seqs:
            assert (await kv.put(toks, data, durable=True)).tokens == 2 * BT
        lossless = is_lossless(kv, "pfs")
    async with await TierKV.open(cfg) as kv:
        await check_restored(kv, seqs, lossless, ("pfs",))


@every_codec_and_model
async def test_durable_tier_and_restart(tmp_path: Path, codec: dict[str, Any] | None, mla: bool) -> None:
    cfg = config(mla, [tier("dram", "dram", tmp_path, "64MiB", None), tier("pfs", "pfs", tmp_path, "64MiB", codec)])
    if await rejected(cfg, mla, codec):
        return
    seqs = prompts(mla)
    async with await TierKV.open(cfg) as kv:
        for toks, data in seqs:
            await kv.put(toks, data, durable=True)
        for toks, data in seqs:  # served by the exact DRAM copy
            g = await kv.get(toks)
            assert g.tokens == 2 * BT and g.exact and g.kv.tobytes() == data.tobytes()
        lossless = is_lossless(kv, "pfs")
        await kv.drain()  # the scheduler service (async with) may still be rebalancing
        assert kv.invariant_violations() == []
    # a fresh process (no service: promotions run inline): only the durable copies remain
    kv = await TierKV.open(cfg)
    try:
        await check_restored(kv, seqs, lossless, ("pfs",))
        # promoted to the raw DRAM tier: a lossy reconstruction keeps exact=False and its
        # raw copy is verified against the reconstruction's checksum
        for toks, _ in seqs:
            assert await kv.prefetch(toks) == 2
        await check_restored(kv, seqs, lossless, ("dram",))
        await kv.drain()  # the scheduler service (async with) may still be rebalancing
        assert kv.invariant_violations() == []
    finally:
        await kv.aclose()


async def test_lossy_auto_on_mla_is_a_config_error(tmp_path: Path) -> None:
    cfg = config(True, [tier("dram", "dram", tmp_path, "64MiB", {"codec": "auto", "allow_lossy": True})])
    with pytest.raises(ConfigError, match="allow_lossy"):
        await TierKV.open(cfg)
