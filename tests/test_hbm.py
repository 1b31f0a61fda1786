"""HbmBackend: pool arithmetic and error paths on CPU; device paths only with CUDA."""

from __future__ import annotations

import pytest

from tierkv.backend import Allocation, TierKind
from tierkv.errors import (
    BlockExistsError,
    BlockNotFoundError,
    CapacityError,
    ConfigError,
    InputError,
    PluginUnavailableError,
)
from tierkv_backends._gpu import cuda_usable
from tierkv_backends.hbm import HbmBackend, HbmPool

pytestmark = pytest.mark.anyio
HAVE_CUDA = cuda_usable()[0]


def test_pool_reserve_commit_accounting() -> None:
    p = HbmPool(1 << 20, granule=4096)
    assert p.capacity == 1 << 20
    a = p.reserve("a", 5000, b"t")
    assert p.used == 8192 and p.reserved == 8192 and p.logical == 5000
    b = p.claim(a)
    with pytest.raises(BlockNotFoundError):
        p.claim(a)  # already being written
    assert p.commit(b)
    assert p.reserved == 0 and p.used == 8192 and "a" in p.blocks
    with pytest.raises(BlockExistsError):
        p.reserve("a", 1)
    assert p.remove("a") and not p.remove("a")
    assert p.used == 0 and p.logical == 0
    assert p.alloc.free_runs() == [(0, 1 << 20)]


def test_pool_capacity_and_fragmentation() -> None:
    p = HbmPool(64 * 4096, granule=4096)
    allocs = [p.reserve(f"k{i}", 4096) for i in range(64)]
    with pytest.raises(CapacityError):
        p.reserve("x", 1)
    for a in allocs[::2]:
        p.remove(a.key)
    # half free but only in single granules: a 2-granule request fails, a 1-granule one succeeds
    with pytest.raises(CapacityError):
        p.reserve("two", 8192)
    p.reserve("one", 4096)
    p.reserve("zero", 0)  # holds nothing
    assert p.used == 33 * 4096


def test_pool_input_errors() -> None:
    p = HbmPool(1 << 20, max_block=1000)
    with pytest.raises(InputError):
        p.reserve("bad key", 1)
    with pytest.raises(InputError):
        p.reserve("k", -1)
    with pytest.raises(InputError):
        p.reserve("k", 1001)
    with pytest.raises(InputError):
        p.reserve("k", 1, b"x" * 257)
    with pytest.raises(BlockNotFoundError):
        p.lookup("nope")
    with pytest.raises(BlockNotFoundError):
        p.claim(Allocation("nope", 1, b"", 99))


def test_pool_evict_while_writing_and_reading() -> None:
    p = HbmPool(1 << 20)
    a = p.reserve("w", 4096)
    b = p.claim(a)
    assert p.remove("w")  # evicted during the copy: memory stays until the copy ends
    assert p.used == 4096
    assert p.commit(b) is False
    assert p.used == 0 and "w" not in p.blocks
    a = p.reserve("r", 4096)
    b = p.commit(p.claim(a)) and p.blocks["r"]
    assert b
    p.pin(b)
    assert p.remove("r")
    assert p.used == 4096  # pinned by the reader
    p.unpin(b)
    assert p.used == 0


def test_pool_abort_releases() -> None:
    p = HbmPool(1 << 20)
    b = p.claim(p.reserve("c", 10000))
    p.abort(b)
    assert p.used == 0 and p.logical == 0 and not p.pending
    p.reserve("c", 10)  # the key is free again


def test_config_errors() -> None:
    with pytest.raises(ConfigError):
        HbmBackend({"granule": 3000})
    with pytest.raises(ConfigError):
        HbmBackend({"nope": 1})
    b = HbmBackend({"capacity": "64MiB"})
    assert b.capabilities.tier_kind is TierKind.HBM and b.capabilities.device_resident
    assert b.stats().capacity_bytes == 64 << 20 and b.stats().used_bytes == 0


@pytest.mark.skipif(HAVE_CUDA, reason="checks the no-CUDA path")
async def test_unavailable_without_cuda() -> None:
    av = HbmBackend.probe()
    assert not av.usable and av.reason
    with pytest.raises(PluginUnavailableError) as ei:
        await HbmBackend.open({"capacity": "1MiB"})
    assert "hint" in str(ei.value)


@pytest.mark.skipif(not HAVE_CUDA, reason="needs a CUDA device")
async def test_device_round_trips() -> None:
    import torch

    async with await HbmBackend.open({"capacity": "64MiB"}) as b:
        for n in (0, 1, 4095, 4096, 4097, 1 << 20):
            host = torch.randint(0, 256, (n,), dtype=torch.uint8)
            a = await b.allocate(f"h{n}", n)
            await b.write(a, host.numpy())
            assert bytes(await b.read(f"h{n}")) == host.numpy().tobytes()
            dev = host.cuda()
            a = await b.allocate(f"d{n}", n)
            await b.write_device(a, dev)
            out = torch.empty(n + 7, dtype=torch.uint8, device="cuda")
            got = await b.read_device(f"d{n}", into=out)
            assert torch.equal(got.cpu(), host)
        with pytest.raises(InputError):
            await b.read_device("d4096", into=torch.empty(10, dtype=torch.uint8, device="cuda"))


@pytest.mark.skipif(not HAVE_CUDA, reason="needs a CUDA device")
async def test_batches_all_or_nothing_and_raw_reference() -> None:
    import torch

    async with await HbmBackend.open({"capacity": "64MiB"}) as b:
        datas = [bytes([i]) * n for i, n in enumerate((0, 5, 4096, 70001, 1 << 20))]
        allocs = await b.allocate_many([(f"k{i}", len(d), b"") for i, d in enumerate(datas)])
        await b.write_many(allocs, datas)
        outs = [bytearray(len(d) + 3) for d in datas]
        got = await b.read_many([f"k{i}" for i in range(len(datas))], into=outs)
        assert [bytes(g) for g in got] == datas
        used = b.stats().used_bytes
        allocs = await b.allocate_many([("x0", 10, b""), ("x1", 10, b"")])
        with pytest.raises(InputError):  # wrong length: nothing claimed, reservations kept for a retry
            await b.write_many(allocs, [bytes(10), bytes(9)])
        await b.write_many(allocs, [bytes(10), bytes(10)])
        with pytest.raises(BlockNotFoundError):
            await b.read_many(["k1", "missing"])
        assert b.stats().used_bytes > used
        m = await b.raw_reference("write", 1 << 20, 8, 1)
        assert m.nbytes == 8 << 20 and m.seconds > 0 and "copy_" in m.method
        assert torch.cuda.is_available()
