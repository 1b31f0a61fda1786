"""NvmeBackend on real files with O_DIRECT (asyncio and trio)."""

from __future__ import annotations

import itertools
import mmap
import os
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierkv.backend import SupportsScan
from tierkv.errors import (
    BackendClosedError,
    BlockExistsError,
    BlockNotFoundError,
    CapacityError,
    ConfigError,
    InputError,
    IntegrityError,
    PluginUnavailableError,
)
from tierkv_backends._gpu import cuda_driver_present
from tierkv_backends.nvme import (
    PAGE,
    NvmeBackend,
    SlotHeader,
    _coalesce,
    pack_slot_header,
    unpack_slot_header,
    wsum32,
    wsum32_torch,
)

pytestmark = pytest.mark.anyio


def opts(tmp_path: Path, **kw: Any) -> dict[str, Any]:
    return {"path": str(tmp_path / "slabs"), "capacity": "8MiB", "slot_bytes": ["64KiB", "1MiB"], **kw}


async def put(b: NvmeBackend, key: str, data: bytes, tag: bytes = b"") -> None:
    a = await b.allocate(key, len(data), tag=tag)
    await b.write(a, data)


@pytest.mark.parametrize("n", [0, 1, 4095, 4096, 4097, 65536, 65537, 1 << 20])
async def test_round_trip_alignment_edges(tmp_path: Path, n: int) -> None:
    data = os.urandom(n)
    async with await NvmeBackend.open(opts(tmp_path, io="posix")) as b:
        assert b.stats().io_path == "O_DIRECT preadv/pwritev"
        await put(b, "k", data, b"tag")
        assert bytes(await b.read("k")) == data
        # into: unaligned bytearray, page-aligned mmap, larger than the block
        ba = bytearray(n + 3)
        assert bytes(await b.read("k", into=ba)) == data and bytes(ba[:n]) == data
        mm = mmap.mmap(-1, max(PAGE, n + PAGE))
        assert bytes(await b.read("k", into=mm)) == data
        # aligned source buffer (zero-copy write path)
        mm2 = mmap.mmap(-1, max(PAGE, n))
        mm2[:n] = data
        a = await b.allocate("k2", n)
        await b.write(a, memoryview(mm2)[:n])
        assert bytes(await b.read("k2")) == data


async def test_restart_recovers_via_scan(tmp_path: Path) -> None:
    blocks = {f"b{i}": os.urandom(i * 3000) for i in range(12)}
    async with await NvmeBackend.open(opts(tmp_path)) as b:
        for k, v in blocks.items():
            await put(b, k, v, k.encode())
        assert await b.evict("b3") is True
        assert await b.evict("b3") is False
    b = await NvmeBackend.open(opts(tmp_path))
    try:
        assert isinstance(b, SupportsScan)
        got = {i.key: (i.nbytes, i.tag) for i in await b.scan()}
        assert got == {k: (len(v), k.encode()) for k, v in blocks.items() if k != "b3"}
        for k in got:
            assert bytes(await b.read(k)) == blocks[k]
        st = b.stats()
        assert st.details["logical_bytes"] == sum(len(v) for k, v in blocks.items() if k != "b3")
        assert st.used_bytes == sum((64 << 10) if v else 0 for k, v in blocks.items() if k != "b3")
        assert b.stats().details["recovered"]["verified"] == 0  # clean close: checkpoint covers all
    finally:
        await b.aclose()


def _slot_offset(slab: Path, slot: int) -> int:
    import struct

    with open(slab, "rb") as f:
        raw = f.read(64)
    stride = struct.unpack_from("<Q", raw, 32)[0]
    return 2 * PAGE + slot * stride


def _find_slot(path: Path, key: str) -> tuple[Path, int]:
    for slab in sorted(path.glob("*.slab")):
        size = slab.stat().st_size
        off = 2 * PAGE
        stride = _slot_offset(slab, 1) - _slot_offset(slab, 0)
        with open(slab, "rb") as f:
            while off < size:
                f.seek(off)
                h = unpack_slot_header(f.read(PAGE))
                if h is not None and h.state == 1 and h.key == key:
                    return slab, off
                off += stride
    raise AssertionError(f"{key} not on disk")


def _poke(slab: Path, off: int, data: bytes) -> None:
    with open(slab, "r+b") as f:
        f.seek(off)
        f.write(data)


def _flip(slab: Path, off: int) -> None:
    with open(slab, "r+b") as f:
        f.seek(off)
        b = f.read(1)
        f.seek(off)
        f.write(bytes([b[0] ^ 0xFF]))
        f.flush()
        os.fsync(f.fileno())


async def test_corrupted_payload_never_served(tmp_path: Path) -> None:
    data = os.urandom(10000)
    async with await NvmeBackend.open(opts(tmp_path)) as b:
        await put(b, "good", data)
        await put(b, "bad", data)
        slab, off = _find_slot(tmp_path / "slabs", "bad")
        _flip(slab, off + PAGE + 5000)
        with pytest.raises(IntegrityError):
            await b.read("bad")
        # quarantined: never served again, and gone after a restart
        with pytest.raises(BlockNotFoundError):
            await b.read("bad")
        assert bytes(await b.read("good")) == data
    async with await NvmeBackend.open(opts(tmp_path)) as b:
        assert [i.key for i in await b.scan()] == ["good"]


async def test_corrupted_header_or_torn_payload_after_crash_not_listed(tmp_path: Path) -> None:
    data = os.urandom(20000)
    async with await NvmeBackend.open(opts(tmp_path)) as b:
        for k in ("h", "p", "ok"):
            await put(b, k, data)
    slab_h, off_h = _find_slot(tmp_path / "slabs", "h")
    slab_p, off_p = _find_slot(tmp_path / "slabs", "p")
    _flip(slab_h, off_h + 20)  # header byte: header crc fails
    _flip(slab_p, off_p + PAGE + 100)  # payload byte
    # simulate a crash: checkpoint back to 0 so every payload is verified at open
    from tierkv_backends.nvme import _CKPT, _CKPT_MAGIC, _sealed

    for slab in (tmp_path / "slabs").glob("*.slab"):
        _poke(slab, PAGE, _sealed(_CKPT.pack(_CKPT_MAGIC, 0)))
    async with await NvmeBackend.open(opts(tmp_path)) as b:
        assert [i.key for i in await b.scan()] == ["ok"]
        assert b.stats().details["recovered"]["torn_or_stale"] == 1
        assert bytes(await b.read("ok")) == data
    # the torn slot was durably invalidated: a later open (clean checkpoint) does not resurrect it
    async with await NvmeBackend.open(opts(tmp_path)) as b:
        assert [i.key for i in await b.scan()] == ["ok"]


async def test_stale_duplicate_older_generation_loses(tmp_path: Path) -> None:
    async with await NvmeBackend.open(opts(tmp_path)) as b:
        await put(b, "k", b"new" * 100, b"new")
        await put(b, "other", b"x" * 100)
    # forge an older generation of "k" in the slot of "other" (a valid, complete block)
    slab, off = _find_slot(tmp_path / "slabs", "other")
    from tierkv_backends import nvme

    old = b"old" * 100
    csum = nvme._checksum_fn(_algo(tmp_path))(old)
    hdr = pack_slot_header(SlotHeader(1, 0, "k", len(old), b"old", csum))  # generation 0 < any real one
    _poke(slab, off, hdr)
    _poke(slab, off + PAGE, old)
    async with await NvmeBackend.open(opts(tmp_path)) as b:
        infos = {i.key: i.tag for i in await b.scan()}
        assert infos == {"k": b"new"}
        assert bytes(await b.read("k")) == b"new" * 100
        assert b.stats().details["recovered"]["duplicates"] == 1


def _algo(tmp_path: Path) -> str:
    import struct

    slab = next((tmp_path / "slabs").glob("*.slab"))
    with open(slab, "rb") as f:
        algo_id = struct.unpack_from("<I", f.read(16), 12)[0]
    return {1: "crc32", 2: "crc32c"}[algo_id]


async def test_capacity_exists_notfound_closed(tmp_path: Path) -> None:
    b = await NvmeBackend.open(opts(tmp_path, capacity="2MiB", slot_bytes="1MiB"))
    assert b.stats().capacity_bytes == 2 << 20
    with pytest.raises(InputError):
        await b.allocate("big", (1 << 20) + 1)
    a1 = await b.allocate("a", 1 << 20)
    with pytest.raises(BlockExistsError):
        await b.allocate("a", 10)
    await b.allocate("b", 10)
    with pytest.raises(CapacityError):
        await b.allocate("c", 10)  # no free slot left
    assert b.stats().used_bytes == 2 << 20 and b.stats().reserved_bytes == 2 << 20
    assert b.stats().details["granule"] == 1 << 20 and b.stats().details["logical_bytes"] == (1 << 20) + 10
    assert await b.evict("b") is True  # a reservation
    await b.write(a1, bytes(1 << 20))
    with pytest.raises(BlockNotFoundError):
        await b.write(a1, bytes(1 << 20))
    with pytest.raises(InputError):
        await b.write(await b.allocate("d", 5), b"1234")
    with pytest.raises(BlockNotFoundError):
        await b.read("nope")
    with pytest.raises(InputError):
        await b.read("a", into=bytearray(10))
    with pytest.raises(InputError):
        await b.read("bad key!")
    await b.aclose()
    await b.aclose()
    with pytest.raises(BackendClosedError):
        await b.read("a")
    assert b.stats().blocks == 1


async def test_concurrent_queue_depth(tmp_path: Path) -> None:
    blobs = {f"c{i}": os.urandom(50_000 + i) for i in range(24)}
    async with await NvmeBackend.open(opts(tmp_path, queue_depth=4)) as b:
        async with anyio.create_task_group() as tg:
            for k, v in blobs.items():
                tg.start_soon(put, b, k, v)
        results: dict[str, bytes] = {}

        async def get(k: str) -> None:
            results[k] = bytes(await b.read(k))

        async with anyio.create_task_group() as tg:
            for k in blobs:
                tg.start_soon(get, k)
        assert results == blobs
        assert b.stats().details["queue_depth"] == 4


async def test_cancelled_write_leaves_nothing(tmp_path: Path) -> None:
    async with await NvmeBackend.open(opts(tmp_path)) as b:
        a = await b.allocate("k", 1 << 20)
        with anyio.CancelScope() as cs:
            cs.cancel()
            await b.write(a, bytes(1 << 20))
        assert not await b.contains("k")
        assert b.stats().used_bytes == 0
        with pytest.raises(BlockNotFoundError):
            await b.read("k")
        free_before = b.stats().details["free_slots"]
    async with await NvmeBackend.open(opts(tmp_path)) as b:
        assert await b.scan() == []
        assert b.stats().details["free_slots"] == free_before


async def test_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        NvmeBackend({})
    with pytest.raises(ConfigError):
        NvmeBackend(opts(tmp_path, io="gds"))
    with pytest.raises(ConfigError):
        NvmeBackend(opts(tmp_path, bogus=1))
    with pytest.raises(ConfigError):
        NvmeBackend(opts(tmp_path, queue_depth=0))
    async with await NvmeBackend.open(opts(tmp_path)):
        pass
    with pytest.raises(ConfigError):  # geometry of existing slabs differs
        await NvmeBackend.open(opts(tmp_path, capacity="16MiB"))


@pytest.mark.skipif(cuda_driver_present(), reason="checks the no-GPU error path")
async def test_kvikio_without_gpu_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(PluginUnavailableError):
        await NvmeBackend.open(opts(tmp_path, io="kvikio"))
    async with await NvmeBackend.open(opts(tmp_path, io="auto")) as b:
        assert b.stats().io_path == "O_DIRECT preadv/pwritev"


async def test_buffered_mode_without_o_direct(tmp_path: Path) -> None:
    async with await NvmeBackend.open(opts(tmp_path, direct=False, io="posix")) as b:
        await put(b, "k", b"abc")
        assert bytes(await b.read("k")) == b"abc"
        assert b.stats().io_path == "buffered preadv/pwritev + fdatasync"


def test_slot_header_codec() -> None:
    h = SlotHeader(1, 42, "abc", 10, b"t" * 256, 7)
    raw = pack_slot_header(h) + bytes(100)
    assert unpack_slot_header(raw) == h
    bad = bytearray(raw)
    bad[30] ^= 1
    assert unpack_slot_header(bytes(bad)) is None
    assert unpack_slot_header(bytes(PAGE)) is None


async def test_batch_calls_round_trip_and_persist(tmp_path: Path) -> None:
    blobs = {f"b{i}": os.urandom(n) for i, n in enumerate([0, 1, 4096, 70_000, 1 << 20, 12345, 65536, 999_999])}
    async with await NvmeBackend.open(opts(tmp_path, queue_depth=4)) as b:
        allocs = await b.allocate_many([(k, len(v), b"t" + k.encode()) for k, v in blobs.items()])
        used = b.stats().used_bytes
        await b.write_many(allocs, list(blobs.values()))
        assert b.stats().used_bytes == used and b.stats().reserved_bytes == 0
        got = await b.read_many(list(blobs))
        assert [bytes(g) for g in got] == list(blobs.values())
        aligned = [mmap.mmap(-1, max(1, len(v))) for v in blobs.values()]
        views = await b.read_many(list(blobs), into=aligned)
        assert [bytes(v) for v in views] == list(blobs.values())
        assert b.stats().writes == len(blobs)
    async with await NvmeBackend.open(opts(tmp_path, queue_depth=2)) as b:
        assert sorted((i.key, i.tag) for i in await b.scan()) == sorted((k, b"t" + k.encode()) for k in blobs)
        assert [bytes(g) for g in await b.read_many(list(blobs))] == list(blobs.values())
        assert await b.evict_many(["b1", "b1", "nope", "b3"]) == [True, False, False, True]
        assert b.stats().blocks == len(blobs) - 2
    async with await NvmeBackend.open(opts(tmp_path)) as b:
        assert sorted(i.key for i in await b.scan()) == sorted(set(blobs) - {"b1", "b3"})


async def test_batch_error_paths_release_everything(tmp_path: Path) -> None:
    async with await NvmeBackend.open(opts(tmp_path, queue_depth=4)) as b:
        free0 = b.stats().details["free_slots"]
        with pytest.raises(BlockExistsError):  # all or nothing
            await b.allocate_many([("a", 10, b""), ("a", 10, b"")])
        with pytest.raises(CapacityError):
            await b.allocate_many([(f"c{i}", 1 << 20, b"") for i in range(100)])
        assert b.stats().used_bytes == 0 and b.stats().details["free_slots"] == free0
        allocs = await b.allocate_many([("w1", 100, b""), ("w2", 100, b"")])
        with pytest.raises(InputError):  # wrong length: no block of the batch commits
            await b.write_many(allocs, [bytes(100), bytes(5)])
        assert b.stats().used_bytes == 0 and b.stats().details["free_slots"] == free0
        with pytest.raises(BlockNotFoundError):
            await b.write_many(allocs, [bytes(100), bytes(100)])
        await put(b, "x", b"1" * 100)
        with pytest.raises(BlockNotFoundError):
            await b.read_many(["x", "missing"])
        with pytest.raises(InputError):
            await b.read_many(["x"], into=[bytearray(10)])


async def test_cancelled_write_many_leaves_nothing(tmp_path: Path) -> None:
    async with await NvmeBackend.open(opts(tmp_path, queue_depth=4)) as b:
        free0 = b.stats().details["free_slots"]
        allocs = await b.allocate_many([(f"k{i}", 1 << 20, b"") for i in range(4)])
        with anyio.CancelScope() as cs:
            cs.cancel()
            await b.write_many(allocs, [os.urandom(1 << 20) for _ in range(4)])
        assert cs.cancelled_caught
        assert not any([await b.contains(f"k{i}") for i in range(4)])
        assert b.stats().used_bytes == 0 and b.stats().reserved_bytes == 0
        assert b.stats().details["free_slots"] == free0
        # cancelled while the I/O is in flight: it finishes, then every slot is freed durably
        allocs = await b.allocate_many([(f"m{i}", 1 << 20, b"") for i in range(4)])
        with anyio.move_on_after(0.001) as cs2:
            await b.write_many(allocs, [os.urandom(1 << 20) for _ in range(4)])
        visible = [await b.contains(f"m{i}") for i in range(4)]
        assert visible in ([False] * 4, [True] * 4)  # never a partial batch
        if cs2.cancelled_caught:
            assert visible == [False] * 4 and b.stats().used_bytes == 0
        assert b.stats().reserved_bytes == 0
    async with await NvmeBackend.open(opts(tmp_path)) as b:
        assert sorted(i.key for i in await b.scan()) == ([f"m{i}" for i in range(4)] if visible[0] else [])


async def test_read_many_quarantines_corrupted_block(tmp_path: Path) -> None:
    data = os.urandom(10000)
    async with await NvmeBackend.open(opts(tmp_path, queue_depth=4)) as b:
        await put(b, "good", data)
        await put(b, "bad", data)
        slab, off = _find_slot(tmp_path / "slabs", "bad")
        _flip(slab, off + PAGE + 5000)
        with pytest.raises(IntegrityError):
            await b.read_many(["good", "bad"])
        assert not await b.contains("bad")
        assert [bytes(v) for v in await b.read_many(["good"])] == [data]
    async with await NvmeBackend.open(opts(tmp_path)) as b:
        assert [i.key for i in await b.scan()] == ["good"]


def test_envelope_instances_hold_a_full_measurement(tmp_path: Path) -> None:
    """Each certification instance lets the envelope move its whole storage target (it moves at
    most 80 % of the free capacity, in slots of block + one header page), at every block size."""
    from tierkv_conformance._envelope import BLOCK_SIZES, STORAGE_TARGET_BYTES

    for size in BLOCK_SIZES:
        o = NvmeBackend.envelope_options({"path": str(tmp_path / "n")}, size)
        assert o is not None and o["slot_bytes"] == size and o["path"].endswith(f"envelope-{size}")
        want = max(32, min(2048, STORAGE_TARGET_BYTES // size))
        assert int(o["capacity"] * 0.8) // (size + 4096) >= want, size
    assert NvmeBackend.envelope_options({"path": [str(tmp_path / "a"), str(tmp_path / "b")]}, 1 << 20) is None


def test_coalesce_plans_adjacent_runs() -> None:
    stride = {0: 64 * 1024 + PAGE, 1: (1 << 20) + PAGE}.__getitem__
    # adjacent slots of one slab form runs (in slot order); gaps, other slabs and None break them
    slots: list[tuple[int, int] | None] = [(0, 3), (0, 1), (0, 2), None, (1, 2), (0, 7), (1, 3)]
    plan = _coalesce(slots, stride, 1)
    assert sorted(i for g in plan for i in g) == list(range(len(slots)))  # each index once
    assert [1, 0, 2] not in plan and [1, 2, 0] in plan  # slot order 1, 2, 3
    assert [5] in plan and [3] in plan
    assert [4] in plan and [6] in plan  # 1 MiB slots: a run would exceed the run size
    # enough I/Os to keep the queue depth busy: 32 adjacent slots, 8 units -> runs of 4
    plan = _coalesce([(0, i) for i in range(32)], stride, 8)
    assert [len(g) for g in plan] == [4] * 8
    # the run size caps a run: 64 KiB slots, one unit -> runs of 1 MiB // stride slots
    plan = _coalesce([(0, i) for i in range(100)], stride, 1)
    assert max(len(g) for g in plan) == (1 << 20) // stride(0)
    assert _coalesce([], stride, 8) == [] and _coalesce([None], stride, 8) == [[0]]


@given(st.lists(st.one_of(st.none(), st.tuples(st.integers(0, 2), st.integers(0, 40))), max_size=60, unique=True))
@settings(max_examples=100, deadline=None)
def test_coalesce_groups_are_contiguous(slots: list[tuple[int, int] | None]) -> None:
    plan = _coalesce(slots, lambda si: 16 * 1024 + PAGE, 4)
    assert sorted(i for g in plan for i in g) == list(range(len(slots)))
    for g in plan:
        got = [slots[i] for i in g]
        if len(g) > 1:
            assert all(s is not None for s in got)
            assert all(
                a is not None and b is not None and (b[0], b[1]) == (a[0], a[1] + 1) for a, b in itertools.pairwise(got)
            )


async def test_coalesced_runs_round_trip_and_isolate_corruption(tmp_path: Path) -> None:
    """Whole 64 KiB slots from page-aligned buffers move in coalesced runs; a corrupted block
    inside a run fails alone (quarantined), its neighbours read fine, and all persist."""
    n = 64 * 1024
    blobs = {f"r{i}": os.urandom(n) for i in range(12)}
    srcs = []
    for v in blobs.values():
        m = mmap.mmap(-1, n)
        m[:] = v
        srcs.append(m)
    async with await NvmeBackend.open(opts(tmp_path, queue_depth=2)) as b:
        allocs = await b.allocate_many([(k, n, b"") for k in blobs])
        await b.write_many(allocs, srcs)
        intos = [mmap.mmap(-1, n) for _ in blobs]
        assert [bytes(v) for v in await b.read_many(list(blobs), into=intos)] == list(blobs.values())
        offs = {k: _find_slot(tmp_path / "slabs", k)[1] for k in blobs}
        assert sorted(offs.values()) == [offs["r0"] + i * (n + PAGE) for i in range(12)]  # adjacent slots
        slab, off = _find_slot(tmp_path / "slabs", "r5")
        _flip(slab, off + PAGE + 777)
        intos = [mmap.mmap(-1, n) for _ in blobs]
        with pytest.raises(IntegrityError, match="r5"):
            await b.read_many(list(blobs), into=intos)
        assert not await b.contains("r5")
        rest = [k for k in blobs if k != "r5"]
        got = await b.read_many(rest, into=[mmap.mmap(-1, n) for _ in rest])
        assert [bytes(v) for v in got] == [blobs[k] for k in rest]
    async with await NvmeBackend.open(opts(tmp_path)) as b:
        assert sorted(i.key for i in await b.scan()) == sorted(rest)
        assert [bytes(v) for v in await b.read_many(rest)] == [blobs[k] for k in rest]


# ------------------------------------------------------------------ device I/O (wsum32 blocks)
@given(data=st.binary(max_size=5000), skip=st.integers(0, 15))
@settings(max_examples=60, deadline=None)
def test_wsum32_numpy_equals_torch(data: bytes, skip: int) -> None:
    """The host checksum and the device reduction agree (torch on CPU runs the same integer math)."""
    torch = pytest.importorskip("torch")
    buf = bytes(skip) + data + b"\0"
    t = torch.frombuffer(bytearray(buf), dtype=torch.uint8)[skip : skip + len(data)]  # unaligned storage offset
    assert wsum32(data) == wsum32_torch(t)
    if data:
        moved = bytes([data[-1]]) + data[:-1]
        if moved != data:
            assert wsum32(moved) != wsum32(data)  # position-weighted: a rotation is caught


def test_wsum32_catches_swapped_pages() -> None:
    a, b = os.urandom(PAGE), os.urandom(PAGE)
    assert wsum32(a + b) != wsum32(b + a)
    assert wsum32(b"") != wsum32(bytes(8)) != wsum32(bytes(16))  # the length is folded in


async def test_device_written_slot_recovers_and_verifies(tmp_path: Path) -> None:
    """A slot committed by write_device (state 2, wsum32 payload checksum) is recovered on open,
    served by read(), and a corrupted payload is caught: the on-disk format, without a GPU."""
    data = os.urandom(70000)
    async with await NvmeBackend.open(opts(tmp_path)) as b:
        await put(b, "dev", data, b"t")
    slab, off = _find_slot(tmp_path / "slabs", "dev")
    h = unpack_slot_header(slab.read_bytes()[off : off + PAGE])
    assert h is not None
    _poke(slab, off, pack_slot_header(SlotHeader(2, h.gen, h.key, h.nbytes, h.tag, wsum32(data))))
    async with await NvmeBackend.open(opts(tmp_path)) as b:
        assert [(i.key, i.tag) for i in await b.scan()] == [("dev", b"t")]
        assert bytes(await b.read("dev")) == data
    _flip(slab, off + PAGE + 123)
    async with await NvmeBackend.open(opts(tmp_path)) as b:
        # written after the checkpoint? then recovery verified it and dropped it; else read() catches it
        if await b.contains("dev"):
            with pytest.raises(IntegrityError):
                await b.read("dev")
        assert not await b.contains("dev")


async def test_device_io_rejects_host_tensors(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    async with await NvmeBackend.open(opts(tmp_path)) as b:
        a = await b.allocate("k", 16)
        with pytest.raises(InputError, match="CUDA tensor"):
            await b.write_device(a, torch.zeros(16, dtype=torch.uint8))
        await b.write(a, bytes(16))
        with pytest.raises(InputError, match="CUDA tensor"):
            await b.read_device("k", into=bytearray(16))
        with pytest.raises(BlockNotFoundError):
            await b.read_device("missing", into=torch.zeros(16, dtype=torch.uint8))


@pytest.mark.skipif(not cuda_driver_present(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("io", ["kvikio", "posix"])
async def test_device_round_trip_on_gpu(tmp_path: Path, io: str) -> None:
    torch = pytest.importorskip("torch")
    if io == "kvikio":
        pytest.importorskip("kvikio")
    async with await NvmeBackend.open(opts(tmp_path, io=io)) as b:
        assert ("kvikio" in b.stats().io_path) == (io == "kvikio")
        for n in (0, 5, 4096, 70001, 1 << 20):
            src = torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda")
            await b.write_device(await b.allocate(f"d{n}", n), src)
            out = torch.zeros(n + 9, dtype=torch.uint8, device="cuda")
            got = await b.read_device(f"d{n}", into=out)
            assert torch.equal(got, src) and bytes(await b.read(f"d{n}")) == src.cpu().numpy().tobytes()
            host = os.urandom(n)  # host-written block read into device memory (crc path)
            await put(b, f"h{n}", host)
            got = await b.read_device(f"h{n}", into=out)
            assert got.cpu().numpy().tobytes() == host
        with pytest.raises(InputError):
            await b.read_device("d70001", into=torch.zeros(10, dtype=torch.uint8, device="cuda"))
    async with await NvmeBackend.open(opts(tmp_path, io=io)) as b:  # device-written blocks survive a restart
        assert bytes(await b.read("d5")) and await b.contains("d70001")
