"""Honest, side-effect-free GPU detection shared by the nvme (kvikio) and hbm tiers.

Nothing here imports ``kvikio`` or initialises CUDA unless asked: the checks
go from cheapest to most expensive and stop at the first "no".
"""

from __future__ import annotations

import ctypes
import importlib.util

__all__ = ["cuda_driver_present", "cuda_usable", "kvikio_installed"]


def cuda_driver_present() -> bool:
    """Whether the CUDA driver library (``libcuda.so.1``) can be loaded.

    kvikio needs it even in its POSIX compatibility mode, so without it kvikio
    must never be imported.
    """
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def cuda_usable() -> tuple[bool, str]:
    """``(True, "")`` when torch sees a CUDA device, else ``(False, reason)``.

    Imports torch (cheap when it is already imported) but only calls
    ``torch.cuda.is_available()`` after the driver library was found.
    """
    if not cuda_driver_present():
        return False, "no CUDA driver (libcuda.so.1 not loadable): no NVIDIA GPU on this machine"
    if importlib.util.find_spec("torch") is None:
        return False, "torch is not installed"
    import torch

    if not torch.cuda.is_available():
        return False, f"torch {torch.__version__} reports no usable CUDA device"
    return True, ""


def kvikio_installed() -> bool:
    """Whether the ``kvikio`` package is importable (without importing it)."""
    return importlib.util.find_spec("kvikio") is not None
