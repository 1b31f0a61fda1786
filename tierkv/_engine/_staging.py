"""Speculative decoding: staged draft KV, commit of accepted tokens, rollback.

Owns: the per-request staged KV, held in process memory and invisible to every
reader until :meth:`Staging.commit` stores its accepted tokens through ``put``.

May not touch: stored blocks (rollback never does).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
import numpy as np

from .._keys import to_token_array
from .._layout import as_numpy_kv, block_slice
from ..errors import (
    InputError,
)

if TYPE_CHECKING:
    from ._store import Store

log = logging.getLogger("tierkv")

__all__ = ["Staging"]


class Staging:
    """Staged speculative KV (see the module docstring)."""

    def __init__(self, s: Store) -> None:
        self.s = s
        self.staged: dict[str, tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], str | None]] = {}

    async def stage(self, request: str, tokens: object, kv_data: object, *, tenant: str | None = None) -> int:
        """Hold the KV of a request's sequence *including unverified draft
        tokens* in process memory, invisible to every reader (``lookup``/``get``
        in this process or any other sharing a tier). Replaces what was staged
        for ``request``; returns the staged token count.

        Only :meth:`commit` makes tokens visible, and only accepted ones.
        Raises the input errors of :meth:`put`.
        """
        self.s.check_open()
        if not isinstance(request, str) or not request:
            raise InputError(f"request: expected a non-empty string, got {request!r}")
        arr = to_token_array(tokens)
        kv = as_numpy_kv(kv_data, self.s.spec, self.s.config.kv_dtype, len(arr))
        self.s.scope_digest(tenant)  # validate the tenant now
        copy = await anyio.to_thread.run_sync(np.array, kv)
        self.staged[request] = (arr.copy(), copy, tenant)
        return len(arr)

    def accept(
        self, request: str, accepted_tokens: int
    ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], str | None]:
        """The tokens, KV and tenant of the first ``accepted_tokens`` staged tokens of
        ``request`` (for the front to ``put``); the rejected draft beyond them is dropped.

        Raises InputError (unknown request, ``accepted_tokens`` out of range)."""
        self.s.check_open()
        staged = self.staged.get(request)
        if staged is None:
            raise InputError(f"commit: nothing staged for request {request!r}")
        arr, kv, tenant = staged
        if isinstance(accepted_tokens, bool) or not isinstance(accepted_tokens, int):
            raise InputError(f"accepted_tokens: expected an int, got {type(accepted_tokens).__name__}")
        if not 0 <= accepted_tokens <= len(arr):
            raise InputError(f"accepted_tokens: {accepted_tokens} outside [0, {len(arr)}] staged tokens")
        self.rollback(request, accepted_tokens)
        view = kv[block_slice(self.s.spec, 0, accepted_tokens)]
        return arr[:accepted_tokens], np.ascontiguousarray(view), tenant

    def rollback(self, request: str, to_tokens: int | None = None) -> None:
        """Discard staged draft tokens of ``request`` beyond ``to_tokens`` (all of
        them, and the request, when None). Idempotent; never touches stored blocks."""
        staged = self.staged.get(request)
        if staged is None:
            return
        if to_tokens is None or to_tokens <= 0:
            del self.staged[request]
            return
        arr, kv, tenant = staged
        if to_tokens < len(arr):
            self.staged[request] = (arr[:to_tokens], kv[block_slice(self.s.spec, 0, to_tokens)], tenant)
