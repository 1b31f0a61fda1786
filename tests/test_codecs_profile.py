"""The cachegen codec's ``profile`` scheme: bit-exact symbol round trips, sinks, profiles, versions, corruption."""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tierkv import DecodeError, InputError
from tierkv.codecs import (
    LEVELS,
    CacheGenCodec,
    Profile,
    decode_block,
    encode_block,
    find_profile,
    get_profile,
    peek_header,
    register_profile,
)
from tierkv.codecs._base import ParamValue, meta_for
from tierkv.codecs._floats import to_f32
from tierkv.codecs._profile import _sink_values, dequantize_profile, detect_sinks, quantize_profile

#: 8-byte content digest of the built-in SmolLM2-135M profile: blocks name it, so it must never change
#: silently (a recalibration must add a new profile and keep this one registered).
SMOLLM2_DIGEST = "0de55d89291be297"


def _kv(rng: np.random.Generator, layers: int = 4, tokens: int = 16, heads: int = 2, dim: int = 8) -> Any:
    x = rng.standard_normal((layers, 2, tokens, heads, dim)).astype(np.float32)
    x[:, 0, :, 0, 0] *= 20  # an outlier key channel
    return x


def _small_profile(rng: np.random.Generator, layers: int, channels: int, name: str) -> Profile:
    codes = rng.integers(-20, 4, (layers, 2, channels))
    return Profile.create(name, codes, rng.permutation(layers * 2 * channels))


def _expected(codec: CacheGenCodec, kv: Any, dtype: str) -> Any:
    """Dequantize the encoder's own symbols (and sink rows): what decode must return, bit for bit."""
    x = codec._rows(kv, dtype)
    profile = codec.profile_for(x.shape[0], x.shape[3])
    scale = codec.fallback_scale * codec.step_scale / 1e-4
    sym, codes, sinks = quantize_profile(
        x,
        profile.codes if profile is not None else None,
        codec.code_shift,
        fallback_scale=scale,
        sinks=codec.sinks,
        deadzone=codec.deadzone,
    )
    out = dequantize_profile(sym, codes)
    if len(sinks):
        from tierkv.codecs._profile import _sink_rows

        step, s = _sink_rows(np.ascontiguousarray(x[:, :, sinks].transpose(2, 0, 1, 3)))
        out[:, :, sinks] = _sink_values(step, s).transpose(1, 2, 0, 3)
    from tierkv.codecs._floats import from_f32

    return from_f32(out.reshape(kv.shape), dtype)


def _as(kv32: Any, dtype: str) -> Any:
    if dtype == "bfloat16":
        return (kv32.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return kv32.astype(dtype)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    level=st.sampled_from(sorted(LEVELS)),
    dtype=st.sampled_from(["float16", "bfloat16", "float32"]),
    tokens=st.integers(1, 40),
    with_profile=st.booleans(),
    sinks=st.booleans(),
    zstd_level=st.sampled_from([0, 1, 19]),
)
def test_symbols_round_trip_bit_exact(
    seed: int, level: int, dtype: str, tokens: int, with_profile: bool, sinks: bool, zstd_level: int
) -> None:
    """Decoding equals dequantizing the encoder's own symbols, bit for bit (both payload modes, all dtypes)."""
    rng = np.random.default_rng(seed)
    layers, heads, dim = 3, 2, 4
    kv32 = _kv(rng, layers=layers, tokens=tokens, heads=heads, dim=dim)
    kv32[1, 1, 0] = 0  # a zero row
    if tokens >= 8:
        kv32[1:, 0, 0] *= 0.05  # a sink-like first token
    profile = "auto"
    if with_profile:
        p = _small_profile(rng, layers, heads * dim, f"test-{seed}")
        register_profile(p)
        profile = p.name
    codec = CacheGenCodec(level=level, profile=profile if with_profile else "none", sinks=sinks, zstd_level=zstd_level)
    kv = _as(kv32, dtype)
    block = encode_block(kv, codec, dtype=dtype if dtype == "bfloat16" else None)
    out = decode_block(block)
    assert out.dtype == kv.dtype and out.shape == kv.shape
    assert out.tobytes() == _expected(codec, kv, dtype).tobytes()
    assert not to_f32(out, dtype)[1, 1, 0, 1:].any() or tokens == 1  # zero row (but a sink) decodes to ~0


def test_error_bound_and_sinks() -> None:
    rng = np.random.default_rng(0)
    kv = rng.standard_normal((6, 2, 64, 2, 32)).astype(np.float32)  # no outlier channel: row norms concentrate
    kv[1:, 0, 0] *= 0.01  # token 0: tiny keys in every layer after the first -> a sink
    x = kv.reshape(6, 2, 64, -1)
    assert detect_sinks(x).tolist() == [0]
    codec = CacheGenCodec(level=2, profile="none")
    out = decode_block(encode_block(kv.astype(np.float16), codec)).astype(np.float32)
    # sink rows: 8-bit absmax, error <= step/2 (+ float16 rounding)
    sink_err = np.abs(out[:, :, 0] - kv[:, :, 0]).max(axis=(2, 3))
    assert (sink_err <= np.abs(kv[:, :, 0]).max(axis=(2, 3)) / 127 / 2 * 1.05 + 1e-3).all()
    # other rows: |error| <= step/2 per (layer, K/V, channel) with step <= max(fallback step, absmax/127)
    rel = np.linalg.norm(out[:, :, 1:] - kv[:, :, 1:]) / np.linalg.norm(kv[:, :, 1:])
    assert rel < 0.3


def test_levels_trade_size_for_error_with_a_profile() -> None:
    rng = np.random.default_rng(3)
    layers, heads, dim = 4, 2, 16
    register_profile(Profile.create("test-levels", np.full((layers, 2, heads * dim), 100)))
    kv = _kv(rng, layers=layers, tokens=64, heads=heads, dim=dim).astype(np.float16)
    sizes, errors = [], []
    for level in sorted(LEVELS):
        block = encode_block(kv, CacheGenCodec(level=level, profile="test-levels"))
        sizes.append(len(block))
        errors.append(float(np.abs(decode_block(block).astype(np.float32) - kv).mean()))
    assert sizes == sorted(sizes, reverse=True) and errors == sorted(errors)


def test_builtin_profile_is_stable() -> None:
    p = get_profile("smollm2-135m")
    assert p.codes.shape == (30, 2, 192) and sorted(p.order.tolist()) == list(range(30 * 2 * 192))
    assert find_profile(30, 192) is not None
    assert p.digest.hex() == SMOLLM2_DIGEST
    assert Profile.create("x", p.codes, p.order).digest == p.digest  # content-addressed, not by name
    for bad in (np.zeros((3, 3, 4), np.int16), np.zeros((2, 2, 4)), np.full((2, 2, 4), 9999)):
        with pytest.raises(InputError):
            Profile.create("bad", bad)
    with pytest.raises(InputError):
        Profile.create("bad", np.zeros((2, 2, 4), np.int16), np.zeros(16, np.int64))
    with pytest.raises(InputError):
        register_profile(Profile.create("auto", np.zeros((2, 2, 4), np.int16)))


def test_smollm2_shape_uses_the_profile_and_decodes_anywhere() -> None:
    rng = np.random.default_rng(4)
    kv = (rng.standard_normal((30, 2, 16, 3, 64)) * 0.5).astype(np.float16)
    block = encode_block(kv, CacheGenCodec())
    hdr = peek_header(block)
    assert hdr.params["scheme"] == "profile" and hdr.params["profile"] == "auto"
    payload = memoryview(block)[hdr.header_len :]
    assert payload[1] == 1 and bytes(payload[12:20]).hex() == SMOLLM2_DIGEST  # mode 1, names the profile
    out = decode_block(block)
    assert out.tobytes() == _expected(CacheGenCodec(), kv, "float16").tobytes()


def test_unregistered_profile_is_a_decode_error() -> None:
    rng = np.random.default_rng(6)
    p = _small_profile(rng, 2, 8, "test-gone")
    register_profile(p)
    block = encode_block(_kv(rng, layers=2, heads=2, dim=4).astype(np.float16), CacheGenCodec(profile="test-gone"))
    from tierkv.codecs import _profiles

    _profiles._BY_DIGEST.pop(p.digest)
    with pytest.raises(DecodeError, match="profile"):
        decode_block(block)
    _profiles._BY_DIGEST[p.digest] = p
    decode_block(block)


def test_unknown_payload_version_and_scheme_are_decode_errors() -> None:
    kv = _kv(np.random.default_rng(7)).astype(np.float16)
    codec = CacheGenCodec()
    payload = bytearray(codec.encode(kv, meta=meta_for(kv)))
    payload[0] = 3  # a future scheme version
    with pytest.raises(DecodeError, match="version"):
        codec.decode(bytes(payload), meta=meta_for(kv))
    payload[0], payload[1] = 2, 7  # unknown mode
    with pytest.raises(DecodeError, match="mode"):
        codec.decode(bytes(payload), meta=meta_for(kv))

    class Future(CacheGenCodec):
        @property
        def params(self) -> Mapping[str, ParamValue]:
            return dict(super().params, scheme="wavelet")

    with pytest.raises(DecodeError, match="scheme"):
        decode_block(encode_block(kv, Future()))


def test_truncated_or_padded_payload_is_a_decode_error() -> None:
    kv = _kv(np.random.default_rng(8)).astype(np.float16)
    codec = CacheGenCodec()
    payload = codec.encode(kv, meta=meta_for(kv))
    for bad in (payload[:5], payload[:-1], payload + b"\0"):
        with pytest.raises(DecodeError):
            codec.decode(bad, meta=meta_for(kv))
    head = struct.unpack_from("<BBHII", payload)
    assert head[0] == 2


@settings(max_examples=150, deadline=None)
@given(pos=st.integers(min_value=0), xor=st.integers(min_value=1, max_value=255))
def test_any_flipped_byte_raises_decode_error(pos: int, xor: int) -> None:
    kv = _kv(np.random.default_rng(9), layers=3, tokens=12).astype(np.float16)
    kv[1:, 0, 0] *= 0.01  # with a sink row
    block = bytearray(encode_block(kv, CacheGenCodec(level=2)))
    block[pos % len(block)] ^= xor
    with pytest.raises(DecodeError):
        decode_block(bytes(block))


def test_blocks_of_the_rowmax_scheme_without_a_scheme_field_still_decode() -> None:
    """Blocks written before the profile scheme carry rowmax fields and no ``scheme``: they decode as before."""

    class Old(CacheGenCodec):
        @property
        def params(self) -> Mapping[str, ParamValue]:
            p = dict(super().params)
            p.pop("scheme")
            return p

    kv = _kv(np.random.default_rng(10)).astype(np.float16)
    for entropy in ("ans", "zstd"):
        old = Old(level=2, scheme="rowmax", entropy=entropy)
        block = encode_block(kv, old)
        assert "scheme" not in peek_header(block).params
        expected = CacheGenCodec(level=2, scheme="rowmax", entropy=entropy).decode(
            memoryview(block)[peek_header(block).header_len :], meta=meta_for(kv)
        )
        assert decode_block(block).tobytes() == expected.tobytes()


def test_deadzone_zeroes_small_values() -> None:
    x = np.array([0.55, 0.64, 0.66, 1.4, -0.6], np.float32).reshape(1, 1, 5, 1)
    x = np.concatenate([x, x], axis=1)
    sym, _, _ = quantize_profile(x, np.zeros((1, 2, 1), np.int16), 0, sinks=False, deadzone=0.15)
    assert sym[0, 0, :, 0].tolist() == [0, 0, 1, 1, 0]


def test_builtin_profile_is_package_data_shipped_in_the_wheel() -> None:
    """The built-in profile is a data file read with importlib.resources, listed in the package data."""
    import fnmatch
    import tomllib
    from pathlib import Path

    from tierkv.codecs import _profiles

    res = _profiles.builtin_profile_file("smollm2-135m")
    assert res.is_file()
    with res.open("rb") as f, np.load(f, allow_pickle=False) as data:
        assert data["codes"].shape == (30, 2, 192) and data["order"].shape == (30 * 2 * 192,)
        assert Profile.create("copy", data["codes"], data["order"]).digest.hex() == SMOLLM2_DIGEST
    root = Path(__file__).resolve().parents[1]
    globs = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["tierkv"]
    shipped = Path(str(res)).resolve().relative_to(root / "tierkv").as_posix()
    assert any(fnmatch.fnmatch(shipped, g) for g in globs), (shipped, globs)
    with pytest.raises(KeyError):
        _profiles.builtin_profile_file("no-such-model")
