"""The public entry point: :class:`TierKV`, a thin front over the engine's collaborators.

Blocks and prefixes
-------------------
``put(tokens, kv)`` cuts the token sequence into blocks of ``block_tokens``
tokens. Each *whole* block is stored under a chained key (see
:mod:`tierkv._keys`), so a key names the whole prefix up to the end of its
block. By default a trailing partial block is **not stored**: ``put`` reports how
many tokens it covered (a multiple of ``block_tokens``) and the caller keeps or
recomputes the tail. ``lookup``/``get`` return the longest stored prefix.

With ``partial_blocks = true`` (config), ``put`` also stores the trailing partial
block (a *tail*, 0 < t < ``block_tokens`` tokens) under its own key, derived from
its parent (the last whole block's key, or the chain seed) and its exact tokens
(:func:`tierkv._keys.tail_key`). After the walk over whole blocks stops at block
``n``, ``lookup``/``get`` look for the longest stored tail under that parent whose
tokens begin the rest of the request, and the hit covers ``n * block_tokens + t``
tokens; a follow-up prompt that extends a stored one then recomputes only its new
tokens. A tail is a leaf (nothing chains below it) and is otherwise a block like
any other: tiers, checksums, eviction, quotas, tenants, checkpoints and recovery
from persistent tiers. When the sequence later grows past the tail, the whole block
is stored normally and the tail, now redundant, is left to eviction (it ranks as
any block nobody reads). ``put_paged``/``get_paged`` keep whole blocks only.

Concurrency and cancellation
----------------------------
All methods are coroutines safe to call from many tasks at once, under
asyncio or trio. Index updates are synchronous sections (no await inside), so
they are atomic on the event loop and cannot be cancelled half-way; I/O happens
outside them. A cancelled ``put`` leaves every block either fully stored and
indexed or absent; a cancelled ``get`` changes nothing. Blocks being read are
pinned so that rebalancing never removes them mid-read.

Integrity
---------
A block's tag carries a checksum of its raw bytes (xxh3, computed once, when its first
copy goes to a tier that verifies reads: persistent and network tiers, and a memory tier
configured with ``verify = true``). ``get`` verifies copies read from such tiers against
it, and lossy copies by their codec block's own checksum, and treats a mismatch as a miss
(the copy is removed), never returning wrong bytes. Memory tiers are not verified by
default: a block that lives only there is a copy in this process's own memory, and
hashing it on every put and get would halve their speed.

Where things live (``tierkv/_engine/``): the index and pins (``_index``), the
block tag (``_tags``), relocation (``_mover``), writes and durability
(``_durable``), the put path (``_writer``), the read path (``_reader``), quotas (``_quotas``), the scheduler
service (``_service``), checkpoints (``_checkpoint``), speculative staging
(``_staging``), their shared state (``_store``). See docs/architecture.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

import anyio
import anyio.lowlevel
import numpy as np
from anyio.abc import TaskGroup, TaskStatus

from .._config import Config
from .._device import check_device_kv, is_device_tensor
from .._keys import Scope, tenant_salt
from .._layout import STORAGE_DTYPES, as_numpy_kv, block_slice
from .._options import config_path
from .._paged import PagedCaches, PagedLayout, PagedSink
from .._registry import load_backend_class
from .._telemetry import Telemetry
from ..backend import Backend, BackendStats, OpenContext, TierKind
from ..errors import InputError, KVLayoutError, TierKVError
from ._durable import BlockData
from ._results import CheckpointResult, GetResult, LookupResult, PutResult, TenantStats, TierStats
from ._store import Store

if TYPE_CHECKING:
    from .._sync import SyncTierKV

__all__ = ["TierKV"]


class TierKV:
    """An async KV-cache store over an ordered hierarchy of tiers.

    Open with ``kv = await TierKV.open(config)`` and close with
    ``await kv.aclose()`` (or ``async with await TierKV.open(config) as kv``).
    ``__init__`` does no I/O; use :meth:`open`.
    """

    def __init__(
        self, config: Config, tiers: Sequence[tuple[str, Backend]], *, telemetry: Telemetry | None = None
    ) -> None:
        self.config = config
        self._s = Store(config, tiers, telemetry if telemetry is not None else Telemetry(config.telemetry))
        self._service_tg: TaskGroup | None = None
        # the engine's state, named for tests and debugging
        self._tiers = self._s.tiers
        self._index = self._s.index.entries
        self._sched = self._s.sched

    @property
    def prefetch_stats(self) -> dict[str, int]:
        """Prefetched blocks issued, later hit (``useful``) and dropped unused (``wasted``)."""
        return self._s.prefetch_stats

    @property
    def misses_by_reason(self) -> dict[str, int]:
        """Misses counted by reason, in the operator's view (see :meth:`get`)."""
        return self._s.misses_by_reason

    @property
    def restored_blocks(self) -> int:
        """Blocks copied up from the checkpoint named by ``open(restore=...)``."""
        return self._s.restored_blocks

    @property
    def failed_jobs(self) -> int:
        """Background jobs that failed (logged, traced; the service went on)."""
        return self._s.failed_jobs

    # ----------------------------------------------------------------- lifecycle
    @classmethod
    async def open(
        cls,
        config: Config | Mapping[str, Any] | str | Path,
        *,
        restore: str | None = None,
        tracer_provider: Any = None,
        meter_provider: Any = None,
    ) -> TierKV:
        """Validate ``config``, open every tier, and rebuild the index from
        persistent tiers (warm start). With ``restore``, the blocks of that
        checkpoint are also copied up into the fast tiers, hottest first, up to
        their high watermark (``kv.restored_blocks`` says how many).

        Raises ConfigError, PluginError (backend missing, broken or unusable
        here) and BackendError (a tier failed to open). On failure every tier
        already opened is closed again.
        """
        if isinstance(config, (str, Path)):
            cfg = await anyio.to_thread.run_sync(Config.load, config)
        else:
            cfg = Config.load(config)
        opened: list[tuple[str, Backend]] = []
        try:
            raw_block = (
                int(np.prod(cfg.model.kv_shape(cfg.effective_block_tokens))) * STORAGE_DTYPES[cfg.kv_dtype].itemsize
            )
            for i, t in enumerate(cfg.tiers):
                backend_cls = load_backend_class(t.backend)
                # a codec's block adds its header and may not compress: bound it generously
                bound = raw_block if t.codec is None else raw_block + raw_block // 64 + 4096
                ctx = OpenContext(block_nbytes=bound)
                with config_path(f"tiers[{i}]"):  # a backend's option errors name tiers[i].field
                    opened.append((t.name, await backend_cls.open(t.options, name=t.name, context=ctx)))
            telemetry = Telemetry(cfg.telemetry, tracer_provider=tracer_provider, meter_provider=meter_provider)
            kv = cls(cfg, opened, telemetry=telemetry)
            await kv._s.durable.recover()
            if restore is not None:
                kv._s.restored_blocks = await kv._s.ckpt.restore(restore)
        except BaseException:
            with anyio.CancelScope(shield=True):
                for _, b in opened:
                    try:
                        await b.aclose()
                    except TierKVError:
                        pass
            raise
        return kv

    @classmethod
    def open_sync(
        cls,
        config: Config | Mapping[str, Any] | str | Path,
        *,
        restore: str | None = None,
        scheduler: bool = True,
        backend: Literal["asyncio", "trio"] = "asyncio",
    ) -> SyncTierKV:
        """A :class:`~tierkv.SyncTierKV`: this store opened on a background event-loop thread,
        for synchronous callers (engine threads); see :meth:`SyncTierKV.open`."""
        from .._sync import SyncTierKV

        return SyncTierKV.open(config, restore=restore, scheduler=scheduler, backend=backend)

    async def aclose(self) -> None:
        """Close every tier (persistent tiers keep their blocks); idempotent."""
        if self._s.closed:
            return
        self._s.closed = True
        self._s.tel.close()  # the meter's gauges must not keep this store alive
        with anyio.CancelScope(shield=True):
            errors: list[BaseException] = []
            for t in self._s.tiers:
                try:
                    await t.backend.aclose()
                except TierKVError as exc:
                    errors.append(exc)
            if errors:
                raise errors[0]

    async def __aenter__(self) -> TierKV:
        """Start the scheduler service in a task group owned by this block."""
        tg = anyio.create_task_group()
        await tg.__aenter__()
        try:
            await tg.start(self.run_scheduler)
        except BaseException:
            tg.cancel_scope.cancel()
            await tg.__aexit__(None, None, None)
            raise
        self._service_tg = tg
        return self

    async def __aexit__(self, *exc: object) -> None:
        tg, self._service_tg = self._service_tg, None
        try:
            if tg is not None:
                tg.cancel_scope.cancel()
                await tg.__aexit__(None, None, None)
        finally:
            await self.aclose()

    @property
    def block_tokens(self) -> int:
        return self._s.block_tokens

    @property
    def tier_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self._s.tiers)

    def scope(self, tenant: str | None = None) -> Scope:
        """The key scope for ``tenant`` (for inspection and tests)."""
        return self._s.config.scope(tenant_salt(tenant))

    async def put(
        self,
        tokens: object,
        kv_data: object,
        *,
        block_type: str | None = None,
        tenant: str | None = None,
        durable: bool = False,
        start: int = 0,
    ) -> PutResult:
        """Store the KV of ``tokens`` in whole blocks (see the module docstring), and with
        ``partial_blocks`` on, the trailing partial block too (once every whole block
        before it is stored).

        ``kv_data`` has the layout of :mod:`tierkv._layout` (any strides) covering
        exactly ``tokens[start:]``. Blocks already stored are not written again.

        ``start`` (a multiple of ``block_tokens``, at most ``len(tokens)``) stores only
        the newest blocks of a prefix: the keys still chain over all of ``tokens``,
        and the KV given covers only the part from ``start`` on, so an engine storing
        one new block of a growing prefix passes that block's KV alone. No block before
        ``start`` needs to exist: one that is missing is simply not stored, and
        :meth:`lookup` stops at the first gap. ``PutResult.tokens`` is the stored prefix
        after the call (up to the first missing block).

        ``durable=True``: when ``put`` returns, every whole block of the prefix
        is committed on a persistent tier (written through to the fastest
        healthy persistent tier when it was placed on a volatile one) and
        survives a crash of this process. This is what "acknowledged as
        durable" means; without it a block may live only in volatile memory.

        Cancellation: the block being written when the cancel arrives is
        finished and indexed (a bounded delay), then ``put`` stops; every block
        is either fully stored and indexed or absent.

        Raises:
            TokensError, KVLayoutError, InputError: bad arguments (nothing stored).
            CapacityError: no tier had room for a block (blocks stored before it stay).
            TierUnavailableError: ``durable=True`` and no healthy persistent tier.
            BackendError: a tier failed.
            ClosedError.
        """
        self._s.check_open()
        arr_tokens, keys, tid = self._s.keys(tokens, tenant)
        first = self._first_block(start, len(arr_tokens))
        n_kv = len(arr_tokens) - start
        kv: Any = (
            check_device_kv(kv_data, self._s.spec, self._s.config.kv_dtype, n_kv)
            if is_device_tensor(kv_data)
            else as_numpy_kv(kv_data, self._s.spec, self._s.config.kv_dtype, n_kv)
        )
        spec, bt = self._s.spec, self._s.block_tokens

        def block(i: int) -> BlockData:
            # a view, no copy (of an accelerator tensor too: BlockData's array, see tierkv._device)
            return cast("BlockData", kv[block_slice(spec, (i - first) * bt, (i - first + 1) * bt)])

        def tail_block(t: int) -> BlockData:
            at = (len(keys) - first) * bt
            return cast("BlockData", kv[block_slice(spec, at, at + t)])

        if not self._s.config.partial_blocks:
            return await self._s.writer.put_blocks(arr_tokens, keys, tid, first, block, block_type, durable)
        seed = self._s.scope_digest(tenant)[0]
        return await self._s.writer.put_blocks(
            arr_tokens, keys, tid, first, block, block_type, durable, tail_block, seed
        )

    async def put_paged(
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
        """Store the KV of ``tokens`` held in an engine's paged caches (see :mod:`tierkv._paged`).

        ``caches``: one cache per KV layer in ``layout``'s axes (a ``(K, V)`` pair per layer
        for a paired layout), numpy arrays or CPU torch tensors, views of the engine's memory;
        ``block_table``: the engine block ids of the sequence (``ceil(len(tokens) /
        layout.block_size)`` at least, as an engine keeps them). Each whole tierkv block is
        gathered from its engine blocks straight into the block's bytes, which keep the
        engine's layout; its keys are seeded by the layout, so only :meth:`get_paged` with
        the same layout finds them. ``start`` as for :meth:`put`.

        Raises InputError (a block id outside the caches, a table too short for the tokens,
        an engine block size that does not divide ``block_tokens``, a bad ``start``),
        KVLayoutError (caches that do not match the layout or the model), and what
        :meth:`put` raises; nothing is stored on a bad argument.
        """
        self._s.check_open()
        if not isinstance(layout, PagedLayout):
            raise InputError(f"layout: expected a tierkv.PagedLayout, got {type(layout).__name__}")
        arr_tokens, keys, tid = self._s.keys(tokens, tenant, layout.key_id)
        first = self._first_block(start, len(arr_tokens))
        pc = self._paged(caches, layout, writable=False)
        ids = pc.table(block_table, len(arr_tokens))
        per = pc.per

        def block(i: int) -> BlockData:
            return pc.taken(ids[i * per : (i + 1) * per])  # gathered by the tier (or flat())

        return await self._s.writer.put_blocks(arr_tokens, keys, tid, first, block, block_type, durable)

    def _first_block(self, start: object, tokens: int) -> int:
        bt = self._s.block_tokens
        if isinstance(start, bool) or not isinstance(start, int) or not 0 <= start <= tokens:
            raise InputError(f"start: expected an int in [0, len(tokens)={tokens}], got {start!r}")
        if start % bt:
            raise InputError(f"start: {start} is not a multiple of block_tokens ({bt})")
        return start // bt

    def _paged(self, caches: object, layout: PagedLayout, *, writable: bool) -> PagedCaches:
        pc = PagedCaches(caches, layout, self._s.spec, self._s.config.kv_dtype, self._s.block_tokens, writable=writable)
        if pc.part_nbytes * sum(len(p) for p in pc.layers) != self._s.block_nbytes:
            raise KVLayoutError("caches", f"{self._s.block_nbytes} bytes per block", pc.part_nbytes)
        return pc

    async def lookup(
        self, tokens: object, *, tenant: str | None = None, layout: PagedLayout | None = None
    ) -> LookupResult:
        """How many leading tokens are stored, and in which tiers (no data moved).

        ``layout``: look up blocks stored by :meth:`put_paged` in that paged layout (their
        keys are seeded by the layout); without it, blocks stored by :meth:`put`.

        Raises TokensError, InputError, ClosedError.
        """
        self._s.check_open()
        if layout is not None and not isinstance(layout, PagedLayout):
            raise InputError(f"layout: expected a tierkv.PagedLayout or None, got {type(layout).__name__}")
        arr, keys, tid = self._s.keys(tokens, tenant, None if layout is None else layout.key_id)
        with self._s.tel.timed("lookup") as span:
            rows, reason = self._s.index.walk_rows(keys, tid)
            if reason == "never_stored" and await self._s.reader.adopt_shared(keys, len(rows), tid):
                rows, reason = self._s.index.walk_rows(keys, tid)
            await self._s.reader.drop_forged(keys, len(rows), reason)
            block_tiers = self._s.serving_tier_names(rows)
            tail = self._tail(arr, keys, rows, reason, tid, tenant) if layout is None else None
            tail_tokens = 0
            if tail is not None:
                tail_tokens = self._s.index.tail_tokens(tail)
                block_tiers = (*block_tiers, self._s.serving_tier(tail).name)
            tiers = tuple(t.name for t in self._s.tiers if t.name in block_tiers)
            hit = len(rows) * self._s.block_tokens + tail_tokens
            if span is not None and span.is_recording():
                span.set_attributes(
                    {
                        "tierkv.tokens": len(arr),
                        "tierkv.hit_tokens": hit,
                        "tierkv.tiers_hit": list(tiers),
                        "tierkv.tenant": tid.hex(),
                        "tierkv.miss_reason": self._s.index.miss_reason(arr, len(rows), reason, tid)[0]
                        if len(rows) < len(keys)
                        else "",
                    }
                )
        return LookupResult(hit, len(rows), tiers, block_tiers, tail_tokens)

    def _tail(
        self,
        arr: np.ndarray[Any, Any],
        keys: list[bytes],
        found: Sequence[Any],
        reason: str,
        tid: bytes,
        tenant: str | None,
    ) -> Any:
        """The stored tail after the ``found`` whole blocks (``partial_blocks`` on and the walk
        ended for want of a block, or at the end), or None."""
        if not self._s.config.partial_blocks or reason not in ("", "never_stored"):
            return None
        n = len(found)
        if len(arr) <= n * self._s.block_tokens:
            return None
        return self._s.index.find_tail(arr, keys, n, tid, self._s.scope_digest(tenant)[0])

    async def get(self, tokens: object, *, out: Any = None, tenant: str | None = None) -> GetResult:
        """Return the KV of the longest stored prefix of ``tokens``, bit-identical
        to what was put.

        With ``out`` (a numpy array or CPU torch tensor of the layout for at
        least the returned prefix, of the configured dtype) the prefix is
        written into ``out[..., :tokens, ...]`` and ``out`` is returned as
        ``kv``. A block that fails verification, vanished from its tier, or
        sits on an unhealthy tier ends the prefix there (a miss, never wrong
        bytes); ``miss_reason`` says why. With a prefill rate configured, the
        fetch-vs-recompute gate may answer a miss (``"gated"``) when reading
        would be slower than recomputing.

        Concurrent reads are bounded by ``scheduler.max_concurrent_fetches``
        (admission control); a hit in a slower tier may schedule a promotion
        in the background.

        Raises TokensError, KVLayoutError (bad ``out``), ClosedError, and
        LoadFailedError when a tier fails and ``load_failure = "fail"``.
        """
        self._s.check_open()
        arr, keys, tid = self._s.keys(tokens, tenant)
        return await self._get(arr, keys, tid, out, tenant=tenant, tails=self._s.config.partial_blocks)

    async def get_paged(
        self,
        tokens: object,
        caches: object,
        block_table: object,
        *,
        layout: PagedLayout,
        tenant: str | None = None,
        start: int = 0,
    ) -> GetResult:
        """Load the longest stored prefix of ``tokens`` that was put with :meth:`put_paged` in
        the same ``layout`` into the engine blocks ``block_table`` names (see
        :meth:`put_paged`); each block is scattered from what the tier returns straight into
        its engine blocks. Returns a GetResult whose ``kv`` is None: the caches hold it.
        Engine blocks past the returned prefix are not written.

        ``start`` (a multiple of ``block_tokens``): the engine already holds tokens
        ``[0, start)`` (its own prefix cache): the stored prefix is found as without it (the
        keys chain from token 0, and every block before ``start`` must be stored too), but
        only the blocks from ``start`` on are read and written, and the engine blocks of the
        first ``start`` tokens are never touched. ``tokens`` of the result is where the
        stored prefix ends; less than ``start`` (nothing was loaded) when it ends before it.

        Raises InputError (a block id outside the caches or named twice, a table too short
        for the tokens, a bad ``start``), KVLayoutError (caches that do not match the layout or
        the model, or read-only), and what :meth:`get` raises; nothing is written on a bad
        argument.
        """
        self._s.check_open()
        if not isinstance(layout, PagedLayout):
            raise InputError(f"layout: expected a tierkv.PagedLayout, got {type(layout).__name__}")
        arr, keys, tid = self._s.keys(tokens, tenant, layout.key_id)
        skip = self._first_block(start, len(arr))
        pc = self._paged(caches, layout, writable=True)
        ids = pc.table(block_table, len(arr))
        if len(np.unique(ids)) != len(ids):
            raise InputError("block_table: an engine block is named twice (each must receive its own tokens)")
        return await self._get(arr, keys, tid, PagedSink(pc, ids[skip * pc.per :]), skip=skip)

    async def _get(
        self,
        arr: np.ndarray[Any, Any],
        keys: list[bytes],
        tid: bytes,
        out: Any,
        *,
        tenant: str | None = None,
        tails: bool = False,
        skip: int = 0,
    ) -> GetResult:
        """The get of the walked prefix of ``keys``; ``skip``: the leading blocks the caller
        already holds (they must be stored, they are neither read nor written: ``out`` takes
        the blocks from ``skip`` on; only without tails)."""
        with self._s.tel.timed("get") as span:
            found, reason = self._s.index.walk(keys, tid)
            if reason == "never_stored":
                await self._s.reader.adopt_shared(keys, len(found), tid)
            entries, reason = self._s.index.walk(keys, tid)
            if reason == "integrity":
                await self._s.reader.drop_forged(keys, len(entries), reason)
                found_before = len(entries)
                entries, reason = self._s.index.walk(keys, tid)
                if reason == "never_stored" and len(entries) == found_before:
                    reason = "integrity"  # the forged entry is gone; the caller learns why the prefix ended
            tail = self._tail(arr, keys, entries, reason, tid, tenant) if tails else None
            tail_tokens = 0
            rid = keys[-1].hex() if keys else None  # the request's id (Reader.record_access)
            sched = self._s.sched
            if sched.session is not None:  # the adaptive policy's session shadow: what the get found
                sched.session_get(
                    keys, len(entries), sched.now(), bytes.fromhex(tail.key) if tail is not None else None
                )
            if tail is not None:
                tail_tokens = self._s.index.tail_tokens(tail)
                entries = [*entries, tail]
            if skip and len(entries) <= skip:  # the stored prefix ends inside what the caller holds
                self._s.reader.record_access(entries, len(keys), len(entries), request=rid)
                reason = (
                    self._s.index.miss_reason(arr, len(entries), reason, tid)[0] if len(entries) < len(keys) else ""
                )
                return GetResult(len(entries) * self._s.block_tokens, None, (), reason)
            with self._s.index.pinned(entries):
                self._s.reader.record_access(entries, len(keys), len(entries), request=rid)
                result = await self._s.reader.admitted_fetch(
                    entries[skip:], len(keys) - skip, out, arr, reason, tid, tail_tokens
                )
            served = entries[skip:]
            if skip:
                read = result.tokens // self._s.block_tokens
                miss = result.miss_reason
                if miss and read == len(served):  # the walk's reason, found at the absolute position
                    miss = self._s.index.miss_reason(arr, skip + read, reason, tid)[0]
                relative, result = (
                    result,
                    replace(result, tokens=result.tokens + skip * self._s.block_tokens, miss_reason=miss),
                )
            else:
                relative = result
            operator_reason = result.miss_reason
            if operator_reason == "never_stored":
                operator_reason = self._s.index.miss_reason(
                    arr, result.tokens // self._s.block_tokens, "never_stored", tid
                )[1]
            self._s.reader.after_get(relative, served, tid, span, len(arr), operator_reason)
        return result

    async def invalidate(
        self, *, tenant: str | None = None, all_tenants: bool = False, scope: Scope | None = None
    ) -> int:
        """Remove stored blocks: those of ``tenant`` (the default tenant when
        None), or every tenant's with ``all_tenants=True``; restricted to the
        model ``scope`` if given (its tenant field is ignored), else to this
        configuration's scope. Blocks in use (pinned by a read or a relocation
        at their turn) are skipped. Returns the number of blocks removed."""
        self._s.check_open()
        ms = scope.with_tenant("").digest()[:16] if scope is not None else self._s.model_scope[:16]
        _, tid = self._s.scope_digest(tenant)
        victims = [
            e
            for e in self._s.index.entries.values()
            if e.model_scope[:16] == ms and (all_tenants or e.tenant == tid) and e.pins == 0
        ]
        removed = 0
        for e in victims:
            # checked again at its turn: a block pinned meanwhile (read or relocated) is in use
            if self._s.index.entries.get(e.key) is e and e.pins == 0:
                await self._s.mover.drop(e)
                removed += 1
        return removed

    async def run_scheduler(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """The background placement service: promotions, demotions, prefetches,
        capacity reservations and health probes of unhealthy tiers.

        Start it in your task group with ``await tg.start(kv.run_scheduler)``
        (``async with await TierKV.open(cfg) as kv`` starts it for you). While it
        runs, ``put`` and ``get`` only *queue* placement work, so they never wait
        for it; jobs beyond ``scheduler.queue`` are dropped and counted. Each
        tier runs at most ``scheduler.max_transfers_per_tier`` transfers at once.
        Cancel the enclosing scope (or close the TierKV) to stop it; jobs in
        flight finish their current block (writes are shielded), queued ones are
        dropped. A job that fails is counted (:attr:`failed_jobs`), logged and
        traced, and the service goes on. Only one service may run per TierKV
        (SchedulerError).
        """
        await self._s.service.run(task_status=task_status)

    async def drain(self) -> None:
        """Wait until the scheduler service has no placement job queued or running (a
        rebalance, promotion or reservation that ``put``/``get`` queued); returns at once
        without the service. Useful before measuring, or before checking
        :meth:`invariant_violations` with ``quiescent=True`` while the service runs."""
        self._s.check_open()
        await self._s.service.drain()

    # ------------------------------------------------------------- delegates
    async def flush(self, scope: Scope | None = None, *, batch: int = 64) -> int:
        """Reclaim the blocks of old model scopes on every tier (see :meth:`Checkpoints.flush`)."""
        return await self._s.ckpt.flush(scope, batch=batch)

    async def checkpoint(self, name: str) -> CheckpointResult:
        """Write checkpoint ``name`` to the bottom persistent tier (see :meth:`Checkpoints.checkpoint`)."""
        return await self._s.ckpt.checkpoint(name)

    async def stage(self, request: str, tokens: object, kv_data: object, *, tenant: str | None = None) -> int:
        """Hold a request's KV including unverified draft tokens, invisible to every reader,
        until :meth:`commit` (see :meth:`Staging.stage`). Raises the input errors of :meth:`put`."""
        return await self._s.staging.stage(request, tokens, kv_data, tenant=tenant)

    async def commit(self, request: str, accepted_tokens: int, *, durable: bool = False) -> PutResult:
        """Store the first ``accepted_tokens`` staged tokens of ``request`` (whole blocks, as
        :meth:`put`) and drop the rejected draft. Raises InputError (unknown request,
        ``accepted_tokens`` out of range)."""
        arr, kv, tenant = self._s.staging.accept(request, accepted_tokens)
        return await self.put(arr, kv, tenant=tenant, durable=durable)

    def rollback(self, request: str, to_tokens: int | None = None) -> None:
        """Discard staged draft tokens of ``request`` beyond ``to_tokens`` (all, when None)."""
        self._s.staging.rollback(request, to_tokens)

    def tenant_usage(self, tenant: str | None = None) -> dict[str, int]:
        """Logical bytes ``tenant``'s blocks hold on each tier (each copy where it is stored)."""
        return self._s.quotas.tenant_usage(tenant)

    def tenant_stats(self) -> dict[str, TenantStats]:
        """Per-tenant bytes and quotas of every tenant holding blocks (no I/O)."""
        return self._s.quotas.tenant_stats()

    def invariant_violations(self, *, quiescent: bool = True) -> list[str]:
        """What is wrong between the index and the tiers; empty when sound (no I/O). With
        ``quiescent`` (nothing in flight), pins and per-tier blocks/bytes are checked too."""
        return self._s.index.invariant_violations(quiescent=quiescent)

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
        """Tell the scheduler what the engine knows (never blocks, no I/O); see
        :meth:`Hints.hint` for each field. ``tokens`` (and ``tenant``) tie a
        ``transition``, ``decode_position`` or ``response_tokens`` to that request
        (as given to ``put``/``get``); without them a label applies to the next request
        and an answer length to the most recent one. Raises ConfigError for an unknown
        transition label, InputError for a bad argument or an unknown request (nothing
        changed)."""
        self._s.hints.hint(
            transition=transition,
            tool=tool,
            decode_position=decode_position,
            tokens=tokens,
            tenant=tenant,
            response_tokens=response_tokens,
        )

    async def prefetch(self, tokens: object, *, decode_position: int = 0, tenant: str | None = None) -> int:
        """Promote the blocks of ``tokens`` that the model's layer classes will read at
        ``decode_position`` into the fastest tier ahead of need, most urgent first (sliding layers:
        their window's recent span; global layers: the attention sinks, the recent span, the
        blocks of highest head importance; then the stored blocks past the position), never a
        block no layer can attend to (see :meth:`Hints.prefetch`); queued with the service
        running, run now without it; returns the blocks scheduled or promoted. Raises
        TokensError, InputError."""
        self._s.check_open()
        return await self._s.hints.prefetch(tokens, decode_position=decode_position, tenant=tenant)

    def report_attention(
        self,
        layer: int,
        head_scores: Any,
        positions: Any,
        query_pos: int,
        *,
        layer_class: str | None = None,
        tokens: object = None,
        tenant: str | None = None,
    ) -> None:
        """Report one layer's attention statistics at decode position ``query_pos`` (see
        :meth:`Hints.report_attention`; ``layer_class`` defaults to the layer's class in the
        model spec, ``"local"`` for sliding-window layers, ``"global"`` otherwise): with ``tokens`` (and ``tenant``) the importance of
        that sequence's stored blocks alone changes; without, the most recent request's.
        Raises InputError (nothing changed) for bad shapes or an unknown request."""
        self._s.hints.report_attention(
            layer, head_scores, positions, query_pos, layer_class=layer_class, tokens=tokens, tenant=tenant
        )

    def stats(self) -> dict[str, TierStats]:
        """Per-tier accounting (no I/O)."""
        out: dict[str, TierStats] = {}
        for t in self._s.tiers:
            s: BackendStats = t.backend.stats()
            kind = s.kind.value if isinstance(s.kind, TierKind) else str(s.kind)
            out[t.name] = TierStats(
                name=t.name,
                backend=t.config_name,
                kind=kind,
                capacity_bytes=s.capacity_bytes,
                used_bytes=s.used_bytes,
                blocks=s.blocks,
                hits=t.hits,
                misses=t.misses,
                bytes_in=t.bytes_in,
                bytes_out=t.bytes_out,
                promotions=t.promotions,
                demotions=t.demotions,
                io_path=s.io_path,
                emulated=s.emulated,
                healthy=t.healthy,
                codec=t.codec.name if t.codec is not None else "raw",
                codec_reasoning=t.codec.reasoning if t.codec is not None else None,
            )
        return out

    def __repr__(self) -> str:
        return (
            f"<TierKV tiers={self.tier_names} blocks={len(self._s.index.entries)}{' closed' if self._s.closed else ''}>"
        )
