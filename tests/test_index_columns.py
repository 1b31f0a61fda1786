"""The columnar index: entry identity, detaching, row reuse, parent keys, derived tags, growth."""

from __future__ import annotations

import gc
import hashlib
from pathlib import Path

import pytest
from kvtest import config

from tierkv import TierKV
from tierkv._engine._index import Entry
from tierkv._engine._tags import ZERO16, ZERO32, pack_tag

pytestmark = pytest.mark.anyio


def _key(i: int) -> bytes:
    return hashlib.sha256(b"k%d" % i).digest()


def _entry(kv: TierKV, i: int, parent: bytes, pos: int, *, exact: bool = True) -> Entry:
    s = kv._s
    kb = _key(i)
    tag = pack_tag(s.model_scope, ZERO16, parent, pos, i, 100, b"r" * 8, exact=exact)
    return Entry(kb.hex(), 0, 100, tag, s.model_scope, ZERO16, parent, pos, i)


async def test_identity_detach_and_row_reuse(tmp_path: Path) -> None:
    async with await TierKV.open(config(tmp_path)) as kv:
        ix, t = kv._s.index, kv._s.tiers[0]
        a = _entry(kv, 1, ZERO32, 0)
        tag = a.tag
        ix.adopt(a, b"")
        t.place(a)
        assert ix.entries.get(a.key) is a and ix.entries[a.key] is a and a.key in t.lru
        assert a.tag == tag and a.parent == ZERO32 and a.pos == 0 and a.crc == 1
        a.pins += 1
        assert ix.entries[a.key].pins == 1
        assert ix.remove(a) and a.key not in ix.entries and a.key not in t.lru
        assert a.pins == 1 and a.tag == tag  # detached: it keeps its fields
        b = _entry(kv, 1, ZERO32, 0)  # the same key put again: another entry (the row is reused)
        ix.adopt(b, b"")
        t.place(b)
        a.pins -= 1
        assert ix.entries[b.key] is b and b is not a and b.pins == 0 and a.pins == 0
        assert not ix.remove(a) and ix.entries.get(b.key) is b
        ix.remove(b)
        assert len(ix.entries) == 0 and not t.lru and t.tenant_bytes == {}


async def test_parents_iteration_order_growth_and_tags(tmp_path: Path) -> None:
    async with await TierKV.open(config(tmp_path)) as kv:
        ix, t = kv._s.index, kv._s.tiers[0]
        n = 5000  # past several rehashes of the key table
        parent = ZERO32
        for i in range(n):
            e = _entry(kv, i, parent, i % 50, exact=i % 3 != 0)
            if i % 50 == 0:
                e = _entry(kv, i, ZERO32, 0)
            ix.adopt(e, b"")
            t.place(e)
            parent = _key(i)
        del e
        gc.collect()
        assert len(ix.entries) == n and list(ix.entries) == [_key(i).hex() for i in range(n)]
        assert [k for k in t.lru] == [_key(i).hex() for i in range(n)]
        for i in (1, 49, 50, 51, 4999):
            e = ix.entries[_key(i).hex()]
            p = ZERO32 if i % 50 == 0 else _key(i - 1)
            assert e.parent == p and e.pos == i % 50
            assert e.tag == pack_tag(
                kv._s.model_scope, ZERO16, p, i % 50, i, 100, b"r" * 8, exact=i % 3 != 0 or i % 50 == 0
            )
        # a parent that leaves the index still names its children's parent key
        p = ix.entries[_key(10).hex()]
        ix.remove(p)
        assert ix.entries[_key(11).hex()].parent == _key(10)
        chain = [_key(i) for i in range(10)]
        found, reason = ix.walk(chain, ZERO16)
        assert len(found) == 10 and reason == ""
        assert ix.walk([*chain, _key(10)], ZERO16)[1] == "never_stored"
        for k in list(ix.entries):
            ix.remove(ix.entries[k])
        assert len(ix.entries) == 0 and not t.lru and not ix.cols.orphans
        assert sorted(ix.cols.free) == list(range(ix.cols.rows))


def test_find_many_probes_like_find_binary_through_collisions_and_tombstones() -> None:
    import numpy as np

    from tierkv._engine._columns import Columns

    c = Columns()
    # keys whose first 8 bytes agree modulo the table size: one long probe run
    keys = [(i * 1024).to_bytes(8, "little") + hashlib.sha256(b"%d" % i).digest()[:24] for i in range(40)]
    rows = []
    for k in keys:
        r = c.alloc()
        c.bid[r] = r
        c.insert(k.hex(), r)
        rows.append(r)
    for r in rows[5:40:3]:  # tombstones inside the run
        c.delete(r)
        c.release(r)
    absent = [hashlib.sha256(b"absent%d" % i).digest() for i in range(5)] + [
        (77 * 1024).to_bytes(8, "little") + bytes(24)
    ]
    probe = keys + absent
    kb = np.frombuffer(b"".join(probe), dtype="<u8").reshape(len(probe), 4)
    assert c.find_many(kb).tolist() == [c.find_binary(k) for k in probe]
    assert sum(r >= 0 for r in c.find_many(kb).tolist()) == 40 - len(rows[5:40:3])
    c.alloc()  # the columns still grow: no view of them outlived the call


async def test_vectorised_walk_equals_the_block_by_block_walk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Chains with a wrong position, a foreign parent, another tenant and a gap end where
    the one-key-at-a-time walk ends them, for the same reason."""
    from tierkv._engine import _index

    monkeypatch.setattr(_index, "_WALK_BY_KEY", 0)  # every walk as arrays
    async with await TierKV.open(config(tmp_path)) as kv:
        ix, t = kv._s.index, kv._s.tiers[0]
        keys = [_key(i) for i in range(12)]
        parent = ZERO32
        for i in range(12):
            pos, par = i, parent
            if i == 4:
                pos = 9  # a tag naming another position
            if i == 7:
                par = _key(100)  # a tag naming another parent
            if i != 10:  # a gap
                e = _entry(kv, i, par, pos)
                ix.adopt(e, b"")
                t.place(e)
            parent = keys[i]
        tid = ZERO16
        for ks in (keys, keys[:4], keys[5:], keys[8:], keys[:0]):
            slow = ix._walk_slow(ks, tid)
            assert ix.walk_rows(ks, tid) == slow
        assert ix.walk_rows(keys, tid)[1] == "integrity" and len(ix.walk_rows(keys, tid)[0]) == 4
        assert ix.walk_rows(keys, b"\x05" * 16) == ([], "integrity")  # another tenant's blocks
        t.breaker._open()  # the tier's breaker trips
        assert not t.healthy
        assert ix.walk_rows(keys, tid) == ix._walk_slow(keys, tid) == ([], "tier_unhealthy")


def _longest_run(heads: object, free: int) -> int:
    """The longest run of taken slots in an open-addressing table (wrapping around): what a probe
    for a key that is not there walks at worst."""
    taken = [h != free for h in heads]  # type: ignore[attr-defined]
    if all(taken):
        return len(taken)
    best = run = 0
    for t in taken + taken:  # twice: a run may wrap around the end
        run = run + 1 if t else 0
        best = max(best, run)
    return best


def test_rank_queue_keys_do_not_cluster_when_every_block_is_rekeyed() -> None:
    """A rank queue's keys are integers in a sliding window; when every block is re-keyed (a switch
    of the adaptive tau) the new window overlaps the old keys' slots. Probe runs in its key table stay
    short (keys taken as slot numbers made one run of ~all keys: a re-key of 100k blocks took 36 s)."""
    from tierkv._engine._columns import Columns
    from tierkv._engine._residency import _FREE, RankQueue

    c = Columns()
    rows = [c.alloc() for _ in range(20_000)]
    q = RankQueue(c)
    for r in rows:
        q.set(r, 1_000_000 + r)  # consecutive keys: one per block
    for r in rows:
        q.requeue(r, 1_000_000 + 10_000 + 3 * r)  # every key moves: a wider, shifted window
    assert len(q) == len(rows)
    assert _longest_run(q._heads, _FREE) < 200
    got = q.pick(lambda row: 1, 5)  # still ranked: the lowest keys first
    assert got == rows[:5]
