from __future__ import annotations

import hashlib
import itertools
import json
import os
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

from tierkv import _errors as E
from tierkv._backend import SupportsScan, TierKind
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


def _segments(root: Path) -> list[Path]:
    return sorted(p for p in (root / "segments").iterdir() if p.is_file())


def _where(root: Path, key: str) -> tuple[Path, int, int]:
    """The segment file, offset and length of a format-3 block, from its record link."""
    rec = pfs_mod._parse_record(os.readlink(root / "keys" / key))
    assert rec.seg
    return root / "segments" / rec.seg, rec.off, rec.nbytes


def _flip(root: Path, key: str, at: int = 0) -> None:
    seg, off, n = _where(root, key)
    with open(seg, "r+b") as f:
        f.seek(off + at % max(1, n))
        b = f.read(1)
        f.seek(off + at % max(1, n))
        f.write(bytes([b[0] ^ 0xFF]))


def _old_store(root: Path, blocks: dict[str, tuple[bytes, bytes]]) -> None:
    """A store as the content-addressed format 2 wrote it: objects/<sha256> + tierkv-rec2 links."""
    for sub in ("objects", "keys", "tmp", "quarantine"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    for key, (data, tag) in blocks.items():
        sha = hashlib.sha256(data).hexdigest()
        (root / "objects" / sha).write_bytes(data)
        text = "/".join(["tierkv-rec2", sha, str(len(data)), pfs_mod._fast_check(memoryview(data)), tag.hex()])
        os.symlink(text.rstrip("/"), root / "keys" / key)


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
        assert _objects(tmp_path) == [] and len(_segments(tmp_path)) == 1
        assert os.readlink(tmp_path / "keys" / "k").startswith("tierkv-rec3/")
        assert await b.content_hash("k") == hashlib.sha256(data).hexdigest()
        s = b.stats()
        assert s.kind is TierKind.PFS and s.io_path == "posix pread/pwrite + fsync" and not s.emulated
        assert s.used_bytes == n and s.blocks == 1
    assert isinstance(b, SupportsScan)


async def test_identical_content_is_not_shared_and_accounting_is_exact(tmp_path: Path) -> None:
    async with await _open(tmp_path) as b:
        data = _rand(50_000, 1)
        await _put(b, "a", data)
        used1 = b.stats().used_bytes
        assert used1 == 50_000
        a2 = await b.allocate("b", 50_000)
        assert b.stats().used_bytes == 100_000  # the reservation counts until written
        await b.write(a2, data)
        assert b.stats().used_bytes == 100_000  # no dedup: every block has its own bytes
        assert len(_segments(tmp_path)) == 2 and b.stats().details["segments"] == 2
        assert b.stats().details["logical_bytes"] == 100_000
        assert await b.evict("a") is True
        assert bytes(await b.read("b")) == data
        assert len(_segments(tmp_path)) == 1 and b.stats().used_bytes == 50_000
        assert await b.evict("b") is True
        assert await b.evict("b") is False
        assert _segments(tmp_path) == [] and b.stats().used_bytes == 0
        assert sorted(os.listdir(tmp_path / "keys")) == []


async def test_errors(tmp_path: Path) -> None:
    async with await _open(tmp_path, capacity=MiB, max_block_bytes=2 * MiB) as b:
        with pytest.raises(E.CapacityError):
            await b.allocate("k", MiB + 1)
        with pytest.raises(E.InputError):
            await b.allocate("k", 3 * MiB)
        with pytest.raises(E.InputError):
            await b.allocate("../etc", 1)
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
    for opts in ({}, {"path": str(tmp_path), "fsync": "yes"}, {"path": str(tmp_path), "nope": 1}):
        with pytest.raises(E.ConfigError):
            PfsBackend(opts)


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
        allocs = await b.allocate_many([(k, 10_000, b"") for k in ("k", "twin", "other")])
        await b.write_many(allocs, [data, data, _rand(10_000, 6)])  # one segment
        assert len(_segments(tmp_path)) == 1
        _flip(tmp_path, "k", 1234)
        with pytest.raises(E.IntegrityError):
            await b.read("k")
        assert not await b.contains("k") and not (tmp_path / "keys" / "k").exists()
        assert len(os.listdir(tmp_path / "quarantine")) == 1  # the bad bytes, kept for inspection
        with pytest.raises(E.BlockNotFoundError):
            await b.read("k")
        assert bytes(await b.read("twin")) == data  # equal content, its own bytes
        assert bytes(await b.read("other")) == _rand(10_000, 6)
        assert b.stats().used_bytes == 20_000 and b.stats().details["integrity_failures"] == 1
        assert {i.key for i in await b.scan()} == {"twin", "other"}
    async with await _open(tmp_path) as b2:  # a new process never serves it either
        assert {i.key for i in await b2.scan()} == {"twin", "other"}
        with pytest.raises(E.BlockNotFoundError):
            await b2.read("k")


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


async def test_truncated_file_is_integrity_error(tmp_path: Path) -> None:
    async with await _open(tmp_path) as b:
        await _put(b, "k", _rand(5000))
        (seg,) = _segments(tmp_path)
        os.truncate(seg, 100)
        with pytest.raises(E.IntegrityError):
            await b.read("k")
        assert not await b.contains("k")


async def test_restart_recovery_via_scan(tmp_path: Path) -> None:
    blocks = {f"key{i}": _rand(1000 * i + 1, i) for i in range(6)}
    async with await _open(tmp_path) as b:
        for k, v in blocks.items():
            await _put(b, k, v, tag=k.encode())
        await _put(b, "dup", blocks["key3"])  # equal bytes, stored again
        pending = await b.allocate("pending", 10)  # never written: must not come back
        assert pending.nbytes == 10
    # garbage a crashed writer would leave behind
    (tmp_path / "tmp" / "deadhost.1.abc.tmp").write_bytes(b"junk")
    (tmp_path / "tmp" / f"{pfs_mod._HOST}.999999999.abc.tmp").write_bytes(b"junk")
    (tmp_path / "keys" / "ghost").write_text('{"v":1,"sha256":"' + "0" * 64 + '","nbytes":3,"tag":""}')
    async with await _open(tmp_path) as b2:
        infos = {i.key: i for i in await b2.scan()}
        assert set(infos) == {*blocks, "dup"}
        for k, v in blocks.items():
            assert infos[k].nbytes == len(v) and infos[k].tag == k.encode()
            assert bytes(await b2.read(k)) == v
        assert b2.stats().used_bytes == sum(len(v) for v in blocks.values()) + len(blocks["key3"])
        assert not (tmp_path / "tmp" / f"{pfs_mod._HOST}.999999999.abc.tmp").exists()  # dead writer cleaned
        assert (tmp_path / "tmp" / "deadhost.1.abc.tmp").exists()  # another host's, recent: left alone
        assert not (tmp_path / "keys" / "ghost").exists()
        await b2.evict("key3")
        assert bytes(await b2.read("dup")) == blocks["key3"]


async def _cancel_during_publish(monkeypatch: pytest.MonkeyPatch, write: Callable[[], Awaitable[None]]) -> None:
    """Run ``write`` and cancel it while its record-publishing phase is held in its worker
    thread; that phase then goes on (it links the records, and the cancelled write must
    undo them). Fails if the whole dance does not finish within 5 s."""
    started = threading.Event()
    release = threading.Event()
    real = PfsBackend._publish

    def slow_publish(self: PfsBackend, *args: Any) -> Any:
        started.set()
        release.wait(5)
        return real(self, *args)

    monkeypatch.setattr(PfsBackend, "_publish", slow_publish)
    with anyio.move_on_after(5) as outer:
        async with anyio.create_task_group() as tg:
            tg.start_soon(write)
            while not started.is_set():  # noqa: ASYNC110 - set by a worker thread
                await anyio.sleep(0.001)
            tg.cancel_scope.cancel()
            release.set()
    assert not outer.cancelled_caught


async def test_cancel_mid_write_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    b = await _open(tmp_path)
    a = await b.allocate("k", 300_000)

    async def writer() -> None:
        await b.write(a, _rand(300_000))

    await _cancel_during_publish(monkeypatch, writer)
    assert not await b.contains("k")
    assert b.stats().used_bytes == 0 and b.stats().reserved_bytes == 0
    assert _segments(tmp_path) == [] and os.listdir(tmp_path / "keys") == []
    assert os.listdir(tmp_path / "tmp") == []
    await b.aclose()
    async with await _open(tmp_path) as b2:
        assert await b2.scan() == []


async def test_cancel_before_publish(tmp_path: Path) -> None:
    async with await _open(tmp_path) as b:
        a = await b.allocate("k", 1000)
        with anyio.move_on_after(0):
            await b.write(a, bytes(1000))
        assert not await b.contains("k") and b.stats().used_bytes == 0
        assert _segments(tmp_path) == []


async def test_batch_twins_and_concurrency(tmp_path: Path) -> None:
    async with await _open(tmp_path, fsync=False) as b:
        datas = [_rand(20_000, i % 3) for i in range(9)]  # 3 distinct contents, 9 blocks
        allocs = await b.allocate_many([(f"k{i}", 20_000, b"") for i in range(9)])
        await b.write_many(allocs, datas)
        assert len(_segments(tmp_path)) == 1 and b.stats().used_bytes == 180_000
        got = await b.read_many([f"k{i}" for i in range(9)])
        assert [bytes(g) for g in got] == datas
        assert await b.evict_many([f"k{i}" for i in range(9)]) == [True] * 9
        assert _segments(tmp_path) == [] and b.stats().used_bytes == 0
        with pytest.raises(E.BlockNotFoundError):
            await b.read_many(["k0"])


def test_default_options(tmp_path: Path) -> None:
    opts = PfsBackend.default_options(tmp_path)
    assert opts["path"].startswith(str(tmp_path))
    assert PfsBackend.probe().usable


async def test_records_are_links_and_version1_records_still_read(tmp_path: Path) -> None:
    data = _rand(5000, 7)
    tag = bytes(range(256))  # the largest tag fits in a link target
    async with await _open(tmp_path) as b:
        await _put(b, "new", data, tag=tag)
        link = tmp_path / "keys" / "new"
        assert link.is_symlink() and os.readlink(link).startswith("tierkv-rec3/")
    # a record file written by format 1 pointing at a content file, and junk links
    sha = hashlib.sha256(data).hexdigest()
    (tmp_path / "objects" / sha).write_bytes(data)
    record = {"v": 1, "sha256": sha, "nbytes": len(data), "tag": "abcd", "xxh3": ""}
    (tmp_path / "keys" / "old").write_text(json.dumps(record))
    os.symlink("somebody-else:xyz", tmp_path / "keys" / "foreign")
    async with await _open(tmp_path) as b2:
        infos = {i.key: i for i in await b2.scan()}
        assert set(infos) == {"new", "old"}
        assert infos["new"].tag == tag and infos["old"].tag == bytes.fromhex("abcd")
        assert bytes(await b2.read("old")) == data == bytes(await b2.read("new"))
        assert await b2.content_hash("old") == sha == await b2.content_hash("new")
        assert (tmp_path / "keys" / "foreign").is_symlink()  # not ours: left alone
        assert await b2.evict("old") and not (tmp_path / "objects" / sha).exists()


async def test_format2_store_written_by_the_old_code_is_read_verified_and_evicted(tmp_path: Path) -> None:
    shared = _rand(30_000, 1)
    _old_store(tmp_path, {"a": (shared, b"ta"), "b": (shared, b"tb"), "c": (_rand(9000, 2), b"")})
    async with await _open(tmp_path) as b:
        infos = {i.key: i for i in await b.scan()}
        assert {k: (i.nbytes, i.tag) for k, i in infos.items()} == {
            "a": (30_000, b"ta"),
            "b": (30_000, b"tb"),
            "c": (9000, b""),
        }
        assert b.stats().used_bytes == 39_000  # the shared content file counts once
        got = await b.read_many(["a", "b", "c"])
        assert [bytes(g) for g in got] == [shared, shared, _rand(9000, 2)]
        assert await b.content_hash("a") == hashlib.sha256(shared).hexdigest()
        await _put(b, "new", _rand(100, 3))  # new blocks go to segments
        assert len(_segments(tmp_path)) == 1 and len(_objects(tmp_path)) == 2
        assert await b.evict("a")
        assert bytes(await b.read("b")) == shared and len(_objects(tmp_path)) == 2  # still shared
        assert b.stats().used_bytes == 39_100
        assert await b.evict("b")
        assert len(_objects(tmp_path)) == 1 and b.stats().used_bytes == 9100
        # a corrupt content file is still quarantined
        (obj,) = _objects(tmp_path)
        obj.write_bytes(b"x" + obj.read_bytes()[1:])
        with pytest.raises(E.IntegrityError):
            await b.read("c")
        assert _objects(tmp_path) == [] and len(os.listdir(tmp_path / "quarantine")) == 1
        assert b.stats().used_bytes == 100


async def test_segment_packing_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pfs_mod, "_SHARE_BYTES", 1 << 20)  # several shares for this 3.5 MiB batch
    sizes = [0, 1, 4095, 4096, 4097, 100_000, 300_000, 1 << 20, 17, 2 * MiB + 3, 8192]
    datas = [_rand(n, i) for i, n in enumerate(sizes)]
    keys = [f"s{i}" for i in range(len(sizes))]
    async with await _open(tmp_path, max_concurrency=3) as b:
        allocs = await b.allocate_many(
            [(k, len(d), f"t{i}".encode()) for i, (k, d) in enumerate(zip(keys, datas, strict=True))]
        )
        await b.write_many(allocs, datas)
        segs = _segments(tmp_path)
        assert 1 < len(segs) <= 3  # one segment per share, at most max_concurrency
        assert b.stats().details["segments"] == len(segs) and b.stats().used_bytes == sum(sizes)
        where = [_where(tmp_path, k) for k in keys]
        assert all(off % 4096 == 0 for _, off, _ in where)
        for seg in segs:  # blocks of one segment do not overlap
            spans = sorted((off, off + n) for s, off, n in where if s == seg)
            assert all(a[1] <= b_[0] for a, b_ in itertools.pairwise(spans))
        order = [7, 0, 3, 10, 1, 9, 2, 5, 4, 8, 6]
        got = await b.read_many([keys[i] for i in order], into=[bytearray(sizes[i] + 5) for i in order])
        assert [bytes(g) for g in got] == [datas[i] for i in order]
        assert [bytes(x) for x in await b.read_many(keys)] == datas
    async with await _open(tmp_path) as b2:
        infos = {i.key: i for i in await b2.scan()}
        assert {k: (i.nbytes, i.tag) for k, i in infos.items()} == {
            k: (n, f"t{i}".encode()) for i, (k, n) in enumerate(zip(keys, sizes, strict=True))
        }
        assert [bytes(x) for x in await b2.read_many(keys)] == datas
        assert await b2.evict_many(keys) == [True] * len(keys)
        assert _segments(tmp_path) == [] and b2.stats().used_bytes == 0


async def test_eviction_punches_holes_and_frees_space(tmp_path: Path) -> None:
    n = 100 * 1024  # 8 of them make one segment
    async with await _open(tmp_path) as b:
        keys = [f"p{i}" for i in range(8)]
        allocs = await b.allocate_many([(k, n, b"") for k in keys])
        await b.write_many(allocs, [_rand(n, i) for i in range(8)])
        (seg,) = _segments(tmp_path)
        before = os.stat(seg).st_blocks
        assert await b.evict_many(keys[:4]) == [True] * 4
        if b.stats().details["unpunched_bytes"]:
            pytest.skip("this filesystem cannot punch holes")
        after = os.stat(seg).st_blocks
        assert after * 512 <= before * 512 - 4 * n  # the evicted blocks' bytes are freed
        assert os.stat(seg).st_size == 8 * n  # the offsets of the others stay
        assert [bytes(x) for x in await b.read_many(keys[4:])] == [_rand(n, i) for i in range(4, 8)]
        assert b.stats().used_bytes == 4 * n and b.stats().details["segments"] == 1
        await b.evict_many(keys[4:])
        assert _segments(tmp_path) == [] and b.stats().used_bytes == 0


async def test_block_evicted_by_another_process_reads_as_not_found(tmp_path: Path) -> None:
    async with await _open(tmp_path) as b1, await _open(tmp_path) as b2:
        allocs = await b1.allocate_many([(f"x{i}", 50_000, b"") for i in range(4)])
        await b1.write_many(allocs, [_rand(50_000, i) for i in range(4)])
        assert {i.key for i in await b2.scan()} == {f"x{i}" for i in range(4)}
        assert await b1.evict("x1")  # unlinks the record and punches the range b2 still indexes
        with pytest.raises(E.BlockNotFoundError):
            await b2.read("x1")
        assert not await b2.contains("x1")
        # the key rewritten by the other process: b2's entry is stale, not corrupt
        await b1.evict("x2")
        await _put(b1, "x2", _rand(50_000, 99))
        _flip(tmp_path, "x0", 3)  # real damage is still found
        with pytest.raises(E.BlockNotFoundError):
            await b2.read("x2")
        assert (tmp_path / "keys" / "x2").is_symlink()  # b1's new record is left alone
        assert b2.stats().details["integrity_failures"] == 0 and os.listdir(tmp_path / "quarantine") == []
        with pytest.raises(E.IntegrityError):
            await b2.read("x0")
        assert bytes(await b2.read("x3")) == _rand(50_000, 3)
        assert {i.key for i in await b2.scan()} == {"x2", "x3"}
        assert bytes(await b2.read("x2")) == _rand(50_000, 99)
        assert bytes(await b1.read("x2")) == _rand(50_000, 99)


async def test_scan_removes_orphan_segments(tmp_path: Path) -> None:
    async with await _open(tmp_path) as b:
        await _put(b, "live", _rand(1000))
    segs = tmp_path / "segments"
    dead = segs / f"{pfs_mod._HOST}.999999999.{'a' * 32}"  # a writer of this host that died
    old = segs / f"elsewhere.12.{'b' * 32}"  # another host's, unreferenced for long
    recent = segs / f"elsewhere.13.{'c' * 32}"  # another host's, maybe still being published
    for p in (dead, old, recent):
        p.write_bytes(b"x" * 5000)
    past = time.time() - 2 * pfs_mod._ORPHAN_MAX_AGE_S
    os.utime(old, (past, past))
    async with await _open(tmp_path) as b2:
        assert [i.key for i in await b2.scan()] == ["live"]
        assert not dead.exists() and not old.exists() and recent.exists()
        assert len(_segments(tmp_path)) == 2 and bytes(await b2.read("live")) == _rand(1000)


async def test_read_many_hot_and_cold_paths_agree(tmp_path: Path) -> None:
    blocks = {f"h{i}": _rand(3000 * i + 17, i) for i in range(1, 12)}
    async with await _open(tmp_path) as b:
        for k, v in blocks.items():
            await _put(b, k, v)
        hot = await b.read_many(list(blocks))
        for p in _segments(tmp_path):  # drop the pages: the cold pass serves them
            if p.is_file():
                fd = os.open(p, os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
        cold = await b.read_many(list(blocks), into=[bytearray(len(v)) for v in blocks.values()])
        assert [bytes(x) for x in hot] == [bytes(x) for x in cold] == list(blocks.values())


async def test_write_many_group_commit_mixed_failures_and_restart(tmp_path: Path) -> None:
    async with await _open(tmp_path) as b:
        datas = [_rand(9000 + i, i % 2) for i in range(6)]  # two of them share content with others
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
        assert all((tmp_path / "keys" / f"g{i}").is_symlink() for i in range(6))
    async with await _open(tmp_path) as b2:
        infos = {i.key: i.tag for i in await b2.scan()}
        assert infos == {f"g{i}": f"t{i}".encode() for i in range(6)}


async def test_cancel_mid_write_many_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    b = await _open(tmp_path)
    allocs = await b.allocate_many([(f"c{i}", 600_000, b"") for i in range(5)])  # several segments

    async def writer() -> None:
        await b.write_many(allocs, [_rand(600_000, i) for i in range(5)])

    await _cancel_during_publish(monkeypatch, writer)
    assert b.stats().used_bytes == 0 and b.stats().reserved_bytes == 0
    assert _segments(tmp_path) == [] and os.listdir(tmp_path / "keys") == []
    assert os.listdir(tmp_path / "tmp") == [] and b.stats().details["segments"] == 0
    await b.aclose()
    async with await _open(tmp_path) as b2:
        assert await b2.scan() == []


@pytest.mark.parametrize("at", [0, 300_000, 600_000, (1 << 20) - 1])
async def test_large_blocks_verified_piece_by_piece(tmp_path: Path, at: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks over 512 KiB read from the page cache by a lone caller are read and hashed in
    pieces (two of 512 KiB here): a flipped byte in any piece is still caught (and
    quarantined), the others read."""
    calls: list[int] = []
    real = PfsBackend._read_pieces

    def counted(self: PfsBackend, *args: Any) -> str:
        calls.append(1)
        return real(self, *args)

    monkeypatch.setattr(PfsBackend, "_read_pieces", counted)
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
    assert calls  # the piecewise path did the reading
