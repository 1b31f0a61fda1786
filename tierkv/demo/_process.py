"""How the demo process runs its model: one model thread, and freed memory kept for reuse.

Owns two process-level choices an inference engine makes for itself, applied by ``tierkv demo``
alike to the recompute and the cached runs (never by the library, which leaves the process alone):

* :class:`ModelThread` -- every model call runs on one long-lived thread. A new calling thread
  pays the start of its own OpenMP team on its first parallel region (~0.3 s for SmolLM2 on 2
  cores); an engine keeps one model thread, and so does the demo, instead of landing on whichever
  ``anyio`` worker is free.
* :func:`attention_on_kv_heads` -- ``transformers``' SDPA attention repeats every KV head for its
  query heads (``repeat_kv``: a copy of the whole cache per layer and step, ~280 MB for a 2,000-token
  SmolLM2 prefix) whenever it is given a mask, which a prefill on top of a cache always is; the demo
  lets SDPA group the query heads instead (``enable_gqa``, as vLLM's kernels do), the same
  arithmetic without the copy. A full prefill (no mask) takes that path already.
* :func:`keep_freed_memory` -- glibc returns every large freed block to the kernel (``munmap``) and
  faults a new one in, page by page and zeroed, on the next allocation: loading 92 MB of KV into a
  new buffer costs ~30 ms of page faults on this 2-core VM against ~10 ms for the copy itself. An
  engine preallocates its KV pool once; the demo asks glibc (``mallopt``) to serve large blocks
  from its heap and keep freed memory for reuse, which is the same effect. Other C libraries: a
  no-op, reported as such.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import anyio.to_thread

__all__ = ["ModelThread", "attention_on_kv_heads", "keep_freed_memory"]

T = TypeVar("T")

# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3


def attention_on_kv_heads() -> bool:
    """Let ``transformers``' SDPA attention group query heads over their KV head even with a mask
    (see the module docstring); an explicit ``TRANSFORMERS_SDPA_FORCE_GQA`` in the environment wins.
    Returns whether it is on."""
    return os.environ.setdefault("TRANSFORMERS_SDPA_FORCE_GQA", "1") == "1"


def keep_freed_memory(largest: int = 1 << 30) -> bool:
    """Serve allocations up to ``largest`` bytes from glibc's heap and keep freed memory (see the
    module docstring). Returns whether glibc took every setting (False elsewhere: nothing changed)."""
    if not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name, use_errno=True)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = bool(mallopt(_M_MMAP_THRESHOLD, min(largest, (1 << 31) - 1)) == 1)
    ok = bool(mallopt(_M_TRIM_THRESHOLD, (1 << 31) - 1) == 1) and ok
    return bool(mallopt(_M_TOP_PAD, 64 << 20) == 1) and ok


class ModelThread:
    """One long-lived thread for every model call (see the module docstring).

    ``await run(fn)`` runs ``fn()`` there and returns its result (its exception is raised); calls
    are serialised. Cancelling the awaiting task does not stop a call already running (the thread
    finishes it). :meth:`close` (or leaving ``with ModelThread() as model:``) waits for the running
    call and stops the thread; idempotent."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tierkv-demo-model")

    async def run(self, fn: Callable[[], T]) -> T:
        future = self._pool.submit(fn)
        return await anyio.to_thread.run_sync(future.result)

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def __enter__(self) -> ModelThread:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
