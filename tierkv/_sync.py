"""A synchronous facade over :class:`~tierkv.TierKV` for engine threads.

Owns: the background event-loop thread (anyio's blocking portal) a synchronous caller
drives a store through, the scheduler service running on that loop, and the facade's
lifecycle (``close``, context manager, a finaliser when the facade is dropped unclosed).

Contract:

* every method of :class:`SyncTierKV` has the signature and the errors of the
  :class:`~tierkv.TierKV` method of the same name, and blocks the calling thread until
  it is done; coroutines run on the facade's loop thread, and the synchronous methods
  (``hint``, ``stats``, ``rollback``, ...) run there too, so the store's state is only
  ever touched by that thread;
* thread-safe: any number of threads may call at once (each call is one task on the
  loop; they interleave as concurrent tasks of one ``TierKV`` do);
* a call interrupted in its thread (``KeyboardInterrupt``) does not cancel the task on
  the loop; ``close()`` stops the scheduler service, closes the store and joins the
  loop thread, and is idempotent; a call after ``close()`` raises ClosedError;
* the loop thread holds the store, not the facade: a facade dropped without ``close()``
  is closed by its finaliser, so no thread outlives it.

May not touch: the store's internals (only its public methods).
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import weakref
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import Future
from contextlib import AbstractContextManager
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, TypeVar, overload

import anyio.from_thread
from anyio.from_thread import BlockingPortal

from .errors import ClosedError

if TYPE_CHECKING:
    from ._config import Config
    from ._engine import CheckpointResult, GetResult, LookupResult, PutResult, TenantStats, TierKV, TierStats
    from ._keys import Scope
    from ._paged import PagedLayout

__all__ = ["SyncTierKV"]

T = TypeVar("T")


class _Loop:
    """The portal, the store and its service: what the finaliser closes (never the facade).

    One hop per call (:meth:`call`). Under asyncio it is the loop's own
    ``call_soon_threadsafe``: ``fn`` runs on the loop thread as a plain task that reports
    to a lock the caller waits on (a third of the portal's cost per call, which spawns
    every call into its task group); under trio the portal's ``call``. Calls in flight
    are counted, so ``close`` lets them finish, then closes the store, then stops the
    loop: no call is left waiting on a loop that no longer runs."""

    def __init__(self, backend: str) -> None:
        self.cm: AbstractContextManager[BlockingPortal] = anyio.from_thread.start_blocking_portal(backend)
        self.portal: BlockingPortal | None = self.cm.__enter__()
        self.kv: TierKV | None = None
        self.service: Future[None] | None = None
        self.lock = threading.Lock()
        self.idle = threading.Condition(self.lock)
        self.inflight = 0
        self.aloop: asyncio.AbstractEventLoop | None = None
        self.thread = 0
        if backend == "asyncio":
            self.aloop = self.portal.call(asyncio.get_running_loop)
            self.thread = self.portal.call(threading.get_ident)

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the loop thread (awaited there if it returns an awaitable);
        its result or exception here. Raises ClosedError once ``close`` began, and
        RuntimeError from the loop thread itself (it would wait on itself)."""
        with self.lock:
            portal = self.portal
            if portal is None:
                raise ClosedError("this SyncTierKV is closed")
            self.inflight += 1
        try:
            aloop = self.aloop
            if aloop is None:
                return portal.call(fn, *args)
            if threading.get_ident() == self.thread:
                raise RuntimeError(
                    "SyncTierKV: called from its own event-loop thread (await the store's methods there)"
                )
            done = threading.Lock()
            done.acquire()
            box: list[Any] = []

            def finish(task: asyncio.Task[Any]) -> None:
                if task.cancelled():
                    box.append((False, asyncio.CancelledError()))
                else:
                    exc = task.exception()
                    box.append((False, exc) if exc is not None else (True, task.result()))
                done.release()

            def start() -> None:
                try:
                    r = fn(*args)
                    if not inspect.isawaitable(r):
                        box.append((True, r))
                        done.release()
                        return
                    aloop.create_task(_awaited(r)).add_done_callback(finish)
                except BaseException as exc:  # handed to the caller's thread
                    box.append((False, exc))
                    done.release()

            aloop.call_soon_threadsafe(start)
            done.acquire()
            ok, value = box[0]
            if ok:
                return value
            raise value
        finally:
            with self.lock:
                self.inflight -= 1
                if not self.inflight:
                    self.idle.notify_all()

    def close(self) -> None:
        with self.lock:
            portal, self.portal = self.portal, None
            if portal is None:
                return
            if threading.get_ident() != self.thread:
                while self.inflight:
                    self.idle.wait()
        try:
            if self.service is not None:
                self.service.cancel()
            if self.kv is not None:
                portal.call(self.kv.aclose)
        finally:
            self.cm.__exit__(None, None, None)


async def _awaited(aw: Awaitable[T]) -> T:
    return await aw


class SyncTierKV:
    """A :class:`~tierkv.TierKV` for synchronous callers (see the module docstring).

    Open it with :meth:`open` (or ``TierKV.open_sync``); use it as a context manager or
    call :meth:`close`. :attr:`aio` is the underlying store, for code that runs on the
    facade's loop (:meth:`call`)."""

    __slots__ = ("__weakref__", "_finalizer", "_loop")

    def __init__(self, loop: _Loop) -> None:
        self._loop = loop
        self._finalizer = weakref.finalize(self, loop.close)

    @classmethod
    def open(
        cls,
        config: Config | Mapping[str, Any] | str | Path,
        *,
        restore: str | None = None,
        scheduler: bool = True,
        backend: Literal["asyncio", "trio"] = "asyncio",
        tracer_provider: Any = None,
        meter_provider: Any = None,
    ) -> SyncTierKV:
        """Start a loop thread running ``backend`` and open the store on it (the arguments
        of :meth:`TierKV.open`); with ``scheduler`` its placement service runs there too.
        Raises what :meth:`TierKV.open` raises (the thread is stopped again)."""
        from ._engine import TierKV

        loop = _Loop(backend)
        assert loop.portal is not None
        try:
            loop.kv = loop.portal.call(
                lambda: TierKV.open(
                    config, restore=restore, tracer_provider=tracer_provider, meter_provider=meter_provider
                )
            )
            if scheduler:
                loop.service, _ = loop.portal.start_task(loop.kv.run_scheduler, name="tierkv scheduler")
        except BaseException:
            loop.close()
            raise
        return cls(loop)

    # ----------------------------------------------------------------- plumbing
    @overload
    def _call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T: ...
    @overload
    def _call(self, fn: Callable[..., T], *args: Any) -> T: ...
    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return self._loop.call(fn, *args)

    @property
    def aio(self) -> TierKV:
        """The asynchronous store this facade drives (use it only on the facade's loop)."""
        kv = self._loop.kv
        if kv is None or self._loop.portal is None:
            raise ClosedError("this SyncTierKV is closed")
        return kv

    @overload
    def call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T: ...
    @overload
    def call(self, fn: Callable[..., T], *args: Any) -> T: ...
    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` on the facade's loop thread and return its result; ``fn`` may
        be a coroutine function (awaited there), e.g. one that makes several calls of
        :attr:`aio` in one hop."""
        return self._loop.call(fn, *args)

    def close(self) -> None:
        """Stop the scheduler service, close the store, join the loop thread; idempotent."""
        self._finalizer()

    @property
    def closed(self) -> bool:
        return self._loop.portal is None

    def __enter__(self) -> SyncTierKV:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # ------------------------------------------------------------------ the API
    @property
    def block_tokens(self) -> int:
        return self.aio.block_tokens

    @property
    def tier_names(self) -> tuple[str, ...]:
        return self.aio.tier_names

    @property
    def failed_jobs(self) -> int:
        return self.aio.failed_jobs

    def scope(self, tenant: str | None = None) -> Scope:
        return self._call(lambda: self.aio.scope(tenant))

    def put(
        self,
        tokens: object,
        kv_data: object,
        *,
        block_type: str | None = None,
        tenant: str | None = None,
        durable: bool = False,
        start: int = 0,
    ) -> PutResult:
        """:meth:`TierKV.put`, from a synchronous thread."""
        kv = self.aio
        return self._call(
            lambda: kv.put(tokens, kv_data, block_type=block_type, tenant=tenant, durable=durable, start=start)
        )

    def lookup(self, tokens: object, *, tenant: str | None = None, layout: PagedLayout | None = None) -> LookupResult:
        """:meth:`TierKV.lookup`, from a synchronous thread."""
        kv = self.aio
        return self._call(lambda: kv.lookup(tokens, tenant=tenant, layout=layout))

    def get(self, tokens: object, *, out: Any = None, tenant: str | None = None) -> GetResult:
        """:meth:`TierKV.get`, from a synchronous thread."""
        kv = self.aio
        return self._call(lambda: kv.get(tokens, out=out, tenant=tenant))

    def put_paged(
        self,
        tokens: object,
        caches: object,
        block_table: object,
        *,
        layout: PagedLayout,
        start: int = 0,
        block_type: str | None = None,
        tenant: str | None = None,
        durable: bool = False,
    ) -> PutResult:
        """:meth:`TierKV.put_paged`, from a synchronous thread."""
        kv = self.aio
        return self._call(
            lambda: kv.put_paged(
                tokens,
                caches,
                block_table,
                layout=layout,
                start=start,
                block_type=block_type,
                tenant=tenant,
                durable=durable,
            )
        )

    def get_paged(
        self,
        tokens: object,
        caches: object,
        block_table: object,
        *,
        layout: PagedLayout,
        tenant: str | None = None,
        start: int = 0,
    ) -> GetResult:
        """:meth:`TierKV.get_paged`, from a synchronous thread."""
        kv = self.aio
        return self._call(lambda: kv.get_paged(tokens, caches, block_table, layout=layout, tenant=tenant, start=start))

    def invalidate(self, *, tenant: str | None = None, all_tenants: bool = False, scope: Scope | None = None) -> int:
        """:meth:`TierKV.invalidate`, from a synchronous thread."""
        kv = self.aio
        return self._call(lambda: kv.invalidate(tenant=tenant, all_tenants=all_tenants, scope=scope))

    def prefetch(self, tokens: object, *, decode_position: int = 0, tenant: str | None = None) -> int:
        """:meth:`TierKV.prefetch`, from a synchronous thread."""
        kv = self.aio
        return self._call(lambda: kv.prefetch(tokens, decode_position=decode_position, tenant=tenant))

    def flush(self, scope: Scope | None = None, *, batch: int = 64) -> int:
        kv = self.aio
        return self._call(lambda: kv.flush(scope, batch=batch))

    def checkpoint(self, name: str) -> CheckpointResult:
        kv = self.aio
        return self._call(kv.checkpoint, name)

    def stage(self, request: str, tokens: object, kv_data: object, *, tenant: str | None = None) -> int:
        kv = self.aio
        return self._call(lambda: kv.stage(request, tokens, kv_data, tenant=tenant))

    def commit(self, request: str, accepted_tokens: int, *, durable: bool = False) -> PutResult:
        kv = self.aio
        return self._call(lambda: kv.commit(request, accepted_tokens, durable=durable))

    def rollback(self, request: str, to_tokens: int | None = None) -> None:
        kv = self.aio
        self._call(kv.rollback, request, to_tokens)

    def hint(
        self,
        *,
        transition: str | None = None,
        tool: str | None = None,
        decode_position: int | None = None,
        tokens: object = None,
        tenant: str | None = None,
        response_tokens: int | None = None,
    ) -> None:
        """:meth:`TierKV.hint`, run on the loop thread."""
        kv = self.aio
        self._call(
            lambda: kv.hint(
                transition=transition,
                tool=tool,
                decode_position=decode_position,
                tokens=tokens,
                tenant=tenant,
                response_tokens=response_tokens,
            )
        )

    def report_attention(self, layer: int, head_scores: Any, positions: Any, query_pos: int, **kw: Any) -> None:
        """:meth:`TierKV.report_attention` (``layer_class``, ``tokens``, ``tenant``), run on the loop thread."""
        kv = self.aio
        self._call(lambda: kv.report_attention(layer, head_scores, positions, query_pos, **kw))

    def drain(self) -> None:
        """:meth:`TierKV.drain`, from a synchronous thread."""
        self._call(self.aio.drain)

    def stats(self) -> dict[str, TierStats]:
        return self._call(self.aio.stats)

    def tenant_usage(self, tenant: str | None = None) -> dict[str, int]:
        kv = self.aio
        return self._call(kv.tenant_usage, tenant)

    def tenant_stats(self) -> dict[str, TenantStats]:
        return self._call(self.aio.tenant_stats)

    def invariant_violations(self, *, quiescent: bool = True) -> list[str]:
        kv = self.aio
        return self._call(lambda: kv.invariant_violations(quiescent=quiescent))
