from __future__ import annotations

import os
from typing import Any

import anyio
import numpy as np
import pytest
from kvtest import hold_in_thread

from tierkv import errors as E
from tierkv.backend import Backend, TierKind
from tierkv_backends import dram as dram_mod
from tierkv_backends.dram import DramBackend

pytestmark = pytest.mark.anyio

MiB = 1 << 20


def _rand(n: int, seed: int = 0) -> np.ndarray[Any, Any]:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


async def _open(**opts: Any) -> DramBackend:
    opts.setdefault("capacity", 8 * MiB)
    return await DramBackend.open(opts)


@pytest.mark.parametrize("n", [0, 1, 4095, 4096, 70_000, 3 * MiB + 5])
async def test_round_trip_bit_exact(n: int) -> None:
    async with await _open() as b:
        data = _rand(n, n)
        a = await b.allocate("k1", n, tag=b"t")
        await b.write(a, data)
        assert await b.contains("k1")
        got = await b.read("k1")
        assert bytes(got) == data.tobytes()
        into = bytearray(n + 10)
        view = await b.read("k1", into=into)
        assert len(view) == n and bytes(view) == data.tobytes()
        assert bytes(into[:n]) == data.tobytes()
        s = b.stats()
        assert s.kind is TierKind.DRAM and s.io_path == "memcpy" and not s.emulated
        assert s.blocks == 1 and s.used_bytes == (n + 4095) // 4096 * 4096


async def test_read_without_into_is_a_copy() -> None:
    async with await _open() as b:
        a = await b.allocate("k", 100_000)
        await b.write(a, _rand(100_000))
        first = await b.read("k")
        first[:] = b"\0" * 100_000  # mutating the copy must not touch the stored block
        assert bytes(await b.read("k")) == _rand(100_000).tobytes()


async def test_accounting_returns_exactly_after_evict() -> None:
    async with await _open() as b:
        base = b.stats().used_bytes
        a = await b.allocate("x", 12_345)
        assert b.stats().used_bytes == base + 16384 and b.stats().reserved_bytes == 16384
        assert b.stats().details["logical_bytes"] == 12_345
        await b.write(a, bytes(12_345))
        assert b.stats().reserved_bytes == 0
        assert await b.evict("x") is True
        assert await b.evict("x") is False
        assert b.stats().used_bytes == base and b.stats().details["logical_bytes"] == 0
        # reservation dropped by evict
        a2 = await b.allocate("y", 5000)
        assert await b.evict("y") is True
        assert b.stats().used_bytes == base
        with pytest.raises(E.BlockNotFoundError):
            await b.write(a2, bytes(5000))


async def test_errors() -> None:
    async with await _open(capacity=MiB, max_block_bytes=2 * MiB) as b:
        with pytest.raises(E.InputError):
            await b.allocate("bad/key", 10)
        with pytest.raises(E.InputError):
            await b.allocate("k", -1)
        with pytest.raises(E.InputError):
            await b.allocate("k", 3 * MiB)  # above max_block_bytes
        with pytest.raises(E.InputError):
            await b.allocate("k", 1, tag=b"x" * 257)
        with pytest.raises(E.CapacityError):
            await b.allocate("k", MiB + 1)
        a = await b.allocate("k", MiB)
        with pytest.raises(E.BlockExistsError):
            await b.allocate("k", 1)
        with pytest.raises(E.CapacityError):
            await b.allocate("k2", 1)
        with pytest.raises(E.InputError):
            await b.write(a, bytes(10))  # wrong length: fails and releases
        assert b.stats().used_bytes == 0 and not await b.contains("k")
        with pytest.raises(E.BlockNotFoundError):
            await b.read("nope")
        a = await b.allocate("k", 10)
        await b.write(a, bytes(10))
        with pytest.raises(E.BlockNotFoundError):
            await b.write(a, bytes(10))  # already written
        with pytest.raises(E.BlockExistsError):
            await b.allocate("k", 1)
        with pytest.raises(E.InputError):
            await b.read("k", into=bytearray(5))
        with pytest.raises(E.InputError):
            await b.read("k", into=bytes(10))  # read-only


async def test_config_errors() -> None:
    for opts in ({"capacity": "lots"}, {"pin": "maybe"}, {"granule": 3000}, {"bogus": 1}, {"max_concurrency": 0}):
        with pytest.raises(E.ConfigError):
            DramBackend(opts)


async def test_pin_true_without_cuda_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dram_mod, "_cuda_present", lambda: False)
    with pytest.raises(E.PluginUnavailableError):
        await DramBackend.open({"capacity": MiB, "pin": True})
    b = await DramBackend.open({"capacity": MiB, "pin": "auto"})
    assert b.stats().details["pinned"] is False
    await b.aclose()


async def test_use_after_close() -> None:
    b = await _open()
    a = await b.allocate("k", 10)
    await b.aclose()
    await b.aclose()  # idempotent
    for coro in (b.allocate("j", 1), b.write(a, bytes(10)), b.read("k"), b.evict("k"), b.contains("k")):
        with pytest.raises(E.BackendClosedError):
            await coro
    with pytest.raises(E.BackendClosedError):
        await b.read_many(["k"])
    assert b.stats().blocks == 0


async def test_cancel_mid_write_leaves_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    b = await _open(capacity=32 * MiB, inline_copy_bytes=0, large_copies="thread")  # worker thread
    held = hold_in_thread(monkeypatch, dram_mod.Arena, "write_at")
    base = b.stats().used_bytes
    a = await b.allocate("k", 4 * MiB)
    with anyio.move_on_after(5) as outer:
        async with anyio.create_task_group() as tg:

            async def writer() -> None:
                await b.write(a, _rand(4 * MiB))

            tg.start_soon(writer)
            await held.entered()
            tg.cancel_scope.cancel()
            held.release.set()
    assert not outer.cancelled_caught
    assert not await b.contains("k")
    assert b.stats().used_bytes == base and b.stats().reserved_bytes == 0
    with pytest.raises(E.BlockNotFoundError):
        await b.read("k")
    monkeypatch.setattr(dram_mod.Arena, "write_at", held.real)
    a = await b.allocate("k", 10)  # key is free again
    await b.write(a, b"0123456789")
    assert bytes(await b.read("k")) == b"0123456789"
    await b.aclose()


async def test_evict_during_read_defers_free(monkeypatch: pytest.MonkeyPatch) -> None:
    b = await _open(capacity=16 * MiB, inline_copy_bytes=0, large_copies="thread")  # worker thread
    data = _rand(2 * MiB, 3)
    a = await b.allocate("k", 2 * MiB)
    await b.write(a, data)
    held = hold_in_thread(monkeypatch, dram_mod.Arena, "read_at")
    result: list[bytes] = []
    async with anyio.create_task_group() as tg:

        async def reader() -> None:
            result.append(bytes(await b.read("k")))

        tg.start_soon(reader)
        await held.entered()
        assert await b.evict("k") is True
        assert not await b.contains("k")
        held_bytes = b.stats().used_bytes
        assert held_bytes == 2 * MiB  # still pinned by the read
        held.release.set()
    assert result[0] == data.tobytes()
    assert b.stats().used_bytes == 0
    await b.aclose()


async def test_batch_twins() -> None:
    async with await _open(capacity=16 * MiB) as b:
        n = 16
        items = [(f"k{i}", 16384, b"") for i in range(n)]
        allocs = await b.allocate_many(items)
        datas = [_rand(16384, i) for i in range(n)]
        await b.write_many(allocs, datas)
        outs = [np.empty(16384, dtype=np.uint8) for _ in range(n)]
        views = await b.read_many([k for k, _, _ in items], into=outs)
        for i in range(n):
            assert np.array_equal(outs[i], datas[i]) and bytes(views[i]) == datas[i].tobytes()
        fresh = await b.read_many(["k0", "k5"])
        assert bytes(fresh[1]) == datas[5].tobytes()
        # all-or-nothing allocate_many
        used = b.stats().used_bytes
        with pytest.raises(E.CapacityError):
            await b.allocate_many([("a", MiB, b""), ("b", 64 * MiB, b"")])
        with pytest.raises(E.BlockExistsError):
            await b.allocate_many([("a", 1, b""), ("a", 1, b"")])
        assert b.stats().used_bytes == used and not await b.evict("a")
        # failing write_many releases every reservation of the batch
        allocs2 = await b.allocate_many([("w1", 100_000, b""), ("w2", 100_000, b"")])
        with pytest.raises(E.InputError):
            await b.write_many(allocs2, [bytes(100_000), bytes(5)])
        assert b.stats().used_bytes == used and not await b.contains("w1")
        assert await b.evict_many(["k0", "k0", "zz"]) == [True, False, False]
        with pytest.raises(E.BlockNotFoundError):
            await b.read_many(["k1", "k0"])


async def test_batch_mixed_sizes_tags_and_buffers() -> None:
    async with await _open(capacity=16 * MiB) as b:
        sizes = [0, 1, 4095, 4096, 70_000, 16384]
        items = [(f"m{i}", n, bytearray(b"t%d" % i)) for i, n in enumerate(sizes)]
        allocs = await b.allocate_many(items)  # type: ignore[arg-type]
        assert [a.tag for a in allocs] == [b"t%d" % i for i in range(len(sizes))]
        assert len({a.handle for a in allocs}) == len(sizes)
        datas: list[Any] = [_rand(n, i) for i, n in enumerate(sizes)]
        datas[1] = datas[1].tobytes()
        datas[2] = bytearray(datas[2].tobytes())
        datas[3] = memoryview(datas[3].tobytes())
        await b.write_many(allocs, datas)
        intos: list[Any] = [bytearray(n + 3) for n in sizes]  # longer than the blocks: views of the head
        intos[4] = np.empty(sizes[4], dtype=np.uint8)
        views = await b.read_many([k for k, _, _ in items], into=intos)
        for i, n in enumerate(sizes):
            assert len(views[i]) == n and bytes(views[i]) == bytes(memoryview(datas[i]).cast("B"))
        with pytest.raises(E.InputError):  # read-only into
            await b.read_many(["m2"], into=[bytes(4095)])
        s = b.stats()
        assert s.details["logical_bytes"] == sum(sizes) and s.writes == len(sizes) and s.reads == len(sizes)
        assert s.used_bytes == sum(-(-n // 4096) * 4096 for n in sizes) and s.reserved_bytes == 0
        assert await b.evict_many([k for k, _, _ in items]) == [True] * len(sizes)
        assert b.stats().used_bytes == 0 and b.stats().details["logical_bytes"] == 0


async def test_large_batch_through_thread_and_cancelled_write_many(monkeypatch: pytest.MonkeyPatch) -> None:
    b = await _open(capacity=32 * MiB)
    allocs = await b.allocate_many([(f"b{i}", MiB, b"") for i in range(4)])
    with anyio.move_on_after(0):  # cancelled at the first checkpoint: the thread hop
        await b.write_many(allocs, [_rand(MiB, i) for i in range(4)])
    assert b.stats().used_bytes == 0 and b.stats().blocks == 0
    await b.aclose()


async def test_concurrent_tasks_same_and_distinct_keys() -> None:
    async with await _open(capacity=32 * MiB) as b:
        errors: list[Exception] = []

        async def worker(i: int) -> None:
            key = f"c{i % 4}"
            data = bytes([i % 4]) * 200_000
            try:
                a = await b.allocate(key, len(data))
                await b.write(a, data)
            except E.BlockExistsError as exc:
                errors.append(exc)
                while not await b.contains(key):  # noqa: ASYNC110 - the other task is writing
                    await anyio.sleep(0.001)
            got = await b.read(key)
            assert bytes(got) == data

        async with anyio.create_task_group() as tg:
            for i in range(16):
                tg.start_soon(worker, i)
        assert b.stats().blocks == 4 and len(errors) == 12


def test_is_a_backend_and_probe() -> None:
    assert issubclass(DramBackend, Backend)
    assert DramBackend.probe().usable
    assert "capacity" in DramBackend.default_options(__import__("pathlib").Path(os.getcwd()))


@pytest.mark.parametrize("large", ["slices", "thread", "split", "auto"])
async def test_array_io_of_large_strided_blocks(large: str) -> None:
    """Blocks above ``inline_copy_bytes`` go through the large-copy policy: a strided source
    gathered and a strided destination scattered are still exact."""
    b = await _open(capacity="64MiB", inline_copy_bytes="256KiB", large_copies=large)
    try:
        cache = np.random.default_rng(3).standard_normal((30, 2, 512, 3, 64)).astype(np.float16)
        src = cache[:, :, 128:384]  # 2.9 MB, not contiguous
        a = await b.allocate("big", src.nbytes)
        await b.write_arrays([a], [src])
        assert bytes(await b.read("big")) == np.ascontiguousarray(src).tobytes()
        out = np.zeros((30, 2, 512, 3, 64), np.float16)
        await b.read_arrays(["big"], [out[:, :, 256:]])
        assert np.array_equal(out[:, :, 256:], src) and not out[:, :, :256].any()
    finally:
        await b.aclose()


async def test_split_copies_share_a_batch_and_read_back_exactly() -> None:
    """``split``: a batch of strided blocks, written and read back with the copies shared between
    a worker thread and the event loop's thread, is exact in both directions (every block, no
    byte of the destination outside the blocks written)."""
    b = await _open(capacity="128MiB", inline_copy_bytes="256KiB", large_copies="split")
    try:
        cache = np.random.default_rng(4).standard_normal((6, 30, 2, 256, 3, 64)).astype(np.float16)
        srcs = [cache[i][:, :, ::-1] for i in range(6)]  # reversed along tokens: not contiguous
        allocs = [await b.allocate(f"s{i}", s.nbytes) for i, s in enumerate(srcs)]
        await b.write_arrays(allocs, srcs)
        for i, src in enumerate(srcs):
            assert bytes(await b.read(f"s{i}")) == np.ascontiguousarray(src).tobytes()
        out = np.zeros((30, 2, 6 * 256 + 7, 3, 64), np.float16)
        await b.read_arrays([f"s{i}" for i in range(6)], [out[:, :, i * 256 : (i + 1) * 256] for i in range(6)])
        for i, src in enumerate(srcs):
            assert np.array_equal(out[:, :, i * 256 : (i + 1) * 256], src)
        assert not out[:, :, 6 * 256 :].any()
    finally:
        await b.aclose()


@pytest.mark.parametrize("large", ["slices", "split"])
async def test_cancelled_array_read_never_writes_after_it_returns(large: str) -> None:
    """A read_arrays cancelled at any point returns only once every copy into the caller's
    memory has ended (the split worker's too): the destination does not change afterwards."""
    b = await _open(capacity="128MiB", inline_copy_bytes="256KiB", large_copies=large)
    try:
        src = np.random.default_rng(5).standard_normal((8, 30, 2, 256, 3, 64)).astype(np.float16)
        allocs = [await b.allocate(f"r{i}", src[i].nbytes) for i in range(8)]
        await b.write_arrays(allocs, list(src))
        for delay in (0.0, 0.0001, 0.0005, 0.002, 0.01):
            out = np.zeros_like(src)
            with anyio.move_on_after(delay):
                await b.read_arrays([f"r{i}" for i in range(8)], list(out))
            snap = out.copy()
            await anyio.sleep(0.02)  # a copy still running would change ``out`` meanwhile
            assert np.array_equal(out, snap)
    finally:
        await b.aclose()


@pytest.mark.parametrize("large", ["slices", "split"])
async def test_cancelled_array_write_commits_nothing(large: str) -> None:
    """A write_arrays cancelled at any point either commits the whole block or nothing,
    and never leaves a reservation behind."""
    b = await _open(capacity="64MiB", inline_copy_bytes="64KiB", large_copies=large)
    try:
        src = np.ones((64, 4096), np.float16)[:, ::2]
        committed = 0
        for i, delay in enumerate((0.0, 0.00005, 0.0002, 0.001, 0.01)):
            a = await b.allocate(f"c{i}", src.nbytes)
            with anyio.move_on_after(delay):
                await b.write_arrays([a], [src])
            if await b.contains(f"c{i}"):
                committed += 1
                assert bytes(await b.read(f"c{i}")) == np.ascontiguousarray(src).tobytes()
            st = b.stats()
            assert st.reserved_bytes == 0 and st.blocks == committed
            assert st.details["logical_bytes"] == committed * src.nbytes
    finally:
        await b.aclose()
