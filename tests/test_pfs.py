from __future__ import annotations

import hashlib
import json
import os
import threading
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
        obj = _objects(tmp_path)
        assert [p.name for p in obj] == [hashlib.sha256(data).hexdigest()]
        s = b.stats()
        assert s.kind is TierKind.PFS and s.io_path == "posix pread/pwrite + fsync" and not s.emulated
        assert s.used_bytes == n and s.blocks == 1
    assert isinstance(b, SupportsScan)


async def test_dedup_and_accounting(tmp_path: Path) -> None:
    async with await _open(tmp_path) as b:
        data = _rand(50_000, 1)
        await _put(b, "a", data)
        used1 = b.stats().used_bytes
        assert used1 == 50_000
        a2 = await b.allocate("b", 50_000)
        assert b.stats().used_bytes == 100_000  # the reservation counts until written
        await b.write(a2, data)
        assert b.stats().used_bytes == 50_000  # identical content stored once
        assert len(_objects(tmp_path)) == 1
        assert b.stats().details["logical_bytes"] == 100_000
        assert await b.evict("a") is True
        assert bytes(await b.read("b")) == data  # the other key keeps the content
        assert len(_objects(tmp_path)) == 1 and b.stats().used_bytes == 50_000
        assert await b.evict("b") is True
        assert await b.evict("b") is False
        assert _objects(tmp_path) == [] and b.stats().used_bytes == 0
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
        await _put(b, "k", data)
        await _put(b, "twin", data)  # shares the content file
        await _put(b, "other", _rand(10_000, 6))
        (obj,) = [p for p in _objects(tmp_path) if p.name == hashlib.sha256(data).hexdigest()]
        raw = bytearray(obj.read_bytes())
        raw[1234] ^= 0xFF
        obj.write_bytes(bytes(raw))
        with pytest.raises(E.IntegrityError):
            await b.read("k")
        assert not obj.exists()
        assert len(os.listdir(tmp_path / "quarantine")) == 1
        for key in ("k", "twin"):
            assert not await b.contains(key)
            with pytest.raises(E.BlockNotFoundError):
                await b.read(key)
        assert bytes(await b.read("other")) == _rand(10_000, 6)
        assert b.stats().used_bytes == 10_000 and b.stats().details["integrity_failures"] == 1
        assert {i.key for i in await b.scan()} == {"other"}
    async with await _open(tmp_path) as b2:  # a new process never serves it either
        assert {i.key for i in await b2.scan()} == {"other"}
        with pytest.raises(E.BlockNotFoundError):
            await b2.read("k")


async def test_truncated_file_is_integrity_error(tmp_path: Path) -> None:
    async with await _open(tmp_path) as b:
        await _put(b, "k", _rand(5000))
        (obj,) = _objects(tmp_path)
        os.truncate(obj, 100)
        with pytest.raises(E.IntegrityError):
            await b.read("k")
        assert not await b.contains("k")


async def test_restart_recovery_via_scan(tmp_path: Path) -> None:
    blocks = {f"key{i}": _rand(1000 * i + 1, i) for i in range(6)}
    async with await _open(tmp_path) as b:
        for k, v in blocks.items():
            await _put(b, k, v, tag=k.encode())
        await _put(b, "dup", blocks["key3"])
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
        assert b2.stats().used_bytes == sum(len(v) for v in blocks.values())
        assert not (tmp_path / "tmp" / f"{pfs_mod._HOST}.999999999.abc.tmp").exists()  # dead writer cleaned
        assert (tmp_path / "tmp" / "deadhost.1.abc.tmp").exists()  # another host's, recent: left alone
        assert not (tmp_path / "keys" / "ghost").exists()
        await b2.evict("key3")
        assert bytes(await b2.read("dup")) == blocks["key3"]


async def test_cancel_mid_write_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    b = await _open(tmp_path)
    started = threading.Event()
    release = threading.Event()
    real = PfsBackend._publish

    def slow_publish(self: PfsBackend, *args: Any) -> bool:
        started.set()
        release.wait(5)
        return real(self, *args)

    monkeypatch.setattr(PfsBackend, "_publish", slow_publish)
    a = await b.allocate("k", 300_000)
    with anyio.move_on_after(5) as outer:
        async with anyio.create_task_group() as tg:

            async def writer() -> None:
                await b.write(a, _rand(300_000))

            tg.start_soon(writer)
            while not started.is_set():  # noqa: ASYNC110 - set by a worker thread
                await anyio.sleep(0.001)
            tg.cancel_scope.cancel()
            release.set()
    assert not outer.cancelled_caught
    assert not await b.contains("k")
    assert b.stats().used_bytes == 0 and b.stats().reserved_bytes == 0
    assert _objects(tmp_path) == [] and os.listdir(tmp_path / "keys") == []
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
        assert _objects(tmp_path) == []


async def test_batch_twins_and_concurrency(tmp_path: Path) -> None:
    async with await _open(tmp_path, fsync=False) as b:
        datas = [_rand(20_000, i % 3) for i in range(9)]  # 3 distinct contents
        allocs = await b.allocate_many([(f"k{i}", 20_000, b"") for i in range(9)])
        await b.write_many(allocs, datas)
        assert len(_objects(tmp_path)) == 3 and b.stats().used_bytes == 60_000
        got = await b.read_many([f"k{i}" for i in range(9)])
        assert [bytes(g) for g in got] == datas
        assert await b.evict_many([f"k{i}" for i in range(9)]) == [True] * 9
        assert _objects(tmp_path) == [] and b.stats().used_bytes == 0
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
        assert link.is_symlink() and os.readlink(link).startswith("tierkv-rec2/")
        sha = await b.content_hash("new")
    # a record file written by format 1 pointing at the same content, and junk links
    record = {"v": 1, "sha256": sha, "nbytes": len(data), "tag": "abcd", "xxh3": ""}
    (tmp_path / "keys" / "old").write_text(json.dumps(record))
    os.symlink("somebody-else:xyz", tmp_path / "keys" / "foreign")
    async with await _open(tmp_path) as b2:
        infos = {i.key: i for i in await b2.scan()}
        assert set(infos) == {"new", "old"}
        assert infos["new"].tag == tag and infos["old"].tag == bytes.fromhex("abcd")
        assert bytes(await b2.read("old")) == data == bytes(await b2.read("new"))
        assert (tmp_path / "keys" / "foreign").is_symlink()  # not ours: left alone


async def test_read_many_hot_and_cold_paths_agree(tmp_path: Path) -> None:
    blocks = {f"h{i}": _rand(3000 * i + 17, i) for i in range(1, 12)}
    async with await _open(tmp_path) as b:
        for k, v in blocks.items():
            await _put(b, k, v)
        hot = await b.read_many(list(blocks))
        for p in (tmp_path / "objects").rglob("*"):  # drop the pages: the cold pass serves them
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
    started = threading.Event()
    release = threading.Event()
    real = PfsBackend._put_share

    def slow_commit(self: PfsBackend, *args: Any) -> Any:
        started.set()
        release.wait(5)
        return real(self, *args)

    monkeypatch.setattr(PfsBackend, "_put_share", slow_commit)
    allocs = await b.allocate_many([(f"c{i}", 50_000, b"") for i in range(5)])
    with anyio.move_on_after(5) as outer:
        async with anyio.create_task_group() as tg:

            async def writer() -> None:
                await b.write_many(allocs, [_rand(50_000, i) for i in range(5)])

            tg.start_soon(writer)
            while not started.is_set():  # noqa: ASYNC110 - set by a worker thread
                await anyio.sleep(0.001)
            tg.cancel_scope.cancel()
            release.set()
    assert not outer.cancelled_caught
    assert b.stats().used_bytes == 0 and b.stats().reserved_bytes == 0
    assert _objects(tmp_path) == [] and os.listdir(tmp_path / "keys") == []
    assert os.listdir(tmp_path / "tmp") == []
    await b.aclose()
    async with await _open(tmp_path) as b2:
        assert await b2.scan() == []
