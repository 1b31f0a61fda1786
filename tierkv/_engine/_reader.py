"""The read path of ``get``: admission, batched reads, verification, assembly.

Owns: adopting blocks another process committed on a shared tier, admission control
(``max_concurrent_fetches``), the fetch-vs-recompute gate's verdict, reading every
block of a prefix batched per tier with fall-back to a durable copy, checksum
verification (exact tiers against the raw CRC, lossy tiers by their codec), assembly
into the caller's buffer, miss reasons, and feeding the predictor with the access.

May not touch: placement (it only queues promotions through the service).
"""

from __future__ import annotations

import functools
import logging
import time
from typing import TYPE_CHECKING, Any, cast

import anyio
import anyio.lowlevel
import numpy as np

from .._device import check_device_kv, host_view, is_device_tensor
from .._device import copy as device_copy
from .._layout import as_numpy_kv, block_slice
from .._paged import PagedSink
from .._scheduling import shadow_id
from ..backend import SupportsArrayIO, SupportsDeviceIO, SupportsTagLookup
from ..errors import (
    BackendError,
    BlockNotFoundError,
    IntegrityError,
    KVLayoutError,
    LoadFailedError,
)
from ..scheduler._tau import TauAdapter
from ._index import Entry, pbin
from ._results import GetResult
from ._service import Promote
from ._tags import ZERO32, tag_checked, tag_checksum, unpack_tag

if TYPE_CHECKING:
    from ._store import Store

log = logging.getLogger("tierkv")

__all__ = ["Reader"]


class Reader:
    """Reads prefixes for ``get`` (see the module docstring)."""

    def __init__(self, s: Store) -> None:
        self.s = s

    async def drop_forged(self, keys: list[bytes], found: int, reason: str) -> None:
        """After a walk that ended on an entry whose tag is not of its chain: remove it."""
        if reason == "integrity" and found < len(keys):
            e = self.s.index.entries.get(keys[found].hex())
            if e is not None:
                self.s.tel.decision(
                    "forged_tag", {"tierkv.block": e.key[:16], "tierkv.tier": self.s.tiers[e.tier].name}
                )
                await self.s.mover.drop(e)

    async def adopt_shared(self, keys: list[bytes], start: int, tid: bytes) -> int:
        """Adopt blocks ``keys[start:]`` that another process committed on a shared
        tier (``capabilities.shared`` and :class:`SupportsTagLookup`), in chain
        order, stopping at the first key no such tier holds. A tag is adopted
        only if it is ours and names this model scope, tenant, position and
        parent; its CRC is verified by ``get`` as for any block. A tier error
        feeds that tier's breaker and ends the walk. Returns how many blocks
        were adopted."""
        shared = [
            (ti, t)
            for ti, t in enumerate(self.s.tiers)
            if t.healthy and t.backend.capabilities.shared and isinstance(t.backend, SupportsTagLookup)
        ]
        adopted = 0
        for i in range(start, len(keys) if shared else start):
            key = keys[i].hex()
            if key in self.s.index.entries:
                break
            hit: tuple[int, bytes] | None = None
            for ti, t in shared:
                backend = t.backend
                assert isinstance(backend, SupportsTagLookup)
                try:
                    tag = await backend.tag_of(key)
                except BackendError as exc:
                    self.s.tier_failed(ti, exc)
                    return adopted
                parsed = unpack_tag(tag) if tag is not None else None
                if tag is not None and parsed is not None:
                    ms, tenant, parent, pos, _crc, _nbytes, _root = parsed
                    if (ms, tenant, parent, pos) == (
                        self.s.model_scope[:16],
                        tid[:16],
                        keys[i - 1] if i else ZERO32,
                        i,
                    ):
                        hit = (ti, tag)
                        break
            if hit is None:
                break
            ti, tag = hit
            ms, tenant, parent, pos, crc, nbytes, root = unpack_tag(tag) or (b"", b"", b"", 0, 0, 0, b"")
            if key not in self.s.index.entries:
                adopted_e = Entry(key, ti, nbytes, tag, ms, tenant, parent, pos, crc)
                self.s.index.adopt(adopted_e, root)
                self.s.mover.arc_stored(adopted_e)
                self.s.tiers[ti].place(adopted_e)
            adopted += 1
        return adopted

    async def admitted_fetch(
        self,
        entries: list[Entry],
        wanted: int,
        out: Any,
        arr: np.ndarray[Any, Any],
        reason: str,
        tid: bytes,
        tail: int = 0,
    ) -> GetResult:
        """Admission control: at most ``max_concurrent_fetches`` reads at once; with
        ``fetch_wait_s`` a request that cannot start within that budget is
        answered at once as a miss (``overloaded``: the engine recomputes), so
        latency stays bounded during a miss storm."""
        wait = self.s.sched.fetch_wait_s
        if wait is None or not entries:
            async with self.s.fetch_limiter:
                return await self.fetch(entries, wanted, out, arr, reason, tid, tail)
        acquired = False
        with anyio.move_on_after(wait):
            await self.s.fetch_limiter.acquire()
            acquired = True
        if not acquired:
            return GetResult(0, None, (), "overloaded")
        try:
            return await self.fetch(entries, wanted, out, arr, reason, tid, tail)
        finally:
            self.s.fetch_limiter.release()

    def after_get(
        self, r: GetResult, entries: list[Entry], tid: bytes, span: Any, tokens: int, operator_reason: str
    ) -> None:
        """Account one get. ``misses_by_reason`` and the ``tierkv.misses`` metric are the
        operator's: they carry the operator's view of the reason (``operator_reason``, which
        may know of another tenant's blocks); the result and the span carry the caller's."""
        tel = self.s.tel
        tenant = tid.hex()
        if r.miss_reason:
            self.s.misses_by_reason[operator_reason] = self.s.misses_by_reason.get(operator_reason, 0) + 1
            tel.misses.add(1, {"reason": operator_reason, "tenant": tenant})
        if r.tokens:
            tel.tokens_saved += r.tokens
            tel.saved_tokens.add(r.tokens, {"tenant": tenant})
            tel.tenant_tokens.add(r.tokens, {"tenant": tenant, "op": "hit"})
        served = entries[: -(-r.tokens // self.s.block_tokens)]  # a tail's tokens round up to its entry
        for e in served:
            if e.key in self.s.prefetched:
                self.s.prefetched.discard(e.key)
                self.s.prefetch_stats["useful"] += 1
                tel.prefetch.add(1, {"outcome": "useful"})
        if span is not None and span.is_recording():
            span.set_attributes(
                {
                    "tierkv.tokens": tokens,
                    "tierkv.hit_tokens": r.tokens,
                    "tierkv.tiers_hit": list(r.tiers),
                    "tierkv.bytes": sum(e.nbytes for e in served),
                    "tierkv.codec": sorted({self.s.codec_name(e.tier) for e in served}),
                    "tierkv.exact": r.exact,
                    "tierkv.tenant": tenant,
                    "tierkv.miss_reason": r.miss_reason,
                }
            )
        # promotions of blocks served from slower tiers (background, never blocking this call)
        if self.s.service.running:
            healthy = [t.healthy for t in self.s.tiers]
            for e in served:
                if e.tier > 0:
                    dst = self.s.sched.promotion_target(e.cell, self.s.block_tokens, e.nbytes, e.tier, healthy, e.count)
                    if dst is not None:
                        self.s.service.submit(Promote(e.key, dst))

    #: a chunk put whose parent block was accessed at most this long ago (scheduler clock)
    #: continues that access (:meth:`record_chunk`): its earlier blocks are not refreshed again
    CHUNK_REFRESH_S = 1.0

    def record_access(
        self,
        entries: list[Entry],
        prompt_blocks: int,
        leading_seen: int,
        *,
        counted_from: int = 0,
        request: str | None = None,
    ) -> None:
        """Feed the predictor with one request's blocks and re-rank them (synchronous).

        Blocks are touched leaf first with increasing timestamps so that a
        parent always ranks at least as high as its descendants. The first
        ``counted_from`` entries were already counted for this request (a chunk
        put's earlier blocks, read or stored by the same request): their recency
        and rank are refreshed, no reuse is counted nor predicted for them.

        ``request``: the request's id (the hex key of the last whole block of its tokens): a
        transition label tied to it labels these blocks, and the access is remembered for the
        signals tied to it (``SchedulerState.note_request``); an untied label applies to this
        request and is then cleared."""
        sched = self.s.sched
        tied = sched.take_transition(request)
        now = sched.now()
        n = len(entries)
        mover = self.s.mover
        ranked = sched.policy != "lru"
        floor = -(1 << 62)  # parents never rank below their descendants (a child is useless alone)
        for i in range(n - 1, -1, -1):
            e = entries[i]
            if i < counted_from:
                e.t_last = now + (n - i) * 1e-6
                if ranked:
                    mover.rerank(e)
            else:
                self._observe(e, now, now + (n - i) * 1e-6, prompt_blocks, leading_seen, tied)
            if ranked:
                if e.rank < floor:
                    e.rank = floor
                floor = e.rank
            self.s.index.touch(e)
        self._end_access(entries[-1] if entries else None, n, now, request)

    def record_chunk(
        self, parent: Entry, entries: list[Entry], prompt_blocks: int, leading_seen: int, *, request: str | None
    ) -> None:
        """:meth:`record_access` of a chunk put's blocks ``entries`` (root first) that continue a
        chain whose blocks up to ``parent`` were accessed at most :attr:`CHUNK_REFRESH_S` ago
        (every access of a block accesses its ancestors too): the earlier blocks are not refreshed
        again, so the cost is the new blocks', not the prefix's. The new blocks are placed as a
        full refresh would order them: just below their parent in recency (the deepest is the
        least recent) and ranked at most as high as it (a parent never ranks below a
        descendant; equal keys: the child leaves first). Synchronous."""
        sched = self.s.sched
        tied = sched.take_transition(request)
        now = sched.now()
        ranked = sched.policy != "lru"
        index, tiers = self.s.index, self.s.tiers
        for k in range(len(entries) - 1, -1, -1):  # observed leaf first, as record_access does
            self._observe(entries[k], now, parent.t_last - (k + 1) * 1e-6, prompt_blocks, leading_seen, tied)
        above = parent
        for e in entries:
            if ranked and e.rank > above.rank:
                e.rank = above.rank
            index.touch(e)
            if e.tier == above.tier and e.row >= 0 and above.row >= 0:
                t = tiers[e.tier]
                if t.lru.has(e.row) and t.lru.has(above.row):
                    t.lru.move_before(e.row, above.row)
                    if t.ranked:
                        t.queue.set_before(e.row, e.rank, above.row)
            above = e
        self._end_access(entries[-1] if entries else parent, prompt_blocks, now, request)

    def _observe(
        self, e: Entry, now: float, t_last: float, prompt_blocks: int, leading_seen: int, tied: int | None
    ) -> None:
        """One block of a request, not yet counted for it: resolve its previous prediction, count
        it, place it in its predictor cell at ``t_last``, feed the shadows and re-key it."""
        sched = self.s.sched
        pred = sched.predictor
        tel = self.s.tel
        if e.count and tel.enabled:  # resolve the previous prediction: reused within the horizon?
            reused = now - e.t_last <= pred.horizon
            tel.calibration.add(1, {"bin": pbin(e.p_pred), "outcome": "reused" if reused else "not_reused"})
        hit = e.count > 0  # held before this request (a block stored by this put has count 0)
        sid = shadow_id(e.key)
        if hit:
            sched.count_access(sid)  # (a new block was counted by the put that stored it)
            if e.row >= 0:  # used by a second request: ARC's frequent list
                self.s.tiers[e.tier].make_frequent(e.row)
        e.count += 1
        e.t_last = t_last
        e.cell = sched.cell(
            label=e.label,
            position=e.pos,
            prompt_blocks=prompt_blocks,
            leading_seen=leading_seen,
            count=e.count - 1,
            fanout=e.children,
            transition=tied,
        )
        e.p_pred = sched.p_reuse(e.cell)
        pred.observe(now, e.bid, e.cell)
        sched.observe_ranked(sid, e.cell, now, e.children, hit)
        self.s.mover.rerank(e)

    def _end_access(self, leaf: Entry | None, blocks: int, now: float, request: str | None) -> None:
        sched = self.s.sched
        sched.predictor.advance(now)
        sched.transition = None  # an untied label applies to the next request only
        if leaf is not None:
            sched.note_request(request or leaf.key, now, leaf.key, blocks, leaf.bid, leaf.cell)
        sched.end_request(now)
        if sched.slru:  # the segmented LRU: a second use may have moved blocks to the protected segment
            self._trim_protected()
        self.s.mover.refresh_ranking()  # the adaptive tau may have switched, or importance changed

    def _trim_protected(self) -> None:
        """Trim the protected segment of every full tier (no room for one more block below its high
        watermark: where victims are picked) to ``TauAdapter.PROTECTED`` of its blocks, once a
        request's access is recorded (its second uses promoted). Not when a victim is picked: the
        blocks demoted then would land behind the put's own new blocks, where the victim search
        leaves probation (:meth:`Mover.pick_victims <tierkv._engine._mover.Mover.pick_victims>`)."""
        s = self.s
        share = TauAdapter.PROTECTED
        for t in s.tiers:
            if t.arc[1].n <= int(share * t.lru.n):
                continue  # within its share: nothing to trim (and no stats to read)
            st = t.backend.stats()  # (in memory)
            if st.used_bytes + s.block_nbytes > t.high * st.capacity_bytes:
                t.trim_frequent(share)

    async def read_blocks(self, entries: list[Entry], served: list[int]) -> list[memoryview | BaseException]:
        """Read every entry's bytes, batched per tier; a failure is returned in
        place. ``served[i]`` is set to the tier entry ``i`` was read from."""
        results: list[memoryview | BaseException] = [BlockNotFoundError("unread")] * len(entries)
        by_tier: dict[int, list[int]] = {}
        for i, e in enumerate(entries):
            ti = e.tier if self.s.tiers[e.tier].healthy or e.backing < 0 else e.backing
            served[i] = ti
            by_tier.setdefault(ti, []).append(i)
        for ti, idxs in by_tier.items():
            await self.read_tier(ti, idxs, entries, results)
        for i, r in enumerate(results):
            e = entries[i]
            if isinstance(r, BlockNotFoundError) and e.tier != served[i]:
                # moved by a concurrent promotion/demotion while we read: read where it is now
                try:
                    results[i] = await self.s.read_raw(e.tier, e.key)
                    served[i] = e.tier
                    continue
                except BackendError as exc:
                    results[i] = r = exc
            # serve from the durable copy when the fast copy failed
            if isinstance(r, BaseException) and e.backing >= 0 and e.backing != e.tier:
                try:
                    results[i] = await self.s.read_raw(e.backing, e.key)
                except BackendError:
                    continue
                served[i] = e.backing
                await self.s.mover.retarget(e, e.backing, claimed=False)
        return results

    async def read_tier(
        self, ti: int, idxs: list[int], entries: list[Entry], results: list[memoryview | BaseException]
    ) -> None:
        """Batch-read the entries ``idxs`` from tier ``ti`` into ``results``;
        feeds the tier's bandwidth estimator and circuit breaker."""
        tier = self.s.tiers[ti]
        backend = tier.backend
        t0 = time.perf_counter()
        stored = 0
        t1 = t0
        try:
            views = await backend.read_many([entries[i].key for i in idxs])
            t1 = time.perf_counter()
            stored = sum(len(v) for v in views)
            if tier.codec is not None:
                views = [await self.s.decoded(ti, entries[i].key, v) for i, v in zip(idxs, views, strict=True)]
        except BackendError as batch_exc:
            pending: BackendError | None = batch_exc if isinstance(batch_exc, IntegrityError) else None
            for i in idxs:  # find which block failed
                try:
                    results[i] = await self.s.read_raw(ti, entries[i].key)
                    tier.breaker.record_success()
                except BlockNotFoundError as exc:
                    # blocks the batch found corrupt are quarantined, so they now read as missing:
                    # after a batch IntegrityError every such block counts as corrupt
                    results[i] = pending or exc
                except IntegrityError as exc:
                    results[i] = exc
                except BackendError as exc:
                    results[i] = exc
                    self.s.tier_failed(ti, exc)
            return
        tier.breaker.record_success()
        raw = 0
        for i, v in zip(idxs, views, strict=True):
            results[i] = v
            raw += len(v)
        # the transfer and the decode are measured apart: the gate models them apart
        self.s.sched.estimators[ti].observe(stored, t1 - t0)
        if tier.codec is not None:
            self.s.sched.observe_decode(ti, raw, time.perf_counter() - t1)

    async def fetch(
        self,
        entries: list[Entry],
        wanted: int,
        out: Any,
        arr: np.ndarray[Any, Any],
        reason: str,
        tid: bytes,
        tail: int = 0,
    ) -> GetResult:
        """Read ``entries`` (whole blocks, the last a tail of ``tail`` tokens when ``tail``)
        into ``out`` (or a new array); ``wanted``: the whole blocks the request has."""
        bt = self.s.block_tokens
        n = len(entries)
        whole = n - 1 if tail else n
        miss_reason = "" if whole == wanted else self.s.index.miss_reason(arr, whole, reason, tid)[0]
        if n == 0:
            if wanted:
                self.s.tiers[-1].misses += 1
            return GetResult(0, None, (), miss_reason)
        by_tier: dict[int, int] = {}
        for e in entries:
            by_tier[e.tier] = by_tier.get(e.tier, 0) + e.nbytes
        total = whole * bt + tail
        decision = self.s.sched.gate(total, by_tier)
        if decision is not None:
            self.s.tel.gate.add(1, {"decision": "fetch" if decision.fetch else "recompute"})
            with self.s.tel.span(
                "tierkv.gate",
                {
                    "tierkv.fetch_s": decision.fetch_s,
                    "tierkv.recompute_s": decision.recompute_s,
                    "tierkv.decision": "fetch" if decision.fetch else "recompute",
                    "tierkv.reason": decision.reason,
                    "tierkv.probe": decision.probe,
                    "tierkv.tokens": total,
                },
            ):
                pass
            if not decision.fetch:
                return GetResult(0, None, (), "gated", decision.fetch_s, decision.recompute_s)
        sink = out if isinstance(out, PagedSink) else None
        target = self.out_view(out, total) if sink is None else None
        served = [e.tier for e in entries]
        # blocks scattered by their tier straight into ``target`` (or the paged caches) ...
        done = await self.read_direct(entries, target, sink, total)
        datas: list[memoryview | BaseException] = [memoryview(b"")] * n
        good = n
        rest = [i for i in range(n) if i not in done]
        if rest:  # ... and the others read, checked and copied in the checked way
            sub_served = [served[i] for i in rest]
            sub = await self.read_blocks([entries[i] for i in rest], sub_served)
            for j, i in enumerate(rest):
                datas[i], served[i] = sub[j], sub_served[j]
            good = await anyio.to_thread.run_sync(
                functools.partial(self.assemble, entries, datas, served, sink, target, total, rest)
            )
        per_tier: dict[int, list[int]] = {}
        for i in range(good):
            e, tier = entries[i], self.s.tiers[served[i]]
            tier.hits += 1
            tier.bytes_out += e.nbytes
            acc = per_tier.setdefault(served[i], [0, 0])
            acc[0] += 1
            acc[1] += e.nbytes
        for ti, (blocks, nbytes) in per_tier.items():  # one observation per tier per request
            self.s.tel.hits.add(blocks, {"tier": self.s.tiers[ti].name})
            self.s.tel.bytes_read.add(nbytes, {"tier": self.s.tiers[ti].name})
        if good < n:
            e, err = entries[good], datas[good]
            tier = self.s.tiers[e.tier]
            tier.misses += 1
            if isinstance(err, BlockNotFoundError) and (
                e.tier != served[good] or self.s.index.entries.get(e.key) is not e
            ):
                miss_reason = "evicted_local"  # moved or dropped by another task during this read
            elif isinstance(err, (BlockNotFoundError, IntegrityError)):
                if isinstance(err, IntegrityError):
                    miss_reason = "integrity"
                else:
                    miss_reason = "evicted_remote" if tier.backend.capabilities.shared else "evicted_local"
                await self.discard_failed_copy(e)
            else:
                if self.s.config.load_failure == "fail":
                    raise LoadFailedError(f"reading block {good} from tier {tier.name!r} failed: {err}") from (
                        err if isinstance(err, BaseException) else None
                    )
                miss_reason = "tier_unhealthy" if not tier.healthy else "tier_error"
        # blocks after the first failure that the tier found corrupt (a batch read quarantines
        # every corrupt block it meets) leave the index too, else they would stay indexed on a
        # tier that no longer has them and a later put would skip them as existing. A missing
        # block there is left alone: it may be a transient race, settled when it is read first.
        for i in range(good + 1, n):
            e_i, err_i = entries[i], datas[i]
            if isinstance(err_i, IntegrityError) and e_i.tier == served[i] and self.s.index.entries.get(e_i.key) is e_i:
                await self.discard_failed_copy(e_i)
        if good == 0:
            return GetResult(0, None, (), miss_reason)
        got = total if good == n else good * bt  # a tail is the last entry: whole blocks before it
        used = set(served[:good])
        tiers = tuple(t.name for i, t in enumerate(self.s.tiers) if i in used)
        exact = all(e.exact and self.s.exact_tier(ti) for e, ti in zip(entries[:good], served[:good], strict=True))
        if sink is not None:
            return GetResult(got, None, tiers, miss_reason, exact=exact)
        if out is not None:
            return GetResult(got, out, tiers, miss_reason, exact=exact)
        assert target is not None
        result = target if good == n else np.ascontiguousarray(target[block_slice(self.s.spec, 0, got)])
        return GetResult(got, result, tiers, miss_reason, exact=exact)

    def assemble(
        self,
        entries: list[Entry],
        datas: list[memoryview | BaseException],
        served: list[int],
        sink: PagedSink | None,
        target: np.ndarray[Any, Any] | None,
        total: int,
        positions: list[int],
    ) -> int:
        """Check each block read at ``positions`` (ascending; size, and the checksum on a
        verifying tier) and copy it into ``target`` (or the paged ``sink``), in a worker
        thread; returns the first position whose block is bad (its error is put in
        ``datas``), or ``len(entries)``. ``total``: the tokens of all ``entries`` (the last
        may be a tail, shorter than a block)."""
        bt = self.s.block_tokens
        for i in positions:
            e, d = entries[i], datas[i]
            if isinstance(d, BaseException):
                return i
            ti = served[i]  # where it was read from (read_blocks may have fallen back)
            verify = self.s.exact_tier(ti) and self.s.verifies(ti) and tag_checked(e.tag)
            if len(d) != e.nbytes or (verify and tag_checksum(e.tag, d) != e.crc):
                datas[i] = IntegrityError(f"block {e.key[:16]} failed its checksum", tier=self.s.tiers[e.tier].name)
                return i
            if sink is not None:
                sink.place(i, d)
                continue
            assert target is not None
            end = min((i + 1) * bt, total)
            shape = self.s.block_shape if end - i * bt == bt else self.s.spec.kv_shape(end - i * bt)
            blk = np.frombuffer(d, dtype=self.s.dtype).reshape(shape)
            view = target[block_slice(self.s.spec, i * bt, end)]
            if is_device_tensor(view):  # a host block to the accelerator (one copy)
                device_copy(view, host_view(np.frombuffer(d, dtype=np.uint8), view))
            else:
                view[...] = blk
        return len(entries)

    async def read_direct(
        self, entries: list[Entry], target: np.ndarray[Any, Any] | None, sink: PagedSink | None, total: int
    ) -> set[int]:
        """The one-copy read: the blocks on a healthy tier without a codec that does not verify
        reads and scatters into arrays itself (:class:`SupportsArrayIO`) are copied by that
        tier straight into their place in ``target`` (or their engine blocks in ``sink``),
        one batch per such tier; into an accelerator ``target``, a device-resident tier's
        blocks (:class:`SupportsDeviceIO`) too, on the device. Returns the positions so read;
        the others (other tiers, or a tier that failed: nothing to rely on there) are for the
        checked read."""
        bt, spec = self.s.block_tokens, self.s.spec
        on_device = target is not None and is_device_tensor(target)
        by_tier: dict[int, list[int]] = {}
        for i, e in enumerate(entries):
            by_tier.setdefault(e.tier, []).append(i)
        done: set[int] = set()
        for ti, idxs in by_tier.items():
            tier = self.s.tiers[ti]
            backend = tier.backend
            array_io = isinstance(backend, SupportsArrayIO)
            if (
                tier.codec is not None
                or self.s.verifies(ti)
                or not tier.healthy
                or not (array_io or (on_device and isinstance(backend, SupportsDeviceIO)))
            ):
                continue
            if not array_io:
                if await self._read_device(ti, idxs, entries, target, total):
                    done.update(idxs)
                continue
            views: list[Any]
            if sink is not None:
                views = [sink.parts(i) for i in idxs]
            else:
                assert target is not None
                views = [target[block_slice(spec, i * bt, min((i + 1) * bt, total))] for i in idxs]
            t0 = time.perf_counter()
            try:
                await cast("SupportsArrayIO", backend).read_arrays([entries[i].key for i in idxs], views)
            except BackendError as exc:
                if not isinstance(exc, (BlockNotFoundError, IntegrityError)):
                    self.s.tier_failed(ti, exc)
                continue
            tier.breaker.record_success()
            self.s.sched.estimators[ti].observe(sum(entries[i].nbytes for i in idxs), time.perf_counter() - t0)
            done.update(idxs)
        return done

    async def _read_device(self, ti: int, idxs: list[int], entries: list[Entry], target: Any, total: int) -> bool:
        """:meth:`read_direct` of the blocks at ``idxs`` into an accelerator ``target`` from a
        device-resident tier (:class:`SupportsDeviceIO`): each block is read on the device and
        copied into its place there; it never crosses to the host."""
        tier = self.s.tiers[ti]
        backend = cast("SupportsDeviceIO", tier.backend)
        bt, spec = self.s.block_tokens, self.s.spec
        t0 = time.perf_counter()
        import torch

        try:
            for i in idxs:
                e = entries[i]
                view = target[block_slice(spec, i * bt, min((i + 1) * bt, total))]
                buf = torch.empty(e.nbytes, dtype=torch.uint8, device=view.device)
                got = await backend.read_device(e.key, into=buf)
                await anyio.to_thread.run_sync(device_copy, view, got.view(view.dtype).reshape(view.shape))
        except BackendError as exc:
            if not isinstance(exc, (BlockNotFoundError, IntegrityError)):
                self.s.tier_failed(ti, exc)
            return False
        tier.breaker.record_success()
        self.s.sched.estimators[ti].observe(sum(entries[i].nbytes for i in idxs), time.perf_counter() - t0)
        return True

    async def discard_failed_copy(self, e: Entry) -> None:
        """A read found the serving copy of ``e`` missing or corrupt: evict it; the durable
        copy (if on another tier) serves the next request, else ``e`` leaves the index."""
        await self.drop_quietly(e)
        if e.backing >= 0 and e.backing != e.tier:
            await self.s.mover.retarget(e, e.backing, claimed=False)
        else:
            await self.s.mover.forget(e, None)

    async def drop_quietly(self, e: Entry) -> None:
        try:
            await self.s.tiers[e.tier].backend.evict(e.key)
        except BackendError:
            pass

    def out_view(self, out: Any, tokens: int) -> Any:
        """Where a get writes: a new array (``out`` None), a numpy view of ``out``, or ``out``
        itself for an accelerator tensor; KVLayoutError for a wrong type, shape or dtype."""
        if out is None:
            return np.empty(self.s.spec.kv_shape(tokens), dtype=self.s.dtype)
        if not isinstance(out, np.ndarray) and not type(out).__module__.startswith("torch"):
            raise KVLayoutError("out type", "a numpy array or a torch tensor", type(out).__name__)
        shape = tuple(out.shape)
        expected = self.s.spec.kv_shape(tokens)
        ax = 1 if self.s.spec.attention == "mla" else 2
        if len(shape) != len(expected) or any(
            (s != x) if j != ax else (s < x) for j, (s, x) in enumerate(zip(shape, expected, strict=True))
        ):
            raise KVLayoutError("out shape", f"{expected} (or more tokens on axis {ax})", shape)
        if is_device_tensor(out):
            return check_device_kv(out, self.s.spec, self.s.config.kv_dtype, shape[ax], what="out")
        probe = as_numpy_kv(out, self.s.spec, self.s.config.kv_dtype, shape[ax])
        if not probe.flags.writeable:
            raise KVLayoutError("out", "a writable buffer", "read-only")
        return probe
