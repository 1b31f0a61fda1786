"""TierCodec: the per-tier codec API (config, choice by bandwidth, round trips, corruption, async)."""

from __future__ import annotations

from typing import Any

import anyio
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tierkv import ConfigError, DecodeError
from tierkv.codecs import MEASURED_CANDIDATES, CacheGenCodec, TierCodec, encode_block


def _kv(seed: int = 0, tokens: int = 16) -> np.ndarray[Any, Any]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((3, 2, tokens, 2, 8)).astype(np.float32)
    x[:, 0, :, 0, 0] *= 20
    return x.astype(np.float16)


def test_none_is_raw_and_lossless() -> None:
    tc = TierCodec.from_config(None)
    kv = _kv()
    assert tc.name == "raw" and tc.lossless and tc.ratio_estimate == 1.0
    assert tc.decode(tc.encode(kv)).tobytes() == kv.tobytes()
    assert tc.reasoning["reason"] == "configured explicitly"


def test_bandwidth_picks_lossy_on_slow_tiers_and_lossless_on_fast() -> None:
    slow = TierCodec.from_config(None, bandwidth_Bps=20e6)
    fast = TierCodec.from_config(None, bandwidth_Bps=100e9)
    assert not slow.lossless and slow.name == "cachegen" and slow.ratio_estimate > 2
    assert fast.lossless
    assert "GB/s" in slow.reasoning["reason"] and slow.reasoning["break_even_bps"]
    assert slow.decode_Bps > 0
    lossless_only = TierCodec.from_config({"codec": "auto", "allow_lossy": False}, bandwidth_Bps=20e6)
    assert lossless_only.lossless


def test_explicit_codec_reports_its_measured_candidate() -> None:
    tc = TierCodec.from_config({"codec": "cachegen", "level": 2, "entropy": "zstd"})
    cand = next(c for c in MEASURED_CANDIDATES if c.lossy and c.level == 2 and c.params["entropy"] == "zstd")
    assert tc.ratio_estimate == cand.ratio and not tc.lossless
    kv = _kv()
    out = tc.decode(tc.encode(kv))
    assert out.shape == kv.shape and out.dtype == kv.dtype
    assert np.abs(out.astype(np.float32) - kv.astype(np.float32)).max() < np.abs(kv.astype(np.float32)).max() / 4


@pytest.mark.parametrize("bw", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_bandwidth_is_a_config_error(bw: float) -> None:
    with pytest.raises(ConfigError):
        TierCodec.from_config(None, bandwidth_Bps=bw)


def test_channel_power_validated() -> None:
    with pytest.raises(ConfigError):
        TierCodec.from_config({"codec": "cachegen", "channel_power": 0})
    with pytest.raises(ConfigError):
        TierCodec.from_config({"codec": "cachegen", "channel_power": 1.5})


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**16), pos=st.integers(0, 10**6), cut=st.booleans(), level=st.sampled_from([1, 2, 3, 4]))
def test_corruption_raises_decode_error(seed: int, pos: int, cut: bool, level: int) -> None:
    tc = TierCodec.from_config({"codec": "cachegen", "level": level, "entropy": "ans"})
    block = bytearray(tc.encode(_kv(seed)))
    if cut:
        del block[pos % len(block) :]
    else:
        block[pos % len(block)] ^= 0xFF
    with pytest.raises(DecodeError):
        tc.decode(bytes(block))


def test_decode_many_threads_equals_serial() -> None:
    tc = TierCodec.from_config({"codec": "cachegen", "level": 2, "entropy": "zstd", "threads": 2})
    blocks = [tc.encode(_kv(s)) for s in range(4)]
    assert tc.threads == 2
    many = tc.decode_many(blocks)
    assert [m.tobytes() for m in many] == [tc.decode(b).tobytes() for b in blocks]


def test_any_block_decodes_through_any_tier_codec() -> None:
    """The header names the codec: a tier configured for lz4 decodes a cachegen block identically."""
    kv = _kv(3)
    block = encode_block(kv, CacheGenCodec(level=1, entropy="zstd"))
    expected = TierCodec.from_config({"codec": "cachegen", "level": 1, "entropy": "zstd"}).decode(block)
    assert TierCodec.from_config({"codec": "lz4"}).decode(block).tobytes() == expected.tobytes()


@pytest.mark.anyio
async def test_async_round_trip() -> None:
    tc = TierCodec.from_config({"codec": "cachegen", "level": 3, "entropy": "zstd"})
    kv = _kv(5)
    block = await tc.aencode(kv)
    out = await tc.adecode(block)
    assert out.tobytes() == tc.decode(block).tobytes()
    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(tc.adecode, block)
    assert tc.stats()["decoded_blocks"] == 5


def test_auto_caps_at_default_level_and_labels_are_unique() -> None:
    labels = [c.label for c in MEASURED_CANDIDATES]
    assert len(labels) == len(set(labels))
    tc = TierCodec.from_config(None, bandwidth_Bps=1e6)
    assert not tc.lossless and tc.params["level"] <= 2
    assert TierCodec.from_config({"codec": "auto", "max_level": 3}, bandwidth_Bps=1e6).params["level"] == 3
