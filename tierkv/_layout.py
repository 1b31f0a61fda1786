"""KV tensor layout: validation against the model spec and conversion to numpy.

Layout accepted by :meth:`tierkv.TierKV.put` (and produced by ``get``):

* MHA / GQA / MQA: ``(kv_layers, 2, tokens, kv_heads, head_dim)`` — index 0 of
  the second axis is K, 1 is V.
* MLA: ``(kv_layers, tokens, kv_lora_rank + qk_rope_head_dim)``.

``kv_layers`` counts only layers that hold a KV cache (linear-attention and
Mamba layers of a hybrid model have none). Tensors are numpy arrays or CPU
torch tensors, of any strides (views of a larger cache included), of the
configured ``kv_dtype`` in native byte order; ``bfloat16`` and ``float8`` numpy data come as ``uint16``/``uint8`` bit
patterns (numpy has no such dtypes). A byte-swapped array (``>f2`` on a
little-endian machine) is rejected, never reinterpreted: convert it with
``arr.astype(arr.dtype.newbyteorder("="))``. A torch tensor on the ``meta``
device (shape only, no data) is rejected too. Pure functions: no I/O.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._model import ModelSpec
from .errors import KVLayoutError

__all__ = ["STORAGE_DTYPES", "as_numpy_kv", "as_storage_array", "block_slice", "from_torch", "token_axis"]

#: numpy dtype that holds each KV dtype's bits.
STORAGE_DTYPES: dict[str, np.dtype[Any]] = {
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(np.uint16),
    "float32": np.dtype(np.float32),
    "float8_e4m3fn": np.dtype(np.uint8),
    "float8_e5m2": np.dtype(np.uint8),
}


def token_axis(spec: ModelSpec) -> int:
    return 1 if spec.attention == "mla" else 2


def block_slice(spec: ModelSpec, start: int, stop: int) -> tuple[slice, ...]:
    """Index selecting tokens ``[start, stop)`` of a KV array."""
    return (slice(None),) * token_axis(spec) + (slice(start, stop),)


def from_torch(t: Any, kv_dtype: str) -> np.ndarray[Any, Any]:
    dev = getattr(t, "device", None)
    if dev is not None and dev.type == "meta":
        raise KVLayoutError("device", "a tensor with data on the cpu", "a 'meta' tensor (shape only, no data)")
    if dev is not None and dev.type != "cpu":
        raise KVLayoutError(
            "device", "cpu (put and get(out=) take CUDA tensors; paged caches and the rest: .cpu())", str(dev)
        )
    name = str(t.dtype).removeprefix("torch.")
    if name != kv_dtype:
        raise KVLayoutError("dtype", kv_dtype, name)
    import torch

    if kv_dtype == "bfloat16":
        t = t.view(torch.uint16) if hasattr(torch, "uint16") else t.view(torch.int16)
    elif kv_dtype.startswith("float8"):
        t = t.view(torch.uint8)
    arr: np.ndarray[Any, Any] = t.detach().numpy()
    return arr.view(STORAGE_DTYPES[kv_dtype])


def as_storage_array(data: object, kv_dtype: str, what: str = "") -> np.ndarray[Any, Any]:
    """``data`` (a numpy array, or a CPU torch tensor) as a numpy view of the configured
    storage dtype, any shape and strides, no copy. ``what`` prefixes the error's field
    (``caches[3]``). Raises KVLayoutError for a wrong type, dtype, byte order or device."""
    pre = f"{what} " if what else ""
    if isinstance(data, np.ndarray):
        arr = data
        want = STORAGE_DTYPES[kv_dtype]
        if arr.dtype != want:
            if not arr.dtype.isnative:
                raise KVLayoutError(
                    f"{pre}byte order",
                    f"native {want} (convert with arr.astype(arr.dtype.newbyteorder('=')))",
                    f"byte-swapped {arr.dtype.str}",
                )
            if getattr(arr.dtype, "name", "") == kv_dtype and arr.dtype.itemsize == want.itemsize:
                arr = arr.view(want)  # e.g. ml_dtypes.bfloat16
            else:
                raise KVLayoutError(f"{pre}dtype", f"{want} (for kv_dtype {kv_dtype})", str(arr.dtype))
        return arr
    if type(data).__module__.startswith("torch"):
        return from_torch(data, kv_dtype)
    raise KVLayoutError(f"{pre}type", "a numpy array or a torch tensor", type(data).__name__)


def as_numpy_kv(kv_data: object, spec: ModelSpec, kv_dtype: str, tokens: int) -> np.ndarray[Any, Any]:
    """Check ``kv_data`` against the spec for ``tokens`` tokens; return a numpy view (no copy).

    Any strides are accepted (a slice of a larger cache, a transposed or Fortran-ordered
    array, a non-contiguous CPU tensor): each block is gathered from (or scattered into)
    the caller's memory as it is copied, never through a whole-array intermediate.

    Raises:
        KVLayoutError: wrong type, shape, dtype, byte order or device (including
            ``meta``); the message states expected vs got.
    """
    arr = as_storage_array(kv_data, kv_dtype)
    expected = spec.kv_shape(tokens)
    if tuple(arr.shape) != tuple(expected):
        raise KVLayoutError("shape", f"{tuple(expected)} for {tokens} tokens", tuple(arr.shape))
    return arr
