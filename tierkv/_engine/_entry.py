"""The index record of one block: :class:`Entry`, and its indexed form, a handle on a row.

Owns: the fields of a block's record and the two forms an entry object takes. An entry the
core has created and not yet adopted, or one that has left the index, holds its fields itself
(plain slots). While indexed, the same object is a handle on its row of
:class:`~._columns.Columns`: every field reads and writes the columns, so a million indexed
blocks cost no Python object each. Identity is kept: while any code holds the handle of a row,
every lookup of that row returns that object (``Columns.handles``); when the row leaves the
index the handle is detached (its fields are copied back into it) and the row may be reused
for another block without the old object seeing it.

May not touch: the key table, residency, backends. Synchronous only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._columns import NO_LABEL, U32, WIDE

if TYPE_CHECKING:
    from ._columns import Columns

__all__ = ["Entry", "attach", "detach", "handle"]


class Entry:
    """Index record of one block. ``tier`` serves reads; ``backing`` is the
    persistent tier holding a durable copy (-1: none; equal to ``tier`` when
    the serving tier is itself persistent). ``bid``, ``cell``, ``count``,
    ``children`` (prefix fanout) and ``t_last`` feed the predictor."""

    __slots__ = (
        "__weakref__",
        "_c",
        "backing",
        "bid",
        "cell",
        "children",
        "count",
        "crc",
        "exact",
        "key",
        "label",
        "model_scope",
        "moving",
        "nbytes",
        "p_pred",
        "parent",
        "pins",
        "pos",
        "rank",
        "row",
        "t_last",
        "tag",
        "tenant",
        "tier",
    )

    _c: Columns

    def __init__(
        self,
        key: str,
        tier: int,
        nbytes: int,
        tag: bytes,
        model_scope: bytes,
        tenant: bytes,
        parent: bytes,
        pos: int,
        crc: int,
    ) -> None:
        #: the row while indexed (-1: not indexed)
        self.row = -1
        self.key = key
        self.tier = tier
        self.nbytes = nbytes
        self.tag = tag
        self.model_scope = model_scope
        self.tenant = tenant
        self.parent = parent
        self.pos = pos
        self.crc = crc
        self.pins = 0
        self.backing = -1
        self.bid = 0
        self.cell = 0
        self.count = 0
        self.children = 0
        self.t_last = 0.0
        #: quantised eviction key (the mover's ``rank_of``), kept in its tier's ``queue``
        self.rank = 0
        self.label: int | None = None
        self.p_pred = 0.0
        #: the raw bytes on exact tiers (checked against ``crc``) are the original bits; False once
        #: they were rebuilt from a lossy copy. Copies on lossy tiers are guarded by their codec's CRC.
        self.exact = True
        self.moving = False  # a relocation (move, promotion, demotion) holds it


class _Row(Entry):
    """An indexed entry: every field is its row's column (see the module docstring)."""

    __slots__ = ()

    @property
    def tier(self) -> int:
        return self._c.tier[self.row]

    @tier.setter
    def tier(self, v: int) -> None:
        self._c.tier[self.row] = v

    @property
    def backing(self) -> int:
        return self._c.backing[self.row]

    @backing.setter
    def backing(self, v: int) -> None:
        self._c.backing[self.row] = v

    @property
    def pins(self) -> int:
        return self._c.pins[self.row]

    @pins.setter
    def pins(self, v: int) -> None:
        self._c.pins[self.row] = v

    @property
    def moving(self) -> bool:
        return self._c.moving[self.row] != 0

    @moving.setter
    def moving(self, v: bool) -> None:
        self._c.moving[self.row] = 1 if v else 0

    @property
    def exact(self) -> bool:
        return self._c.exact[self.row] != 0

    @exact.setter
    def exact(self, v: bool) -> None:
        self._c.exact[self.row] = 1 if v else 0

    @property
    def bid(self) -> int:
        return self._c.bid[self.row]

    @bid.setter
    def bid(self, v: int) -> None:
        self._c.bid[self.row] = v

    @property
    def cell(self) -> int:
        v = self._c.cell[self.row]
        return v if v != 0xFFFF else self._c.wide[("cell", self.row)]

    @cell.setter
    def cell(self, v: int) -> None:
        self._c.put("cell", self._c.cell, self.row, v)

    @property
    def count(self) -> int:
        v = self._c.count[self.row]
        return v if v != U32 else self._c.wide[("count", self.row)]

    @count.setter
    def count(self, v: int) -> None:
        self._c.put("count", self._c.count, self.row, v)

    @property
    def children(self) -> int:
        return self._c.children[self.row]

    @children.setter
    def children(self, v: int) -> None:
        self._c.children[self.row] = v

    @property
    def t_last(self) -> float:
        return self._c.t_last[self.row]

    @t_last.setter
    def t_last(self, v: float) -> None:
        self._c.t_last[self.row] = v

    @property
    def p_pred(self) -> float:
        return self._c.p_pred[self.row]

    @p_pred.setter
    def p_pred(self, v: float) -> None:
        self._c.p_pred[self.row] = v

    @property
    def rank(self) -> int:
        return self._c.rank[self.row]

    @rank.setter
    def rank(self, v: int) -> None:
        self._c.rank[self.row] = v

    @property
    def label(self) -> int | None:
        v = self._c.label[self.row]
        if v == NO_LABEL:
            return None
        return v if v != WIDE["label"] else self._c.wide[("label", self.row)]

    @label.setter
    def label(self, v: int | None) -> None:
        _put_label(self._c, self.row, v)

    # the fields the tag is derived from: a change keeps the tag as it was
    @property
    def nbytes(self) -> int:
        v = self._c.nbytes[self.row]
        return v if v != U32 else self._c.wide[("nbytes", self.row)]

    @nbytes.setter
    def nbytes(self, v: int) -> None:
        c, r = self._c, self.row
        c.keep_tag(r)
        c.put("nbytes", c.nbytes, r, v)
        c.settle_tag(r)

    @property
    def pos(self) -> int:
        v = self._c.pos[self.row]
        return v if v != U32 else self._c.wide[("pos", self.row)]

    @pos.setter
    def pos(self, v: int) -> None:
        c, r = self._c, self.row
        c.keep_tag(r)
        c.put("pos", c.pos, r, v)
        c.settle_tag(r)

    @property
    def crc(self) -> int:
        v = self._c.crc[self.row]
        return v if v != U32 else self._c.wide[("crc", self.row)]

    @crc.setter
    def crc(self, v: int) -> None:
        c, r = self._c, self.row
        if self.crc != v:
            c.keep_tag(r)
            c.put("crc", c.crc, r, v)
            c.settle_tag(r)

    @property
    def parent(self) -> bytes:
        return self._c.parent_of(self.row)

    @parent.setter
    def parent(self, v: bytes) -> None:
        c, r = self._c, self.row
        c.keep_tag(r)
        c.set_parent(r, v)
        c.settle_tag(r)

    @property
    def model_scope(self) -> bytes:
        return self._c.pairs[self._c.st[self.row]][0]

    @model_scope.setter
    def model_scope(self, v: bytes) -> None:
        c, r = self._c, self.row
        c.keep_tag(r)
        c.st[r] = c.intern(v, self.tenant)
        c.settle_tag(r)

    @property
    def tenant(self) -> bytes:
        return self._c.pairs[self._c.st[self.row]][1]

    @tenant.setter
    def tenant(self, v: bytes) -> None:
        c, r = self._c, self.row
        c.keep_tag(r)
        c.st[r] = c.intern(self.model_scope, v)
        c.settle_tag(r)

    @property
    def tag(self) -> bytes:
        return self._c.tag(self.row)

    @tag.setter
    def tag(self, v: bytes) -> None:
        self._c.set_tag(self.row, v)


_FIELDS = (
    "tier",
    "backing",
    "pins",
    "moving",
    "exact",
    "bid",
    "cell",
    "count",
    "children",
    "t_last",
    "p_pred",
    "rank",
    "label",
    "nbytes",
    "pos",
    "crc",
    "parent",
    "model_scope",
    "tenant",
    "tag",
)


def _put_label(c: Columns, row: int, v: int | None) -> None:
    if v is None:
        c.label[row] = NO_LABEL
        if c.wide:
            c.wide.pop(("label", row), None)
    elif v == NO_LABEL:
        c.label[row] = WIDE["label"]
        c.wide[("label", row)] = v
    else:
        c.put("label", c.label, row, v)


def handle(c: Columns, row: int) -> Entry:
    """The entry object of indexed ``row``: the one some code holds, else a new handle."""
    e = c.handle_of(row)
    if e is None:
        e = _Row.__new__(_Row)
        e._c = c
        e.row = row
        e.key = c.key_of(row)
        c.hold(row, e)
    return e


def attach(c: Columns, e: Entry, row: int) -> None:
    """Move the fields of unindexed ``e`` into ``row`` (already in the key table) and make
    ``e`` the handle of that row."""
    r = row
    c.tier[r] = e.tier
    c.backing[r] = e.backing
    c.pins[r] = e.pins
    c.moving[r] = 1 if e.moving else 0
    c.exact[r] = 1 if e.exact else 0
    c.bid[r] = e.bid
    c.put("cell", c.cell, r, e.cell)
    c.put("count", c.count, r, e.count)
    c.children[r] = e.children
    c.t_last[r] = e.t_last
    c.p_pred[r] = e.p_pred
    c.rank[r] = e.rank
    _put_label(c, r, e.label)
    c.put("nbytes", c.nbytes, r, e.nbytes)
    c.put("pos", c.pos, r, e.pos)
    c.put("crc", c.crc, r, e.crc)
    c.set_parent(r, e.parent)
    c.st[r] = c.intern(e.model_scope, e.tenant)
    c.set_tag(r, e.tag)
    e.__class__ = _Row
    e._c = c
    e.row = row
    c.hold(row, e)


def detach(c: Columns, row: int) -> None:
    """``row`` leaves the index: its handle, if any code holds one, keeps the row's fields."""
    e = c.unhold(row)
    if e is None:
        return
    values = [getattr(e, f) for f in _FIELDS]
    e.__class__ = Entry
    e.row = -1
    for f, v in zip(_FIELDS, values, strict=True):
        setattr(e, f, v)
