"""Per-tier codec choice and the async pipeline."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tierkv import ConfigError, DecodeError, InputError
from tierkv.codecs import CodecCandidate, CodecPipeline, break_even_bandwidth, choose_codec, fetch_decode_seconds

pytestmark = pytest.mark.anyio

RAW = CodecCandidate("raw", {}, 1.0, 3000.0)
LZ4 = CodecCandidate("lz4", {"shuffle": True}, 1.3, 600.0)
L2 = CodecCandidate("cachegen", {"level": 2, "entropy": "zstd"}, 6.0, 300.0, lossy=True, level=2)
L3 = CodecCandidate("cachegen", {"level": 3, "entropy": "zstd"}, 10.0, 250.0, lossy=True, level=3)
ALL = [RAW, LZ4, L2, L3]


def test_fast_tier_gets_raw_slow_tier_gets_lossy() -> None:
    assert choose_codec(ALL, 50e9).chosen is RAW
    slow = choose_codec(ALL, 10e6)
    assert slow.chosen is L3
    assert "cachegen:3" in slow.reason
    assert choose_codec(ALL, 10e6, allow_lossy=False).chosen is LZ4
    assert choose_codec(ALL, 10e6, max_level=2).chosen is L2
    assert set(choose_codec(ALL, 10e6, max_level=2).excluded) == {"cachegen:3:zstd"}


def test_break_even_matches_costs() -> None:
    bw = break_even_bandwidth(L2, RAW)
    assert 0 < bw < math.inf
    a = fetch_decode_seconds(L2, 1e6, bw)
    b = fetch_decode_seconds(RAW, 1e6, bw)
    assert a == pytest.approx(b)
    assert fetch_decode_seconds(L2, 1e6, bw / 2) < fetch_decode_seconds(RAW, 1e6, bw / 2)
    assert break_even_bandwidth(RAW, L2) == 0.0
    assert break_even_bandwidth(CodecCandidate("x", {}, 2.0, 9000.0), RAW) == math.inf
    # more decode threads raise the break-even bandwidth proportionally
    assert break_even_bandwidth(L2, RAW, parallelism=4) == pytest.approx(4 * bw)
    assert choose_codec(ALL, 1e9).break_even["cachegen:2:zstd"] == pytest.approx(bw)


def test_choice_rejects_bad_input() -> None:
    with pytest.raises(InputError):
        choose_codec(ALL, 0)
    with pytest.raises(InputError):
        choose_codec([L2], 1e9, allow_lossy=False)


async def test_pipeline_async_round_trip_and_stats() -> None:
    pipe = CodecPipeline.from_config({"codec": "lz4"}, tier="dram")
    arr = np.arange(600, dtype=np.float16).reshape(2, 2, 10, 3, 5)
    block = await pipe.aencode(arr)
    assert (await pipe.adecode(block)).tobytes() == arr.tobytes()
    s = pipe.stats()
    assert s["codec"] == "lz4" and s["encoded_blocks"] == 1 and s["decoded_blocks"] == 1 and s["ratio"] > 0
    with pytest.raises(DecodeError):
        await pipe.adecode(block[:-1])


async def test_pipeline_auto_records_reasoning() -> None:
    pipe = CodecPipeline.from_config({"codec": "auto", "threads": 2}, tier="nvme", bandwidth=20e6, candidates=ALL)
    assert pipe.codec.name == "cachegen" and pipe.stats()["choice"]["level"] == 3
    kv = np.random.default_rng(0).standard_normal((3, 2, 8, 2, 4)).astype(np.float16)
    out = await pipe.adecode(await pipe.aencode(kv))
    assert out.shape == kv.shape
    with pytest.raises(ConfigError):
        CodecPipeline.from_config({"codec": "auto"}, bandwidth=1e9)
    with pytest.raises(ConfigError):
        CodecPipeline.from_config({"codec": "cachegen", "level": 9})
    assert CodecPipeline.from_config(None).codec.name == "raw"
