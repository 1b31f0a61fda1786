from __future__ import annotations

import mmap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierkv_backends._arena import Arena, BuddyAllocator, Extent


def _no_overlap(extents: list[tuple[int, int]]) -> None:
    end = 0
    for off, n in sorted(extents):
        assert off >= end, f"overlap at {off}"
        end = off + n


def test_rounding_and_exact_accounting() -> None:
    a = BuddyAllocator(1 << 20, granule=4096)
    assert a.capacity == 1 << 20
    e = a.allocate(5000)
    assert e is not None and e.held == 8192 and e.offset % 4096 == 0
    assert a.used == 8192
    e2 = a.allocate(3 * 4096)  # not a power of two: tail of the 4-granule run is given back
    assert e2 is not None and e2.held == 3 * 4096
    assert a.used == 8192 + 3 * 4096
    a.free(e)
    a.free(e2)
    assert a.used == 0
    assert a.free_runs() == [(0, 1 << 20)]


def test_zero_bytes_holds_nothing() -> None:
    a = BuddyAllocator(8192, granule=4096)
    e = a.allocate(0)
    assert e == Extent(0, 0, 0)
    assert a.used == 0
    a.free(e)
    assert a.used == 0


def test_full_then_none_then_reuse() -> None:
    a = BuddyAllocator(64 * 1024, granule=4096)
    es = [a.allocate(4096) for _ in range(16)]
    assert all(e is not None for e in es)
    assert a.allocate(1) is None
    assert a.largest_free == 0
    a.free(es[3])  # type: ignore[arg-type]
    again = a.allocate(100)
    assert again is not None and again.offset == es[3].offset  # type: ignore[union-attr]


def test_whole_capacity_non_power_of_two() -> None:
    a = BuddyAllocator(7 * 4096 + 100, granule=4096)  # rounds down to 7 granules
    assert a.capacity == 7 * 4096
    e = a.allocate(4 * 4096)
    f = a.allocate(2 * 4096)
    g = a.allocate(4096)
    assert e and f and g
    assert a.allocate(1) is None
    _no_overlap(a.live_extents())


def test_double_free_rejected() -> None:
    a = BuddyAllocator(1 << 16)
    e = a.allocate(4096)
    assert e is not None
    a.free(e)
    with pytest.raises(ValueError):
        a.free(e)


def test_bad_granule() -> None:
    with pytest.raises(ValueError):
        BuddyAllocator(1 << 16, granule=3000)


@settings(max_examples=200, deadline=None)
@given(
    size_granules=st.integers(1, 300),
    ops=st.lists(st.tuples(st.booleans(), st.integers(0, 40 * 512), st.integers(0, 1000)), max_size=120),
)
def test_property_no_overlap_exact_accounting(size_granules: int, ops: list[tuple[bool, int, int]]) -> None:
    g = 512
    a = BuddyAllocator(size_granules * g, granule=g)
    live: list[Extent] = []
    for is_alloc, nbytes, pick in ops:
        if is_alloc or not live:
            before = a.used
            e = a.allocate(nbytes)
            if e is None:
                assert a.used == before
                assert a.largest_free < a.held_bytes(nbytes) or nbytes > a.capacity
                continue
            assert e.held == a.held_bytes(nbytes)
            assert 0 <= e.offset and e.offset + e.held <= a.capacity
            assert a.used == before + e.held
            live.append(e)
        else:
            e = live.pop(pick % len(live))
            before = a.used
            a.free(e)
            assert a.used == before - e.held
        assert a.used == sum(x.held for x in live)
        _no_overlap([(x.offset, x.held) for x in live if x.held])
        # free runs and live extents tile the arena exactly
        tiles = a.free_runs() + a.live_extents()
        _no_overlap(tiles)
        assert sum(n for _, n in tiles) == a.capacity
    for e in live:
        a.free(e)
    assert a.used == 0
    assert sum(n for _, n in a.free_runs()) == a.capacity
    # fully coalesced: as few runs as the initial decomposition
    assert len(a.free_runs()) == bin(size_granules).count("1")


def test_arena_over_numpy_copies() -> None:
    ar = Arena(np.empty(1 << 20, dtype=np.uint8))
    ar.prefault()
    e = ar.allocate(10_000)
    assert e is not None
    src = np.random.default_rng(1).integers(0, 256, 10_000, dtype=np.uint8)
    ar.write_at(e, src)
    dst = np.empty(10_000, dtype=np.uint8)
    ar.read_at(e, dst)
    assert np.array_equal(src, dst)
    assert ar.used == ar.held_bytes(10_000)
    ar.free(e)
    assert ar.used == 0


def test_arena_over_mmap() -> None:
    m = mmap.mmap(-1, 1 << 16)
    ar = Arena(m, granule=4096)
    e = ar.allocate(4096)
    assert e is not None
    ar.write_at(e, np.full(4096, 7, dtype=np.uint8))
    assert m[e.offset : e.offset + 4096] == b"\x07" * 4096
    got = ar.allocate_many([4096] * 100)
    assert got is None and ar.used == 4096  # all or nothing
    ar.free(e)
    del ar, e


def test_arena_rejects_readonly() -> None:
    with pytest.raises(ValueError):
        Arena(b"x" * 4096)


@pytest.mark.parametrize("granules", [3, 1440, 1441, 8191])
def test_blocks_of_an_odd_size_fill_the_arena(granules: int) -> None:
    """Blocks whose size is not a power of two (most KV blocks: a SmolLM2 256-token block is
    1440 granules) pack back to back: the arena holds capacity // size of them, not one per
    power-of-two run (a plain buddy system held 61 of 86 such blocks in 487 MiB)."""
    g = 4096
    a = BuddyAllocator(511_209_472 // g * g, g)
    nbytes = granules * g
    held = []
    while (e := a.allocate(nbytes)) is not None:
        held.append(e)
    assert len(held) == a.capacity // nbytes
    # and the space comes back whole
    for e in held:
        a.free(e)
    assert a.used == 0 and a.largest_free == 1 << (a.capacity.bit_length() - 1)
