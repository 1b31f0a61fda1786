"""The self-describing block format (version 1).

Layout (all integers little-endian)::

    offset  size  field
    0       4     magic b"TKVB"
    4       1     format version (1)
    5       1     dtype code (index in DTYPE_NAMES)
    6       1     ndim
    7       1     codec name length N (1..255, ASCII [a-z0-9_.-])
    8       2     params length P (compact JSON with sorted keys, UTF-8)
    10      8     payload length
    18      N     codec name
    18+N    P     codec params (JSON object)
    ..      8*nd  shape (uint64 each)
    ..      4     CRC-32 (zlib) of every header byte before it, then of the payload
    ..      ...   payload

A reader rejects (with :class:`~tierkv.DecodeError`) a wrong magic, an
unknown version, a length that does not add up (truncation or trailing bytes),
a checksum mismatch, an unknown codec or dtype, and a codec result whose shape
or dtype differs from the header. CRC-32 detects every single-byte change and
every burst of up to 32 bits, so a flipped byte can never decode as garbage.
"""

from __future__ import annotations

import json
import re
import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import CodecError, DecodeError, InputError, TierKVError
from ._base import BlockMeta, Codec, ParamValue, dtype_code, dtype_from_code, meta_for

__all__ = [
    "FORMAT_VERSION",
    "MAGIC",
    "BlockHeader",
    "decode_block",
    "encode_block",
    "peek_header",
]

MAGIC = b"TKVB"
FORMAT_VERSION = 1
_PREFIX = struct.Struct("<4sBBBBHQ")
_CRC = struct.Struct("<I")
_NAME_RE = re.compile(r"^[a-z0-9_.-]{1,255}$")


@dataclass(frozen=True, slots=True)
class BlockHeader:
    """What a block says about itself (see the module docstring for the layout)."""

    version: int
    codec: str
    params: Mapping[str, ParamValue]
    shape: tuple[int, ...]
    dtype: str
    header_len: int
    payload_len: int
    checksum: int

    @property
    def meta(self) -> BlockMeta:
        return BlockMeta(shape=self.shape, dtype=self.dtype)

    @property
    def total_len(self) -> int:
        return self.header_len + self.payload_len


def _header_bytes(codec: Codec, meta: BlockMeta, payload_len: int) -> bytes:
    name = codec.name
    if not _NAME_RE.match(name):
        raise CodecError(f"codec name {name!r} is not 1..255 characters of [a-z0-9_.-]")
    try:
        params = json.dumps(dict(codec.params), sort_keys=True, separators=(",", ":"), allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise CodecError(f"codec {name!r} params are not JSON-representable: {exc}") from exc
    if len(params) > 0xFFFF:
        raise CodecError(f"codec {name!r} params take {len(params)} bytes; at most 65535 fit a header")
    if len(meta.shape) > 255:
        raise CodecError(f"arrays of {len(meta.shape)} dimensions do not fit a header (at most 255)")
    prefix = _PREFIX.pack(
        MAGIC, FORMAT_VERSION, dtype_code(meta.dtype), len(meta.shape), len(name), len(params), payload_len
    )
    return prefix + name.encode() + params + struct.pack(f"<{len(meta.shape)}Q", *meta.shape)


def encode_block(array: np.ndarray[Any, Any], codec: Codec, *, dtype: str | None = None) -> bytes:
    """Encode ``array`` with ``codec`` into a self-describing block.

    ``dtype="bfloat16"`` marks a ``uint16`` array as bf16 bit patterns.
    Raises :class:`~tierkv.InputError` for an unsupported array and
    :class:`~tierkv.CodecError` when the codec fails. Blocks the calling
    thread (CPU-bound); thread-safe.
    """
    meta = meta_for(array, dtype)
    array = np.ascontiguousarray(array)
    try:
        payload = codec.encode(array, meta=meta)
    except TierKVError:
        raise
    except Exception as exc:
        raise CodecError(f"codec {codec.name!r} failed to encode {meta}: {exc!r}") from exc
    header = _header_bytes(codec, meta, len(payload))
    crc = zlib.crc32(payload, zlib.crc32(header))
    return b"".join((header, _CRC.pack(crc), payload))


def _parse_header(view: memoryview) -> BlockHeader:
    if len(view) < _PREFIX.size:
        raise DecodeError(f"block truncated: {len(view)} bytes, a header needs at least {_PREFIX.size}")
    magic, version, dcode, ndim, name_len, params_len, payload_len = _PREFIX.unpack_from(view, 0)
    if magic != MAGIC:
        raise DecodeError(f"not a tierkv block (magic {bytes(magic)!r})")
    if version != FORMAT_VERSION:
        raise DecodeError(f"unknown block format version {version}; this tierkv reads version {FORMAT_VERSION}")
    header_len = _PREFIX.size + name_len + params_len + 8 * ndim + _CRC.size
    if len(view) < header_len:
        raise DecodeError(f"block truncated inside the header ({len(view)} of {header_len} bytes)")
    pos = _PREFIX.size
    try:
        name = bytes(view[pos : pos + name_len]).decode("ascii")
        pos += name_len
        params = json.loads(bytes(view[pos : pos + params_len]).decode("utf-8"))
        pos += params_len
        shape = struct.unpack_from(f"<{ndim}Q", view, pos)
        pos += 8 * ndim
        (crc,) = _CRC.unpack_from(view, pos)
        dtype = dtype_from_code(dcode)
    except (UnicodeDecodeError, ValueError, IndexError, struct.error) as exc:
        raise DecodeError(f"corrupted block header: {exc}") from exc
    if not _NAME_RE.match(name) or not isinstance(params, dict):
        raise DecodeError("corrupted block header: bad codec name or params")
    return BlockHeader(
        version=version,
        codec=name,
        params=params,
        shape=tuple(int(s) for s in shape),
        dtype=dtype,
        header_len=header_len,
        payload_len=int(payload_len),
        checksum=int(crc),
    )


def peek_header(block: bytes | bytearray | memoryview) -> BlockHeader:
    """Parse the header of ``block`` without checking the checksum or decoding.

    Needs only the header bytes (a prefix of the block is enough). Raises
    :class:`~tierkv.DecodeError` for a bad magic, an unknown version or a
    malformed header.
    """
    return _parse_header(memoryview(block).cast("B"))


def decode_block(
    block: bytes | bytearray | memoryview,
    *,
    codec: Codec | None = None,
) -> np.ndarray[Any, Any]:
    """Verify and decode a block written by :func:`encode_block`.

    The codec is rebuilt from the header's name and params through the codec
    registry (entry-point group ``tierkv.codecs``), unless ``codec`` is given
    (it must have the header's name). Returns a fresh, writable array of the
    header's shape (``bfloat16`` blocks come back as ``uint16``). Raises
    :class:`~tierkv.DecodeError` for anything wrong: truncation, trailing bytes,
    checksum mismatch, unknown version, codec or dtype, a codec failure.
    Blocks the calling thread; thread-safe.
    """
    view = memoryview(block).cast("B")
    header = _parse_header(view)
    if len(view) != header.total_len:
        what = "truncated" if len(view) < header.total_len else "followed by extra bytes"
        raise DecodeError(f"block {what}: {len(view)} bytes, header says {header.total_len}")
    crc = zlib.crc32(view[header.header_len :], zlib.crc32(view[: header.header_len - _CRC.size]))
    if crc != header.checksum:
        raise DecodeError(f"block checksum mismatch (stored {header.checksum:#010x}, computed {crc:#010x})")
    if codec is None:
        from ._registry import codec_from_params

        try:
            codec = codec_from_params(header.codec, header.params)
        except TierKVError as exc:
            raise DecodeError(f"cannot rebuild codec {header.codec!r} of the block: {exc}") from exc
    elif codec.name != header.codec:
        raise DecodeError(f"block was written by codec {header.codec!r}, not {codec.name!r}")
    meta = header.meta
    try:
        out = codec.decode(view[header.header_len :], meta=meta)
    except DecodeError:
        raise
    except (TierKVError, InputError, Exception) as exc:
        raise DecodeError(f"codec {header.codec!r} failed to decode: {exc!r}") from exc
    if tuple(out.shape) != meta.shape or out.dtype != meta.numpy_dtype:
        raise DecodeError(f"codec {header.codec!r} returned {out.shape}/{out.dtype}, header says {meta}")
    return out
