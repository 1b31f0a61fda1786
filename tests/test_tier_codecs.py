"""Per-tier codecs inside TierKV: lossless tiers stay bit-exact, lossy tiers are
labelled inexact, corrupt payloads are misses, the auto choice shows its reasoning."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tierkv import ConfigError, TierKV
from tierkv_backends import pfs as pfs_mod

pytestmark = pytest.mark.anyio

HF = json.loads((Path(__file__).parent / "data" / "hf_configs" / "smollm2-135m-instruct.json").read_text())
BT = 16
BLK = 30 * 2 * BT * 3 * 64 * 2


def kv_for(n: int, seed: int = 0) -> np.ndarray:
    # KV-like values: smooth per channel, a few outlier channels
    rng = np.random.default_rng(seed)
    base = rng.standard_normal((30, 2, 1, 3, 64)) * np.linspace(0.5, 4.0, 64)
    return (base + 0.1 * rng.standard_normal((30, 2, n, 3, 64))).astype(np.float16)


def config(tmp_path: Path, codec: dict[str, Any] | None, kv_dtype: str = "float16") -> dict[str, Any]:
    pfs: dict[str, Any] = {"name": "pfs", "backend": "pfs", "path": str(tmp_path / "pfs"), "capacity": "256MiB"}
    if codec is not None:
        pfs["codec"] = codec
    return {
        "model": {"name": "smol", "revision": "r1", "hf_config": HF},
        "kv_dtype": kv_dtype,
        "block_tokens": BT,
        "tiers": [{"name": "dram", "backend": "dram", "capacity": BLK * 2}, pfs],
        "scheduler": {"promote": False},
    }


async def fill(kv: TierKV, n: int = 4) -> list[tuple[list[int], np.ndarray]]:
    out = []
    for i in range(n):
        toks = list(range(i * 1000, i * 1000 + 32))
        data = kv_for(32, i)
        await kv.put(toks, data)
        out.append((toks, data))
    return out


async def test_lossless_codec_tier_is_bit_exact_and_smaller(tmp_path: Path) -> None:
    kv = await TierKV.open(config(tmp_path, {"codec": "zstd"}))
    try:
        seqs = await fill(kv)
        st = kv.stats()["pfs"]
        assert st.codec == "zstd" and st.blocks > 0
        assert st.used_bytes < st.blocks * BLK  # stored compressed
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
        assert st.codec.startswith("cachegen") and st.used_bytes < st.blocks * BLK / 3
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
