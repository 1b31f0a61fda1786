"""The index's storage: one row of typed columns per indexed block, and the key -> row table.

Owns: :class:`Columns` (one ``array.array`` per field, rows reused through a free list; the
32-byte binary block keys and parent keys; the interning tables of model scopes and tenants;
the open-addressing key -> row hash table, whose hash is the first 8 bytes of the key, a
digest), the block tag derived from the fields (it is not stored; a tag that cannot be derived
is kept as it was given), and the registry of live entry handles (:mod:`._entry`) that keeps
one handle object per row for as long as any code holds it.

A row holds no Python object per block: the per-block cost is the columns' bytes plus the
hash table's slot. Everything here is synchronous and does no I/O.

May not touch: tiers' residency (``_residency`` owns the links kept here), backends, the scheduler.
"""

from __future__ import annotations

import weakref
from array import array
from typing import TYPE_CHECKING, Any

import numpy as np

from ._tags import ZERO32, pack_tag_flags, tag_flags, unpack_tag

if TYPE_CHECKING:
    from ._entry import Entry
    from ._residency import Tier

__all__ = ["NO_LABEL", "Columns"]


class _Ref(weakref.ref):  # type: ignore[type-arg]
    """A weak reference to the handle of ``row``."""

    __slots__ = ("row",)
    row: int


#: ``label`` column value meaning None
NO_LABEL = -128
#: the value a narrow column holds when the field's value does not fit it (kept in ``Columns.wide``)
WIDE = {"nbytes": 0xFFFFFFFF, "pos": 0xFFFFFFFF, "crc": 0xFFFFFFFF, "count": 0xFFFFFFFF, "cell": 0xFFFF, "label": -127}
U32 = 0xFFFFFFFF
_EMPTY = -1
_TOMB = -2
_MAX_LOAD = 0.6

#: (column, typecode, value of a fresh row)
_COLUMNS: tuple[tuple[str, str, int | float], ...] = (
    ("tier", "b", 0),
    ("backing", "b", -1),
    ("pins", "i", 0),
    ("moving", "b", 0),
    ("exact", "b", 1),
    ("tinx", "B", 2),  # the tag's flags byte (inexact, xxh3, unchecked; the tag is derived, see Columns.tag)
    ("nbytes", "I", 0),
    ("pos", "I", 0),
    ("crc", "I", 0),
    ("bid", "q", -1),  # -1: a free row (bids are >= 0 and unique per adoption)
    ("cell", "H", 0),
    ("count", "I", 0),
    ("children", "i", 0),
    ("t_last", "d", 0.0),
    ("p_pred", "d", 0.0),
    ("rank", "q", 0),
    ("label", "b", NO_LABEL),
    ("st", "I", 0),  # (model scope, tenant), interned
    ("root", "Q", 0),  # the tag's root (8 bytes, little-endian)
    ("prow", "i", -1),  # the row holding the parent key (-1: ZERO32)
    ("refs", "I", 0),  # rows whose parent key this row holds
    # residency (``_residency``): the serving tier's recency list and the rank queue's FIFOs
    ("lt", "b", -1),  # tier whose recency list holds the row (-1: none)
    ("lprev", "i", -1),
    ("lnext", "i", -1),
    ("bt", "b", -1),  # tier whose durable-only set holds the row (-1: none)
    ("qkey", "q", 0),
    ("qprev", "i", -2),  # -2: in no rank queue
    ("qnext", "i", -1),
    # the ARC lists (``Tier.arc``): 1 if the block is in the frequent list (accessed by two requests
    # while stored, or stored again while ARC remembered it), and the list holding it (2 * tier + arc)
    ("arc", "b", 0),
    ("at", "b", -1),
    ("aprev", "i", -1),
    ("anext", "i", -1),
)


class Columns:
    """Per-row columns, the key -> row table and the live handles (see the module docstring)."""

    tier: array[int]
    backing: array[int]
    pins: array[int]
    moving: array[int]
    exact: array[int]
    tinx: array[int]
    nbytes: array[int]
    pos: array[int]
    crc: array[int]
    bid: array[int]
    cell: array[int]
    count: array[int]
    children: array[int]
    t_last: array[float]
    p_pred: array[float]
    rank: array[int]
    label: array[int]
    st: array[int]
    root: array[int]
    prow: array[int]
    refs: array[int]
    lt: array[int]
    lprev: array[int]
    lnext: array[int]
    bt: array[int]
    qkey: array[int]
    qprev: array[int]
    qnext: array[int]
    arc: array[int]
    at: array[int]
    aprev: array[int]
    anext: array[int]

    def __init__(self) -> None:
        for name, code, _ in _COLUMNS:
            setattr(self, name, array(code))
        self._fresh = [(getattr(self, name), value) for name, _, value in _COLUMNS]
        self.keys = bytearray()  # 32 bytes per row
        self.rows = 0  # rows ever allocated (free ones included)
        self.free = array("i")
        self.live = 0
        # key -> row: open addressing, linear probing, tombstones; hash = key[:8]
        self._slots = array("i", [_EMPTY]) * 1024
        self._mask = 1023
        self._used = 0  # live + tombstones
        #: keys that are not 64 lowercase hex digits (never produced by tierkv; kept exact)
        self.odd: dict[str, int] = {}
        self.odd_key: dict[int, str] = {}
        self.tag_over: dict[int, bytes] = {}  # rows whose tag is not derivable from their fields
        self.parent_over: dict[int, bytes] = {}  # rows whose parent is not 32 bytes
        #: rows not indexed, kept for their key while other rows name it as their parent
        self.orphans: dict[bytes, int] = {}
        #: (model scope, tenant) pairs, interned (the ``st`` column)
        self.pairs: list[tuple[bytes, bytes]] = []
        self._pair_ids: dict[tuple[bytes, bytes], int] = {}
        #: (column, row) -> a value too wide for its narrow column (which holds ``WIDE[column]``)
        self.wide: dict[tuple[str, int], int] = {}
        #: the handle of each row that some code holds (one object per row while held)
        self.handles: dict[int, _Ref] = {}
        #: the residency of each tier, by tier index (bound by ``Index``)
        self.tiers: list[Tier] = []

    # -- handles -------------------------------------------------------------------------------
    def handle_of(self, row: int) -> Entry | None:
        ref = self.handles.get(row)
        return None if ref is None else ref()

    def hold(self, row: int, e: Entry) -> None:
        ref = _Ref(e, self._gone)
        ref.row = row
        self.handles[row] = ref

    def unhold(self, row: int) -> Entry | None:
        ref = self.handles.pop(row, None)
        return None if ref is None else ref()

    def _gone(self, ref: _Ref) -> None:
        if self.handles.get(ref.row) is ref:
            del self.handles[ref.row]

    # -- interning -------------------------------------------------------------------------
    def intern(self, model_scope: bytes, tenant: bytes) -> int:
        k = (model_scope, tenant)
        i = self._pair_ids.get(k)
        if i is None:
            i = self._pair_ids[k] = len(self.pairs)
            self.pairs.append(k)
        return i

    # -- narrow columns ------------------------------------------------------------------------
    def put(self, name: str, col: array[int], row: int, v: int) -> None:
        """``col[row] = v``, or the column's wide marker and ``v`` in ``wide`` when it does not fit."""
        try:
            if v == WIDE[name]:
                raise OverflowError
            col[row] = v
        except OverflowError:
            col[row] = WIDE[name]
            self.wide[(name, row)] = v
            return
        if self.wide:
            self.wide.pop((name, row), None)

    def get(self, name: str, col: array[int], row: int) -> int:
        v = col[row]
        return self.wide[(name, row)] if v == WIDE[name] else v

    # -- rows --------------------------------------------------------------------------------
    def alloc(self) -> int:
        if self.free:
            row = self.free.pop()
            self._reset(row)
            return row
        row = self.rows
        for col, value in self._fresh:
            col.append(value)
        self.keys += bytes(32)
        self.rows += 1
        return row

    def _reset(self, row: int) -> None:
        for col, value in self._fresh:
            col[row] = value

    def take(self, key: str) -> int:
        """A row for ``key`` about to be indexed: the row that already holds its key as a
        parent (see :meth:`set_parent`), else a new one."""
        if self.orphans:
            kb = self.binary(key)
            row = self.orphans.pop(kb, -1) if kb is not None else -1
            if row >= 0:
                refs = self.refs[row]
                self._reset(row)
                self.refs[row] = refs
                return row
        return self.alloc()

    def release(self, row: int) -> None:
        """``row`` left the index (already out of the key table and every residency list):
        freed, or kept for its key while other rows name it as their parent."""
        self.bid[row] = -1
        if self.wide:
            for k in [k for k in self.wide if k[1] == row]:
                del self.wide[k]
        self.tag_over.pop(row, None)
        self.parent_over.pop(row, None)
        pr = self.prow[row]
        self.prow[row] = -1
        if self.refs[row]:
            o = row << 5
            self.orphans[bytes(self.keys[o : o + 32])] = row
        else:
            self.free.append(row)
        if pr >= 0:
            self._unref(pr)

    def _unref(self, pr: int) -> None:
        self.refs[pr] -= 1
        if not self.refs[pr] and self.bid[pr] < 0:  # an unindexed row kept only as a parent key
            o = pr << 5
            del self.orphans[bytes(self.keys[o : o + 32])]
            self.free.append(pr)

    def key_of(self, row: int) -> str:
        if self.odd_key and row in self.odd_key:
            return self.odd_key[row]
        o = row << 5
        return self.keys[o : o + 32].hex()

    def parent_of(self, row: int) -> bytes:
        if self.parent_over and row in self.parent_over:
            return self.parent_over[row]
        pr = self.prow[row]
        if pr < 0:
            return ZERO32
        o = pr << 5
        return bytes(self.keys[o : o + 32])

    def set_parent(self, row: int, v: bytes) -> None:
        """The parent key of ``row``: a reference to the row holding that key (the parent's
        own row, or one kept for the key alone while the parent is not indexed)."""
        old = self.prow[row]
        self.parent_over.pop(row, None)
        if len(v) != 32:
            self.parent_over[row] = v
            pr = -1
        elif v == ZERO32:
            pr = -1
        else:
            kb = bytes(v)
            pr = self.find_binary(kb)
            if pr < 0:
                pr = self.orphans.get(kb, -1)
                if pr < 0:
                    pr = self.alloc()
                    self.keys[pr << 5 : (pr << 5) + 32] = kb
                    self.orphans[kb] = pr
            self.refs[pr] += 1
        self.prow[row] = pr
        if old >= 0:
            self._unref(old)

    # -- the tag -----------------------------------------------------------------------------
    def derive_tag(self, row: int) -> bytes:
        ms, tenant = self.pairs[self.st[row]]
        return pack_tag_flags(
            ms,
            tenant,
            self.parent_of(row),
            self.get("pos", self.pos, row),
            self.get("crc", self.crc, row),
            self.get("nbytes", self.nbytes, row),
            self.root[row].to_bytes(8, "little"),
            self.tinx[row],
        )

    def tag(self, row: int) -> bytes:
        if self.tag_over:
            t = self.tag_over.get(row)
            if t is not None:
                return t
        return self.derive_tag(row)

    def set_tag(self, row: int, tag: bytes) -> None:
        parsed = unpack_tag(tag)
        if parsed is not None:
            self.root[row] = int.from_bytes(parsed[6], "little")
            self.tinx[row] = tag_flags(tag)
            try:
                derived = self.derive_tag(row)
            except Exception:  # a field pack_tag cannot hold: keep the tag as given
                derived = b""
            if derived == tag:
                self.tag_over.pop(row, None)
                return
        self.tag_over[row] = tag

    def keep_tag(self, row: int) -> None:
        """Before a field the tag is derived from changes: the tag stays what it was."""
        if row not in self.tag_over:
            self.tag_over[row] = self.derive_tag(row)

    def settle_tag(self, row: int) -> None:
        """After such a change: drop the kept tag when the fields give it again."""
        t = self.tag_over.get(row)
        if t is not None:
            self.set_tag(row, t)

    # -- key -> row ----------------------------------------------------------------------------
    @staticmethod
    def binary(key: str) -> bytes | None:
        """The 32 binary bytes of a canonical key (64 lowercase hex digits), else None."""
        if len(key) != 64:
            return None
        try:
            kb = bytes.fromhex(key)
        except ValueError:
            return None
        return kb if len(kb) == 32 and kb.hex() == key else None

    def find(self, key: str) -> int:
        """The row of ``key``, or -1."""
        kb = self.binary(key) if type(key) is str else None
        if kb is None:
            return self.odd.get(key, -1) if self.odd and isinstance(key, str) else -1
        return self.find_binary(kb)

    def find_binary(self, kb: bytes) -> int:
        slots, mask, keys = self._slots, self._mask, self.keys
        i = int.from_bytes(kb[:8], "little") & mask
        while True:
            r = slots[i]
            if r == _EMPTY:
                return -1
            if r >= 0 and keys[r << 5 : (r << 5) + 32] == kb:
                return r
            i = (i + 1) & mask

    def find_many(self, kb: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """The rows of the binary keys ``kb`` (an ``(n, 4)`` little-endian uint64 array of
        32-byte keys), -1 where not indexed: every key's first slot probed as arrays, the
        few keys that are not in their first slot by :meth:`find_binary`. The views of the
        table taken here do not outlive the call."""
        n = len(kb)
        if n == 0 or self.rows == 0:
            return np.full(n, -1, dtype=np.int64)
        slots = np.frombuffer(self._slots, dtype=np.int32)
        keys = np.frombuffer(self.keys, dtype="<u8").reshape(-1, 4)
        try:
            mask = self._mask
            pos = kb[:, 0].view(np.int64) & mask
            r = slots[pos].astype(np.int64)
            hit = (keys[r] == kb).min(axis=1)  # a free slot (r < 0) reads some row's key:
            hit &= r >= 0  # never a hit
            rows = np.where(hit, r, -1)
            todo = np.flatnonzero(~hit & (r != _EMPTY))
            tpos = pos[todo]  # aligned with todo
            for _ in range(3):  # the next slots of the keys that collided, as arrays
                if todo.size < 8:
                    break
                tpos = (tpos + 1) & mask
                r = slots[tpos].astype(np.int64)
                hit = (keys[r] == kb[todo]).min(axis=1) & (r >= 0)
                rows[todo[hit]] = r[hit]
                keep = ~hit & (r != _EMPTY)
                todo, tpos = todo[keep], tpos[keep]
            for i in todo.tolist():  # the rest key by key (from their first slot)
                rows[i] = self.find_binary(kb[i].tobytes())
        finally:
            del slots, keys
        return rows

    def insert(self, key: str, row: int) -> None:
        """Index ``row`` under ``key`` (not indexed)."""
        kb = self.binary(key)
        if kb is None:
            self.odd[key] = row
            self.odd_key[row] = key
            self.live += 1
            return
        o = row << 5
        self.keys[o : o + 32] = kb
        if (self._used + 1) > _MAX_LOAD * (self._mask + 1):
            self._rehash(self.live + 1)
        slots, mask = self._slots, self._mask
        i = int.from_bytes(kb[:8], "little") & mask
        while slots[i] >= 0:
            i = (i + 1) & mask
        if slots[i] == _EMPTY:
            self._used += 1
        slots[i] = row
        self.live += 1

    def delete(self, row: int) -> None:
        """Take ``row`` out of the key table."""
        self.live -= 1
        if self.odd_key:
            k = self.odd_key.pop(row, None)
            if k is not None:
                del self.odd[k]
                return
        o = row << 5
        slots, mask = self._slots, self._mask
        i = int.from_bytes(self.keys[o : o + 8], "little") & mask
        while slots[i] != row:
            i = (i + 1) & mask
        slots[i] = _TOMB if slots[(i + 1) & mask] != _EMPTY else _EMPTY
        if slots[i] == _EMPTY:
            self._used -= 1

    def indexed_rows(self) -> np.ndarray[Any, Any]:
        """Rows in the index, in adoption order (the order a dict of them would iterate)."""
        bid = np.frombuffer(self.bid, dtype=np.int64)[: self.rows].copy()
        rows = np.flatnonzero(bid >= 0)
        return rows[np.argsort(bid[rows], kind="stable")]

    def _rehash(self, want: int) -> None:
        cap = self._mask + 1
        while want > 0.3 * cap:
            cap *= 2
        bid = np.frombuffer(self.bid, dtype=np.int64)[: self.rows].copy()
        live = bid >= 0
        if self.odd_key:
            live[list(self.odd_key)] = False
        rows = np.flatnonzero(live).astype(np.int32)
        keys = np.frombuffer(bytes(self.keys[: self.rows << 5]), dtype="<u8").reshape(-1, 4)
        pos = (keys[rows, 0] & np.uint64(cap - 1)).astype(np.int64)
        slots = np.full(cap, _EMPTY, dtype=np.int32)
        while len(rows):
            free = slots[pos] == _EMPTY
            cand_pos, cand_rows = pos[free], rows[free]
            _, first = np.unique(cand_pos, return_index=True)
            slots[cand_pos[first]] = cand_rows[first]
            placed = np.zeros(len(rows), dtype=bool)
            placed[np.flatnonzero(free)[first]] = True
            rows, pos = rows[~placed], (pos[~placed] + 1) & (cap - 1)
        self._slots = array("i", slots.tobytes())
        self._mask = cap - 1
        self._used = self.live - len(self.odd_key)
