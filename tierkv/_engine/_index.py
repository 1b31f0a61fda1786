"""The index: the entries of one store (key -> :class:`Entry`), the prefix walk, the one pin helper.

Owns: :class:`Entries` (``Index.entries``, the mapping view of the indexed blocks by hex key,
kept in :class:`~._columns.Columns`: one row per block, no Python object per block), adopting
and removing entries (with their tiers' residency, :mod:`._residency`), the prefix walk, the
first-block roots behind miss reasons, :meth:`Index.pinned`, and the invariant check.
Everything here is synchronous: an index mutation never awaits, so it is atomic on the event
loop and cannot be cancelled half-way.

May not touch: backends (no I/O), the scheduler's state, telemetry.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, overload

import numpy as np

from .._keys import tail_key
from ._columns import WIDE, Columns
from ._entry import Entry, attach, detach, handle
from ._residency import Tier
from ._tags import ZERO32, root_of, tag_tail, unpack_tag

if TYPE_CHECKING:
    from ._store import Store

__all__ = ["Entries", "Entry", "Index", "Tier", "pbin"]


def pbin(p: float) -> str:
    """Calibration bin of a predicted probability: "0.0" .. "0.9" (tenths)."""
    return f"{min(int(p * 10), 9) / 10:.1f}"


class Entries:
    """The indexed blocks by hex key: ``get``, ``[]``, ``in``, ``del``, ``len`` and iteration
    (``keys``/``values``/``items``, in adoption order, as a dict's). While any code holds the
    entry of a block, every lookup of that block returns that same object. ``del`` takes the
    block out of the index and its tiers' residency (as :meth:`Index.remove`, without touching
    its parent's fanout or the roots)."""

    __slots__ = ("_c", "_ix")

    def __init__(self, ix: Index) -> None:
        self._ix = ix
        self._c = ix.cols

    @overload
    def get(self, key: str) -> Entry | None: ...
    @overload
    def get(self, key: str, default: Entry) -> Entry: ...
    def get(self, key: str, default: Entry | None = None) -> Entry | None:
        r = self._c.find(key)
        return default if r < 0 else handle(self._c, r)

    def __getitem__(self, key: str) -> Entry:
        r = self._c.find(key)
        if r < 0:
            raise KeyError(key)
        return handle(self._c, r)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self._c.find(key) >= 0

    def __len__(self) -> int:
        return self._c.live

    def __bool__(self) -> bool:
        return self._c.live > 0

    def __delitem__(self, key: str) -> None:
        r = self._c.find(key)
        if r < 0:
            raise KeyError(key)
        self._ix.free(handle(self._c, r))

    def _rows(self) -> Iterator[int]:
        c = self._c
        rows = c.indexed_rows()
        bids = np.frombuffer(c.bid, dtype=np.int64)[rows].tolist() if len(rows) else []
        bid = c.bid
        for r, b in zip(rows.tolist(), bids, strict=True):
            if bid[r] == b:  # still the block that was indexed there
                yield r

    def __iter__(self) -> Iterator[str]:
        return self.keys()

    def keys(self) -> Iterator[str]:
        key_of = self._c.key_of
        return (key_of(r) for r in self._rows())

    def values(self) -> Iterator[Entry]:
        c = self._c
        return (handle(c, r) for r in self._rows())

    def items(self) -> Iterator[tuple[str, Entry]]:
        c = self._c
        return ((e.key, e) for e in (handle(c, r) for r in self._rows()))


#: the rows the current task keeps (Index.kept): never its own victims at the bottom tier
_KEPT: contextvars.ContextVar[tuple[object, set[int] | frozenset[int]]] = contextvars.ContextVar(
    "tierkv_kept", default=(None, frozenset())
)

#: up to this many keys the walk goes key by key (:meth:`Index.walk_rows`)
_WALK_BY_KEY = 24


class Index:
    """The entries of one store and the walk over them (see the module docstring)."""

    def __init__(self, s: Store) -> None:
        self.s = s
        self.cols = Columns()
        for ti, t in enumerate(s.tiers):
            t.bind(self.cols, ti)
        self.cols.tiers = list(s.tiers)
        self.entries = Entries(self)
        self.next_bid = 0
        #: (tenant, root) -> blocks at position 0 with that root: tells a tenant's own
        #: ``different_scope`` miss from ``never_stored``; ``roots_any`` is the operator's view
        self.roots: dict[tuple[bytes, bytes], int] = {}
        self.roots_any: dict[bytes, int] = {}
        #: parent key -> {tail tokens: indexed tails}: the partial last blocks stored under a
        #: parent (the key of the last whole block, or the chain seed), so a lookup probes
        #: only the few tail lengths present (:meth:`find_tail`)
        self.tails: dict[bytes, dict[int, int]] = {}
        #: rows some put keeps (:meth:`kept`) -> how many puts keep them
        self.kept_all: dict[int, int] = {}
        self.token_nbytes = max(1, s.block_nbytes // s.block_tokens)

    def owns(self, e: Entry) -> bool:
        """Whether ``e`` is the indexed entry of its block (``entries.get(e.key) is e``)."""
        return e.row >= 0 and e._c is self.cols

    def _parent_row(self, parent: bytes) -> int:
        c = self.cols
        return c.find_binary(parent) if len(parent) == 32 else c.find(parent.hex())

    def remove(self, e: Entry) -> bool:
        """Take ``e`` out of the index and its tiers' residency; False if it was not there."""
        if not self.owns(e):
            return False
        c, r = self.cols, e.row
        c.delete(r)
        if e.pos:
            pr = self._parent_row(e.parent)
            if pr >= 0 and c.children[pr] > 0:
                c.children[pr] -= 1
        if e.pos == 0 and not tag_tail(e.tag):
            self.unroot(e)
        self.s.tiers[e.tier].unplace(e)
        if e.backing >= 0:
            self.s.tiers[e.backing].unback(e)
        self._release(e)
        return True

    def free(self, e: Entry) -> None:
        """Take indexed ``e`` out of the key table and every tier's residency (``del entries[k]``)."""
        self.cols.delete(e.row)
        self._release(e)

    def _release(self, e: Entry) -> None:
        """Free ``e``'s row (out of the key table): unlinked from any residency left, its
        handle detached."""
        c, r = self.cols, e.row
        if self.tails and tag_tail(e.tag):
            self._count_tail(e, -1)
        if c.lt[r] >= 0:
            c.tiers[c.lt[r]].unplace(e)
        for t in c.tiers:
            if t.backed.has(r):
                t.unback(e)
        detach(c, r)
        c.release(r)

    def adopt(self, e: Entry, root: bytes) -> None:
        """Insert a new entry into the index (under the lock, or before serving)."""
        c = self.cols
        tail = tag_tail(e.tag)
        if not self.owns(e):  # (an entry adopted again keeps its row, as a dict keeps it)
            old = c.find(e.key)
            if old >= 0:  # another entry under this key: replaced (its residency with it)
                self.free(handle(c, old))
            row = c.take(e.key)
            c.insert(e.key, row)
            attach(c, e, row)
            if tail:
                self._count_tail(e, 1)
        e.bid = self.next_bid
        self.next_bid += 1
        if e.pos:
            pr = self._parent_row(e.parent)
            if pr >= 0:
                c.children[pr] += 1
        if tail:
            return  # a tail is a leaf: no root of its own (its chain's first block has it)
        if not root and e.pos == 0:
            parsed = unpack_tag(e.tag)
            root = parsed[6] if parsed is not None else b""
        if root and e.pos == 0:
            rk = (e.tenant[:16], root[:8])
            self.roots[rk] = self.roots.get(rk, 0) + 1
            self.roots_any[root[:8]] = self.roots_any.get(root[:8], 0) + 1

    def _count_tail(self, e: Entry, d: int) -> None:
        parent = bytes(e.parent)
        t = e.nbytes // self.token_nbytes
        lens = self.tails.setdefault(parent, {})
        n = lens.get(t, 0) + d
        if n > 0:
            lens[t] = n
        else:
            lens.pop(t, None)
            if not lens:
                del self.tails[parent]

    def find_tail(
        self, arr: np.ndarray[Any, Any], keys: list[bytes], found: int, tid: bytes, seed: bytes
    ) -> Entry | None:
        """The longest stored tail (partial last block) after the first ``found`` whole
        blocks of ``keys`` whose tokens are a prefix of the rest of ``arr``, or None.

        Only the tail lengths indexed under that parent (``tails``) are probed, longest
        first, one hash each; a tail's key covers its exact tokens, so a hit is an exact
        match. Its tag must name this place (position ``found``, the parent, model scope
        and tenant, the tail flag) and one of its copies must be on a healthy tier, as for a
        whole block in :meth:`walk_rows`. Synchronous; no per-token Python work."""
        if not self.tails:
            return None
        parent = keys[found - 1] if found else seed
        lens = self.tails.get(parent)
        if not lens:
            return None
        bt = self.s.block_tokens
        start = found * bt
        rest = len(arr) - start
        ms = self.s.model_scope[:16]
        check_tenant = not self.s.config.share_across_tenants
        tiers = self.s.tiers
        for t in sorted(lens, reverse=True):
            if t > rest or t >= bt:
                continue
            e = self.entries.get(tail_key(parent, arr[start : start + t]).hex())
            if e is None:
                continue
            if (
                not tag_tail(e.tag)
                or e.pos != found
                or bytes(e.parent) != parent
                or e.nbytes != t * self.token_nbytes
                or e.model_scope[:16] != ms
                or (check_tenant and e.tenant[:16] != tid[:16])
            ):
                continue
            if not tiers[e.tier].healthy and not (e.backing >= 0 and tiers[e.backing].healthy):
                continue
            return e
        return None

    def tails_count(self) -> int:
        """Tails indexed (by the tail map)."""
        return sum(sum(lens.values()) for lens in self.tails.values())

    def tail_tokens(self, e: Entry) -> int:
        """The tokens a tail entry covers."""
        return e.nbytes // self.token_nbytes

    def evictable(
        self, row: int, tenant: bytes | None, *, bottom: bool = False, background: bool = False
    ) -> int | None:
        """The size of indexed ``row``'s block if it may be chosen as a victim now (not pinned,
        not being relocated, ``tenant``'s when given, and, when the victim would be lost
        (``bottom``), not :meth:`kept` by the calling task or, for ``background`` shedding, by
        any), else None."""
        c = self.cols
        if c.pins[row] or c.moving[row] or (tenant is not None and c.pairs[c.st[row]][1][:16] != tenant):
            return None
        if bottom:
            owner, kept = _KEPT.get()
            if (owner is self and row in kept) or (background and row in self.kept_all):
                return None
        return c.get("nbytes", c.nbytes, row)

    def kept_row(self, row: int, *, background: bool = False) -> bool:
        """Whether ``row`` is :meth:`kept` by the calling task (or, with ``background``, by any)."""
        owner, kept = _KEPT.get()
        return (owner is self and row in kept) or (background and row in self.kept_all)

    def touch(self, e: Entry) -> None:
        """``e`` was accessed: most recently used on its serving tier, ranked by ``e.rank`` (the
        last of its key's FIFO: a request touches its blocks leaf first, so among equal keys a
        child leaves before its parent)."""
        r = e.row
        if r < 0:
            return
        t = self.s.tiers[e.tier]
        if t.lru.has(r):
            t.touch(r)
            if t.ranked:
                t.queue.requeue(r, e.rank)

    @contextlib.contextmanager
    def pinned(self, entries: Sequence[Entry]) -> Iterator[None]:
        """Pin ``entries`` for the duration of the ``with`` block: the one pin helper.

        A pinned block is never chosen as a victim, invalidated or flushed. Pinning and
        unpinning never await, so neither can be cancelled or interleaved with another
        task; pins belong to the entry *objects* (a block re-put meanwhile under the same
        key is another entry and is not touched)."""
        pinned = list(entries)
        for e in pinned:
            e.pins += 1
        try:
            yield
        finally:
            for e in pinned:
                e.pins -= 1

    @contextlib.contextmanager
    def kept(self, entries: Sequence[Entry]) -> Iterator[Kept]:
        """While the ``with`` block runs, ``entries`` are not chosen as victims where a victim is
        lost (the bottom healthy tier; above it they may still move down) by the calling task's
        own shedding nor by background shedding (watermarks, room for promotions); other tasks'
        writes may still evict them. A put keeps its own chain so: its later blocks must not evict
        its earlier ones, while concurrent puts make room as before. Yields a :class:`Kept`
        (``add`` keeps one more). The calling task is told apart by a context variable."""
        k = Kept(self)
        token = _KEPT.set((self, k.rows))
        try:
            for e in entries:
                k.add(e)
            yield k
        finally:
            _KEPT.reset(token)
            k.release()

    def set_backing(self, e: Entry, ti: int) -> None:
        """Point the durable copy of ``e`` at tier ``ti`` (-1: none), keeping each
        tier's set of backing-only copies exact (call under the lock)."""
        if e.backing >= 0 and e.backing != e.tier:
            self.s.tiers[e.backing].unback(e)
        e.backing = ti
        if ti >= 0 and ti != e.tier:
            self.s.tiers[ti].back(e)

    def find_rows(self, keys: list[bytes]) -> list[int]:
        """The row of every key (-1 where not indexed): probed as arrays past ``_WALK_BY_KEY``
        binary keys (no per-key Python work), one by one below."""
        c = self.cols
        if len(keys) <= _WALK_BY_KEY or c.odd or set(map(len, keys)) != {32}:
            return [c.find_binary(k) if len(k) == 32 else c.find(k.hex()) for k in keys]
        kb = np.frombuffer(b"".join(keys), dtype="<u8").reshape(len(keys), 4)
        rows: list[int] = c.find_many(kb).tolist()
        return rows

    def chain_to(self, leaf: str, blocks: int) -> list[Entry]:
        """The stored chain ending at block ``leaf``, root first, found by parent links: at most
        ``blocks`` entries, and only a whole chain (from position 0, every ancestor stored). Empty
        when ``leaf`` is not stored or an ancestor is missing (its descendants are useless alone)."""
        c = self.cols
        r = c.find(leaf)
        out: list[Entry] = []
        while r >= 0 and len(out) < blocks:
            e = handle(c, r)
            out.append(e)
            if e.pos == 0:
                out.reverse()
                return out
            r = self._parent_row(e.parent)
        return []

    def walk(self, keys: list[bytes], tid: bytes) -> tuple[list[Entry], str]:
        """Index entries of the longest stored prefix and, if it ends early, why
        (:meth:`walk_rows`, with the entry object of each row)."""
        rows, reason = self.walk_rows(keys, tid)
        c = self.cols
        return [handle(c, r) for r in rows], reason

    def walk_rows(self, keys: list[bytes], tid: bytes) -> tuple[list[int], str]:
        """Rows of the longest stored prefix and, if it ends early, why.

        Each entry's tag must belong to the chain being walked (parent key, position,
        model scope, tenant): an entry whose tag names another place (a record renamed or
        forged on a shared medium) ends the prefix as ``integrity`` and is never served.
        A block whose serving tier and durable copy are both on unhealthy tiers ends it as
        ``tier_unhealthy``; a key not indexed as ``never_stored``.

        Past ``_WALK_BY_KEY`` keys they are probed and checked as arrays over the index's
        columns (no per-block Python work; below it, numpy's fixed cost per operation is
        more than the loop's). Synchronous; the numpy views of the columns it takes do not
        outlive the call (the columns may grow afterwards)."""
        n = len(keys)
        c = self.cols
        if n <= _WALK_BY_KEY or c.odd or set(map(len, keys)) != {32}:
            return self._walk_slow(keys, tid)
        kb = np.frombuffer(b"".join(keys), dtype="<u8").reshape(n, 4)
        rows = c.find_many(kb)
        miss = np.flatnonzero(rows < 0)
        found = int(miss[0]) if miss.size else n
        rows = rows[:found]
        bad = self._chain_failures(rows, kb, tid)
        bi = int(bad[0]) if bad.size else found
        unhealthy = self._unhealthy(rows[:bi])
        ui = int(unhealthy[0]) if unhealthy.size else bi
        if ui < bi:
            return rows[:ui].tolist(), "tier_unhealthy"
        if bi < found:
            return rows[:bi].tolist(), "integrity"
        return rows.tolist(), "" if found == n else "never_stored"

    def _chain_failures(self, rows: np.ndarray[Any, Any], kb: np.ndarray[Any, Any], tid: bytes) -> np.ndarray[Any, Any]:
        """Positions ``i`` (ascending) whose row is not block ``i`` of this chain: another
        position, another parent key, another model scope or (unless tenants share one key
        space) another tenant."""
        c = self.cols
        n = len(rows)
        if n == 0:
            return rows
        ms, tid16 = self.s.model_scope[:16], tid[:16]
        check_tenant = not self.s.config.share_across_tenants
        st_ok = np.fromiter(
            (p[0][:16] == ms and (not check_tenant or p[1][:16] == tid16) for p in c.pairs),
            dtype=bool,
            count=len(c.pairs),
        )
        ok = st_ok[np.frombuffer(c.st, dtype=np.uint32)[rows]]
        pos = np.frombuffer(c.pos, dtype=np.uint32)[rows].astype(np.int64)
        want = np.arange(n, dtype=np.int64)
        ok &= (pos == want) | (pos == WIDE["pos"])
        prow = np.frombuffer(c.prow, dtype=np.int32)[rows]
        prev = np.empty(n, dtype=np.int64)
        prev[0] = -1
        prev[1:] = rows[:-1]
        # a parent row other than the previous block's (or one kept in parent_over) is
        # compared by its key, as are positions too wide for their column
        odd = np.flatnonzero(((prow != prev) | (pos == WIDE["pos"])) & ok)
        for i in odd.tolist():
            r = int(rows[i])
            parent = ZERO32 if i == 0 else kb[i - 1].tobytes()
            if c.get("pos", c.pos, r) != i or (
                (prow[i] != prev[i] or (c.parent_over and r in c.parent_over)) and c.parent_of(r) != parent
            ):
                ok[i] = False
        if c.parent_over:
            for i in range(n):
                r = int(rows[i])
                if ok[i] and r in c.parent_over:
                    ok[i] = c.parent_of(r) == (ZERO32 if i == 0 else kb[i - 1].tobytes())
        return np.flatnonzero(~ok)

    def _unhealthy(self, rows: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """Positions whose serving tier and durable copy (if any) are both unhealthy."""
        tiers = self.s.tiers
        if not len(rows) or all(t.healthy for t in tiers):
            return rows[:0]
        c = self.cols
        healthy = np.array([t.healthy for t in tiers] + [False], dtype=bool)  # index -1: no copy
        tier = np.frombuffer(c.tier, dtype=np.int8)[rows].astype(np.int64)
        back = np.frombuffer(c.backing, dtype=np.int8)[rows].astype(np.int64)
        return np.flatnonzero(~(healthy[tier] | healthy[back]))

    def _walk_slow(self, keys: list[bytes], tid: bytes) -> tuple[list[int], str]:
        """:meth:`walk_rows` one key at a time (a key that is not 32 binary bytes)."""
        out: list[int] = []
        c = self.cols
        ms = self.s.model_scope[:16]
        tid16 = tid[:16]
        parent, prev = ZERO32, -1
        check_tenant = not self.s.config.share_across_tenants  # shared: one key space, any tenant's blocks
        tiers = self.s.tiers
        for i, k in enumerate(keys):
            r = c.find_binary(k) if len(k) == 32 else c.find(k.hex())
            if r < 0:
                return out, "never_stored"
            e_ms, e_tenant = c.pairs[c.st[r]]
            if (
                c.get("pos", c.pos, r) != i
                or ((c.prow[r] != prev or (c.parent_over and r in c.parent_over)) and c.parent_of(r) != parent)
                or e_ms[:16] != ms
                or (check_tenant and e_tenant[:16] != tid16)
            ):
                return out, "integrity"
            bk = c.backing[r]
            if not tiers[c.tier[r]].healthy and not (bk >= 0 and tiers[bk].healthy):
                return out, "tier_unhealthy"
            out.append(r)
            parent, prev = k, r
        return out, ""

    def unroot(self, e: Entry) -> None:
        parsed = unpack_tag(e.tag)
        if parsed is None or not parsed[6]:
            return
        root = parsed[6][:8]
        rk = (e.tenant[:16], root)
        if self.roots.get(rk, 0) > 1:
            self.roots[rk] -= 1
        else:
            self.roots.pop(rk, None)
        if self.roots_any.get(root, 0) > 1:
            self.roots_any[root] -= 1
        else:
            self.roots_any.pop(root, None)

    def miss_reason(self, arr: np.ndarray[Any, Any], found: int, reason: str, tid: bytes) -> tuple[str, str]:
        """(the caller's reason, the operator's reason) for a prefix that ended after
        ``found`` blocks. The caller's view refines ``never_stored`` at the first block into
        ``different_scope`` only when *the same tenant* stored these tokens under another
        model scope: one tenant never learns what another cached. The operator's view (for
        operator-side telemetry only) says ``different_scope`` for any tenant's copy."""
        if reason == "never_stored" and found == 0 and len(arr) >= self.s.block_tokens:
            root = root_of(arr, self.s.block_tokens)[:8]
            own = "different_scope" if (tid[:16], root) in self.roots else reason
            return own, "different_scope" if root in self.roots_any else reason
        return reason, reason

    def invariant_violations(self, *, quiescent: bool = True) -> list[str]:
        """Check the index against the tiers (no I/O); returns what is wrong, empty when sound.

        Always: no entry has a negative pin count; the tail map lists exactly the indexed tails; each tier's serving and durable copies
        are indexed only once. With ``quiescent`` (no operation in flight, e.g. after a
        concurrency run has joined its tasks): every pin is released, no relocation claim
        is held, each tier holds exactly the blocks the index places on it (serving copies,
        durable copies, checkpoint copies and manifests) and no reservation, and for a tier
        without a codec its ``details["logical_bytes"]`` equals the indexed bytes."""
        out: list[str] = []
        if quiescent and self.kept_all:
            out.append(f"{len(self.kept_all)} rows still kept by puts that ended")
        expect_blocks = [0] * len(self.s.tiers)
        expect_bytes = [0] * len(self.s.tiers)
        for k, e in self.entries.items():
            if e.key != k:
                out.append(f"entry {k[:16]} indexed under another key {e.key[:16]}")
            if e.pins < 0 or (quiescent and e.pins):
                out.append(f"block {k[:16]} has pins == {e.pins}")
            if quiescent and e.moving:
                out.append(f"block {k[:16]} still claimed for a relocation")
            for ti in {e.tier, e.backing} - {-1}:
                expect_blocks[ti] += 1
                expect_bytes[ti] += e.nbytes
            if k not in self.s.tiers[e.tier].lru:
                out.append(f"block {k[:16]} missing from tier {self.s.tiers[e.tier].name}'s order")
            if e.backing >= 0 and e.backing != e.tier and k not in self.s.tiers[e.backing].backed:
                out.append(f"block {k[:16]}'s durable copy missing from tier {self.s.tiers[e.backing].name}'s set")
        tails: dict[bytes, dict[int, int]] = {}
        for e in self.entries.values():
            if tag_tail(e.tag):
                lens = tails.setdefault(bytes(e.parent), {})
                lens[e.nbytes // self.token_nbytes] = lens.get(e.nbytes // self.token_nbytes, 0) + 1
        if tails != self.tails:
            out.append(
                f"the tail map lists {self.tails_count()} tails, the index holds {sum(sum(v.values()) for v in tails.values())}"
            )
        for ti, keys in self.s.retained.items():
            for k in keys:
                r = self.entries.get(k)
                if r is None or ti not in (r.tier, r.backing):
                    expect_blocks[ti] += 1
        for ti, names in self.s.manifests.items():
            expect_blocks[ti] += len(names)
            expect_bytes[ti] += sum(names.values())
        for ti, t in enumerate(self.s.tiers):
            stray = [k for k in t.lru if (s_ := self.entries.get(k)) is None or s_.tier != ti]
            stray += [k for k in t.backed if (b_ := self.entries.get(k)) is None or b_.backing != ti]
            if stray:
                out.append(f"tier {t.name}: {len(stray)} keys in its bookkeeping are not indexed there")
            c = self.cols
            for cls, lst in enumerate(t.arc):  # ARC's two lists split the serving copies
                rows = list(lst.rows())
                wrong = sum(1 for r in rows if c.lt[r] != ti or c.arc[r] != cls)
                if wrong or lst.n != len(rows):
                    out.append(f"tier {t.name}: ARC list {cls} holds {wrong} rows of another list or tier")
            if len(t.arc[0]) + len(t.arc[1]) != len(t.lru):
                out.append(
                    f"tier {t.name}: ARC's lists hold {len(t.arc[0]) + len(t.arc[1])} rows, its order {len(t.lru)}"
                )
            if not quiescent:
                continue
            st = t.backend.stats()
            if st.blocks != expect_blocks[ti]:
                out.append(f"tier {t.name}: holds {st.blocks} blocks, the index places {expect_blocks[ti]} there")
            if st.reserved_bytes:
                out.append(f"tier {t.name}: {st.reserved_bytes} bytes still reserved")
            logical = st.details.get("logical_bytes")
            if t.codec is None and isinstance(logical, int) and logical != expect_bytes[ti]:
                out.append(f"tier {t.name}: holds {logical} logical bytes, the index places {expect_bytes[ti]} there")
        return out


class Kept:
    """The rows one put keeps (:meth:`Index.kept`)."""

    __slots__ = ("_ix", "rows")

    def __init__(self, ix: Index) -> None:
        self._ix = ix
        self.rows: set[int] = set()

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, e: Entry) -> None:
        """Keep ``e`` too, until the ``with`` block ends."""
        r = e.row
        if r < 0 or r in self.rows:
            return
        self.rows.add(r)
        counts = self._ix.kept_all
        counts[r] = counts.get(r, 0) + 1

    def release(self) -> None:
        counts = self._ix.kept_all
        for r in self.rows:
            n = counts.get(r, 0) - 1
            if n > 0:
                counts[r] = n
            else:
                counts.pop(r, None)
        self.rows.clear()
