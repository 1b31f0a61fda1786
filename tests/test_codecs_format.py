"""Block format: round trips of every codec, header, corruption and truncation handling."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tierkv import CodecError, ConfigError, DecodeError, InputError, PluginNotFoundError
from tierkv.codecs import (
    FORMAT_VERSION,
    CacheGenCodec,
    Lz4Codec,
    RawCodec,
    ZstdCodec,
    codec_from_params,
    decode_block,
    encode_block,
    list_codecs,
    load_codec_class,
    peek_header,
)
from tierkv.codecs._format import MAGIC

LOSSLESS = [RawCodec(), Lz4Codec(), Lz4Codec(shuffle=False), ZstdCodec(), ZstdCodec(shuffle=False, level=1)]
DTYPES = [np.float16, np.float32, np.uint16, np.uint8, np.int32]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.data(),
    codec=st.sampled_from(LOSSLESS),
    dtype=st.sampled_from(DTYPES),
    shape=hnp.array_shapes(min_dims=1, max_dims=5, min_side=0, max_side=7),
)
def test_lossless_round_trip_is_bit_exact(data: Any, codec: Any, dtype: Any, shape: tuple[int, ...]) -> None:
    arr = data.draw(hnp.arrays(dtype, shape, elements=hnp.from_dtype(np.dtype(dtype), allow_nan=False)))
    block = encode_block(arr, codec)
    out = decode_block(block)
    assert out.dtype == arr.dtype and out.shape == arr.shape
    assert out.tobytes() == arr.tobytes()
    assert out.flags.writeable


def test_bfloat16_is_kept_in_the_header() -> None:
    arr = np.arange(12, dtype=np.uint16).reshape(3, 4)
    block = encode_block(arr, Lz4Codec(), dtype="bfloat16")
    h = peek_header(block)
    assert h.dtype == "bfloat16" and h.shape == (3, 4) and h.codec == "lz4" and h.version == FORMAT_VERSION
    assert decode_block(block).tobytes() == arr.tobytes()
    with pytest.raises(InputError):
        encode_block(arr.astype(np.float16), RawCodec(), dtype="bfloat16")


def _sample_block() -> bytes:
    rng = np.random.default_rng(1)
    return encode_block(rng.standard_normal((2, 2, 5, 1, 4)).astype(np.float16), CacheGenCodec(level=2))


@settings(max_examples=200, deadline=None)
@given(
    pos=st.integers(min_value=0),
    xor=st.integers(min_value=1, max_value=255),
    which=st.sampled_from(["raw", "lz4", "cachegen"]),
)
def test_any_flipped_byte_raises_decode_error(pos: int, xor: int, which: str) -> None:
    arr = np.linspace(-3, 3, 60, dtype=np.float32).astype(np.float16).reshape(2, 2, 5, 1, 3)
    block = bytearray(encode_block(arr, {"raw": RawCodec(), "lz4": Lz4Codec(), "cachegen": CacheGenCodec()}[which]))
    block[pos % len(block)] ^= xor
    with pytest.raises(DecodeError):
        decode_block(bytes(block))


@settings(max_examples=100, deadline=None)
@given(cut=st.integers(min_value=0))
def test_truncated_or_extended_block_raises_decode_error(cut: int) -> None:
    block = _sample_block()
    with pytest.raises(DecodeError):
        decode_block(block[: cut % len(block)])
    with pytest.raises(DecodeError):
        decode_block(block + b"\0")


def test_unknown_version_and_magic() -> None:
    block = bytearray(_sample_block())
    bad = bytearray(block)
    bad[4] = FORMAT_VERSION + 1
    with pytest.raises(DecodeError, match="version"):
        decode_block(bytes(bad))
    with pytest.raises(DecodeError, match="version"):
        peek_header(bytes(bad))
    bad = bytearray(block)
    bad[:4] = b"NOPE"
    with pytest.raises(DecodeError, match="magic"):
        decode_block(bytes(bad))
    assert bytes(block[:4]) == MAGIC


def test_unknown_codec_in_a_valid_block_raises_decode_error() -> None:
    class Fake(RawCodec):
        name = "no-such-codec"

    block = encode_block(np.zeros(3, np.float16), Fake())
    with pytest.raises(DecodeError, match="no-such-codec"):
        decode_block(block)
    assert decode_block(block, codec=Fake()).tolist() == [0, 0, 0]
    with pytest.raises(DecodeError):
        decode_block(block, codec=RawCodec())


def test_peek_header_needs_only_the_header() -> None:
    block = _sample_block()
    h = peek_header(block)
    assert h.total_len == len(block)
    assert peek_header(block[: h.header_len]) == h
    with pytest.raises(DecodeError):
        peek_header(block[: h.header_len - 1])
    assert struct.unpack_from("<Q", block, 10)[0] == h.payload_len


def test_registry_knows_builtins_and_rejects_unknown() -> None:
    assert {"raw", "lz4", "zstd", "cachegen"} <= set(list_codecs())
    assert load_codec_class("cachegen") is CacheGenCodec
    assert codec_from_params("lz4", {"shuffle": False}) == Lz4Codec(shuffle=False)
    with pytest.raises(PluginNotFoundError):
        load_codec_class("nope")
    with pytest.raises(ConfigError):
        codec_from_params("zstd", {"level": 99})
    with pytest.raises(ConfigError):
        codec_from_params("raw", {"x": 1})


def test_params_rebuild_an_equal_codec() -> None:
    for codec in [*LOSSLESS, CacheGenCodec(level=1), CacheGenCodec(level=3, entropy="zstd", anchor=10)]:
        assert type(codec).from_params(codec.params) == codec


def test_encode_errors_are_codec_errors() -> None:
    with pytest.raises(CodecError):
        encode_block(np.zeros((2, 3), np.float16), CacheGenCodec())
    with pytest.raises(InputError):
        encode_block([1, 2], RawCodec())  # type: ignore[arg-type]
