"""Lossless codecs: ``raw``, ``lz4`` and ``zstd``, both with an optional byte-plane shuffle.

Floating-point KV compresses poorly byte by byte: the exponent bytes are
repetitive, the low mantissa bytes are noise, and interleaved they defeat LZ
matching (plain lz4 on fp16 KV gives a ratio of about 1.0). The shuffle stores
all first bytes of the elements, then all second bytes, and so on ("byte
planes"), which lets lz4/zstd find the redundancy in the exponent planes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self

import numpy as np

from .._options import opt_bool, opt_int, reject_unknown
from ..errors import CodecError, DecodeError
from ._base import BlockMeta, Codec, ParamValue

__all__ = ["Lz4Codec", "RawCodec", "ZstdCodec", "shuffle_bytes", "unshuffle_bytes"]


def shuffle_bytes(array: np.ndarray[Any, Any]) -> bytes:
    """Byte planes of a contiguous array: all bytes 0 of the elements, then all bytes 1, ..."""
    size = array.dtype.itemsize
    flat = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    if size == 1:
        return flat.tobytes()
    return flat.reshape(-1, size).T.tobytes()


def unshuffle_bytes(data: bytes | memoryview, meta: BlockMeta) -> np.ndarray[Any, Any]:
    """Inverse of :func:`shuffle_bytes`; ``data`` must hold exactly ``meta.nbytes`` bytes."""
    dt = meta.numpy_dtype
    planes = np.frombuffer(data, dtype=np.uint8)
    if dt.itemsize == 1:
        return planes.copy().view(dt).reshape(meta.shape)
    return planes.reshape(dt.itemsize, -1).T.copy().view(dt).reshape(meta.shape)


def _plain(array: np.ndarray[Any, Any]) -> bytes:
    return np.ascontiguousarray(array).tobytes()


def _from_plain(data: bytes | memoryview, meta: BlockMeta) -> np.ndarray[Any, Any]:
    return np.frombuffer(data, dtype=meta.numpy_dtype).reshape(meta.shape).copy()


def _check_len(got: int, meta: BlockMeta, name: str) -> None:
    if got != meta.nbytes:
        raise DecodeError(f"{name}: payload decodes to {got} bytes, expected {meta.nbytes}")


class RawCodec(Codec):
    """No compression: the payload is the array's bytes (C order)."""

    name = "raw"
    encode_mbps = 4000.0
    decode_mbps = 4000.0

    @property
    def params(self) -> Mapping[str, ParamValue]:
        return {}

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> Self:
        reject_unknown(params, set(), prefix="codec")
        return cls()

    def encode(self, array: np.ndarray[Any, Any], *, meta: BlockMeta) -> bytes:
        return _plain(array)

    def decode(self, payload: bytes | memoryview, *, meta: BlockMeta) -> np.ndarray[Any, Any]:
        _check_len(len(payload), meta, self.name)
        return _from_plain(payload, meta)


class Lz4Codec(Codec):
    """lz4 block compression, after a byte-plane shuffle unless ``shuffle=False``.

    Params: ``shuffle`` (bool, default true), ``acceleration`` (int >= 1,
    default 1; larger is faster and compresses less).
    """

    name = "lz4"
    encode_mbps = 400.0
    decode_mbps = 1500.0

    def __init__(self, *, shuffle: bool = True, acceleration: int = 1) -> None:
        import lz4.block  # noqa: F401  (fail early when the extra is missing)

        self.shuffle = shuffle
        self.acceleration = acceleration

    @property
    def params(self) -> Mapping[str, ParamValue]:
        return {"shuffle": self.shuffle, "acceleration": self.acceleration}

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> Self:
        reject_unknown(params, {"shuffle", "acceleration"}, prefix="codec")
        return cls(
            shuffle=opt_bool(params, "shuffle", True, prefix="codec"),
            acceleration=opt_int(params, "acceleration", 1, prefix="codec", minimum=1, maximum=65537),
        )

    def encode(self, array: np.ndarray[Any, Any], *, meta: BlockMeta) -> bytes:
        import lz4.block

        data = shuffle_bytes(array) if self.shuffle else _plain(array)
        out: bytes = lz4.block.compress(data, mode="fast", acceleration=self.acceleration, store_size=False)
        return out

    def decode(self, payload: bytes | memoryview, *, meta: BlockMeta) -> np.ndarray[Any, Any]:
        import lz4.block

        if meta.nbytes == 0:
            return np.zeros(meta.shape, meta.numpy_dtype)
        try:
            data = lz4.block.decompress(payload, uncompressed_size=meta.nbytes)
        except Exception as exc:  # lz4.block.LZ4BlockError
            raise DecodeError(f"lz4: corrupted payload ({exc})") from exc
        _check_len(len(data), meta, self.name)
        return unshuffle_bytes(data, meta) if self.shuffle else _from_plain(data, meta)


class ZstdCodec(Codec):
    """zstd compression, after a byte-plane shuffle unless ``shuffle=False``.

    Params: ``shuffle`` (bool, default true), ``level`` (int in [-7, 22],
    default 3).
    """

    name = "zstd"
    encode_mbps = 150.0
    decode_mbps = 800.0

    def __init__(self, *, shuffle: bool = True, level: int = 3) -> None:
        import zstandard  # noqa: F401

        self.shuffle = shuffle
        self.level = level

    @property
    def params(self) -> Mapping[str, ParamValue]:
        return {"shuffle": self.shuffle, "level": self.level}

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> Self:
        reject_unknown(params, {"shuffle", "level"}, prefix="codec")
        return cls(
            shuffle=opt_bool(params, "shuffle", True, prefix="codec"),
            level=opt_int(params, "level", 3, prefix="codec", minimum=-7, maximum=22),
        )

    def encode(self, array: np.ndarray[Any, Any], *, meta: BlockMeta) -> bytes:
        import zstandard

        data = shuffle_bytes(array) if self.shuffle else _plain(array)
        try:
            return zstandard.ZstdCompressor(level=self.level).compress(data)
        except zstandard.ZstdError as exc:
            raise CodecError(f"zstd: {exc}") from exc

    def decode(self, payload: bytes | memoryview, *, meta: BlockMeta) -> np.ndarray[Any, Any]:
        import zstandard

        try:
            data = zstandard.ZstdDecompressor().decompress(payload, max_output_size=meta.nbytes)
        except zstandard.ZstdError as exc:
            raise DecodeError(f"zstd: corrupted payload ({exc})") from exc
        _check_len(len(data), meta, self.name)
        return unshuffle_bytes(data, meta) if self.shuffle else _from_plain(data, meta)
