"""CacheGen-style codec: symbol round trips, levels, static models, error bounds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tierkv import CodecError, ConfigError, DecodeError
from tierkv.codecs import (
    LEVELS,
    ROWMAX_LEVELS,
    CacheGenCodec,
    StaticModel,
    decode_block,
    encode_block,
    int8_codec,
    register_static_model,
)
from tierkv.codecs._base import meta_for
from tierkv.codecs._cachegen import dequantize, quantize


def _kv(
    rng: np.random.Generator, layers: int = 4, tokens: int = 12, heads: int = 2, dim: int = 8
) -> np.ndarray[Any, Any]:
    x = rng.standard_normal((layers, 2, tokens, heads, dim)).astype(np.float32)
    x[:, 0, :, 0, 0] *= 20  # an outlier key channel, as in real models
    return x.astype(np.float16)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    entropy=st.sampled_from(["ans", "zstd", "raw"]),
    level=st.sampled_from(sorted(ROWMAX_LEVELS)),
    anchor=st.sampled_from([0, 3, 10]),
    tokens=st.integers(1, 23),
)
def test_symbols_round_trip_bit_exact(seed: int, entropy: str, level: int, anchor: int, tokens: int) -> None:
    """Decoding equals dequantizing the encoder's own symbols, bit for bit, in every entropy mode."""
    rng = np.random.default_rng(seed)
    kv = _kv(rng, tokens=tokens)
    kv[1, 1, 0] = 0  # a zero row is clamped
    codec = CacheGenCodec(level=level, scheme="rowmax", entropy=entropy, anchor=anchor)
    sym, step, scales, m = codec.quantize_array(kv, "float16")
    assert sym.max() <= 2 * m.max()
    out = codec.decode(codec.encode(kv, meta=meta_for(kv)), meta=meta_for(kv))
    expected = dequantize(sym, step, m, anchor)
    if scales:
        cs = np.frombuffer(scales, np.float16).reshape(kv.shape[0], -1, kv.shape[3] * kv.shape[4]).astype(np.float32)
        expected[:, : cs.shape[1]] *= cs[:, :, None, :]
    assert out.tobytes() == expected.reshape(kv.shape).astype(np.float16).tobytes()
    assert not out[1, 1, 0].any()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_dtypes_and_error_bound(dtype: str) -> None:
    rng = np.random.default_rng(0)
    kv32 = _kv(rng).astype(np.float32)
    arr = (kv32.view(np.uint32) >> 16).astype(np.uint16) if dtype == "bfloat16" else kv32.astype(dtype)
    block = encode_block(arr, CacheGenCodec(level=3, scheme="rowmax"), dtype=dtype if dtype == "bfloat16" else None)
    out = decode_block(block)
    assert out.dtype == arr.dtype
    back = (out.astype(np.uint32) << 16).view(np.float32) if dtype == "bfloat16" else out.astype(np.float32)
    # per row: |error| <= step/2 (+ float16 rounding), step = absmax / M, M >= 7
    absmax = np.abs(kv32).max(axis=(3, 4), keepdims=True)
    assert (np.abs(back - kv32) <= absmax / 7 / 2 * 1.05 + 1e-2).all()


def test_levels_trade_size_for_error() -> None:
    rng = np.random.default_rng(3)
    kv = _kv(rng, layers=6, tokens=64, heads=2, dim=16)
    sizes, errors = [], []
    for level in sorted(LEVELS):
        block = encode_block(kv, CacheGenCodec(level=level))
        sizes.append(len(block))
        errors.append(float(np.abs(decode_block(block).astype(np.float32) - kv).mean()))
    assert sizes == sorted(sizes, reverse=True)
    assert errors == sorted(errors)
    assert len(encode_block(kv, int8_codec())) > sizes[0]


def test_static_model_round_trip_and_persistence(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    base = CacheGenCodec(level=2, scheme="rowmax")
    model = StaticModel.calibrate([_kv(rng, tokens=32) for _ in range(3)], base)
    assert model.counts.min() >= 1
    model.save(tmp_path / "m.npz")
    loaded = StaticModel.load(tmp_path / "m.npz")
    assert loaded.id == model.id
    codec = CacheGenCodec(level=2, scheme="rowmax", table=register_static_model(loaded))
    kv = _kv(rng, tokens=16)
    block = encode_block(kv, codec)
    assert decode_block(block).tobytes() == decode_block(encode_block(kv, base)).tobytes()
    with pytest.raises(CodecError):
        encode_block(_kv(rng, layers=3), codec)  # model was calibrated for 4 layers
    with pytest.raises(ConfigError):
        CacheGenCodec(level=3, scheme="rowmax", table=model.id)  # other quantizer
    with pytest.raises(ConfigError):
        CacheGenCodec(table="sm-unknown")


def test_unregistered_static_model_cannot_decode() -> None:
    rng = np.random.default_rng(6)
    model = StaticModel.calibrate([_kv(rng)], CacheGenCodec(level=3, scheme="rowmax"))
    codec = CacheGenCodec(level=3, scheme="rowmax", table=register_static_model(model))
    block = encode_block(_kv(rng), codec)
    from tierkv.codecs import _registry, _rowmax

    _rowmax._STATIC.pop(model.id)
    _registry._cached.cache_clear()
    with pytest.raises(DecodeError, match="register"):
        decode_block(block)


def test_non_finite_and_bad_params() -> None:
    kv = _kv(np.random.default_rng(0))
    kv[0, 0, 0, 0, 0] = np.inf
    with pytest.raises(CodecError):
        encode_block(kv, CacheGenCodec())
    for bad in (
        {"level": 7},
        {"key_bins": [1, 2]},
        {"entropy": "huffman"},
        {"anchor": -1},
        {"table": "x", "entropy": "zstd"},
        {"scheme": "rowmax", "level": 5},
        {"scheme": "v9"},
        {"step_scale": 0},
        {"step_scale": True},
        {"deadzone": 0.7},
        {"profile": "no-such-profile"},
        {"profile": ""},
        {"sinks": 1},
        {"zstd_level": -1},
        {"scheme": "profile", "anchor": 3},
        {"entropy": "ans", "step_scale": 1e-4},
    ):
        with pytest.raises(ConfigError):
            CacheGenCodec.from_params(bad)


def test_quantize_anchor_reconstructs_from_anchor() -> None:
    rng = np.random.default_rng(9)
    x = np.cumsum(rng.standard_normal((2, 2, 20, 8)).astype(np.float32) * 0.01, axis=2) + 5
    m = np.full((2, 2), 7)
    plain = dequantize(*quantize(x, m, 0), m, 0)
    delta = dequantize(*quantize(x, m, 10), m, 10)
    assert np.abs(delta - x).mean() < np.abs(plain - x).mean()
