"""tierkv.backend.ReservationLedger: the one reservation bookkeeping every backend uses."""

from __future__ import annotations

import dataclasses

import pytest

from tierkv import _ledger
from tierkv.backend import Allocation, Reservation, ReservationLedger
from tierkv.errors import BlockExistsError, BlockNotFoundError, CapacityError, InputError


def counts(ledger: ReservationLedger[Reservation]) -> tuple[int, int, int, int]:
    return ledger.used_bytes, ledger.reserved_bytes, ledger.logical_bytes, len(ledger)


def test_reserve_commit_release_return_every_count_to_where_it_was() -> None:
    ledger: ReservationLedger[Reservation] = ReservationLedger(tier="t", capacity=100)
    a = ledger.reserve("k1", 30, b"tag")
    assert isinstance(a, Allocation) and (a.key, a.nbytes, a.tag) == ("k1", 30, b"tag")
    assert counts(ledger) == (30, 30, 30, 1)
    r = ledger.claim(a)
    assert r.writing and ledger.is_pending(r)
    assert ledger.commit(r)
    assert counts(ledger) == (30, 0, 30, 0) and ledger.committed_bytes == 30
    ledger.release(30)
    assert counts(ledger) == (0, 0, 0, 0) and ledger.committed_bytes == 0


def test_held_counts_in_used_and_reserved_nbytes_in_logical() -> None:
    ledger: ReservationLedger[Reservation] = ReservationLedger(tier="t")
    ledger.check("k", 10, b"")
    a = ledger.add(Reservation("k", 10, held=4096))
    assert counts(ledger) == (4096, 4096, 10, 1)
    r = ledger.claim(a)
    assert ledger.commit(r)
    assert counts(ledger) == (4096, 0, 10, 0)
    ledger.release(10, 4096)
    assert counts(ledger) == (0, 0, 0, 0)


def test_capacity_exists_and_argument_errors_name_the_tier() -> None:
    ledger: ReservationLedger[Reservation] = ReservationLedger(tier="mytier", capacity=100, max_block_bytes=80)
    ledger.reserve("a", 60)
    with pytest.raises(CapacityError, match=r"\[mytier\].*40 of 100 free"):
        ledger.reserve("b", 50)
    with pytest.raises(BlockExistsError, match="mytier"):
        ledger.reserve("a", 1)
    with pytest.raises(BlockExistsError):
        ledger.reserve("c", 1, committed={"c"})
    with pytest.raises(InputError, match="max_block_bytes=80"):
        ledger.reserve("d", 81)
    with pytest.raises(InputError, match="invalid block key"):
        ledger.reserve("bad key", 1)
    assert counts(ledger) == (60, 60, 60, 1)  # refused reservations count nothing


def test_used_replaces_the_committed_part_where_the_backend_counts_it() -> None:
    ledger: ReservationLedger[Reservation] = ReservationLedger(tier="t", capacity=100)
    ledger.check_fits(100)
    with pytest.raises(CapacityError):
        ledger.check_fits(11, used=90)
    ReservationLedger[Reservation](tier="t").check_fits(1 << 60)  # no capacity: the allocator decides


def test_claim_refuses_unknown_stale_and_in_flight_allocations() -> None:
    ledger: ReservationLedger[Reservation] = ReservationLedger(tier="t")
    a = ledger.reserve("k", 5)
    with pytest.raises(BlockNotFoundError):
        ledger.claim(Allocation("other", 5))
    with pytest.raises(BlockNotFoundError):
        ledger.claim(Allocation("k", 5, b"", a.handle + 1))  # an older or forged handle
    with pytest.raises(BlockNotFoundError):
        ledger.claim("k")
    r = ledger.claim(a)
    with pytest.raises(BlockNotFoundError):
        ledger.claim(a)  # a second write of the same reservation while the first runs
    assert ledger.abort(r)
    assert counts(ledger) == (0, 0, 0, 0) and r.dropped and not r.writing
    with pytest.raises(BlockNotFoundError):
        ledger.claim(a)  # aborted: gone


def test_evict_during_a_write_makes_the_commit_fail_and_counts_nothing() -> None:
    ledger: ReservationLedger[Reservation] = ReservationLedger(tier="t")
    r = ledger.claim(ledger.reserve("k", 7))
    dropped = ledger.drop("k")
    assert dropped is r and r.dropped and r.writing  # the write in flight frees its storage
    assert counts(ledger) == (0, 0, 0, 0)
    assert not ledger.commit(r)
    assert not ledger.abort(r)
    assert counts(ledger) == (0, 0, 0, 0) and ledger.committed_bytes == 0
    assert ledger.drop("k") is None


def test_a_new_reservation_of_the_key_is_not_the_old_one() -> None:
    ledger: ReservationLedger[Reservation] = ReservationLedger(tier="t")
    old = ledger.claim(ledger.reserve("k", 3))
    ledger.drop("k")
    new = ledger.reserve("k", 4)
    assert new.handle != old.handle
    assert not ledger.commit(old)  # the old write must not publish over the new reservation
    assert counts(ledger) == (4, 4, 4, 1)
    assert ledger.commit(ledger.claim(new))


def test_batches_restore_and_clear() -> None:
    ledger: ReservationLedger[Reservation] = ReservationLedger(tier="t")
    ledger.restore(100, 128)  # a block found on the medium at open
    assert counts(ledger) == (128, 0, 100, 0)
    recs = [Reservation(k, 10, held=16) for k in ("a", "b", "c")]
    for r, h in zip(recs, ledger.handles(3), strict=True):
        r.handle = h
    ledger.add_many(recs, nbytes=30, held=48)
    assert counts(ledger) == (176, 48, 130, 3)
    for r in recs[:2]:
        ledger.claim(r.allocation())
    ledger.commit_many(recs[:2])
    assert counts(ledger) == (176, 16, 130, 1) and ledger.committed_bytes == 160
    assert ledger.clear() == [recs[2]] and recs[2].dropped
    assert counts(ledger) == (160, 0, 120, 0)


def test_reserve_many_is_all_or_nothing() -> None:
    ledger: ReservationLedger[Reservation] = ReservationLedger(tier="t", capacity=100)
    allocs = ledger.reserve_many([("a", 10, b"x"), ("b", 20, b"")])
    assert [(a.key, a.nbytes, a.tag) for a in allocs] == [("a", 10, b"x"), ("b", 20, b"")]
    assert len({a.handle for a in allocs}) == 2 and counts(ledger) == (30, 30, 30, 2)
    with pytest.raises(CapacityError):
        ledger.reserve_many([("c", 40, b""), ("d", 40, b"")])  # each fits, the batch does not
    with pytest.raises(BlockExistsError, match="twice"):
        ledger.reserve_many([("e", 1, b""), ("e", 1, b"")])
    with pytest.raises(BlockExistsError):
        ledger.reserve_many([("f", 1, b""), ("a", 1, b"")])
    with pytest.raises(InputError):
        ledger.reserve_many([("g", 1, b""), ("h", -1, b"")])
    assert counts(ledger) == (30, 30, 30, 2)  # nothing of a refused batch was added
    assert ledger.claim(allocs[1]).key == "b"


def test_fast_allocation_constructor_builds_the_same_frozen_value() -> None:
    a = _ledger._new_allocation("k", 5, b"t", 7)
    ref = Allocation("k", 5, b"t", 7)
    assert type(a) is Allocation and a == ref and hash(a) == hash(ref) and repr(a) == repr(ref)
    assert (a.key, a.nbytes, a.tag, a.handle) == ("k", 5, b"t", 7)
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.key = "x"  # type: ignore[misc]
    assert dataclasses.replace(a, nbytes=6) == Allocation("k", 6, b"t", 7)


def test_drop_unclaimed_gives_up_the_rest_of_a_batch() -> None:
    ledger: ReservationLedger[Reservation] = ReservationLedger(tier="t")
    a, b, c = ledger.reserve_many([("a", 1, b""), ("b", 2, b""), ("c", 4, b"")])
    ra = ledger.claim(a)  # a write of it is in flight: it undoes itself
    stale = Allocation("c", 4, b"", c.handle + 100)
    dropped = ledger.drop_unclaimed([a, b, stale, "not an allocation", Allocation("zz", 1)])
    assert [r.key for r in dropped] == ["b"] and dropped[0].dropped
    assert ledger.is_pending(ra) and "c" in ledger and counts(ledger) == (5, 5, 5, 2)
