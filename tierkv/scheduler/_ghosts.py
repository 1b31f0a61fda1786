"""A FIFO of remembered block ids without a Python object per id: ARC's ghost lists (pure, no I/O).

Owns: :class:`GhostList`. The ids (unsigned 64-bit: ``shadow_id``) sit in a ring ``array`` in the order
they were remembered, and an open-addressing table of two ``array`` columns (id, ring position) answers
membership and marks an id forgotten from the middle. A ring slot whose table entry points elsewhere is
stale and skipped when the oldest id is taken; the ring is compacted once stale slots outnumber live ones,
the table rehashed once live and deleted entries pass half of it. About 40 bytes per id (8 in the ring,
16 per table slot at a load of at most one half) instead of about 127 in an ``OrderedDict`` of Python
ints. Not thread-safe (one event loop, or the replay's thread).
"""

from __future__ import annotations

from array import array

__all__ = ["GhostList"]

_EMPTY = -1
_DELETED = -2
_MUL = 0x9E3779B97F4A7C15
_MASK64 = 0xFFFFFFFFFFFFFFFF


class GhostList:
    """Ids in the order they were remembered (oldest first); ``in``, ``len``, :meth:`remember` (to the
    newest end, moved there when already held), :meth:`forget` (from anywhere) and :meth:`pop_oldest`,
    each O(1) amortised. Ids are ints in ``[0, 2**64)``."""

    __slots__ = ("_dead", "_head", "_ids", "_mask", "_n", "_pos", "_ring", "_used")

    def __init__(self) -> None:
        self._ring = array("Q")
        self._head = 0  # ring slots before it are gone
        self._n = 0  # live ids
        self._mask = 15
        self._ids = array("Q", [0]) * 16
        self._pos = array("q", [_EMPTY]) * 16  # ring position of the id, or _EMPTY / _DELETED
        self._used = 0  # table slots live or deleted
        self._dead = 0  # stale ring slots at or after _head

    def __len__(self) -> int:
        return self._n

    def __bool__(self) -> bool:
        return self._n > 0

    def __contains__(self, block: object) -> bool:
        return isinstance(block, int) and self._find(block) >= 0

    def _slot(self, block: int) -> int:
        return ((block * _MUL) & _MASK64) >> 32

    def _find(self, block: int) -> int:
        """The table slot holding ``block``, or -1."""
        ids, pos, mask = self._ids, self._pos, self._mask
        i = self._slot(block) & mask
        while True:
            p = pos[i]
            if p == _EMPTY:
                return -1
            if p != _DELETED and ids[i] == block:
                return i
            i = (i + 1) & mask

    def remember(self, block: int) -> None:
        """``block`` becomes the newest id (moved there if held)."""
        i = self._find(block)
        if i >= 0:
            self._pos[i] = _DELETED  # its old ring slot turns stale
            self._dead += 1
            self._n -= 1
        if self._used + 1 > (self._mask + 1) >> 1:
            self._rehash()
        ids, pos, mask = self._ids, self._pos, self._mask
        j = self._slot(block) & mask
        while pos[j] >= 0:
            j = (j + 1) & mask
        if pos[j] == _EMPTY:
            self._used += 1
        ids[j] = block
        pos[j] = len(self._ring)
        self._ring.append(block)
        self._n += 1
        self._maybe_compact()

    def forget(self, block: int) -> bool:
        """Drop ``block``; True if it was held."""
        i = self._find(block)
        if i < 0:
            return False
        self._pos[i] = _DELETED
        self._n -= 1
        self._dead += 1
        self._maybe_compact()
        return True

    def pop_oldest(self) -> int:
        """Drop and return the oldest id; IndexError when empty."""
        if not self._n:
            raise IndexError("pop from an empty GhostList")
        ring = self._ring
        while True:
            h = self._head
            block = ring[h]
            self._head = h + 1
            i = self._find(block)
            if i >= 0 and self._pos[i] == h:
                self._pos[i] = _DELETED
                self._n -= 1
                self._maybe_compact()
                return block
            self._dead -= 1  # a stale slot passed

    def _maybe_compact(self) -> None:
        if self._head + self._dead > max(64, len(self._ring) >> 1):
            self._compact()

    def _compact(self) -> None:
        """Rebuild the ring with the live ids only, in order, and the table for them."""
        ring, head = self._ring, self._head
        live = array("Q")
        for k in range(head, len(ring)):
            block = ring[k]
            i = self._find(block)
            if i >= 0 and self._pos[i] == k:
                live.append(block)
        self._ring = array("Q")
        self._head = self._dead = self._n = 0
        cap = 16
        while len(live) + 1 > cap >> 2:
            cap <<= 1
        self._mask = cap - 1
        self._ids = array("Q", [0]) * cap
        self._pos = array("q", [_EMPTY]) * cap
        self._used = 0
        for block in live:
            self.remember(block)

    def _rehash(self) -> None:
        """A table for the live ids (twice as large when they fill a quarter of it)."""
        cap = self._mask + 1
        if self._n + 1 > cap >> 2:
            cap <<= 1
        old_ids, old_pos = self._ids, self._pos
        self._mask = cap - 1
        self._ids = array("Q", [0]) * cap
        self._pos = array("q", [_EMPTY]) * cap
        self._used = 0
        ids, pos, mask = self._ids, self._pos, self._mask
        for block, p in zip(old_ids, old_pos, strict=True):
            if p >= 0:
                j = self._slot(block) & mask
                while pos[j] != _EMPTY:
                    j = (j + 1) & mask
                ids[j] = block
                pos[j] = p
                self._used += 1
