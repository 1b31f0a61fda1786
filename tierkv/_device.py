"""Accelerator tensors (torch CUDA) as KV sources and destinations.

Owns: telling an accelerator tensor from host memory (:func:`is_device_tensor`), checking
one against the model's KV layout (:func:`check_device_kv`), and the copies between such a
tensor and host bytes or another device tensor (:func:`to_host`, :func:`copy`,
:func:`host_view`, :func:`contiguous_bytes`). torch is imported only when a caller passes
a torch tensor; ``import tierkv`` never imports it.

Where a block of a device tensor goes (the core's writer, reader and the tiers decide, see
``docs/architecture.md``):

* a tier with :class:`~tierkv.backend.SupportsDeviceIO` (HBM; NVMe through kvikio/GDS)
  takes it on the device (``write_device`` / ``read_device``): the block never crosses to
  the host;
* a memory tier with :class:`~tierkv.backend.SupportsArrayIO` (DRAM, CXL) copies between
  the device and its arena in one copy each way; the DRAM arena is page-locked (pinned)
  when a CUDA device is present, so the copy runs at DMA speed on tierkv's side stream;
* any other tier (pfs, rdma, a codec) gets host bytes: the block is copied to host memory
  first (the staging copy), in a worker thread.

Contract for callers: a device tensor must hold its final values when it is passed to
tierkv (the work that produced it has completed or was queued on the device's current
stream of the thread that calls, which tierkv's side stream waits for); a destination is
complete when the call returns. Copies block, so the core runs them in worker threads,
never on the event loop.

``ACCELERATORS`` names the torch device types taken as accelerators; the tests add
``"cpu"`` to run these very code paths with CPU tensors (the CUDA-only parts, side
streams and pinned memory, are skipped on a CPU device and run in
``benchmarks/gpu_check.py`` on a GPU machine).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from ._model import ModelSpec
from .errors import KVLayoutError

__all__ = [
    "ACCELERATORS",
    "check_device_kv",
    "contiguous_bytes",
    "copy",
    "host_view",
    "is_device_tensor",
    "to_host",
]

#: torch device types whose tensors take the device path (``"cuda"`` covers ROCm too).
ACCELERATORS: set[str] = {"cuda"}

_streams: dict[Any, Any] = {}
_streams_lock = threading.Lock()


def is_device_tensor(x: object) -> bool:
    """Whether ``x`` is a torch tensor on an accelerator (see :data:`ACCELERATORS`)."""
    if not type(x).__module__.startswith("torch"):
        return False
    dev = getattr(x, "device", None)
    return dev is not None and getattr(dev, "type", None) in ACCELERATORS


def check_device_kv(t: Any, spec: ModelSpec, kv_dtype: str, tokens: int | None, *, what: str = "") -> Any:
    """``t`` (an accelerator tensor) checked against the KV layout: the configured dtype and,
    with ``tokens``, the shape for that many tokens (``None``: the dtype only; the caller
    checks the shape). Returns ``t``. KVLayoutError otherwise."""
    pre = f"{what} " if what else ""
    name = str(t.dtype).removeprefix("torch.")
    if name != kv_dtype:  # torch names the KV dtypes as tierkv's config does
        raise KVLayoutError(f"{pre}dtype".strip(), kv_dtype, name)
    if tokens is not None:
        expected = spec.kv_shape(tokens)
        if tuple(t.shape) != tuple(expected):
            raise KVLayoutError(f"{pre}shape".strip(), f"{tuple(expected)} for {tokens} tokens", tuple(t.shape))
    return t


def _side_stream(device: Any) -> Any:
    """tierkv's copy stream on a CUDA ``device`` (one per device, made once); None elsewhere."""
    if device.type != "cuda":
        return None
    import torch

    with _streams_lock:
        s = _streams.get(device)
        if s is None:
            s = _streams[device] = torch.cuda.Stream(device=device)  # type: ignore[no-untyped-call]
        return s


def copy(dst: Any, src: Any) -> None:
    """``dst.copy_(src)`` for torch tensors of one shape, at least one on an accelerator, and
    complete on return: on CUDA on tierkv's side stream, after the work queued on the
    device's current stream (blocking: call it from a worker thread)."""
    dev = dst.device if dst.device.type != "cpu" else src.device
    stream = _side_stream(dev)
    if stream is None:
        dst.copy_(src)
        return
    import torch

    stream.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(stream):
        dst.copy_(src, non_blocking=True)
    stream.synchronize()


def host_view(buf: np.ndarray[Any, Any], like: Any) -> Any:
    """Host bytes ``buf`` (1-D uint8, exactly ``like``'s bytes) as a torch CPU tensor of
    ``like``'s dtype and shape, sharing ``buf``'s memory (a read-only ``buf`` is only ever
    copied from)."""
    import warnings

    import torch

    with warnings.catch_warnings():  # torch warns about read-only numpy memory it will not write
        warnings.simplefilter("ignore", UserWarning)
        flat = torch.from_numpy(buf)
    return flat.view(like.dtype).reshape(like.shape)


def to_host(t: Any) -> memoryview:
    """The bytes of ``t`` (any strides) in C order, copied to host memory (blocking: call it
    from a worker thread)."""
    import torch

    host = torch.empty(tuple(t.shape), dtype=t.dtype, device="cpu", pin_memory=t.device.type == "cuda")
    copy(host, t)
    flat = host.reshape(-1).view(torch.uint8)
    arr: np.ndarray[Any, Any] = flat.numpy()
    return arr.data


def contiguous_bytes(t: Any) -> Any:
    """``t``'s bytes in C order as a contiguous 1-D uint8 tensor on its device, complete on
    return: ``t`` itself (viewed) when it is contiguous, else a device-side gather into a
    new tensor by :func:`copy` (blocking: call it from a worker thread)."""
    import torch

    if not t.is_contiguous():
        out = torch.empty(tuple(t.shape), dtype=t.dtype, device=t.device)
        copy(out, t)
        t = out
    return t.reshape(-1).view(torch.uint8)
