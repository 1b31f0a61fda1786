"""Reservations: :class:`Allocation`, :class:`Reservation` and the :class:`ReservationLedger`.

Import them from :mod:`tierkv.backend`, which re-exports them. Owns the exact
accounting of pending reservations and committed bytes that every backend keeps;
it touches no storage (the backend's allocator, files or server hold the bytes).
No other tierkv module but :mod:`tierkv.errors` and the checks of ``_checks``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Generic, TypeVar

from ._checks import check_allocation
from .errors import BlockExistsError, BlockNotFoundError, CapacityError

__all__ = ["Allocation", "Reservation", "ReservationLedger"]


@dataclass(frozen=True, slots=True)
class Allocation:
    """A reservation returned by :meth:`Backend.allocate` and consumed by :meth:`Backend.write`.

    ``handle`` is backend-private (an arena offset, a slot number); callers
    must treat it as opaque.
    """

    key: str
    nbytes: int
    tag: bytes = b""
    handle: int = 0


def _allocation_factory() -> Callable[[str, int, bytes, int], Allocation]:
    """A constructor of :class:`Allocation` that skips the frozen dataclass ``__init__``
    (four ``object.__setattr__`` calls through the generic path) and stores the fields
    through the slot descriptors directly: the same object (same type, fields, equality,
    hash, repr, still frozen against assignment), at about half the cost. Falls back
    to the class itself if its fields or slots are not exactly the expected ones."""
    names = ("key", "nbytes", "tag", "handle")
    fields = tuple(f.name for f in dataclasses.fields(Allocation))
    if fields != names or getattr(Allocation, "__slots__", None) != names or hasattr(Allocation, "__post_init__"):
        return Allocation
    set_key, set_nbytes, set_tag, set_handle = (Allocation.__dict__[n].__set__ for n in names)
    new = object.__new__

    def make(key: str, nbytes: int, tag: bytes, handle: int) -> Allocation:
        a: Allocation = new(Allocation)
        set_key(a, key)
        set_nbytes(a, nbytes)
        set_tag(a, tag)
        set_handle(a, handle)
        return a

    return make


_new_allocation = _allocation_factory()
_KEY, _NBYTES, _TAG, _HANDLE = (attrgetter(n) for n in ("key", "nbytes", "tag", "handle"))


class Reservation:
    """One pending reservation of a :class:`ReservationLedger`: what ``allocate`` promised.

    ``nbytes`` is the size asked for; ``held`` what it counts in ``used_bytes`` (``nbytes``
    rounded up to the medium's granule, a whole slot; ``nbytes`` by default). ``handle``
    tells a fresh reservation from an older one of the same key (the ledger assigns it).
    ``writing`` is set while a write of it is in flight (:meth:`ReservationLedger.claim`);
    ``dropped`` once it left the ledger (evicted, aborted, or the backend closed).

    Subclass it, with ``__slots__``, to keep a backend's own state of a reservation (an
    arena offset, a slot number), or of the block it becomes.
    """

    __slots__ = ("dropped", "handle", "held", "key", "nbytes", "tag", "writing")

    def __init__(self, key: str, nbytes: int, tag: bytes = b"", *, held: int | None = None) -> None:
        self.key = key
        self.nbytes = nbytes
        self.tag = tag
        self.held = nbytes if held is None else held
        self.handle = 0
        self.writing = False
        self.dropped = False

    def allocation(self) -> Allocation:
        """The :class:`Allocation` that ``allocate`` returns for this reservation."""
        return _new_allocation(self.key, self.nbytes, self.tag, self.handle)

    def __repr__(self) -> str:
        state = "dropped" if self.dropped else ("writing" if self.writing else "pending")
        return f"<{type(self).__name__} {self.key!r} {self.nbytes} B (holds {self.held}) #{self.handle} {state}>"


_R = TypeVar("_R", bound=Reservation)


class ReservationLedger(Generic[_R]):
    """The reservation bookkeeping of a backend, exact and in one place.

    It keeps the pending reservations (``allocate`` until ``write`` commits, or
    ``evict`` drops them) under their keys and three counts that return exactly to
    their previous values when a reservation is dropped or a committed block leaves:

    * ``reserved_bytes``: what pending reservations hold;
    * ``used_bytes``: what committed blocks and pending reservations hold
      (``committed_bytes + reserved_bytes``), the ``BackendStats.used_bytes``;
    * ``logical_bytes``: the exact sizes asked for, of both.

    With ``capacity`` it refuses a reservation that does not fit
    (:class:`~tierkv.CapacityError`); a backend whose allocator decides that (an arena,
    a pool of slots) passes None and asks its allocator. The committed blocks
    themselves (their bytes, their index) stay the backend's; it tells the ledger
    when one arrives (:meth:`commit`, or :meth:`restore` for blocks found at open)
    and leaves (:meth:`release`).

    The life of a reservation (``self._blocks``: the backend's committed index)::

        # allocate: check, fit, add (all three in one: ledger.reserve(...))
        ledger.check(key, nbytes, tag, committed=self._blocks)
        ledger.check_fits(held)
        allocation = ledger.add(MyReservation(key, nbytes, tag, held=held, slot=...))
        # write
        r = ledger.claim(allocation)     # BlockNotFoundError if unknown or in flight
        ...copy or I/O...                 # failed or cancelled: ledger.abort(r), undo, raise
        if not ledger.commit(r):          # evicted meanwhile: undo, raise BlockNotFoundError
            ...
        self._blocks[r.key] = ...
        # evict
        r = ledger.drop(key)              # a pending reservation (free it unless r.writing)
        ledger.release(nbytes, held)      # or a committed block

    Not thread-safe: call it from the event loop, without an ``await`` between a check
    and the change it guards.
    """

    __slots__ = (
        "_next_handle",
        "capacity",
        "committed_bytes",
        "logical_bytes",
        "max_block_bytes",
        "pending",
        "reserved_bytes",
        "tier",
    )

    def __init__(self, *, tier: str = "", capacity: int | None = None, max_block_bytes: int = 1 << 30) -> None:
        self.tier = tier
        self.capacity = capacity
        self.max_block_bytes = max_block_bytes
        #: the pending reservations by key
        self.pending: dict[str, _R] = {}
        self.reserved_bytes = 0
        self.committed_bytes = 0
        self.logical_bytes = 0
        self._next_handle = 1

    # ------------------------------------------------------------------ counts
    @property
    def used_bytes(self) -> int:
        """What committed blocks and pending reservations hold."""
        return self.committed_bytes + self.reserved_bytes

    def __contains__(self, key: object) -> bool:
        return key in self.pending

    def __len__(self) -> int:
        return len(self.pending)

    def get(self, key: str) -> _R | None:
        """The pending reservation under ``key``, or None."""
        return self.pending.get(key)

    # --------------------------------------------------------------- allocate
    def check(self, key: object, nbytes: object, tag: object, *, committed: Container[str] = ()) -> None:
        """The checks of ``allocate``: :func:`check_allocation` (InputError), then
        :class:`~tierkv.BlockExistsError` when ``key`` is pending here or in ``committed``."""
        check_allocation(key, nbytes, tag, max_block_bytes=self.max_block_bytes, tier=self.tier)
        assert isinstance(key, str)
        if key in self.pending or key in committed:
            raise BlockExistsError(f"a block or reservation exists under {key!r}", tier=self.tier)

    def check_fits(self, held: int, *, used: int | None = None) -> None:
        """CapacityError unless ``held`` more bytes fit in ``capacity`` (nothing to check
        without one). ``used`` replaces ``used_bytes`` where the backend counts the
        committed part itself (content shared between blocks counted once)."""
        if self.capacity is None:
            return
        now = self.used_bytes if used is None else used
        if now + held > self.capacity:
            raise CapacityError(
                f"cannot reserve {held} bytes: {max(0, self.capacity - now)} of {self.capacity} free",
                tier=self.tier,
            )

    def handles(self, count: int) -> range:
        """``count`` fresh handles (for reservations added with :meth:`add_many`)."""
        h0 = self._next_handle
        self._next_handle = h0 + count
        return range(h0, h0 + count)

    def add(self, r: _R) -> Allocation:
        """Register the checked reservation ``r`` (give it a fresh handle) and return its
        :class:`Allocation`."""
        r.handle = self._next_handle
        self._next_handle += 1
        self.pending[r.key] = r
        self.reserved_bytes += r.held
        self.logical_bytes += r.nbytes
        return _new_allocation(r.key, r.nbytes, r.tag, r.handle)

    def add_many(
        self,
        records: Sequence[_R],
        *,
        nbytes: int,
        held: int,
        columns: tuple[Sequence[str], Sequence[int], Sequence[bytes], Sequence[int]] | None = None,
    ) -> list[Allocation]:
        """Register checked reservations at once and return their allocations; their
        handles come from :meth:`handles`, and ``nbytes`` / ``held`` are their totals (a
        batch computes them in one pass). ``columns``: the records' keys, sizes, tags and
        handles, where the caller has them as sequences already (saves a pass over the
        records). C-level loops only."""
        if columns is None:
            columns = (
                list(map(_KEY, records)),
                list(map(_NBYTES, records)),
                list(map(_TAG, records)),
                list(map(_HANDLE, records)),
            )
        keys, sizes, tags, handles = columns
        self.pending.update(zip(keys, records, strict=True))
        self.reserved_bytes += held
        self.logical_bytes += nbytes
        return list(map(_new_allocation, keys, sizes, tags, handles))

    def reserve(
        self: ReservationLedger[Reservation], key: str, nbytes: int, tag: bytes = b"", *, committed: Container[str] = ()
    ) -> Allocation:
        """:meth:`check`, :meth:`check_fits` and :meth:`add` of a plain :class:`Reservation`
        holding ``nbytes``: the whole ``allocate`` of a backend without an allocator of its own."""
        self.check(key, nbytes, tag, committed=committed)
        self.check_fits(nbytes)
        return self.add(Reservation(key, nbytes, bytes(tag)))

    def reserve_many(
        self: ReservationLedger[Reservation],
        items: Sequence[tuple[str, int, bytes]],
        *,
        committed: Container[str] = (),
    ) -> list[Allocation]:
        """:meth:`reserve` of a batch, all or nothing: every item is checked (a key twice in
        the batch is BlockExistsError) and the batch must fit as a whole before any is
        added; the batch twin of ``allocate`` for a backend without an allocator of its own."""
        seen: set[str] = set()
        total = 0
        for key, nbytes, tag in items:
            self.check(key, nbytes, tag, committed=committed)
            if key in seen:
                raise BlockExistsError(f"key {key!r} appears twice in the batch", tier=self.tier)
            seen.add(key)
            total += nbytes
        self.check_fits(total)
        records = [Reservation(key, nbytes, bytes(tag)) for key, nbytes, tag in items]
        for r, h in zip(records, self.handles(len(records)), strict=True):
            r.handle = h
        return self.add_many(records, nbytes=total, held=total)

    # ------------------------------------------------------------------ write
    def claim(self, allocation: object) -> _R:
        """Start a write of ``allocation``: its pending reservation, marked ``writing``.

        Raises :class:`~tierkv.BlockNotFoundError` when it is not a pending reservation
        of this ledger (never made, already written, dropped: an older handle of the
        key) or a write of it is already in flight."""
        r = self.pending.get(allocation.key) if isinstance(allocation, Allocation) else None
        if r is None or r.handle != getattr(allocation, "handle", None) or r.writing:
            raise BlockNotFoundError(f"unknown or already written allocation {allocation!r}", tier=self.tier)
        r.writing = True
        return r

    def is_pending(self, r: _R) -> bool:
        """Whether ``r`` is still the pending reservation of its key (not dropped)."""
        return self.pending.get(r.key) is r

    def commit(self, r: _R, *, held: int | None = None) -> bool:
        """The write of ``r`` is done: it leaves the pending set and counts as a committed
        block holding ``held`` bytes (default ``r.held``; less where its content is
        shared). False, and nothing counted, when ``r`` was dropped meanwhile (the
        caller undoes what it stored and raises BlockNotFoundError)."""
        r.writing = False
        if self.pending.get(r.key) is not r:
            return False
        del self.pending[r.key]
        self.reserved_bytes -= r.held
        self.committed_bytes += r.held if held is None else held
        return True

    def commit_many(self, records: Sequence[_R]) -> None:
        """:meth:`commit` of several reservations known to be pending (not dropped)."""
        pending = self.pending
        held = 0
        for r in records:
            r.writing = False
            del pending[r.key]
            held += r.held
        self.reserved_bytes -= held
        self.committed_bytes += held

    def abort(self, r: _R) -> bool:
        """A write of ``r`` failed, was cancelled or its data was refused: drop ``r`` if it
        is still pending. True when it was (its storage is now the caller's to free);
        False when an evict (or close) dropped it before."""
        r.writing = False
        if self.pending.get(r.key) is not r:
            return False
        self._forget(r)
        return True

    # ------------------------------------------------------------------ evict
    def drop(self, key: str) -> _R | None:
        """Evict the pending reservation under ``key``: it leaves the ledger (``dropped``)
        and is returned, or None if there is none. Its storage is the caller's to free,
        unless a write of it is in flight (``r.writing``): that write frees it when its
        :meth:`commit` says False."""
        r = self.pending.get(key)
        if r is None:
            return None
        self._forget(r)
        return r

    def drop_unclaimed(self, allocations: Sequence[object]) -> list[_R]:
        """Drop the pending reservations that ``allocations`` name and no write has claimed
        (the rest of a batch that does not commit) and return them: their storage is the
        caller's to free. A claimed one stays (its write undoes it); an unknown or stale
        allocation is passed over."""
        dropped: list[_R] = []
        for a in allocations:
            if not isinstance(a, Allocation):
                continue
            r = self.pending.get(a.key)
            if r is not None and r.handle == a.handle and not r.writing:
                self._forget(r)
                dropped.append(r)
        return dropped

    def clear(self, *, committed: bool = False) -> list[_R]:
        """Drop every pending reservation (at close) and return them. With ``committed``
        the committed blocks' counts go too (a tier whose blocks do not outlive close)."""
        dropped = list(self.pending.values())
        for r in dropped:
            r.dropped = True
        self.pending.clear()
        self.reserved_bytes = 0
        self.logical_bytes -= sum(r.nbytes for r in dropped)
        if committed:
            self.committed_bytes = self.logical_bytes = 0
        return dropped

    def _forget(self, r: _R) -> None:
        del self.pending[r.key]
        r.dropped = True
        self.reserved_bytes -= r.held
        self.logical_bytes -= r.nbytes

    # ---------------------------------------------------------- committed blocks
    def release(self, nbytes: int, held: int | None = None) -> None:
        """A committed block of ``nbytes`` leaves (evicted, lost, quarantined) and gives
        back ``held`` bytes (default ``nbytes``; 0 where its content is still shared)."""
        self.logical_bytes -= nbytes
        self.committed_bytes -= nbytes if held is None else held

    def restore(self, nbytes: int, held: int | None = None) -> None:
        """A committed block of ``nbytes`` holding ``held`` bytes (default ``nbytes``) that
        the backend found on its medium (at open, by a scan) joins the counts."""
        self.logical_bytes += nbytes
        self.committed_bytes += nbytes if held is None else held
