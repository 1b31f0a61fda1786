"""The put path: storing the new blocks of a prefix, given how to get each block's bytes.

Owns: deciding which blocks a put writes (absent ones; with ``durable``, those without a
durable copy), whether their checksum is computed now (the block's first tier verifies
reads, or ``durable``) and whether a block goes to its tier as the caller's strided view
(one copy, :class:`~tierkv.backend.SupportsArrayIO`), the tag of each block, the per-block
shielded store (:meth:`Durable.store_block`), the put's span and telemetry, recording the
access, and the rebalance that follows. ``TierKV.put`` and ``put_paged`` validate their
arguments and hand over a ``block(i)`` function.

May not touch: argument validation (the front's), the index's internals, backends directly.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
import numpy as np

from .._device import is_device_tensor
from .._keys import tail_key
from .._scheduling import raw_shadow_id, shadow_id
from ..errors import CapacityError, InputError, TierUnavailableError
from ._durable import BlockData, flat, nbytes_of
from ._entry import handle
from ._results import PutResult
from ._service import Rebalance
from ._tags import ZERO32, checksum, pack_tag, root_of

if TYPE_CHECKING:
    from ._entry import Entry
    from ._store import Store

__all__ = ["Writer"]

#: a put's blocks go to the fastest tier in batches of at most this many bytes (Durable.store_batch):
#: one allocation, one shedding and one copy each (the copy is cancellable at the tier's slice
#: boundaries, and a cancelled batch stores none of its blocks); per batch the fixed work and the
#: start of the tier's second copy thread cost ~0.3 ms on the 2-vCPU development VM, ~10% of a
#: 32 MiB batch's copy: a large put goes in few large batches
_BATCH_BYTES = 256 << 20
#: a batch that does not fit in the tier's free bytes makes room by shedding blocks, and its copy is
#: then shielded (the shed blocks' room is not thrown away by a cancel): such batches stay this
#: small, so that a cancel waits for at most one of their copies (~3 ms at memory speed)
_SHED_BATCH_BYTES = 32 << 20
#: a put of at least this many new bytes is batched in batches of up to _BATCH_BYTES: what a
#: tier copies on two cores (the DRAM tier's ``large_copies = "auto"``)
_BATCH_MIN = 16 << 20
#: a smaller put is batched in batches of up to this many bytes (at least one block each): one
#: allocation, one shedding and one copy per batch instead of per block, a cancel taking effect
#: after at most one batch's copy when it had to shed (well under a millisecond)
_SMALL_BATCH_BYTES = 2 << 20


class Writer:
    """Stores the new blocks of a prefix (see the module docstring)."""

    def __init__(self, s: Store) -> None:
        self.s = s

    def _admitted(
        self,
        keys: list[bytes],
        todo: list[int],
        new: list[bool],
        durable: bool,
        tid: bytes,
        tail: bytes | None = None,
        tail_nbytes: int = 0,
    ) -> tuple[list[int], bool]:
        """The adaptive policy's admission filter (synchronous): count the put's missed blocks in
        the frequency sketches (``SchedulerState.count_access``); while admission is on
        (``SchedulerState.admit``) and the cache has no room for them, keep ``todo`` only up to the
        first missed block that is not more frequent than the cache's next victim by the mode's
        counts (``SchedulerState.admission_sketch``; the blocks after it would be unreachable). ``new[j]``: block
        ``todo[j]`` is not stored (else it is in ``todo`` for a durable copy); a durable put
        is never filtered (it promises every block committed on a persistent tier). The room is
        what the tiers hold below their high watermarks (above them a put's rebalance sheds).
        Under a quota of tenant ``tid`` that leaves less room than that, the victim is the
        tenant's own next one (a tenant at its quota evicts only its own blocks).

        ``tail``: the raw key of the put's partial last block when it is not stored yet (``partial_blocks``),
        of ``tail_nbytes`` bytes, counted and filtered as one more missed block after ``todo``. Returns
        the kept ``todo`` and whether the tail may be stored."""
        sched = self.s.sched
        whole = sum(new)  # the missed whole blocks (the tail, if any, comes on top)
        ids = [raw_shadow_id(keys[i]) if n else 0 for i, n in zip(todo, new, strict=True)]
        for sid, n in zip(ids, new, strict=True):
            if n:
                sched.count_access(sid)
        if tail is not None:
            ids.append(raw_shadow_id(tail))
            new = [*new, True]
            sched.count_access(ids[-1])
        if durable or not sched.admit:
            return todo, True
        sk = sched.admission_sketch
        assert sk is not None
        loads = self.s.loads()
        # the room the new blocks take where they go first (whole granules of the fastest healthy tier:
        # a tail takes its own bytes' worth, not a block's)
        fit = self.s.mover.room_of(next((i for i, ld in enumerate(loads) if ld.healthy), 0))
        need = whole * fit(self.s.block_nbytes) + (fit(tail_nbytes) if tail is not None else 0)
        room = sum(max(0, int(ld.high_watermark * ld.capacity) - ld.used) for ld in loads if ld.healthy)
        tenant: bytes | None = None
        q = self.s.quota_for(tid)
        if q is not None:
            usage = [t.tenant_bytes.get(tid, 0) for t in self.s.tiers]
            own = q.total - sum(usage) if q.total is not None else None
            limits = [q.per_tier.get(t.name) for t in self.s.tiers]
            if None not in limits:  # every tier capped: the caps bound the tenant's room too
                per = sum(
                    max(0, lim - u)
                    for lim, u, ld in zip(limits, usage, loads, strict=True)
                    if ld.healthy and lim is not None
                )
                own = per if own is None else min(own, per)
            if own is not None and own < min(room, need):
                room, tenant = own, tid
        if room >= need:
            return todo, True
        victims: list[Entry] = []
        for ti in range(len(loads) - 1, -1, -1):  # the bottom healthy tier (holding the tenant's blocks)
            if loads[ti].healthy:
                victims = self.s.mover.pick_victims(ti, 1, tenant)
                if victims or tenant is None:
                    break
        if not victims:
            return todo, True
        victim = sk.get(shadow_id(victims[0].key))
        for j, (n, sid) in enumerate(zip(new, ids, strict=True)):
            if n and sk.get(sid) <= victim:  # (read after every count: an aging in between halved both)
                return todo[:j], False
        return todo, True

    def _followed(
        self, keys: list[bytes], todo: list[int], missed: list[bool], tail: bytes | None = None
    ) -> tuple[list[int], list[bool], bool]:
        """The session mode's admission (``SchedulerState.session_mode``): ``todo`` and ``missed`` up to
        the first missed block the session shadow did not keep when it saw this request (a block after
        it would be unreachable), and whether the put's new partial last block ``tail`` (raw key; None:
        none) may be stored: only after every missed block was kept, and if the shadow kept it too.
        Synchronous."""
        ses = self.s.sched.session
        assert ses is not None
        for j, (i, m) in enumerate(zip(todo, missed, strict=True)):
            if m and not ses.holds(keys[i]):
                return todo[:j], missed[:j], tail is None
        return todo, missed, tail is None or ses.holds(tail)

    async def put_blocks(
        self,
        arr_tokens: np.ndarray[Any, Any],
        keys: list[bytes],
        tid: bytes,
        first: int,
        block: Callable[[int], BlockData],
        block_type: str | None,
        durable: bool,
        tail_block: Callable[[int], BlockData] | None = None,
        seed: bytes = b"",
    ) -> PutResult:
        """Store blocks ``first..`` of a prefix; ``block(i)`` gives block ``i``'s KV as an
        array of any strides (its elements in C order are the block's bytes).

        ``tail_block`` (``partial_blocks`` on, canonical layout only): ``tail_block(t)``
        gives the KV of the trailing ``t`` tokens past the whole blocks; that partial last
        block (a *tail*) is stored too, under :func:`~tierkv._keys.tail_key` of its parent
        (the last whole block's key, or ``seed`` for a sequence shorter than one block),
        once every whole block before it is stored (a tail after a gap could never be
        found). A tail is a leaf: it is stored, tiered, verified and evicted as a block."""
        bt = self.s.block_tokens
        if block_type is not None and not isinstance(block_type, str):
            raise InputError(f"block_type: expected a string or None, got {type(block_type).__name__}")
        if durable and self.s.persistent_tier() is None:
            raise TierUnavailableError("put(durable=True) needs a healthy persistent tier (e.g. nvme or pfs)")
        tail = len(arr_tokens) - len(keys) * bt
        # the raw key of the partial last block this put stores (None: none, or partial_blocks off)
        tkey = (
            tail_key(keys[-1] if keys else seed, arr_tokens[len(keys) * bt :])
            if tail_block is not None and tail
            else None
        )
        todo: list[int] = []
        missed: list[bool] = []  # per ``todo`` entry: not stored at all (else: a durable copy wanted)
        existing = 0
        # this put's own stored blocks (and the parent of ``start``) are kept while it stores the
        # rest: a put never drops its own chain at the bottom tier to make room (that would only
        # leave its later blocks behind a gap; above it they may move down); when nothing else is
        # left to evict, it stops there
        own: list[Entry] = []
        if first:
            e = self.s.index.entries.get(keys[first - 1].hex())
            if e is not None:
                own.append(e)
        sched = self.s.sched
        arc = sched.arc
        for i in range(first, len(keys)):
            e = self.s.index.entries.get(keys[i].hex())
            if e is None or (durable and e.backing < 0):
                todo.append(i)
                missed.append(e is None)
            if e is not None:
                existing += 1
                self.s.index.touch(e)
                if arc and e.count and e.row >= 0:
                    # on ARC a block another request used joins the frequent list before the new ones
                    # are stored, as ARC serves a request (and its shadow does): the put's victims
                    # are then never its own used blocks left in the recent list
                    self.s.tiers[e.tier].make_frequent(e.row)
                own.append(e)
        # the tail, when not stored yet, is admitted as one more missed block after ``todo``
        new_tail = tkey if tkey is not None and tkey.hex() not in self.s.index.entries else None
        tail_ok = True
        if sched.session is not None:  # the adaptive policy's session shadow sees every request
            sched.session_put(keys, first, sched.now(), tkey)
            if not durable and sched.session_mode and (todo or new_tail is not None):
                todo, missed, tail_ok = self._followed(keys, todo, missed, new_tail)
        if (todo or new_tail is not None) and sched.sketch is not None:
            todo, admitted_tail = self._admitted(
                keys, todo, missed, durable, tid, new_tail if tail_ok else None, self.s.block_nbytes * tail // bt
            )
            tail_ok = tail_ok and admitted_tail
        tiers_used: list[str] = []
        stored = 0

        # the checksum is computed here when the block's first copy must carry one (its tier
        # verifies reads, or durable=True); else the tier that first needs it computes it
        fastest = next((ti for ti, t in enumerate(self.s.tiers) if t.healthy), 0)
        top = self.s.tiers[fastest]
        checked = durable or self.s.needs_checksum(fastest)
        # nothing to hash and a tier that gathers strided arrays itself: the block is copied
        # once, from the caller's memory into the tier's (no intermediate, no thread hop)
        # (an accelerator block likewise, or stays on the device for a device-resident tier)
        on_device = bool(todo) and is_device_tensor(block(todo[0]))
        direct = not checked and top.codec is None and (top.array_io or (on_device and top.device_io))

        def prepare() -> list[tuple[int, BlockData, int]]:
            out: list[tuple[int, BlockData, int]] = []
            for i in todo:
                blk = block(i)
                if direct:
                    out.append((i, blk, 0))
                    continue
                data = flat(blk)
                out.append((i, data, checksum(data) if checked else 0))
            return out

        label = self.s.sched.block_type_index(block_type)
        root = root_of(arr_tokens, bt) if keys else b""
        span_cm = self.s.tel.timed("put")
        span = span_cm.__enter__()
        try:
            with self.s.index.kept(own) as held:

                def tag_of(i: int, data: BlockData, crc: int) -> tuple[bytes, bytes]:
                    """(parent key, tag) of block ``i``."""
                    parent = keys[i - 1] if i else ZERO32
                    return parent, pack_tag(
                        self.s.model_scope, tid, parent, i, crc, nbytes_of(data), root, checked=checked
                    )

                def account(key: str, new: bool) -> int:
                    """Keep block ``key`` just stored (or found) for the rest of the put, note its
                    tier; 1 if this put stored it, else 0."""
                    e = self.s.index.entries.get(key)
                    if e is not None:
                        held.add(e)
                        if new and self.s.tiers[e.tier].name not in tiers_used:
                            tiers_used.append(self.s.tiers[e.tier].name)
                    return int(new)

                prepared = (prepare() if direct else await anyio.to_thread.run_sync(prepare)) if todo else []
                done = 0
                batchable = direct and not durable and not on_device and len(prepared) > 1
                if batchable:
                    # the blocks in batches of at most _BATCH_BYTES (a large put: a tier copies a large
                    # batch on two cores) or _SMALL_BATCH_BYTES: one allocation and one backend call
                    # each, one batch's copy at most between checkpoints
                    total = sum(nbytes_of(d) for _, d, _ in prepared)
                    limit = _BATCH_BYTES if total >= _BATCH_MIN else _SMALL_BATCH_BYTES
                    while done < len(prepared):
                        if limit > _SHED_BATCH_BYTES:
                            st = top.backend.stats()
                            if st.capacity_bytes - st.used_bytes < min(limit, total):
                                limit = _SHED_BATCH_BYTES  # the rest sheds: shielded copies, kept short
                        end, size = done, 0
                        while end < len(prepared) and (end == done or size + nbytes_of(prepared[end][1]) <= limit):
                            size += nbytes_of(prepared[end][1])
                            end += 1
                        items = []
                        for i, data, crc in prepared[done:end]:
                            parent, tag = tag_of(i, data, crc)
                            items.append((keys[i].hex(), data, tag, i, parent))
                        # (allocation and indexing shielded inside; a cancel during the copy of a
                        # batch that did not shed stores none of it and ends the put here)
                        flags = await self.s.durable.store_batch(items, tid, root, label)
                        total -= size
                        for (key, _, _, _, _), new in zip(items, flags, strict=False):
                            stored += account(key, new)
                        done += len(flags)
                        await anyio.lowlevel.checkpoint_if_cancelled()
                        if len(flags) < len(items):
                            break  # the rest one by one
                for i, data, crc in prepared[done:]:
                    parent, tag = tag_of(i, data, crc)
                    key = keys[i].hex()
                    try:
                        with anyio.CancelScope(shield=True):
                            placed = await self.s.durable.store_block(
                                key, data, tag, i, tid, parent, durable, root, label
                            )
                    except CapacityError:
                        if not held:
                            raise
                        break  # only this put's own blocks are left to drop: it stops here
                    if placed is None:
                        # another task is storing this block right now: wait until it is indexed (and
                        # durable, if asked), so that on return every block of the prefix is stored
                        store = functools.partial(
                            self.s.durable.store_block, key, data, tag, i, tid, parent, durable, root, label
                        )
                        await self.s.durable.await_concurrent_store(key, store, data, tag, durable)
                        continue
                    stored += account(key, placed)
                    await anyio.lowlevel.checkpoint_if_cancelled()
            index = self.s.index
            head = index.find_rows(keys[:first])  # the blocks before ``start``, as arrays when many
            # with ``start``: the stored prefix ends at the first block before it that is missing
            new_entries = [index.entries.get(k.hex()) for k in keys[first:]]
            if -1 in head:
                lead = head.index(-1)
            else:  # (a new block pushed out again, by a concurrent put, ends the stored prefix too)
                lead = first + (new_entries.index(None) if None in new_entries else len(new_entries))
            above = handle(index.cols, head[-1]) if head and -1 not in head else None
            chunk = (
                above is not None
                and self.s.sched.now() - above.t_last <= self.s.reader.CHUNK_REFRESH_S
                and not (block_type == "tool_context" and self.s.sched.tool is not None)
            )
            fresh = [e for e in new_entries if e is not None]  # (and the tail, below)
            entries: list[Entry]
            if chunk and above is not None:  # the prefix up to ``start`` was accessed just now: not walked again
                present: list[Entry | None] = [*([above] * first), *new_entries]
                entries = [above] * first + fresh
            else:
                present = [handle(index.cols, r) if r >= 0 else None for r in head] + new_entries
                entries = [e for e in present if e is not None]
            covered = lead * bt
            tail_e = None
            if (
                tkey is not None
                and tail_block is not None
                and tail_ok
                and lead == len(keys)
                and None not in new_entries
            ):
                placed_tail, tail_e = await self._put_tail(
                    tkey, keys, tid, tail, tail_block, seed, checked, direct, durable, label
                )
                if tail_e is not None:
                    entries.append(tail_e)
                    fresh.append(tail_e)
                    covered += tail
                    tail = 0
                    if placed_tail:
                        stored += 1
                        if self.s.tiers[tail_e.tier].name not in tiers_used:
                            tiers_used.append(self.s.tiers[tail_e.tier].name)
                    else:
                        existing += 1
            sched = self.s.sched
            lost_tail = tkey if tail_e is None else None
            if sched.tau_adapter is not None and (lost_tail is not None or any(p is None for p in present)):
                # blocks not stored or pushed out again by their own put (and a tail not stored): the
                # shadow caches still see the access, leaf first
                now = sched.now()
                if lost_tail is not None:
                    sched.observe_ranked(raw_shadow_id(lost_tail), 0, now)
                for i in range(len(keys) - 1, -1, -1):
                    if present[i] is None:
                        sched.observe_ranked(raw_shadow_id(keys[i]), 0, now)
            # a chunk put (``start``): the blocks before it were read or stored by this request already
            request = keys[-1].hex() if keys else None
            if chunk and above is not None:
                self.s.reader.record_chunk(above, fresh, len(keys), existing, request=request)
            else:
                counted = sum(1 for e in present[:first] if e is not None)
                self.s.reader.record_access(entries, len(keys), existing, counted_from=counted, request=request)
            if block_type == "tool_context" and self.s.sched.tool is not None:
                self.s.tool_blocks[self.s.sched.tool] = [k.hex() for k in keys]
                self.s.sched.chain.observe_size(self.s.sched.tool, sum(e.nbytes for e in entries))
            self.s.tel.tenant_tokens.add(
                (len(keys) - first) * bt + (covered - lead * bt), {"tenant": tid.hex(), "op": "put"}
            )
            if span is not None and span.is_recording():
                span.set_attributes(
                    {
                        "tierkv.tokens": len(arr_tokens),
                        "tierkv.stored_tokens": (len(keys) - first) * bt + (covered - lead * bt),
                        "tierkv.new_blocks": stored,
                        "tierkv.bytes": sum(nbytes_of(d) for _, d, _ in prepared),
                        "tierkv.tiers": tiers_used,
                        "tierkv.codec": sorted(
                            {self.s.codec_name(i) for i, t in enumerate(self.s.tiers) if t.name in tiers_used}
                        ),
                        "tierkv.tenant": tid.hex(),
                        "tierkv.durable": durable,
                    }
                )
        except BaseException as exc:
            # the access is not recorded: the blocks this put stored leave their provisional rank
            self.s.mover.settle([self.s.index.entries.get(k.hex()) for k in keys[first:]])
            span_cm.__exit__(type(exc), exc, exc.__traceback__)
            raise
        span_cm.__exit__(None, None, None)
        if self.s.service.running:
            self.s.service.submit(Rebalance())
        else:
            await self.s.mover.rebalance()
        return PutResult(
            tokens=covered,
            new_blocks=stored,
            existing_blocks=existing,
            tail_tokens=tail,
            tiers=tuple(tiers_used),
        )

    async def _put_tail(
        self,
        tkey: bytes,
        keys: list[bytes],
        tid: bytes,
        t: int,
        tail_block: Callable[[int], BlockData],
        seed: bytes,
        checked: bool,
        direct: bool,
        durable: bool,
        label: int | None,
    ) -> tuple[bool, Any]:
        """Store the tail of ``t`` tokens after ``keys`` under its raw key ``tkey``; (whether written
        here, its entry or None when it is not indexed after all, e.g. evicted at once)."""
        n = len(keys)
        parent = keys[-1] if keys else seed
        key = tkey.hex()
        e = self.s.index.entries.get(key)
        if e is not None and not (durable and e.backing < 0):
            self.s.index.touch(e)
            return False, e

        def prepare() -> tuple[BlockData, int]:
            blk = tail_block(t)
            if direct:
                return blk, 0
            data = flat(blk)
            return data, checksum(data) if checked else 0

        data, crc = prepare() if direct else await anyio.to_thread.run_sync(prepare)
        tag = pack_tag(self.s.model_scope, tid, parent, n, crc, nbytes_of(data), b"", checked=checked, tail=True)
        with anyio.CancelScope(shield=True):
            placed = await self.s.durable.store_block(key, data, tag, n, tid, parent, durable, b"", label)
        if placed is None:
            store = functools.partial(self.s.durable.store_block, key, data, tag, n, tid, parent, durable, b"", label)
            await self.s.durable.await_concurrent_store(key, store, data, tag, durable)
        return bool(placed) and e is None, self.s.index.entries.get(key)
