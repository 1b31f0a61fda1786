"""The codec protocol and the block metadata shared by every codec.

A codec turns one numpy array into bytes and back. It never sees the block
header: :mod:`tierkv.codecs._format` writes shape, dtype, codec name and
parameters around the payload, so a codec's ``decode`` receives them as a
:class:`BlockMeta`. Codecs are pure CPU code, thread-safe (an instance may be
used from many worker threads at once) and never touch the event loop.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Self

import numpy as np

from ..errors import InputError

__all__ = [
    "DTYPE_NAMES",
    "BlockMeta",
    "Codec",
    "ParamValue",
    "dtype_code",
    "dtype_from_code",
    "meta_for",
    "numpy_dtype",
]

#: JSON-representable parameter values (what a block header can carry).
ParamValue = bool | int | float | str | list[Any] | None

#: Element types a block may carry. The position in this tuple is the code
#: written in the header: append only, never reorder. ``bfloat16`` travels as
#: ``uint16`` arrays (numpy has no bf16); the header keeps the distinction.
DTYPE_NAMES: tuple[str, ...] = (
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "uint8",
    "int8",
    "uint16",
    "int16",
    "uint32",
    "int32",
    "uint64",
    "int64",
)
_NUMPY = {name: np.dtype(np.uint16 if name == "bfloat16" else name) for name in DTYPE_NAMES}


def numpy_dtype(name: str) -> np.dtype[Any]:
    """The numpy dtype that carries elements of ``name`` (``bfloat16`` -> ``uint16``)."""
    try:
        return _NUMPY[name]
    except KeyError:
        raise InputError(f"unsupported dtype {name!r}; supported: {', '.join(DTYPE_NAMES)}") from None


def dtype_code(name: str) -> int:
    """Header code of a dtype name; raises InputError for an unsupported one."""
    numpy_dtype(name)
    return DTYPE_NAMES.index(name)


def dtype_from_code(code: int) -> str:
    """Dtype name of a header code; raises ``IndexError`` for an unknown code (callers translate)."""
    if not 0 <= code < len(DTYPE_NAMES):
        raise IndexError(code)
    return DTYPE_NAMES[code]


@dataclass(frozen=True, slots=True)
class BlockMeta:
    """Shape and element type of the array inside a block.

    ``dtype`` is a name from :data:`DTYPE_NAMES`; ``bfloat16`` arrays are
    handled as ``uint16`` bit patterns.
    """

    shape: tuple[int, ...]
    dtype: str

    @property
    def numpy_dtype(self) -> np.dtype[Any]:
        return numpy_dtype(self.dtype)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.numpy_dtype.itemsize


def meta_for(array: np.ndarray[Any, Any], dtype: str | None = None) -> BlockMeta:
    """Describe ``array``; ``dtype="bfloat16"`` marks a ``uint16`` array as bf16 bit patterns.

    Raises :class:`~tierkv.InputError` if the array's dtype is unsupported or
    does not match ``dtype``.
    """
    if not isinstance(array, np.ndarray):
        raise InputError(f"expected a numpy array, got {type(array).__name__}")
    if dtype is None:
        name = array.dtype.name
        if name not in _NUMPY or name == "bfloat16":
            raise InputError(f"unsupported array dtype {array.dtype}; supported: {', '.join(DTYPE_NAMES)}")
    else:
        name = dtype
        if numpy_dtype(name) != array.dtype:
            raise InputError(f"dtype {name!r} needs a {numpy_dtype(name)} array, got {array.dtype}")
    return BlockMeta(shape=tuple(int(s) for s in array.shape), dtype=name)


class Codec(ABC):
    """A block codec: ``encode(array, meta=...) -> bytes`` and ``decode(payload, meta=...) -> array``.

    Contract:

    * ``name`` is the registry name (entry point in group ``tierkv.codecs``).
    * ``params`` is a JSON-representable mapping that fully describes the codec
      instance: ``type(codec).from_params(codec.params)`` yields a codec that
      decodes what this one encodes. The block header stores it.
    * ``encode`` raises :class:`~tierkv.CodecError` when the input cannot be
      encoded (unsupported dtype or layout for this codec, non-finite values
      for a lossy codec); it never returns a payload it could not decode.
    * ``decode`` raises :class:`~tierkv.DecodeError` for a payload it cannot
      decode, and returns an array of exactly ``meta.shape`` / ``meta.dtype``.
    * Thread safety: instances are immutable after construction and may be used
      from many threads concurrently. Both methods block (CPU-bound); async
      callers go through :mod:`tierkv.codecs._pipeline`.
    * ``encode_mbps`` / ``decode_mbps`` are throughput estimates in MB/s of
      input array bytes (fp16 for KV) on one core, used by the per-tier
      choice; they may be replaced by measured numbers.
    """

    name: ClassVar[str] = ""
    lossy: ClassVar[bool] = False
    encode_mbps: float = 500.0
    decode_mbps: float = 1000.0

    @property
    @abstractmethod
    def params(self) -> Mapping[str, ParamValue]:
        """Everything needed to rebuild an equivalent codec (JSON-representable)."""

    @classmethod
    @abstractmethod
    def from_params(cls, params: Mapping[str, Any]) -> Self:
        """Build a codec from ``params``; raises :class:`~tierkv.ConfigError` naming a bad field."""

    @abstractmethod
    def encode(self, array: np.ndarray[Any, Any], *, meta: BlockMeta) -> bytes:
        """Encode ``array`` (described by ``meta``) into a payload."""

    @abstractmethod
    def decode(self, payload: bytes | memoryview, *, meta: BlockMeta) -> np.ndarray[Any, Any]:
        """Decode a payload written by :meth:`encode` with equal ``params``."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dict(self.params)!r})"

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and dict(self.params) == dict(other.params)

    def __hash__(self) -> int:
        return hash((type(self), repr(sorted(self.params.items()))))
