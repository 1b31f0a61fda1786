"""The rdma backend against a real mooncake_master on 127.0.0.1 (TCP stands in for RDMA here)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("mooncake.store", reason="needs mooncake-transfer-engine-non-cuda and libibverbs1")

from tierkv._backend import Capabilities, TierKind
from tierkv._errors import (
    BackendIOError,
    BlockExistsError,
    BlockNotFoundError,
    CapacityError,
    ConfigError,
    InputError,
    IntegrityError,
    PluginUnavailableError,
)
from tierkv_backends._mooncake import ERROR_CODES, MasterProcess, code_name, translate
from tierkv_backends.rdma import HEADER_BYTES, RdmaBackend

pytestmark = pytest.mark.anyio
_HAS_IB_SYSFS = Path("/sys/class/infiniband").exists()


@pytest.fixture(scope="module")
def master(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MasterProcess]:
    m = MasterProcess(log_dir=tmp_path_factory.mktemp("mooncake"), lease_ttl_ms=2000)
    with m:
        yield m


def _opts(master: MasterProcess, **kw: Any) -> dict[str, Any]:
    o: dict[str, Any] = {"master": master.address, "global_segment_size": "128MiB", "staging_bytes": "32MiB"}
    o.update(kw)
    return o


def _blob(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


async def test_round_trip_contains_evict_and_stats(master: MasterProcess, anyio_backend: str) -> None:
    ns = f"rt-{anyio_backend}"
    async with await RdmaBackend.open(_opts(master, namespace=ns)) as b:
        caps = b.capabilities
        assert isinstance(caps, Capabilities) and caps.shared and caps.tier_kind is TierKind.RDMA
        data = _blob(1 << 20, 1)
        a = await b.allocate("k1", data.nbytes, tag=b"t" * 200)
        assert b.stats().reserved_bytes == data.nbytes
        with pytest.raises(BlockExistsError):
            await b.allocate("k1", 10)
        await b.write(a, data)
        assert bytes(await b.read("k1")) == data.tobytes()
        out = bytearray(data.nbytes + 100)
        view = await b.read("k1", into=out)
        assert len(view) == data.nbytes and bytes(view) == data.tobytes()
        with pytest.raises(InputError):
            await b.read("k1", into=bytearray(10))
        assert await b.contains("k1") and not await b.contains("k2")
        with pytest.raises(BlockNotFoundError):
            await b.read("k2")
        st = b.stats()
        assert (st.blocks, st.used_bytes, st.reserved_bytes, st.writes, st.reads) == (1, data.nbytes, 0, 1, 2)
        assert st.io_path == "mooncake tcp" and st.emulated and st.details["protocol"] == "tcp"
        assert st.details["rdma_devices"] == [] and st.details["namespace"] == ns
        # empty block, then eviction is idempotent
        e = await b.allocate("empty", 0)
        await b.write(e, b"")
        assert bytes(await b.read("empty")) == b""
        assert await b.evict("k1") is True
        assert await b.evict("k1") is False
        assert not await b.contains("k1")
        with pytest.raises(InputError):
            await b.allocate("bad key!", 1)
        with pytest.raises(InputError):
            await b.allocate("big", caps.max_block_bytes + 1)
    with pytest.raises(Exception, match="closed"):
        await b.read("empty")
    assert b.stats().blocks == 1  # stats work after close


async def test_batch_write_read_many(master: MasterProcess, anyio_backend: str) -> None:
    async with await RdmaBackend.open(_opts(master, namespace="batch-" + anyio_backend)) as b:
        sizes = [1, 4096, 1 << 20, 3 << 20, 777, 0, 6 << 20, 12345]
        datas = [_blob(n, i) for i, n in enumerate(sizes)]
        keys = [f"b{i}" for i in range(len(sizes))]
        allocs = await b.allocate_many([(k, n, b"") for k, n in zip(keys, sizes, strict=True)])
        await b.write_many(allocs, datas)  # 12+ MiB in one call: chunked by the 32 MiB arena
        got = await b.read_many(keys)
        assert [bytes(g) for g in got] == [d.tobytes() for d in datas]
        outs = [np.empty(n, np.uint8) for n in sizes]
        await b.read_many(keys, into=outs)
        assert all(np.array_equal(o, d) for o, d in zip(outs, datas, strict=True))
        assert b.stats().blocks == len(keys)
        with pytest.raises(BlockNotFoundError):
            await b.read_many([keys[0], "missing"])
        assert await b.evict_many([*keys, "missing"]) == [True] * len(keys) + [False]
        assert b.stats().used_bytes == 0 and b.stats().blocks == 0


async def test_namespaces_isolate_blocks(master: MasterProcess, anyio_backend: str) -> None:
    async with (
        await RdmaBackend.open(_opts(master, namespace="model-a-" + anyio_backend)) as a,
        await RdmaBackend.open(_opts(master, namespace="model-b-" + anyio_backend)) as b,
    ):
        await a.write(await a.allocate("same", 4), b"AAAA")
        assert not await b.contains("same")
        with pytest.raises(BlockNotFoundError):
            await b.read("same")
        await b.write(await b.allocate("same", 4), b"BBBB")
        assert bytes(await a.read("same")) == b"AAAA" and bytes(await b.read("same")) == b"BBBB"
        await a.evict("same")
        assert bytes(await b.read("same")) == b"BBBB"
        await b.evict("same")


def test_error_code_translation() -> None:
    assert isinstance(translate(-704, op="get", key="k"), BlockNotFoundError)
    assert isinstance(translate(-703, op="get"), BlockNotFoundError)
    assert isinstance(translate(-200, op="put"), CapacityError)
    assert isinstance(translate(-705, op="put"), BlockExistsError)
    assert isinstance(translate(-801, op="get"), IntegrityError)
    for code in (-900, -800, -706, -1, -600, -12345):
        err = translate(code, op="x", tier="rdma")
        assert isinstance(err, BackendIOError) and str(err).startswith("[rdma] mooncake x failed")
    assert code_name(-706) == "OBJECT_HAS_LEASE(-706)" and code_name(-5) == "ERROR(-5)"
    assert all(c < 0 for c in ERROR_CODES)


async def test_remote_eviction_is_a_counted_miss(master: MasterProcess, anyio_backend: str) -> None:
    async with (
        await RdmaBackend.open(_opts(master, namespace="shared-ev-" + anyio_backend)) as a,
        await RdmaBackend.open(_opts(master, namespace="shared-ev-" + anyio_backend)) as other,
    ):
        await a.write(await a.allocate("k", 1000), _blob(1000, 3))
        assert bytes(await other.read("k")) == _blob(1000, 3).tobytes()  # shared pool
        assert await other.evict("k") is True  # someone else removes it behind a's back
        with pytest.raises(BlockNotFoundError):
            await a.read("k")
        st = a.stats()
        assert st.details["evicted_remotely"] == 1 and st.blocks == 0 and st.used_bytes == 0
        # contains() notices a remote loss as well
        await a.write(await a.allocate("k2", 10), b"0123456789")
        await other.evict("k2")
        assert not await a.contains("k2")
        assert a.stats().details["evicted_remotely"] == 2


async def test_corrupted_object_is_integrity_error_then_quarantined(master: MasterProcess, anyio_backend: str) -> None:
    async with (
        await RdmaBackend.open(_opts(master, namespace="integ-" + anyio_backend)) as a,
        await RdmaBackend.open(_opts(master, namespace="integ-" + anyio_backend)) as other,
    ):
        data = _blob(4096, 4)
        await a.write(await a.allocate("k", data.nbytes), data)
        skey = f"tierkv/integ-{anyio_backend}/k"
        store = other._store
        assert store.remove(skey, True) == 0
        # an object of the right size whose header is not ours (zeros)
        assert store.put(skey, bytes(HEADER_BYTES + data.nbytes)) == 0
        with pytest.raises(IntegrityError):
            await a.read("k")
        with pytest.raises(BlockNotFoundError):  # quarantined: never served again
            await a.read("k")
        assert a.stats().details["integrity_failures"] == 1
        # flipped payload byte under a valid header -> checksum mismatch
        await a.write(await a.allocate("k3", data.nbytes), data)
        obj = bytearray(store.get(f"tierkv/integ-{anyio_backend}/k3"))
        obj[-1] ^= 0xFF
        store.remove(f"tierkv/integ-{anyio_backend}/k3", True)
        assert store.put(f"tierkv/integ-{anyio_backend}/k3", bytes(obj)) == 0
        with pytest.raises(IntegrityError, match="checksum"):
            await a.read("k3")


async def test_evict_under_read_lease(master: MasterProcess, anyio_backend: str) -> None:
    async with await RdmaBackend.open(_opts(master, namespace="lease-" + anyio_backend)) as b:
        await b.write(await b.allocate("k", 100), bytes(100))
        await b.read("k")  # grants a 2 s read lease: a plain remove returns -706
        assert await b.evict("k") is True
        assert b.stats().details["lease_conflicts"] >= 1
        assert not await b.contains("k")
    async with await RdmaBackend.open(
        _opts(master, namespace="lease2-" + anyio_backend, force_evict=False, timeout=5.0)
    ) as b:
        await b.write(await b.allocate("k", 100), bytes(100))
        await b.read("k")
        t0 = time.monotonic()
        assert await b.evict("k") is True  # retried until the lease expired
        assert time.monotonic() - t0 < 5.0


async def test_capacity_and_config_errors(master: MasterProcess, tmp_path: Path, anyio_backend: str) -> None:
    async with await RdmaBackend.open(_opts(master, namespace="cap-" + anyio_backend, capacity="1MiB")) as b:
        await b.allocate("a", 600_000)
        with pytest.raises(CapacityError):
            await b.allocate("b", 600_000)
        assert await b.evict("a") is True
        await b.allocate("b", 600_000)
    with pytest.raises(ConfigError, match="bogus"):
        RdmaBackend({"master": "x", "bogus": 1})
    with pytest.raises(ConfigError, match="namespace"):
        RdmaBackend({"master": "x", "namespace": "a/b"})
    with pytest.raises(ConfigError, match="master"):
        RdmaBackend({})
    with pytest.raises(ConfigError, match="protocol"):
        RdmaBackend({"master": "x", "protocol": "udp"})
    if not _HAS_IB_SYSFS:
        with pytest.raises(PluginUnavailableError, match="no RDMA device"):
            await RdmaBackend.open(_opts(master, protocol="rdma"))
    with pytest.raises(BackendIOError):
        await RdmaBackend.open({"master": "127.0.0.1:1", "timeout": 15.0, "global_segment_size": "16MiB"})


async def test_start_master_default_options_and_raw_reference(tmp_path: Path) -> None:
    opts = RdmaBackend.default_options(tmp_path)
    assert opts["start_master"] is True
    b = await RdmaBackend.open(opts)
    try:
        assert b.master_address.startswith("127.0.0.1:")
        await b.write(await b.allocate("k", 1 << 20), _blob(1 << 20, 9))
        for op in ("write", "read"):
            assert await b.raw_reference(1 << 20, op, 3) > 0
        with pytest.raises(InputError):
            await b.raw_reference(1 << 20, "scan", 3)
        assert b.stats().blocks == 1  # raw objects are not accounted
    finally:
        await b.aclose()
    master = b.stats().details["master"]
    import socket

    host, port = master.split(":")
    with pytest.raises(OSError), socket.create_connection((host, int(port)), timeout=1):
        pass  # the private master is gone


@pytest.mark.slow
async def test_master_death_is_bounded_and_recovers(tmp_path: Path) -> None:
    m = MasterProcess(log_dir=tmp_path, lease_ttl_ms=1000).start()
    try:
        async with await RdmaBackend.open(
            {"master": m.address, "global_segment_size": "64MiB", "staging_bytes": "16MiB", "timeout": 10.0}
        ) as b:
            await b.write(await b.allocate("k", 1000), bytes(1000))
            m.kill()
            for op in ("read", "write", "contains", "evict"):
                t0 = time.monotonic()
                print(f"master down: {op} -> typed error", end=" ")
                with pytest.raises((BackendIOError, BlockNotFoundError)):
                    if op == "read":
                        await b.read("k")
                    elif op == "write":
                        await b.write(await b.allocate(f"n-{op}", 10), bytes(10))
                    elif op == "contains":
                        await b.contains("k")
                    else:
                        await b.evict("k")
                print(f"after {time.monotonic() - t0:.2f}s")
                assert time.monotonic() - t0 < 12.0
            m.restart()
            t_restart = time.monotonic()
            deadline = time.monotonic() + 60
            while True:  # the client re-registers with the new master by itself
                try:
                    await b.write(await b.allocate("after", 10), b"0123456789")
                    break
                except (BackendIOError, CapacityError):  # -900 until reconnected, -200 until re-mounted
                    if time.monotonic() > deadline:
                        raise
                    await b.evict("after")
                    import anyio

                    await anyio.sleep(0.5)
            print(f"recovered {time.monotonic() - t_restart:.2f}s after the master restarted")
            assert bytes(await b.read("after")) == b"0123456789"
            with pytest.raises(BlockNotFoundError):  # the old master's metadata is gone: a miss, not bytes
                await b.read("k")
    finally:
        m.stop()
