"""Blocking work and operating-system errors in a backend: :func:`os_error`, :func:`run_blocking`.

Import them from :mod:`tierkv.backend`, which re-exports them. Owns the errno
classification (a full medium is a capacity condition) and the abandonable
worker-thread call; no other tierkv module but :mod:`tierkv.errors`.
"""

from __future__ import annotations

import errno
import math
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread

from .errors import BackendError, BackendIOError, CapacityError

__all__ = ["CAPACITY_ERRNOS", "os_error", "run_blocking"]

_T = TypeVar("_T")

#: ``errno`` values that mean the medium is full: a capacity condition, not a failure
CAPACITY_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def os_error(exc: OSError, what: str, *, tier: str = "") -> BackendError:
    """The tierkv error for an ``OSError`` raised by ``what`` (chain it: ``raise
    os_error(exc, ...) from exc``). A full medium (``ENOSPC``, ``EDQUOT``) is
    :class:`~tierkv.CapacityError`: the core then places the block elsewhere and keeps
    the tier in service for reads; anything else is :class:`~tierkv.BackendIOError`. A
    tierkv error (which may also be an ``OSError``) is returned as it is."""
    if isinstance(exc, BackendError):
        return exc
    if exc.errno in CAPACITY_ERRNOS:
        return CapacityError(f"{what}: the medium is full ({exc})", tier=tier)
    return BackendIOError(f"{what}: {exc}", tier=tier)


_HOP_LIMITER: anyio.lowlevel.RunVar[anyio.CapacityLimiter] = anyio.lowlevel.RunVar("tierkv_hop_limiter")


def _hop_limiter() -> anyio.CapacityLimiter:
    """An unbounded limiter for the thread hops of :func:`run_blocking` (the bound is the
    caller's limiter, held on behalf of each call), one per event loop."""
    try:
        return _HOP_LIMITER.get()
    except LookupError:
        lim = anyio.CapacityLimiter(math.inf)
        _HOP_LIMITER.set(lim)
        return lim


class _Call:
    """One abandonable call of :func:`run_blocking`: who gives its limiter slot back."""

    __slots__ = ("lock", "state")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.state = "queued"  # -> "running" -> "done"; or "dropped" / "abandoned" by the caller


async def run_blocking(
    fn: Callable[..., _T], *args: Any, limiter: anyio.CapacityLimiter, abandon_on_cancel: bool = False
) -> _T:
    """Run the blocking ``fn(*args)`` in a worker thread, holding a slot of ``limiter``.

    Without ``abandon_on_cancel`` this is ``anyio.to_thread.run_sync``: a cancelled caller
    waits for the thread. With it, a cancelled caller returns at once and the thread runs
    on in the background; its result (or exception) is discarded. Use it only where what
    the thread writes is private to the call (a read into buffers the backend allocated
    for it, never a caller's ``into=``). The limiter slot is held until the thread really
    ends, under asyncio and trio alike (anyio's own ``abandon_on_cancel`` gives it back at
    the cancellation on asyncio), so that at most ``total_tokens`` threads are ever busy
    and a backend that waits for all its slots (at close) waits for abandoned threads too.
    A call cancelled before its thread started never runs ``fn``.
    """
    if not abandon_on_cancel:
        return await anyio.to_thread.run_sync(fn, *args, limiter=limiter)
    call = _Call()
    await limiter.acquire_on_behalf_of(call)
    token = anyio.lowlevel.current_token()

    def work() -> _T:
        with call.lock:
            if call.state != "queued":
                raise anyio.get_cancelled_exc_class()()  # dropped before it started: never runs
            call.state = "running"
        try:
            return fn(*args)
        finally:
            with call.lock:
                give_back = call.state == "abandoned"
                call.state = "done"
            if give_back:
                try:
                    anyio.from_thread.run_sync(limiter.release_on_behalf_of, call, token=token)
                except Exception:  # pragma: no cover - the event loop (and its limiter) is gone
                    pass

    try:
        result = await anyio.to_thread.run_sync(work, abandon_on_cancel=True, limiter=_hop_limiter())
    except BaseException:
        with call.lock:
            running = call.state == "running"
            call.state = "abandoned" if running else ("dropped" if call.state == "queued" else call.state)
        if not running:
            limiter.release_on_behalf_of(call)
        raise
    limiter.release_on_behalf_of(call)
    return result
