"""Per-tier codecs inside TierKV: lossless tiers stay bit-exact, lossy tiers are
labelled inexact, corrupt payloads are misses, the auto choice shows its reasoning."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kvtest import BLOCK, dram_tier, pfs_tier, smol_config, smooth_kv

from tierkv import ConfigError, TierKV
from tierkv_backends import pfs as pfs_mod

pytestmark = pytest.mark.anyio


def config(tmp_path: Path, codec: dict[str, Any] | None, kv_dtype: str = "float16") -> dict[str, Any]:
    """A two-block DRAM over a PFS tier with ``codec`` (None: raw), promotions off."""
    pfs = pfs_tier(tmp_path) | ({"codec": codec} if codec is not None else {})
    return smol_config([dram_tier(BLOCK * 2), pfs], revision="r1", kv_dtype=kv_dtype, scheduler={"promote": False})


async def fill(kv: TierKV, n: int = 4) -> list[tuple[list[int], np.ndarray]]:
    out = []
    for i in range(n):
        toks = list(range(i * 1000, i * 1000 + 32))
        data = smooth_kv(32, i)
        await kv.put(toks, data)
        out.append((toks, data))
    return out


async def test_lossless_codec_tier_is_bit_exact_and_smaller(tmp_path: Path) -> None:
    kv = await TierKV.open(config(tmp_path, {"codec": "zstd"}))
    try:
        seqs = await fill(kv)
        st = kv.stats()["pfs"]
        assert st.codec == "zstd" and st.blocks > 0
        assert st.used_bytes < st.blocks * BLOCK  # stored compressed
        for toks, data in seqs:
            g = await kv.get(toks)
            assert g.tokens == 32 and g.exact and g.kv.tobytes() == data.tobytes()
    finally:
        await kv.aclose()
    # a fresh process decodes what the first one wrote (self-describing blocks)
    cfg = config(tmp_path, {"codec": "zstd"})
    cfg["tiers"] = cfg["tiers"][1:]
    kv2 = await TierKV.open(cfg)
    try:
        toks, data = seqs[0]
        g = await kv2.get(toks)
        assert g.tokens == 32 and g.kv.tobytes() == data.tobytes()
    finally:
        await kv2.aclose()


async def test_lossy_codec_tier_is_labelled_inexact(tmp_path: Path) -> None:
    kv = await TierKV.open(config(tmp_path, {"codec": "cachegen", "level": 2, "entropy": "zstd"}))
    try:
        seqs = await fill(kv)
        st = kv.stats()["pfs"]
        assert st.codec.startswith("cachegen") and st.used_bytes < st.blocks * BLOCK / 3
        demoted = [(t, d) for t, d in seqs if "pfs" in (await kv.lookup(t)).tiers]
        assert demoted
        toks, data = demoted[0]
        g = await kv.get(toks)
        assert g.tokens == 32 and not g.exact
        err = np.abs(g.kv.astype(np.float32) - data.astype(np.float32)).mean() / np.abs(data.astype(np.float32)).mean()
        assert err < 0.25  # a reconstruction, not noise (random data would be ~1.4)
        # blocks that never left DRAM are still exact
        fast = [(t, d) for t, d in seqs if (await kv.lookup(t)).tiers == ("dram",)]
        for toks, data in fast:
            g = await kv.get(toks)
            assert g.exact and g.kv.tobytes() == data.tobytes()
    finally:
        await kv.aclose()


def _damage_pfs_blocks(root: Path) -> None:
    """Flip a byte in the middle of every content file of the pfs store (once per file: the
    records of equal blocks are hard links to one file)."""
    seen: set[int] = set()
    for rec in (root / "keys").iterdir():
        st = rec.stat()
        if st.st_ino in seen:
            continue
        seen.add(st.st_ino)
        at = pfs_mod._HDR.size + (st.st_size - pfs_mod._HDR.size) // 2
        with open(rec, "r+b") as f:
            f.seek(at)
            b = f.read(1)
            f.seek(at)
            f.write(bytes([b[0] ^ 0xFF]))


async def test_corrupt_encoded_payload_is_a_miss(tmp_path: Path) -> None:
    kv = await TierKV.open(config(tmp_path, {"codec": "lz4"}))
    try:
        seqs = await fill(kv)
        victim = None
        for t, _ in seqs:
            if (await kv.lookup(t)).block_tiers[0] == "pfs":
                victim = t
                break
        assert victim is not None
        _damage_pfs_blocks(tmp_path / "pfs")
        g = await kv.get(victim)
        assert g.tokens == 0 and g.miss_reason == "integrity"
    finally:
        await kv.aclose()


async def test_auto_codec_shows_its_reasoning(tmp_path: Path) -> None:
    kv = await TierKV.open(config(tmp_path, {"codec": "auto"}))
    try:
        st = kv.stats()["pfs"]
        assert st.codec_reasoning  # why this codec for this tier's bandwidth
        seqs = await fill(kv, 3)
        for toks, data in seqs:
            g = await kv.get(toks)
            assert g.tokens == 32
            if g.exact:
                assert g.kv.tobytes() == data.tobytes()
    finally:
        await kv.aclose()


async def test_lossy_codec_needs_float_kv(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="codec"):
        await TierKV.open(config(tmp_path, {"codec": "cachegen", "level": 2}, kv_dtype="bfloat16"))
