"""Float conversions shared by the cachegen schemes (:mod:`._cachegen`, :mod:`._profile`).

bfloat16 travels as ``uint16`` arrays (its bit pattern), so the conversions work on bits. Owns only these two
pure functions; imports nothing from tierkv (both schemes import it, it imports neither: no cycle).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["from_f32", "to_f32"]


def to_f32(array: np.ndarray[Any, Any], dtype: str) -> np.ndarray[Any, Any]:
    """``array`` of KV ``dtype`` (``float16``, ``bfloat16`` bits as uint16, ``float32``) as float32."""
    if dtype == "bfloat16":
        return (array.astype(np.uint32) << 16).view(np.float32)
    return array.astype(np.float32, copy=False)


def from_f32(x: np.ndarray[Any, Any], dtype: str) -> np.ndarray[Any, Any]:
    """float32 ``x`` as KV ``dtype`` (bfloat16: bits as uint16, rounded to nearest even)."""
    if dtype == "bfloat16":
        bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
        rounded = bits + (np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1)))  # round to nearest even
        return (rounded >> 16).astype(np.uint16)
    return np.ascontiguousarray(x, dtype=np.dtype(dtype))
