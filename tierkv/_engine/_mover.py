"""Relocation: room for writes, shedding, moves, promotions, demotions, drops.

Owns: the relocation claim (one relocation of a block at a time), the reservations
made for writes (``allocate_with_room``: a writer that had to make room allocates
right after its own shedding, under the tier's room lock; ``allocate_many_with_room``:
a batch's, shedding once for it), the eviction order and
victim selection, moving a block between tiers with its durable copy following it,
promotions, and removing a block from the index and every tier (``drop``/``drop_many``/``forget``).
Relocations are shielded from cancellation once they start writing.

May not touch: the public API, the put/get paths' own bookkeeping.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections import deque
from collections.abc import Callable, Hashable, Iterable
from typing import TYPE_CHECKING

import anyio
import anyio.lowlevel
import numpy as np

from .._placement import bytes_to_shed, lower_tier
from .._scheduling import shadow_id
from ..backend import Allocation
from ..errors import (
    BackendError,
    BlockExistsError,
    BlockNotFoundError,
    CapacityError,
    IntegrityError,
)
from ..scheduler._buckets import PROVISIONAL_RANK, quantize, quantize_many
from ._entry import handle
from ._index import Entry, pbin
from ._residency import Recency
from ._tags import checked_tag, checksum, retag, tag_exact, unpack_tag

if TYPE_CHECKING:
    from ..scheduler._session import SessionPolicy
    from ._store import Store

log = logging.getLogger("tierkv")

__all__ = ["Mover"]

_LN4 = math.log(4.0)


#: Blocks used within this many seconds of each other count as one request's (see
#: :meth:`Mover.displaces_its_peers`).
PEER_WINDOW_S = 1e-3


def _hexkey(key: object) -> str:
    """The index key of a session shadow's block id (the raw key bytes the store feeds it)."""
    return key.hex() if isinstance(key, bytes) else str(key)


def _identity(n: int) -> int:
    return n


class Mover:
    """Moves blocks between tiers and out of the store (see the module docstring)."""

    def __init__(self, s: Store) -> None:
        self.s = s
        self._tau = s.sched.tau_s
        self._importance = -1  # the BlockImportance version the keys were computed with
        self._session_queues: list[deque[Hashable]] = []  # per tier: what the session shadow dropped
        self._granules: dict[int, int] = {}  # per tier: its backend's allocation granule (fixed)

    def room_of(self, ti: int, tenant: bytes | None = None) -> Callable[[int], int]:
        """What evicting a block of ``n`` bytes gives back on tier ``ti``: its size in whole granules
        (a partial last block frees a granule's room, enough for a whole block when blocks fill one);
        for a ``tenant``'s quota, which counts logical bytes, ``n`` itself."""
        g = self.granule(ti) if tenant is None else 1
        if g == 1:
            return _identity
        return lambda n: -(-n // g) * g

    def granule(self, ti: int) -> int:
        """Tier ``ti``'s allocation unit in bytes (``stats().details["granule"]``; 1 when it declares
        none): a block there holds its size rounded up to it (a partial last block a whole granule)."""
        g = self._granules.get(ti)
        if g is None:
            raw = self.s.tiers[ti].backend.stats().details.get("granule", 1)
            g = self._granules[ti] = raw if isinstance(raw, int) and raw > 1 else 1
        return g

    async def allocate_with_room(self, ti: int, key: str, nbytes: int, tag: bytes) -> Allocation:
        """Allocate ``nbytes`` for ``key`` on tier ``ti``, shedding its lowest-ranked blocks
        when it is full. Writers that had to make room queue on the tier's room lock and
        each allocates right after its own shedding, so the space made for a write goes to
        that write; concurrent writers never fail for each other's freed space. Raises
        CapacityError only when the tier cannot hold the block: bigger than the tier, or
        nothing left to shed (everything pinned or being relocated)."""
        t = self.s.tiers[ti]
        try:
            return await t.backend.allocate(key, nbytes, tag=tag)
        except CapacityError:
            if t.backend.stats().capacity_bytes < nbytes:
                raise
        async with t.room_lock:
            while True:
                try:
                    return await t.backend.allocate(key, nbytes, tag=tag)
                except CapacityError:
                    if await self.shed(ti, nbytes) <= 0:
                        raise

    async def allocate_many_with_room(self, ti: int, items: list[tuple[str, int, bytes]]) -> list[Allocation]:
        """Allocate every block of ``items`` (key, bytes, tag) on tier ``ti`` in one backend call;
        when the tier is full, its lowest-ranked blocks are shed once for the whole batch, under the
        room lock as in :meth:`allocate_with_room`. Returns [] when the batch cannot be allocated
        whole that way; the caller then stores the blocks one by one, as before.

        The batch sheds only where that sheds what the blocks stored one by one would each have
        made room for, in the same order: the policy is not on ARC or the segmented LRU (whose
        victims depend on each block stored before them); no partial last blocks are stored
        (every block one size, so no victim frees more than a block needs); the tier is the
        bottom one (its victims are dropped, and never the blocks the calling put keeps; above it
        a put's own blocks, among them its earlier batches' new ones, may move down, one by one
        each new block pushing out the one before it). Otherwise, or when a victim picked is of another size, or a key
        is reserved or stored there already, or the tier stays too full or fragmented, it
        returns [] (in the last cases having shed at most the victims the one-by-one path sheds
        first)."""
        t = self.s.tiers[ti]
        backend = t.backend
        try:
            return await backend.allocate_many(items)
        except BlockExistsError:
            return []
        except CapacityError:
            pass
        sched = self.s.sched
        if sched.recency and (sched.arc or sched.slru):
            return []
        if lower_tier(self.s.loads(), ti) is not None:
            return []  # victims move down: a put's own blocks may be among them
        size = items[0][1]
        need = size * len(items)
        if self.s.index.tails or any(n != size for _, n, _ in items) or backend.stats().capacity_bytes < need:
            return []
        async with t.room_lock:
            st = backend.stats()
            deficit = need - (st.capacity_bytes - st.used_bytes)
            if deficit > 0:
                victims = self.pick_victims(ti, deficit)
                if any(e.nbytes != size for e in victims):
                    return []
                if await self.shed(ti, deficit, victims=victims) < deficit:
                    return []
            try:
                return await backend.allocate_many(items)
            except (BlockExistsError, CapacityError):
                return []

    async def rebalance(self) -> None:
        """Move LRU blocks down from every tier past its high watermark."""
        async with self.s.rebalance_lock:
            for ti in range(len(self.s.tiers)):
                need = bytes_to_shed(self.s.loads()[ti])
                if need > 0:
                    await self.shed(ti, need, background=True)

    async def make_room(self, ti: int, nbytes: int) -> None:
        s = self.s.tiers[ti].backend.stats()
        need = nbytes - (s.capacity_bytes - s.used_bytes)
        if need > 0:
            await self.shed(ti, need, background=True)

    def rank_of(self, e: Entry) -> int:
        """The quantised eviction key of ``e`` (higher stays), computed when it is placed or
        accessed: ``ln P(reuse | cell) + t_last / tau`` (+ the answer-length delta), plus the
        head importance of the block itself when the engine reported attention on a sequence
        holding it (``BlockImportance.score``: at least its descendants', so parents keep
        ranking at least as high), plus ln 4 for a high-fanout prefix (a protected shared
        prefix). Under the LRU policy the order is the tiers' recency lists and this key is
        not used."""
        sched = self.s.sched
        key = sched.priority(e.cell, e.t_last)
        imp = sched.block_importance
        if imp is not None:
            key += imp.score(e.key)
        if sched.protected(e.children):
            key += _LN4
        return quantize(key)

    def settle(self, entries: Iterable[Entry | None]) -> None:
        """Give blocks still at the provisional rank a put stores them with (``PROVISIONAL_RANK -
        pos``) their real key: a put that failed or was cancelled before recording its access."""
        for e in entries:
            if e is None or e.row < 0 or e.rank <= PROVISIONAL_RANK >> 1:
                continue
            e.rank = self.rank_of(e)
            t = self.s.tiers[e.tier]
            if t.queue.holds(e.row):
                t.queue.requeue(e.row, e.rank)

    def rerank(self, e: Entry) -> None:
        """Recompute ``e``'s key after an access (the caller then touches it in the index)."""
        if self.s.sched.policy != "lru":
            e.rank = self.rank_of(e)

    def refresh_ranking(self) -> None:
        """Re-key blocks when what their keys depend on changed, at the next access or eviction.
        The adaptive ``tau`` switched (keys computed with different ``tau`` are not comparable):
        every indexed block, O(indexed log indexed), keys recomputed, then raised deepest first to
        their descendants' (a parent never ranks below a child), on the index's arrays
        (:meth:`_rekey_all`: ~0.4 us per block on the 2-vCPU development VM, 0.4 s at 1M blocks;
        block by block, ~10 us). Only attention was reported (``BlockImportance.version``): only the blocks
        whose importance score changed (the reported chains), raised to their new key, never
        lowered (a block's children outside the reported chain may rank as high as its old key; a
        lower score takes effect at the block's next access), their ancestors raised with them."""
        sched = self.s.sched
        imp = sched.block_importance
        version = -1 if imp is None else imp.version
        if sched.tau_s == self._tau and version == self._importance:
            return
        same_tau = sched.tau_s == self._tau
        self._tau, self._importance = sched.tau_s, version
        changed = imp.take_changed() if imp is not None else None
        if sched.policy == "lru":
            return
        if same_tau and changed is not None:
            self._raise_ranks(changed)
            return
        if not self._rekey_all():
            self._rekey_all_by_entry()

    def _rekey_all(self) -> bool:
        """:meth:`_rekey_all_by_entry` on the index's columns as arrays: the same keys (the same
        float operations in the same order), the same raises and the same FIFO order in every
        tier's queue (:meth:`RankQueue.rebuild`; row by row in a tier whose queue holds rows
        outside its recency list), 20-40 times faster. False (nothing changed) when a row needs
        what only the per-entry path handles: a position or cell too wide for its column, odd-sized
        keys or parent keys, a parent not above its child, a cell outside the predictor's table."""
        s = self.s
        c = s.index.cols
        if c.wide or c.odd_key or c.parent_over:
            return False
        rows = c.indexed_rows()  # adoption order, as the index's dict view
        if not len(rows):
            return True
        pos_col = np.frombuffer(c.pos, dtype=np.uint32)
        pos = pos_col[rows].astype(np.int64)
        cell = np.frombuffer(c.cell, dtype=np.uint16)[rows].astype(np.int64)
        sched = s.sched
        log_table = np.asarray(sched.predictor.log_table, dtype=np.float64)
        if len(log_table) == 0 or int(cell.max()) >= len(log_table):
            return False
        t_last = np.frombuffer(c.t_last, dtype=np.float64)[rows]
        tau = sched.tau_s
        key = log_table[cell] + t_last / tau  # Scheduler.priority, term by term
        key = key + sched.response_deltas(t_last)
        imp = sched.block_importance
        if imp is not None:
            scores = imp.scores()
            if scores:
                at = np.full(c.rows, -1, dtype=np.int64)
                at[rows] = np.arange(len(rows))
                for k, v in scores.items():
                    r = c.find(k)
                    if r >= 0 and at[r] >= 0:
                        key[at[r]] += v
        children = np.frombuffer(c.children, dtype=np.int32)[rows]
        key = np.where(children >= sched.placement.protect_fanout, key + _LN4, key)
        rank = quantize_many(key)
        # parents raised to their descendants', deepest first (a parent never ranks below a child)
        ranks = np.frombuffer(c.rank, dtype=np.int64)
        bid = np.frombuffer(c.bid, dtype=np.int64)
        prow = np.frombuffer(c.prow, dtype=np.int32)[rows].astype(np.int64)
        has_parent = prow >= 0
        has_parent[has_parent] = bid[prow[has_parent]] >= 0
        any_parent = bool(has_parent.any())
        if any_parent:  # level by level needs every parent above its child
            ppos = pos_col[prow[has_parent]].astype(np.int64)
            if (ppos >= pos[has_parent]).any():
                return False
        ranks[rows] = rank
        order = np.argsort(-pos, kind="stable")  # deepest first, ties in adoption order
        if any_parent:
            o = order[has_parent[order]]
            lv = pos[o]
            cuts = np.flatnonzero(lv[1:] != lv[:-1]) + 1
            for grp in np.split(o, cuts):
                np.maximum.at(ranks, prow[grp], ranks[rows[grp]])
        seq = rows[order]
        tier_col = np.frombuffer(c.tier, dtype=np.int8)[seq]
        lt = np.frombuffer(c.lt, dtype=np.int8)[seq]
        queued = np.frombuffer(c.qprev, dtype=np.int32)[seq] != -2
        for ti, t in enumerate(s.tiers):
            sel = seq[(tier_col == ti) & queued & (lt == ti)]
            if len(sel) == t.queue.n:
                t.queue.rebuild(sel, ranks[sel])  # (a copy: fancy indexing)
            else:  # (rows queued outside the recency list keep their place, as per entry)
                for r in sel.tolist():
                    t.queue.requeue(r, int(ranks[r]))
        return True

    def _rekey_all_by_entry(self) -> None:
        """Every indexed block re-keyed, entry by entry (see :meth:`refresh_ranking`)."""
        index = self.s.index.entries
        entries = list(index.values())
        for e in entries:
            e.rank = self.rank_of(e)
        entries.sort(key=lambda x: -x.pos)
        for e in entries:
            p = index.get(bytes(e.parent).hex())
            if p is not None and p.rank < e.rank:
                p.rank = e.rank
        for e in entries:  # deepest first: among equal keys a child leaves before its parent
            t = self.s.tiers[e.tier]
            if t.queue.holds(e.row) and t.lru.has(e.row):
                t.queue.requeue(e.row, e.rank)

    def _raise_ranks(self, keys: Iterable[str]) -> None:
        """Re-key the indexed blocks of ``keys`` upward only (see :meth:`refresh_ranking`), each
        ancestor raised to at least its descendant's key; requeued deepest first."""
        index = self.s.index.entries
        todo = sorted((e for k in keys if (e := index.get(k)) is not None), key=lambda x: -x.pos)
        moved: dict[str, Entry] = {}
        for e in todo:
            new = self.rank_of(e)
            if new <= e.rank:
                continue
            e.rank = new
            moved[e.key] = e
            p = index.get(bytes(e.parent).hex())
            while p is not None and p.rank < new:  # (an ancestor below its raised descendant)
                p.rank = new
                moved[p.key] = p
                p = index.get(bytes(p.parent).hex())
        for e in sorted(moved.values(), key=lambda x: -x.pos):  # among equal keys a child leaves first
            t = self.s.tiers[e.tier]
            if t.queue.holds(e.row) and t.lru.has(e.row):
                t.queue.requeue(e.row, e.rank)

    def arc_stored(self, e: Entry) -> None:
        """A new block is indexed (not yet placed): it joins ARC's frequent list if ARC remembers it
        (a ghost: ``ArcTarget.returning`` adapts ARC's target), else the recent list."""
        target = self.s.sched.arc_target
        cols = self.s.index.cols
        if target is None or e.row < 0 or cols.lt[e.row] >= 0:
            return  # (a placed row would be in the other list: only a new, unplaced one changes list here)
        if target.returning(shadow_id(e.key)):
            cols.arc[e.row] = 1

    def arc_lost(self, e: Entry) -> None:
        """``e`` is about to leave the store for room (evicted at the bottom tier, or by its tenant's
        quota): ARC remembers it in the ghost list of the list it leaves."""
        target = self.s.sched.arc_target
        if target is None or e.row < 0:
            return
        frequent = bool(self.s.index.cols.arc[e.row])
        target.lost(shadow_id(e.key), frequent, max(0, self._recent_blocks() - (0 if frequent else 1)))

    def _recent_blocks(self) -> int:
        """Blocks in ARC's recent lists, over every tier (ARC's |T1|)."""
        return sum(len(t.arc[0]) for t in self.s.tiers)

    def _arc_lists(self, ti: int) -> tuple[Recency, Recency]:
        """Tier ``ti``'s ARC lists in eviction order: the recent list first while the store's recent
        lists hold more than ARC's target, else the frequent one first."""
        target = self.s.sched.arc_target
        assert target is not None
        recent, frequent = self.s.tiers[ti].arc
        if target.evict_recent(self._recent_blocks()):
            return recent, frequent
        return frequent, recent

    def _session_victims(
        self, ses: SessionPolicy, ti: int, need: int, want: Callable[[int], int | None]
    ) -> list[Entry]:
        """Tier ``ti``'s blocks the session shadow dropped, oldest first, until ``need`` bytes (each
        once). The shadow's :attr:`~tierkv.scheduler.SessionPolicy.dropped` is drained into one queue
        per tier by each block's tier (a block the shadow holds again, or the store no longer holds, is
        forgotten), and a queued block that moved to another tier moves to its queue: each drop is
        looked at O(tiers) times, not once per victim search. A block not evictable now (pinned, kept
        by a put) or picked stays queued. A queue past ``2 x capacity + 1024`` blocks forgets those
        gone. Synchronous."""
        entries = self.s.index.entries
        queues = self._session_queues
        n = len(self.s.tiers)
        if len(queues) != n:
            queues[:] = [deque() for _ in range(n)]
        src = ses.dropped
        while src:
            key = src.popleft()
            e = entries.get(_hexkey(key))
            if e is not None and e.row >= 0 and not ses.holds(key):
                queues[e.tier].append(key)
        q = queues[ti]
        out: list[Entry] = []
        keep: list[Hashable] = []
        seen: set[int] = set()
        freed = 0
        while q and freed < need:
            key = q.popleft()
            e = entries.get(_hexkey(key))
            if e is None or e.row < 0 or ses.holds(key) or e.row in seen:
                continue  # gone, held again, or queued twice
            if e.tier != ti:
                queues[e.tier].append(key)
                continue
            seen.add(e.row)
            keep.append(key)  # (until it is gone: a victim a shed does not drop is still the first)
            size = want(e.row)
            if size is not None:
                out.append(e)
                freed += size
        q.extendleft(reversed(keep))
        limit = 2 * ses.capacity + 1024
        for t, tq in enumerate(queues):
            if len(tq) > limit:
                queues[t] = deque(k for k in tq if _hexkey(k) in entries and not ses.holds(k))
        return out

    def pick_victims(self, ti: int, need: int, tenant: bytes | None = None, *, background: bool = False) -> list[Entry]:
        """Tier ``ti``'s blocks that should leave it first, until ``need`` bytes (each counted in whole
        granules of the tier, :meth:`granule`: what evicting it gives back there): the least
        recently used (LRU policy, adaptive on recency), ARC's (adaptive on ARC: :meth:`_arc_lists`),
        the segmented LRU's (adaptive on it: probation, then protected), the session shadow's
        (adaptive on it: the blocks it dropped, oldest first, then the least recently used)
        or lowest-keyed (predictive) serving copies, then the durable-only copies, oldest access
        first. Pinned blocks, blocks being relocated, (with ``tenant``) other tenants' blocks and,
        at the bottom tier, the blocks a put keeps (``Index.kept``: the calling put's own, or every
        put's for ``background`` shedding) are passed over; ARC's (or the segments') first list is
        left at the first kept block (a put's own blocks are its most recent) for the other list,
        except that a put's own search on ARC then gets no more victims from a recent list over
        ARC's target (the put stops: ARC would evict its own first blocks and keep its frequent
        list). Costs O(victims + passed over) per call, not O(tier): the ranking is kept up to date
        on access."""
        self.refresh_ranking()  # attention reported since the last access re-keys first
        tier = self.s.tiers[ti]
        index = self.s.index
        cols = index.cols
        victims: list[Entry] = []
        freed = 0

        bottom = lower_tier(self.s.loads(), ti) is None  # a victim here is lost, not moved down

        held = self.room_of(ti, tenant)

        def want(r: int) -> int | None:
            size = index.evictable(r, tenant, bottom=bottom, background=background)
            return None if size is None else held(size)

        sched = self.s.sched
        ses = sched.session if sched.session_mode else None
        if ses is not None:  # the adaptive policy on its session shadow: what the shadow dropped first
            taken: set[int] = set()
            for e in self._session_victims(ses, ti, need, want):
                victims.append(e)
                taken.add(e.row)
                freed += held(e.nbytes)
            if freed < need:  # then the least recently used, as the LRU policy
                for r in tier.lru.rows():
                    if freed >= need:
                        break
                    size = want(r) if r not in taken else None
                    if size is not None:
                        victims.append(handle(cols, r))
                        freed += size
        elif sched.recency:  # the lru policy, or the adaptive one on recency now (LRU, ARC or segmented)
            if sched.arc:
                lists: tuple[Recency, ...] = self._arc_lists(ti)
            elif sched.slru:
                lists = tier.arc  # probation, then protected (trimmed when an access is recorded)
            else:
                lists = (tier.lru,)
            stop = False
            for k, lst in enumerate(lists):
                for r in lst.rows():
                    if freed >= need:
                        break
                    size = want(r)
                    if size is not None:
                        victims.append(handle(cols, r))
                        freed += size
                    elif k == 0 and len(lists) > 1 and bottom and index.kept_row(r, background=background):
                        # the first list reached a put's own blocks (kept, most recent): what follows
                        # is that put's or newer (a put does not pass over them once per block it
                        # stores). The segmented LRU takes the protected segment next; ARC's recent
                        # list over its target gives none: ARC would evict the put's own first blocks,
                        # so the put stops and the frequent list stays. Only for a put's own search (a
                        # tenant's sees only its blocks, ARC's target is store-wide; a background shed
                        # has no put to stop).
                        stop = sched.arc and lst is tier.arc[0] and tenant is None and not background
                        break
                if freed >= need or stop:
                    break
        else:
            for r in tier.queue.pick(want, need):
                e = handle(cols, r)
                victims.append(e)
                freed += held(e.nbytes)
        if freed < need and tier.backed:
            usable = (handle(cols, r) for r in tier.backed.rows() if want(r) is not None)
            for e in sorted(usable, key=lambda x: x.t_last):
                if freed >= need:
                    break
                victims.append(e)
                freed += held(e.nbytes)
        return victims

    async def shed(
        self,
        ti: int,
        need: int,
        *,
        tenant: bytes | None = None,
        background: bool = False,
        victims: list[Entry] | None = None,
    ) -> int:
        """Move (or, at the bottom, drop) enough of tier ``ti``'s lowest-ranked blocks to free
        ``need`` bytes there (only ``tenant``'s blocks, when given: a quota); returns the
        bytes actually freed on ``ti``.

        Victims are entry objects chosen in one synchronous step: pinned blocks and blocks
        another task is relocating are skipped, and a victim that left the index or tier
        ``ti`` before its turn is passed over (a concurrent invalidate, evict or move).
        The relocations are shielded: a cancelled caller never leaves half a move behind."""
        index = self.s.index.entries
        if victims is None:  # (else: picked just now by the caller, with nothing awaited since)
            victims = self.pick_victims(ti, need, tenant, background=background)
        freed = 0  # (in the units pick_victims counts: room_of)
        held = self.room_of(ti, tenant)
        lost: list[Entry] = []  # bottom-tier victims, dropped together (before any other relocation)
        with self.s.index.pinned(victims), anyio.CancelScope(shield=True):
            dest = lower_tier(self.s.loads(), ti)
            for e in victims:
                if index.get(e.key) is not e:
                    continue  # left the index meanwhile
                if lost and (e.tier != ti or e.backing > ti):
                    await self.drop_many(lost)
                    lost = []
                if e.tier != ti:
                    if e.backing == ti and await self.shed_durable_copy(e, ti, dest):
                        freed += held(e.nbytes)
                    continue
                self.prefetch_wasted(e)
                if e.backing > ti:  # a durable copy exists below: just drop this one
                    if await self.demote_to_backing(e):
                        self.s.decided("demote", e, ti, e.backing, "watermark: durable copy below")
                        freed += held(e.nbytes)
                    continue
                if dest is not None:
                    if await self.move(e, ti, dest):
                        self.s.decided("demote", e, ti, dest, "watermark")
                        freed += held(e.nbytes)
                    # else: no room below right now (or another task is writing it there):
                    # keep the block where it is rather than lose it
                    continue
                if e.moving:
                    continue
                self.s.decided("evict", e, ti, -1, "watermark at the bottom tier")
                lost.append(e)
                freed += held(e.nbytes)
            if lost:
                await self.drop_many(lost)
        return freed

    async def shed_durable_copy(self, e: Entry, ti: int, dest: int | None) -> bool:
        """Move the durable copy of a block served elsewhere down to the next
        persistent tier; with none below (or no room), drop it (the block stays
        cached, no longer durable). True if tier ``ti`` no longer holds it."""
        if not await self.claim(e, e.tier):
            return False
        try:
            return await self.shed_durable_copy_claimed(e, ti, dest)
        finally:
            e.moving = False

    async def shed_durable_copy_claimed(self, e: Entry, ti: int, dest: int | None) -> bool:
        moved = False
        if e.backing != ti:
            return False
        if dest is not None and self.s.tiers[dest].backend.capabilities.persistent:
            try:
                data, tag = await self.copy_bytes(e, ti, dest)
                payload = await self.s.encode_for(dest, data)
                alloc = await self.allocate_with_room(dest, e.key, payload.nbytes, tag)
                await self.s.tiers[dest].backend.write(alloc, payload)
                moved = True
            except (BlockNotFoundError, IntegrityError, CapacityError, BlockExistsError):
                moved = False
        if self.s.index.entries.get(e.key) is not e:
            # removed while its copy was being written (a concurrent invalidate): the new copy
            # belongs to nobody, and tier ``ti``'s copy went with the entry
            if moved and dest is not None:
                await self.s.drop_copy(dest, e.key)
            return True
        if moved:
            self.commit_copy_bytes(e, tag)
        self.s.index.set_backing(e, dest if moved and dest is not None else -1)
        await self.s.tiers[ti].backend.evict(e.key)
        self.s.decided(
            "demote" if moved else "evict", e, ti, dest if moved and dest is not None else -1, "durable copy"
        )
        return True

    async def demote_to_backing(self, e: Entry) -> bool:
        old = e.tier
        if not await self.claim(e, old):
            return False
        try:
            await self.retarget(e, e.backing)
            await self.s.tiers[old].backend.evict(e.key)
        finally:
            e.moving = False
        return True

    async def claim(self, e: Entry, tier: int) -> bool:
        """Claim the right to relocate ``e`` (one relocation of a block at a time).
        False if another task is relocating it, or it is no longer indexed on ``tier``."""
        if e.moving or self.s.index.entries.get(e.key) is not e or e.tier != tier:
            return False
        e.moving = True
        return True

    async def move(self, e: Entry, src: int, dst: int) -> bool:
        """:meth:`_move_claimed` under a relocation claim; False if the block is busy."""
        if not await self.claim(e, src):
            return False
        try:
            return await self.move_claimed(e, src, dst)
        finally:
            e.moving = False

    async def move_claimed(self, e: Entry, src: int, dst: int) -> bool:
        """Copy a block from tier ``src`` to ``dst`` then evict it from ``src``.

        The durable copy follows the block: if ``src`` held it, ``dst`` holds it
        afterwards (when persistent). Returns False when the block could not be
        placed on ``dst`` (no room, or another task is writing it there)."""
        s, d = self.s.tiers[src], self.s.tiers[dst]
        try:
            data, tag = await self.copy_bytes(e, src, dst)
        except (BlockNotFoundError, IntegrityError):
            if e.tier != src or self.s.index.entries.get(e.key) is not e:
                return True  # moved or removed by another task meanwhile
            # the serving copy vanished or is corrupt (quarantined by the backend)
            if e.backing >= 0 and e.backing != src:
                await self.retarget(e, e.backing)
            else:
                await self.forget(e, "vanished")
            return True
        s.bytes_out += len(data)
        self.s.tel.bytes_read.add(len(data), {"tier": s.name})
        try:
            payload = await self.s.encode_for(dst, data)
            alloc = await self.allocate_with_room(dst, e.key, payload.nbytes, tag)
        except BlockExistsError:
            if not await d.backend.contains(e.key):
                return False  # only reserved there by another task: not a copy yet
            tag = checked_tag(tag, data)
            if e.backing != dst and not await self.s.durable.verify_copy(dst, e.key, e.nbytes, tag):
                return False
        except CapacityError:
            return False
        else:
            await d.backend.write(alloc, payload)
            d.bytes_in += e.nbytes
            self.s.tel.bytes_written.add(e.nbytes, {"tier": d.name})
        self.commit_copy_bytes(e, tag)
        if self.s.index.entries.get(e.key) is not e:
            await self.s.drop_copy(dst, e.key)  # dropped meanwhile: nothing to move any more
            return True
        s.unplace(e)
        e.tier = dst
        if e.backing == src or (e.backing < 0 and d.backend.capabilities.persistent):
            self.s.index.set_backing(e, dst if d.backend.capabilities.persistent else -1)
        d.place(e)
        await s.backend.evict(e.key)
        return True

    async def copy_bytes(self, e: Entry, src: int, dst: int) -> tuple[memoryview, bytes]:
        """The raw bytes of ``e`` for a new copy on ``dst``, read from ``src`` (or from its
        exact durable copy when ``src`` stores a lossy encoding), and the tag that copy
        carries. Exact tiers of one entry always hold the same bytes, checked against
        ``e.crc``: when the only source is a lossy copy and ``dst`` stores raw bytes, its
        reconstruction becomes the entry's raw bytes (new checksum, ``exact=False``, the
        tag's inexact flag), applied by :meth:`_commit_copy_bytes` once written."""
        if not self.s.exact_tier(src):
            for alt in (e.tier, e.backing):
                if alt >= 0 and alt != src and self.s.exact_tier(alt):
                    src = alt
                    break
        data = await self.s.read_raw(src, e.key)
        if self.s.exact_tier(src) or not self.s.exact_tier(dst):
            if self.s.needs_checksum(dst):
                return data, checked_tag(e.tag, data)  # its first checksum, if it had none
            return data, e.tag
        return data, retag(e.tag, checksum(data), exact=False)

    def commit_copy_bytes(self, e: Entry, tag: bytes) -> None:
        """Adopt the checksum and exactness ``tag`` states for ``e``'s raw copies."""
        if tag != e.tag:
            parsed = unpack_tag(tag)
            if parsed is not None:
                e.crc = parsed[4]
            e.exact = tag_exact(tag)
            e.tag = tag

    async def retarget(self, e: Entry, ti: int, *, claimed: bool = True) -> None:
        """Serve ``e`` from tier ``ti`` (which holds its durable copy) from now on.
        Callers hold the relocation claim; on a read path (``claimed=False``) a
        block being relocated by another task is left to that task."""
        if self.s.index.entries.get(e.key) is not e or e.tier == ti or (not claimed and e.moving):
            return
        self.s.tiers[e.tier].unplace(e)
        if ti >= 0:
            self.s.tiers[ti].unback(e)
        e.tier = ti
        self.s.tiers[ti].place(e)

    async def drop(self, e: Entry) -> None:
        """Remove a block from the index and from every tier holding a copy."""
        await self.forget(e, None)
        with anyio.CancelScope(shield=True):
            await self.s.tiers[e.tier].backend.evict(e.key)
            if e.backing >= 0 and e.backing != e.tier:
                await self.s.tiers[e.backing].backend.evict(e.key)
            await self._drop_retained(e.key)

    async def _drop_retained(self, key: str) -> None:
        """Drop the copies of ``key`` kept on tiers as retained copies (call shielded)."""
        for ti, keys in self.s.retained.items():
            if key in keys:
                keys.discard(key)
                await self.s.drop_copy(ti, key)

    async def drop_many(self, entries: list[Entry]) -> None:
        """Evict ``entries`` at the bottom: each, in turn, goes to ARC's ghost list
        (:meth:`arc_lost`, counted as one by one) and leaves the index; then every tier frees its
        copies of them in one backend call (shielded, as in :meth:`drop`). A backend error on
        the batch frees the rest key by key before it is raised."""
        by_tier: dict[int, list[str]] = {}
        for e in entries:
            self.arc_lost(e)
            await self.forget(e, None)
            by_tier.setdefault(e.tier, []).append(e.key)
            if e.backing >= 0 and e.backing != e.tier:
                by_tier.setdefault(e.backing, []).append(e.key)
        with anyio.CancelScope(shield=True):
            failed: BaseException | None = None
            for ti, keys in by_tier.items():
                backend = self.s.tiers[ti].backend
                try:
                    await backend.evict_many(keys)
                except BackendError as exc:
                    failed = failed or exc
                    for k in keys:
                        with contextlib.suppress(BackendError):
                            await backend.evict(k)
            if self.s.retained:
                for e in entries:
                    await self._drop_retained(e.key)
            if failed is not None:
                raise failed

    def prefetch_wasted(self, e: Entry) -> None:
        """A prefetched block that leaves its tier before any hit was wasted."""
        if e.key in self.s.prefetched:
            self.s.prefetched.discard(e.key)
            self.s.prefetch_stats["wasted"] += 1
            self.s.tel.prefetch.add(1, {"outcome": "wasted"})

    async def forget(self, e: Entry, reason: str | None) -> None:
        """Remove ``e`` from the index (its copies are the caller's business)."""
        self.s.index.remove(e)
        self.prefetch_wasted(e)
        if e.count and self.s.tel.enabled and self.s.sched.now() - e.t_last <= self.s.sched.predictor.horizon:
            pass  # outcome still open: it may yet be reused elsewhere; not counted
        elif e.count and self.s.tel.enabled:
            self.s.tel.calibration.add(1, {"bin": pbin(e.p_pred), "outcome": "not_reused"})
        if reason:
            self.s.tel.evictions.add(1, {"tier": self.s.tiers[e.tier].name, "reason": reason})

    async def promote_if_room(self, e: Entry, dst: int, reason: str) -> bool:
        if self.s.index.entries.get(e.key) is not e or e.tier <= dst:
            return False
        with self.s.index.pinned([e]):
            src = e.tier
            if reason != "prefetch" and self.displaces_its_peers(e, dst):
                return False
            await self.make_room(dst, e.nbytes)
            ok = await self.promote(e, dst)
            if ok:
                self.s.decided("promote", e, src, dst, reason)
                if reason == "prefetch":
                    self.s.prefetched.add(e.key)
                    self.s.prefetch_stats["issued"] += 1
            return ok

    def displaces_its_peers(self, e: Entry, dst: int) -> bool:
        """Whether making room for ``e`` on tier ``dst`` would push out blocks used as recently as
        ``e`` (within :data:`PEER_WINDOW_S`: typically the same request's other blocks, when a
        prefix is larger than the faster tier): moving ``e`` up would only swap it with them, churn
        that costs two copies and saves nothing, so it stays where it is."""
        t = self.s.loads()[dst]  # room up to the high watermark: past it the rebalance pushes blocks out
        need = e.nbytes - int(t.high_watermark * t.capacity - t.used)
        if need <= 0:
            return False
        victims = self.pick_victims(dst, need)
        return bool(victims) and min(v.t_last for v in victims) >= e.t_last - PEER_WINDOW_S

    def warm_target(self, nbytes: int, below: int) -> int | None:
        loads = self.s.loads()
        for ti in range(below):
            t = loads[ti]
            if t.healthy and t.used + nbytes <= t.high_watermark * t.capacity:
                return ti
        return None

    async def promote(self, e: Entry, dst: int) -> bool:
        """:meth:`_promote_claimed` under a relocation claim; False if the block is busy."""
        src = e.tier
        if not await self.claim(e, src):
            return False
        try:
            return await self.promote_claimed(e, dst)
        finally:
            e.moving = False

    async def promote_claimed(self, e: Entry, dst: int) -> bool:
        """Copy a block up to tier ``dst``; a persistent source stays as the
        durable copy, a volatile one is evicted. False if it did not fit."""
        src = e.tier
        dst_backend = self.s.tiers[dst].backend
        with anyio.CancelScope(shield=True):
            try:
                data, tag = await self.copy_bytes(e, src, dst)
                payload = await self.s.encode_for(dst, data)
                alloc = await self.allocate_with_room(dst, e.key, payload.nbytes, tag)
            except (BlockNotFoundError, CapacityError, BlockExistsError, IntegrityError):
                return False
            await dst_backend.write(alloc, payload)
            self.s.tiers[dst].bytes_in += e.nbytes
            self.s.tiers[src].bytes_out += e.nbytes
            self.s.tel.bytes_written.add(e.nbytes, {"tier": self.s.tiers[dst].name})
            self.s.tel.bytes_read.add(e.nbytes, {"tier": self.s.tiers[src].name})
            if self.s.index.entries.get(e.key) is not e or e.tier != src:
                await self.s.drop_copy(dst, e.key)
                return False
            self.commit_copy_bytes(e, tag)
            self.s.tiers[src].unplace(e)
            e.tier = dst
            self.s.tiers[dst].place(e)
            self.s.tiers[dst].promotions += 1
            if e.backing == src:
                self.s.tiers[src].back(e)  # stays as the durable copy
            else:
                await self.s.tiers[src].backend.evict(e.key)
        return True
