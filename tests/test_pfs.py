from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from kvtest import hold_in_thread

from tierkv import errors as E
from tierkv._engine._tags import pack_tag
from tierkv.backend import MAX_TAG_BYTES, SupportsScan, TierKind
from tierkv_backends import pfs as pfs_mod
from tierkv_backends.pfs import PfsBackend

pytestmark = pytest.mark.anyio

MiB = 1 << 20


def _rand(n: int, seed: int = 0) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


async def _open(path: Path, **opts: Any) -> PfsBackend:
    opts.setdefault("capacity", 64 * MiB)
    return await PfsBackend.open({"path": str(path), **opts})


def _objects(root: Path) -> list[Path]:
    return sorted(p for p in (root / "objects").rglob("*") if p.is_file())


def _record(root: Path, key: str) -> Path:
    (p,) = [p for p in (root / "keys").iterdir() if p.name.partition("~")[0] == key]
    return p


def _flip(root: Path, key: str, at: int = 0) -> None:
    """Flip one content byte of ``key``'s content file (every record of it sees the damage)."""
    p = _record(root, key)
    n = p.stat().st_size - pfs_mod._HDR.size
    off = pfs_mod._HDR.size + at % max(1, n)
    with open(p, "r+b") as f:
        f.seek(off)
        b = f.read(1)
        f.seek(off)
        f.write(bytes([b[0] ^ 0xFF]))


def _same(a: Path, b: Path) -> bool:
    return os.path.samefile(a, b)


def _scribble_header(p: Path) -> None:
    with open(p, "r+b") as f:
        f.write(b"garbage!")


def _tenant_tag(tenant: bytes, pos: int = 0) -> bytes:
    return pack_tag(b"m" * 16, tenant.ljust(16, b"\0"), bytes(32), pos, 0, 0, b"r" * 8)


async def _put(b: PfsBackend, key: str, data: bytes, tag: bytes = b"") -> None:
    a = await b.allocate(key, len(data), tag=tag)
    await b.write(a, data)


@pytest.mark.parametrize("n", [0, 1, 4096, 100_000, 2 * MiB + 3])
async def test_round_trip_bit_exact(tmp_path: Path, n: int) -> None:
    async with await _open(tmp_path) as b:
        data = _rand(n, n)
        await _put(b, "k", data, tag=b"tag")
        assert await b.contains("k")
        assert bytes(await b.read("k")) == data
        into = np.zeros(n + 7, dtype=np.uint8)
        view = await b.read("k", into=into)
        assert bytes(view) == data and into[:n].tobytes() == data
        sha = hashlib.sha256(data).hexdigest()
        (obj,) = _objects(tmp_path)
        assert obj.name == sha  # content-addressed: the file is named by the sha256 of the bytes
        rec = _record(tmp_path, "k")
        assert _same(rec, obj) and rec.stat().st_nlink == 2  # the record is a hard link
        assert await b.content_hash("k") == sha
        s = b.stats()
        assert s.kind is TierKind.PFS and s.io_path == "posix pread/pwrite + fsync" and not s.emulated
        assert s.used_bytes == n and s.blocks == 1 and s.details["format"] == 5
    assert isinstance(b, SupportsScan)


async def test_identical_content_stored_once_and_reference_counted(tmp_path: Path) -> None:
    async with await _open(tmp_path) as b:
        data = _rand(50_000, 1)
        await _put(b, "a", data)
        assert b.stats().used_bytes == 50_000
        a2 = await b.allocate("b", 50_000)
        assert b.stats().used_bytes == 100_000  # the reservation counts until written
        await b.write(a2, data)
        s = b.stats()
        assert s.used_bytes == 50_000 and s.details["logical_bytes"] == 100_000  # stored once
        assert s.details["content_files"] == 1 and s.details["dedup_hits"] == 1
        (obj,) = _objects(tmp_path)
        assert obj.stat().st_nlink == 3  # objects/ name + two records: refcount 2
        assert await b.evict("a") is True
        assert obj.stat().st_nlink == 2 and bytes(await b.read("b")) == data
        assert b.stats().used_bytes == 50_000
        assert await b.evict("b") is True
        assert await b.evict("b") is False
        assert _objects(tmp_path) == [] and b.stats().used_bytes == 0  # the last reference took it
        assert sorted(os.listdir(tmp_path / "keys")) == []


async def test_dedup_is_scoped_by_tenant(tmp_path: Path) -> None:
    data = _rand(30_000, 2)
    t1, t1b, t2 = _tenant_tag(b"alice", 0), _tenant_tag(b"alice", 5), _tenant_tag(b"bob", 0)
    async with await _open(tmp_path) as b:
        await _put(b, "a1", data, tag=t1)
        await _put(b, "a2", data, tag=t1b)  # same tenant, another tag: shares the content file
        await _put(b, "b1", data, tag=t2)  # another tenant: never shares
        await _put(b, "u1", data)  # untagged: a scope of its own
        await _put(b, "f1", data, tag=b"foreign-tag")  # a tag that is not tierkv's: scoped by the tag
        objs = _objects(tmp_path)
        assert len(objs) == 4 and {p.name for p in objs} == {hashlib.sha256(data).hexdigest()}
        assert len({p.parent.name for p in objs}) == 4
        assert _same(_record(tmp_path, "a1"), _record(tmp_path, "a2"))
        assert not _same(_record(tmp_path, "a1"), _record(tmp_path, "b1"))
        assert b.stats().used_bytes == 4 * 30_000
    async with await _open(tmp_path / "g", dedup="global") as g:
        await _put(g, "a1", data, tag=t1)
        await _put(g, "b1", data, tag=t2)  # configured to share across tenants
        assert len(_objects(tmp_path / "g")) == 1 and g.stats().used_bytes == 30_000


def test_dedup_scope_and_record_names_are_pure() -> None:
    t = _tenant_tag(b"alice")
    assert pfs_mod.dedup_scope(t, "tenant") == "t-" + b"alice".ljust(16, b"\0").hex()
    assert pfs_mod.dedup_scope(t, "global") == "shared" == pfs_mod.dedup_scope(b"x", "global")
    assert pfs_mod.dedup_scope(b"", "tenant") == "untagged"
    assert pfs_mod.dedup_scope(b"x", "tenant") != pfs_mod.dedup_scope(b"y", "tenant")
    sha = hashlib.sha256(b"x").digest()
    long_tag = bytes(range(MAX_TAG_BYTES))
    name, side = pfs_mod.record_name("k" * 128, long_tag, sha)
    bind = pfs_mod.record_binding("k" * 128, sha, long_tag)
    assert side and len(name) <= 255 and pfs_mod.parse_record_name(name) == ("k" * 128, bind, None, side)
    # the binding covers the key, the content and the tag
    assert len({bind, pfs_mod.record_binding("k", sha, long_tag), pfs_mod.record_binding("k" * 128, sha, b"")}) == 3
    h = sha[:16].hex()
    for bad in ("nosep", f"../x~{h}~", f"k~{h}~~short", f"k~{h}~a=", f"k~{h}~!!", "k~zz~", f"k~{h}"):
        with pytest.raises((ValueError, E.InputError)):
            pfs_mod.parse_record_name(bad)


@given(
    key=st.from_regex(r"[0-9A-Za-z._-]{1,128}", fullmatch=True),
    tag=st.binary(max_size=MAX_TAG_BYTES),
    sha=st.binary(min_size=32, max_size=32),
)
def test_record_names_round_trip(key: str, tag: bytes, sha: bytes) -> None:
    name, side = pfs_mod.record_name(key, tag, sha)
    assert len(name.encode()) <= 255 and "/" not in name
    k, pfx, t, s = pfs_mod.parse_record_name(name)
    assert k == key and pfx == pfs_mod.record_binding(key, sha, tag) and s == side
    assert t == tag if not side else t is None


async def test_errors(tmp_path: Path) -> None:
    async with await _open(tmp_path, capacity=MiB, max_block_bytes=2 * MiB) as b:
        with pytest.raises(E.CapacityError):
            await b.allocate("k", MiB + 1)
        with pytest.raises(E.InputError):
            await b.allocate("k", 3 * MiB)
        with pytest.raises(E.InputError):
            await b.allocate("../etc", 1)
        with pytest.raises(E.InputError):
            await b.allocate("k~x", 1)  # the record separator is not a key character
        a = await b.allocate("k", 100)
        with pytest.raises(E.BlockExistsError):
            await b.allocate("k", 100)
        with pytest.raises(E.InputError):
            await b.write(a, b"short")
        assert b.stats().used_bytes == 0 and not await b.contains("k")
        with pytest.raises(E.BlockNotFoundError):
            await b.write(a, bytes(100))
        with pytest.raises(E.BlockNotFoundError):
            await b.read("k")
        await _put(b, "k", bytes(100))
        with pytest.raises(E.InputError):
            await b.read("k", into=bytearray(10))
    for opts in (
        {},
        {"path": str(tmp_path), "fsync": "yes"},
        {"path": str(tmp_path), "nope": 1},
        {"path": str(tmp_path), "dedup": "tenants"},
    ):
        with pytest.raises(E.ConfigError):
            PfsBackend(opts)


async def test_store_of_an_earlier_format_is_refused(tmp_path: Path) -> None:
    (tmp_path / "keys").mkdir()
    os.symlink("tierkv-rec3/seg/0/10/" + "0" * 32, tmp_path / "keys" / "old")
    with pytest.raises(E.ConfigError, match="earlier"):
        await _open(tmp_path)
    assert (tmp_path / "keys" / "old").is_symlink()  # nothing touched


async def test_use_after_close(tmp_path: Path) -> None:
    b = await _open(tmp_path)
    await _put(b, "k", b"abc")
    await b.aclose()
    await b.aclose()
    for coro in (b.read("k"), b.allocate("x", 1), b.evict("k"), b.contains("k"), b.scan()):
        with pytest.raises(E.BackendClosedError):
            await coro
    assert b.stats().blocks == 1


async def test_corruption_detected_quarantined_never_served(tmp_path: Path) -> None:
    async with await _open(tmp_path) as b:
        data = _rand(10_000, 5)
        for k, v in (("k", data), ("twin", data), ("other", _rand(10_000, 6))):
            await _put(b, k, v)
        assert _same(_record(tmp_path, "k"), _record(tmp_path, "twin"))
        _flip(tmp_path, "k", 1234)
        with pytest.raises(E.IntegrityError):
            await b.read("k")
        # "twin" shared the corrupt content file: it goes too (never served), "other" stays
        for key in ("k", "twin"):
            assert not await b.contains(key)
            with pytest.raises(E.BlockNotFoundError):
                await b.read(key)
        other = pfs_mod.record_name("other", b"", hashlib.sha256(_rand(10_000, 6)).digest())[0]
        assert sorted(os.listdir(tmp_path / "keys")) == [other]
        (q,) = os.listdir(tmp_path / "quarantine")  # the bad bytes, kept for inspection
        assert q.startswith(hashlib.sha256(data).hexdigest())
        assert bytes(await b.read("other")) == _rand(10_000, 6)
        assert b.stats().used_bytes == 10_000 and b.stats().details["integrity_failures"] == 1
        assert len(_objects(tmp_path)) == 1
        await _put(b, "again", data)  # the same content is stored afresh, not linked to the bad file
        assert bytes(await b.read("again")) == data
    async with await _open(tmp_path) as b2:  # a new process never serves it either
        assert {i.key for i in await b2.scan()} == {"other", "again"}
        with pytest.raises(E.BlockNotFoundError):
            await b2.read("k")


async def test_dedup_never_links_to_corrupt_content(tmp_path: Path) -> None:
    data = _rand(20_000, 8)
    async with await _open(tmp_path) as b:
        await _put(b, "a", data)
        _flip(tmp_path, "a", 10)
        await _put(b, "b", data)  # compares the bytes before linking: the bad file is quarantined
        assert bytes(await b.read("b")) == data
        assert len(os.listdir(tmp_path / "quarantine")) == 1
        with pytest.raises(E.IntegrityError):
            await b.read("a")
        assert bytes(await b.read("b")) == data and not await b.contains("a")


async def test_record_linked_to_the_wrong_content_is_never_served(tmp_path: Path) -> None:
    async with await _open(tmp_path) as b:
        await _put(b, "a", _rand(5000, 1))
        await _put(b, "b", _rand(5000, 2))
    ra, rb = _record(tmp_path, "a"), _record(tmp_path, "b")
    os.unlink(ra)
    os.link(rb, ra)  # "a"'s record now names b's (self-consistent) content file
    async with await _open(tmp_path) as b2:
        with pytest.raises(E.IntegrityError):
            await b2.read("a")
        assert not await b2.contains("a") and not ra.exists()  # the bad record went...
        assert bytes(await b2.read("b")) == _rand(5000, 2)  # ...the sound content it named stays
        assert os.listdir(tmp_path / "quarantine") == []


async def test_corruption_in_read_many_is_quarantined_and_the_rest_served(tmp_path: Path) -> None:
    async with await _open(tmp_path) as b:
        datas = [_rand(70_000, i) for i in range(6)]
        allocs = await b.allocate_many([(f"m{i}", 70_000, b"") for i in range(6)])
        await b.write_many(allocs, datas)
        _flip(tmp_path, "m2", 7)
        outs = [bytearray(70_000) for _ in range(6)]
        with pytest.raises(E.IntegrityError):
            await b.read_many([f"m{i}" for i in range(6)], into=outs)
        assert [bytes(o) for i, o in enumerate(outs) if i != 2] == [d for i, d in enumerate(datas) if i != 2]
        assert not await b.contains("m2") and b.stats().details["integrity_failures"] == 1


@pytest.mark.parametrize("how", ["truncate", "header"])
async def test_truncated_or_bad_header_is_integrity_error(tmp_path: Path, how: str) -> None:
    async with await _open(tmp_path) as b:
        await _put(b, "k", _rand(5000))
        p = _record(tmp_path, "k")
        if how == "truncate":
            os.truncate(p, 100)
        else:
            _scribble_header(p)
        with pytest.raises(E.IntegrityError):
            await b.read("k")
        assert not await b.contains("k") and _objects(tmp_path) == []


async def test_restart_recovery_via_scan(tmp_path: Path) -> None:
    blocks = {f"key{i}": _rand(1000 * i + 1, i) for i in range(6)}
    long_tag = bytes(range(200))  # too long for a file name: kept in tags/
    async with await _open(tmp_path) as b:
        for k, v in blocks.items():
            await _put(b, k, v, tag=k.encode())
        await _put(b, "dup", blocks["key3"])  # equal bytes, another scope (untagged)
        await _put(b, "dup2", blocks["key3"], tag=b"key3")  # equal bytes, same scope: shared
        await _put(b, "long", b"L" * 10, tag=long_tag)
        pending = await b.allocate("pending", 10)  # never written: must not come back
        assert pending.nbytes == 10
    # garbage a crashed writer would leave behind
    (tmp_path / "tmp" / "deadhost.1.abc.tmp").write_bytes(b"junk")
    (tmp_path / "tmp" / f"{pfs_mod._HOST}.999999999.abc.tmp").write_bytes(b"junk")
    (tmp_path / "keys" / "notours.txt").write_text("left alone")
    orphan = tmp_path / "objects" / "untagged" / ("0" * 64)  # content no record links, old
    orphan.write_bytes(b"x" * 100)
    recent = tmp_path / "objects" / "untagged" / ("1" * 64)  # maybe still being published
    recent.write_bytes(b"y" * 100)
    past = time.time() - 2 * pfs_mod._ORPHAN_MAX_AGE_S
    os.utime(orphan, (past, past))
    async with await _open(tmp_path) as b2:
        infos = {i.key: i for i in await b2.scan()}
        assert set(infos) == {*blocks, "dup", "dup2", "long"}
        for k, v in blocks.items():
            assert infos[k].nbytes == len(v) and infos[k].tag == k.encode()
            assert bytes(await b2.read(k)) == v
        assert infos["long"].tag == long_tag and bytes(await b2.read("long")) == b"L" * 10
        n = sum(len(v) for v in blocks.values()) + len(blocks["key3"]) + 10
        assert b2.stats().used_bytes == n  # dup2 shares key3's content file: counted once
        assert not (tmp_path / "tmp" / f"{pfs_mod._HOST}.999999999.abc.tmp").exists()  # dead writer cleaned
        assert (tmp_path / "tmp" / "deadhost.1.abc.tmp").exists()  # another host's, recent: left alone
        assert (tmp_path / "keys" / "notours.txt").exists()
        assert not orphan.exists() and recent.exists()
        await b2.evict("key3")
        assert bytes(await b2.read("dup2")) == blocks["key3"]
        assert await b2.content_hash("dup2") == hashlib.sha256(blocks["key3"]).hexdigest()


async def test_duplicate_records_of_a_key_after_a_crash_keep_one(tmp_path: Path) -> None:
    async with await _open(tmp_path) as b:
        await _put(b, "k", b"one", tag=b"t1")
    # a crash between linking a rewrite's record (another tag) and unlinking the old one
    old = _record(tmp_path, "k")
    os.link(old, tmp_path / "keys" / pfs_mod.record_name("k", b"t2", hashlib.sha256(b"one").digest())[0])
    async with await _open(tmp_path) as b2:
        (info,) = await b2.scan()
        assert info.key == "k" and bytes(await b2.read("k")) == b"one"
        assert len(os.listdir(tmp_path / "keys")) == 1


async def _cancel_during_publish(monkeypatch: pytest.MonkeyPatch, write: Callable[[], Awaitable[None]]) -> None:
    """Run ``write`` and cancel it while a block's publish is held in its worker thread
    (after its content file and record were linked); the thread then goes on, and the
    cancelled write must undo what it published. Fails if this takes over 5 s."""
    held = hold_in_thread(monkeypatch, PfsBackend, "_put_block", after_call=True)
    with anyio.move_on_after(5) as outer:
        async with anyio.create_task_group() as tg:
            tg.start_soon(write)
            await held.entered()
            tg.cancel_scope.cancel()
            held.release.set()
    assert not outer.cancelled_caught


async def test_cancel_mid_write_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    b = await _open(tmp_path)
    a = await b.allocate("k", 300_000)

    async def writer() -> None:
        await b.write(a, _rand(300_000))

    await _cancel_during_publish(monkeypatch, writer)
    assert not await b.contains("k")
    assert b.stats().used_bytes == 0 and b.stats().reserved_bytes == 0
    assert _objects(tmp_path) == [] and os.listdir(tmp_path / "keys") == []
    assert os.listdir(tmp_path / "tmp") == []
    await b.aclose()
    async with await _open(tmp_path) as b2:
        assert await b2.scan() == []


async def test_cancel_mid_write_keeps_shared_content(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = _rand(40_000, 4)
    b = await _open(tmp_path)
    await _put(b, "keep", data)
    a = await b.allocate("k", 40_000)

    async def writer() -> None:
        await b.write(a, data)  # deduplicates onto "keep"'s content file, then is cancelled

    await _cancel_during_publish(monkeypatch, writer)
    assert not await b.contains("k") and bytes(await b.read("keep")) == data
    (obj,) = _objects(tmp_path)
    assert obj.stat().st_nlink == 2 and b.stats().used_bytes == 40_000
    await b.aclose()


async def test_cancel_before_publish(tmp_path: Path) -> None:
    async with await _open(tmp_path) as b:
        a = await b.allocate("k", 1000)
        with anyio.move_on_after(0):
            await b.write(a, bytes(1000))
        assert not await b.contains("k") and b.stats().used_bytes == 0
        assert _objects(tmp_path) == []


@pytest.mark.parametrize("tmpfile", [True, False])
async def test_batch_twins_and_both_publish_protocols(tmp_path: Path, tmpfile: bool) -> None:
    async with await _open(tmp_path, fsync=False) as b:
        b._tmpfile = tmpfile and b._tmpfile  # False: the named temp file + rename protocol
        datas = [_rand(20_000, i % 3) for i in range(9)]  # 3 distinct contents, 9 blocks
        allocs = await b.allocate_many([(f"k{i}", 20_000, b"") for i in range(9)])
        await b.write_many(allocs, datas)
        assert b.stats().details["publish"] == ("O_TMPFILE + linkat" if b._tmpfile else "temp file + rename")
        got = await b.read_many([f"k{i}" for i in range(9)])
        assert [bytes(g) for g in got] == datas
        files = _objects(tmp_path)
        assert len(files) == 3 and b.stats().details["dedup_hits"] == 6  # equal blocks of a batch share
        assert b.stats().used_bytes == 60_000 and b.stats().details["content_files"] == 3
        assert os.listdir(tmp_path / "tmp") == []
        assert await b.evict_many([f"k{i}" for i in range(9)]) == [True] * 9
        assert _objects(tmp_path) == [] and b.stats().used_bytes == 0
        with pytest.raises(E.BlockNotFoundError):
            await b.read_many(["k0"])


def test_default_options(tmp_path: Path) -> None:
    opts = PfsBackend.default_options(tmp_path)
    assert opts["path"].startswith(str(tmp_path))
    assert PfsBackend.probe().usable


async def test_rewrite_with_another_tag_replaces_the_record(tmp_path: Path) -> None:
    async with await _open(tmp_path) as b:
        await _put(b, "k", b"v1", tag=b"t1")
        await b.evict("k")
        await _put(b, "k", b"v2", tag=b"t2")
        assert [i.tag for i in await b.scan()] == [b"t2"]
        assert len(os.listdir(tmp_path / "keys")) == 1


async def test_block_evicted_or_rewritten_by_another_process(tmp_path: Path) -> None:
    async with await _open(tmp_path) as b1, await _open(tmp_path) as b2:
        allocs = await b1.allocate_many([(f"x{i}", 50_000, b"") for i in range(4)])
        await b1.write_many(allocs, [_rand(50_000, i) for i in range(4)])
        assert {i.key for i in await b2.scan()} == {f"x{i}" for i in range(4)}
        assert b2.stats().used_bytes == 200_000
        assert await b1.evict("x1")  # unlinks the record (and the content: no other record) b2 indexes
        with pytest.raises(E.BlockNotFoundError):
            await b2.read("x1")
        assert not await b2.contains("x1")
        # the key rewritten by the other process with other bytes: b2's record is gone (a miss)
        # until b2 scans; the same bytes rewritten keep the record's name: b2 still reads them
        await b1.evict("x2")
        await _put(b1, "x2", _rand(50_000, 99))
        with pytest.raises(E.BlockNotFoundError):
            await b2.read("x2")
        await b1.evict("x3")
        await _put(b1, "x3", _rand(50_000, 3))
        assert bytes(await b2.read("x3")) == _rand(50_000, 3)
        assert b2.stats().details["integrity_failures"] == 0 and os.listdir(tmp_path / "quarantine") == []
        _flip(tmp_path, "x0", 3)  # real damage is found by both
        with pytest.raises(E.IntegrityError):
            await b2.read("x0")
        with pytest.raises((E.IntegrityError, E.BlockNotFoundError)):
            await b1.read("x0")
        assert bytes(await b2.read("x3")) == _rand(50_000, 3)
        assert {i.key for i in await b2.scan()} == {"x2", "x3"}
        # shared content across processes: b2's evict keeps what b1 still links
        await _put(b2, "y", _rand(50_000, 3))
        assert _record(tmp_path, "y").stat().st_nlink == 3
        await b1.evict("x3")
        assert bytes(await b2.read("y")) == _rand(50_000, 3)


async def test_read_many_hot_and_cold_paths_agree(tmp_path: Path) -> None:
    blocks = {f"h{i}": _rand(3000 * i + 17, i) for i in range(1, 12)}
    async with await _open(tmp_path) as b:
        for k, v in blocks.items():
            await _put(b, k, v)
        hot = await b.read_many(list(blocks))
        for p in _objects(tmp_path):  # drop the pages: the cold pass serves them
            fd = os.open(p, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        cold = await b.read_many(list(blocks), into=[bytearray(len(v)) for v in blocks.values()])
        assert [bytes(x) for x in hot] == [bytes(x) for x in cold] == list(blocks.values())


async def test_write_many_mixed_failures_and_restart(tmp_path: Path) -> None:
    async with await _open(tmp_path) as b:
        datas = [_rand(9000 + i, i % 2) for i in range(6)]
        allocs = await b.allocate_many([(f"g{i}", len(d), f"t{i}".encode()) for i, d in enumerate(datas)])
        stale = await b.allocate("stale", 10)
        await b.evict("stale")  # its reservation is gone: that block fails, the others commit
        bad = await b.allocate("short", 100)
        with pytest.raises(E.BlockNotFoundError):
            await b.write_many([*allocs, stale, bad], [*datas, bytes(10), bytes(99)])
        for i, d in enumerate(datas):
            assert bytes(await b.read(f"g{i}")) == d
        assert not await b.contains("short") and not await b.contains("stale")
        assert b.stats().reserved_bytes == 0  # the wrong-length reservation was released
    async with await _open(tmp_path) as b2:
        infos = {i.key: i.tag for i in await b2.scan()}
        assert infos == {f"g{i}": f"t{i}".encode() for i in range(6)}


@pytest.mark.parametrize(
    ("err", "expected"),
    [
        (OSError(5, "Input/output error"), E.BackendIOError),
        # a full disk (or quota) is a capacity condition, not a device failure
        (OSError(28, "No space left on device"), E.CapacityError),
        (OSError(122, "Disk quota exceeded"), E.CapacityError),
    ],
)
async def test_io_error_in_one_block_fails_only_that_block(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, err: OSError, expected: type[Exception]
) -> None:
    real = PfsBackend._put_block

    def flaky(self: PfsBackend, scope: str, tag: bytes, key: str, src: memoryview) -> Any:
        if key == "bad":
            raise err
        return real(self, scope, tag, key, src)

    monkeypatch.setattr(PfsBackend, "_put_block", flaky)
    async with await _open(tmp_path) as b:
        allocs = await b.allocate_many([("ok", 100, b""), ("bad", 100, b"")])
        with pytest.raises(expected, match=str(err.strerror)) as info:
            await b.write_many(allocs, [b"a" * 100, b"b" * 100])
        assert expected is E.CapacityError or not isinstance(info.value, E.CapacityError)
        assert bytes(await b.read("ok")) == b"a" * 100 and not await b.contains("bad")
        assert b.stats().used_bytes == 100 and b.stats().reserved_bytes == 0


async def test_cancel_mid_write_many_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    b = await _open(tmp_path)
    allocs = await b.allocate_many([(f"c{i}", 600_000, b"") for i in range(5)])

    async def writer() -> None:
        await b.write_many(allocs, [_rand(600_000, i) for i in range(5)])

    await _cancel_during_publish(monkeypatch, writer)
    assert b.stats().used_bytes == 0 and b.stats().reserved_bytes == 0
    assert _objects(tmp_path) == [] and os.listdir(tmp_path / "keys") == []
    assert os.listdir(tmp_path / "tmp") == [] and b.stats().details["content_files"] == 0
    await b.aclose()
    async with await _open(tmp_path) as b2:
        assert await b2.scan() == []


@pytest.mark.parametrize("at", [0, 300_000, 600_000, (1 << 20) - 1])
async def test_large_blocks_verified_piece_by_piece(tmp_path: Path, at: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks over 512 KiB read from the page cache by a lone caller are read and hashed in
    pieces (two of 512 KiB here): a flipped byte in any piece is still caught (and
    quarantined), the others read."""
    pieces: list[bool] = []
    real = PfsBackend._read_one

    def spy(self: PfsBackend, rec: Any, dst: memoryview, nowait: bool, piecewise: bool, *rest: Any) -> Any:
        pieces.append(piecewise)
        return real(self, rec, dst, nowait, piecewise, *rest)

    monkeypatch.setattr(PfsBackend, "_read_one", spy)
    datas = [_rand(1 << 20, i) for i in range(3)]
    async with await _open(tmp_path) as b:
        allocs = await b.allocate_many([(f"L{i}", 1 << 20, b"") for i in range(3)])
        await b.write_many(allocs, datas)
        assert [bytes(x) for x in await b.read_many(["L0", "L1", "L2"])] == datas  # cached: pieces
        _flip(tmp_path, "L1", at)
        with pytest.raises(E.IntegrityError):
            await b.read_many(["L0", "L1", "L2"], into=[bytearray(1 << 20) for _ in range(3)])
        assert not await b.contains("L1")
        assert [bytes(x) for x in await b.read_many(["L0", "L2"])] == [datas[0], datas[2]]
    assert any(pieces)  # the piecewise path did the reading


async def test_put_during_evict_of_the_same_key_survives(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An evict's record unlink runs in a worker thread after the key left the index; a put of
    the same key and bytes (same record name) meanwhile must not have its record unlinked."""
    real = PfsBackend._apply

    def slow_apply(self: PfsBackend, undo: Any) -> None:
        time.sleep(0.2)  # the put below gets to run while this evict is still pending
        real(self, undo)

    data = _rand(30_000, 9)
    async with await _open(tmp_path) as b:
        await _put(b, "k", data, tag=b"t")
        monkeypatch.setattr(PfsBackend, "_apply", slow_apply)
        async with anyio.create_task_group() as tg:
            tg.start_soon(b.evict, "k")
            await anyio.sleep(0.05)
            assert not await b.contains("k")
            await _put(b, "k", data, tag=b"t")
        monkeypatch.setattr(PfsBackend, "_apply", real)
        assert bytes(await b.read("k")) == data and _record(tmp_path, "k").exists()
        assert b.stats().used_bytes == 30_000
    async with await _open(tmp_path) as b2:
        assert [i.key for i in await b2.scan()] == ["k"] and bytes(await b2.read("k")) == data


async def test_put_deduplicating_onto_content_whose_last_key_is_evicted_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A put that found equal content runs its compare and link outside the content lock; when
    the last key holding that content is evicted in between, the file has no name left and
    cannot be linked: the put publishes the bytes afresh (found by the random concurrency soak
    of tests/test_concurrency_defects.py, where it failed a background demotion)."""
    real = PfsBackend._link_record
    calls: list[str] = []

    def evict_first(self: PfsBackend, fd: int, name: str) -> None:
        if not calls:
            calls.append(name)
            assert anyio.from_thread.run(b.evict, "a") is True  # the last key of that content goes
            assert os.fstat(fd).st_nlink == 0
        real(self, fd, name)

    data = _rand(40_000, 11)
    async with await _open(tmp_path) as b:
        await _put(b, "a", data)
        monkeypatch.setattr(PfsBackend, "_link_record", evict_first)
        await _put(b, "b", data)
        monkeypatch.setattr(PfsBackend, "_link_record", real)
        assert len(calls) == 1
        assert bytes(await b.read("b")) == data and not await b.contains("a")
        (obj,) = _objects(tmp_path)
        assert _same(_record(tmp_path, "b"), obj) and obj.stat().st_nlink == 2
        assert b.stats().used_bytes == 40_000
    async with await _open(tmp_path) as b2:
        assert [i.key for i in await b2.scan()] == ["b"] and bytes(await b2.read("b")) == data


# ------------------------------------------------------------- open descriptors (open_files)
def _fds(root: Path) -> int:
    """This process's open descriptors of files (not directories) under ``root``."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(root)) and os.path.isfile(target.removesuffix(" (deleted)")):
            n += 1
    return n


async def test_read_again_uses_the_open_descriptor_and_evict_closes_it(tmp_path: Path) -> None:
    async with await _open(tmp_path) as b:
        datas = {f"d{i}": _rand(9000 + i, i) for i in range(5)}
        for k, v in datas.items():
            await _put(b, k, v)
        assert b.stats().details["open_files"] == 0  # writes do not open descriptors
        for _ in range(3):
            got = await b.read_many(list(datas))
            assert [bytes(g) for g in got] == list(datas.values())
        assert b.stats().details["open_files"] == 5
        assert _fds(tmp_path) == 5
        await b.evict_many(["d0", "d1"])
        assert b.stats().details["open_files"] == 3
        with pytest.raises(E.BlockNotFoundError):
            await b.read("d0")
        await _put(b, "d0", b"other bytes")  # same key, new content: its own record and descriptor
        assert bytes(await b.read("d0")) == b"other bytes"
    assert _fds(tmp_path) == 0  # aclose closed them


async def test_open_files_is_a_bounded_lru(tmp_path: Path) -> None:
    async with await _open(tmp_path, open_files=2) as b:
        datas = {f"l{i}": _rand(5000, 40 + i) for i in range(6)}
        for k, v in datas.items():
            await _put(b, k, v)
        for _ in range(2):
            for k, v in datas.items():
                assert bytes(await b.read(k)) == v
                assert b.stats().details["open_files"] <= 2
        got = await b.read_many(list(datas))
        assert [bytes(g) for g in got] == list(datas.values())
        assert b.stats().details["open_files"] == 2


async def test_open_files_zero_disables_the_cache(tmp_path: Path) -> None:
    async with await _open(tmp_path, open_files=0) as b:
        await _put(b, "z", _rand(4000, 5))
        for _ in range(3):
            assert bytes(await b.read("z")) == _rand(4000, 5)
        assert b.stats().details["open_files"] == 0
        assert _fds(tmp_path) == 0


async def test_open_files_option_is_checked(tmp_path: Path) -> None:
    with pytest.raises(E.ConfigError, match="open_files"):
        await _open(tmp_path, open_files=-1)


async def test_cached_descriptor_sees_corruption_in_place(tmp_path: Path) -> None:
    async with await _open(tmp_path) as b:
        await _put(b, "c", _rand(30_000, 6))
        assert bytes(await b.read("c")) == _rand(30_000, 6)
        assert b.stats().details["open_files"] == 1
        _flip(tmp_path, "c", 100)  # the same inode the descriptor reads
        with pytest.raises(E.IntegrityError):
            await b.read("c")
        assert not await b.contains("c") and b.stats().details["open_files"] == 0
        assert len(os.listdir(tmp_path / "quarantine")) == 1


async def test_cached_descriptor_does_not_hide_another_process_eviction(tmp_path: Path) -> None:
    async with await _open(tmp_path) as b1, await _open(tmp_path, revalidate_s=0) as b2:
        for i in range(3):
            await _put(b1, f"e{i}", _rand(20_000, 60 + i))
        await b2.scan()
        for i in range(3):
            assert bytes(await b2.read(f"e{i}")) == _rand(20_000, 60 + i)  # b2 holds them open now
        assert b2.stats().details["open_files"] == 3
        await anyio.sleep(0.05)  # past the change-time granularity of b2's opens
        assert await b1.evict("e0")  # unique content: record and content file unlinked
        with pytest.raises(E.BlockNotFoundError):
            await b2.read("e0")
        # shared content: b1 adds a second key of e1's bytes, then evicts e1; e1's record is gone
        await _put(b1, "e1-copy", _rand(20_000, 61))
        assert await b1.evict("e1")
        with pytest.raises(E.BlockNotFoundError):
            await b2.read("e1")
        assert bytes(await b2.read("e2")) == _rand(20_000, 62)
        assert b2.stats().details["integrity_failures"] == 0


async def test_evicts_racing_reads_never_serve_wrong_bytes(tmp_path: Path) -> None:
    """Descriptors dropped while worker threads read through them are closed by their last
    reader: no read fails with EBADF or returns another block's bytes."""
    async with await _open(tmp_path, open_files=8, max_concurrency=4) as b:
        datas = {f"r{i}": _rand(6000, 80 + i) for i in range(24)}
        for k, v in datas.items():
            await _put(b, k, v)
        keys = list(datas)
        served = 0

        async def reader(seed: int) -> None:
            nonlocal served
            rng = np.random.default_rng(seed)
            for _ in range(60):
                pick = [keys[j] for j in rng.choice(len(keys), 5, replace=False)]
                try:
                    got = await b.read_many(pick)
                except E.BlockNotFoundError:
                    continue
                for k, g in zip(pick, got, strict=True):
                    assert bytes(g) == datas[k]
                served += 1

        async def churner() -> None:
            rng = np.random.default_rng(1)
            for _ in range(60):
                k = keys[int(rng.integers(len(keys)))]
                if await b.evict(k):
                    await _put(b, k, datas[k])
                await anyio.lowlevel.checkpoint()

        async with anyio.create_task_group() as tg:
            for s in range(3):
                tg.start_soon(reader, s)
            tg.start_soon(churner)
        assert served > 0 and b.stats().details["integrity_failures"] == 0
        assert _fds(tmp_path) <= 8
    assert _fds(tmp_path) == 0


async def test_cached_descriptor_is_rechecked_after_revalidate_s(tmp_path: Path) -> None:
    async with await _open(tmp_path) as b1, await _open(tmp_path, revalidate_s=1.0) as b2:
        await _put(b1, "v", _rand(10_000, 7))
        await b2.scan()
        assert bytes(await b2.read("v")) == _rand(10_000, 7)
        assert await b1.evict("v")
        # within revalidate_s the open descriptor still serves the (verified) bytes...
        assert bytes(await b2.read("v")) == _rand(10_000, 7)
        await anyio.sleep(1.1)
        # ...after it, the descriptor is checked, found changed, and the record's absence seen
        with pytest.raises(E.BlockNotFoundError):
            await b2.read("v")
        assert b2.stats().details["open_files"] == 0


async def test_revalidate_s_option_is_checked(tmp_path: Path) -> None:
    with pytest.raises(E.ConfigError, match="revalidate_s"):
        await _open(tmp_path, revalidate_s=-1)
