"""The rdma backend against a real mooncake_master on 127.0.0.1 (TCP stands in for RDMA here)."""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import numpy as np
import pytest

pytest.importorskip("mooncake.store", reason="needs mooncake-transfer-engine-non-cuda and libibverbs1")

from tierkv_conformance._reference import RawMeasurement, SupportsRawReference

from tierkv.backend import Capabilities, TierKind
from tierkv.errors import (
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
from tierkv_backends.rdma import (
    _ALGO_CRC32,
    _ALGO_XXH3,
    _HDR_PER_CHUNK,
    HEADER_BYTES,
    RdmaBackend,
    _checksum,
    _checksum_parts,
)

pytestmark = pytest.mark.anyio
_HAS_IB_SYSFS = Path("/sys/class/infiniband").exists()

# Opening a Mooncake client is cheap but closing one takes 1-2 s (its heartbeat
# threads are joined), so one master and three clients serve the whole module,
# once per event loop (module-scoped ``anyio_backend``); tests use distinct keys
# and assert on counter deltas.


@pytest.fixture(scope="module", params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def master(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MasterProcess]:
    m = MasterProcess(log_dir=tmp_path_factory.mktemp("mooncake"), lease_ttl_ms=500)
    with m:
        yield m


@dataclass
class Clients:
    a: RdmaBackend  # namespace "shared-<loop>"
    other: RdmaBackend  # same namespace: "another process" behind a's back
    c: RdmaBackend  # namespace "model-b-<loop>", capacity 1 MiB, force_evict false, timeout 5 s
    ns: str


@pytest.fixture(scope="module")
async def clients(master: MasterProcess, anyio_backend: str) -> AsyncIterator[Clients]:
    ns = f"shared-{anyio_backend}"
    async with (
        await RdmaBackend.open(_opts(master, namespace=ns)) as a,
        await RdmaBackend.open(_opts(master, namespace=ns)) as other,
        await RdmaBackend.open(
            _opts(master, namespace=f"model-b-{anyio_backend}", capacity="1MiB", force_evict=False, timeout=5.0)
        ) as c,
    ):
        yield Clients(a, other, c, ns)


def _opts(master: MasterProcess, **kw: Any) -> dict[str, Any]:
    o: dict[str, Any] = {"master": master.address, "global_segment_size": "128MiB", "staging_bytes": "32MiB"}
    o.update(kw)
    return o


def _blob(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


async def test_round_trip_contains_evict_and_stats(clients: Clients) -> None:
    b = clients.a
    caps = b.capabilities
    assert isinstance(caps, Capabilities) and caps.shared and caps.tier_kind is TierKind.RDMA
    s0 = b.stats()
    data = _blob(1 << 20, 1)
    a = await b.allocate("rt1", data.nbytes, tag=b"t" * 200)
    assert b.stats().reserved_bytes == s0.reserved_bytes + data.nbytes
    with pytest.raises(BlockExistsError):
        await b.allocate("rt1", 10)
    await b.write(a, data)
    assert bytes(await b.read("rt1")) == data.tobytes()
    out = bytearray(data.nbytes + 100)
    view = await b.read("rt1", into=out)
    assert len(view) == data.nbytes and bytes(view) == data.tobytes()
    with pytest.raises(InputError):
        await b.read("rt1", into=bytearray(10))
    assert await b.contains("rt1") and not await b.contains("rt2")
    with pytest.raises(BlockNotFoundError):
        await b.read("rt2")
    st = b.stats()
    assert (st.blocks - s0.blocks, st.used_bytes - s0.used_bytes, st.reserved_bytes) == (1, data.nbytes, 0)
    assert (st.writes - s0.writes, st.reads - s0.reads) == (1, 2)
    assert st.io_path == "mooncake tcp" and st.emulated and st.details["protocol"] == "tcp"
    assert st.details["rdma_devices"] == [] and st.details["namespace"] == clients.ns
    # the same block read by a client that did not write it (no size known: staged path)
    assert bytes(await clients.other.read("rt1", into=bytearray(data.nbytes))) == data.tobytes()
    # empty block, then eviction is idempotent
    e = await b.allocate("rt-empty", 0)
    await b.write(e, b"")
    assert bytes(await b.read("rt-empty")) == b""
    assert bytes(await b.read("rt-empty", into=bytearray(4))) == b""
    assert await b.evict("rt1") is True
    assert await b.evict("rt1") is False
    assert not await b.contains("rt1")
    assert await b.evict("rt-empty") is True
    with pytest.raises(InputError):
        await b.allocate("bad key!", 1)
    with pytest.raises(InputError):
        await b.allocate("big", caps.max_block_bytes + 1)


async def test_batch_write_read_many(clients: Clients) -> None:
    b = clients.a
    s0 = b.stats()
    sizes = [1, 4096, 1 << 20, 3 << 20, 777, 0, 6 << 20, 12345]
    datas = [_blob(n, i) for i, n in enumerate(sizes)]
    keys = [f"b{i}" for i in range(len(sizes))]
    allocs = await b.allocate_many([(k, n, b"") for k, n in zip(keys, sizes, strict=True)])
    await b.write_many(allocs, datas)  # 12+ MiB in one call
    got = await b.read_many(keys)
    assert [bytes(g) for g in got] == [d.tobytes() for d in datas]
    outs = [np.empty(n, np.uint8) for n in sizes]
    await b.read_many(keys, into=outs)
    assert all(np.array_equal(o, d) for o, d in zip(outs, datas, strict=True))
    assert b.stats().blocks == s0.blocks + len(keys)
    with pytest.raises(BlockNotFoundError):
        await b.read_many([keys[0], "missing"])
    assert await b.evict_many([*keys, "missing"]) == [True] * len(keys) + [False]
    assert b.stats().used_bytes == s0.used_bytes and b.stats().blocks == s0.blocks


async def test_header_slots_pooled_and_arena_fallback(clients: Clients, master: MasterProcess) -> None:
    """Batches take their header slots from the set-aside chunks when they fit, and from the
    arena otherwise (more objects than a chunk holds, or an arena too small to set any aside);
    either way every block round-trips and every slot is given back."""
    tiny = await RdmaBackend.open(_opts(master, namespace=f"{clients.ns}-tiny", staging_bytes="1MiB"))
    async with tiny:
        for b, n in ((clients.a, 8), (clients.a, _HDR_PER_CHUNK + 40), (tiny, 8), (tiny, 600)):
            staging = b._staging
            assert staging is not None
            chunks0, free0 = len(staging._hdr_chunks), list(staging._free)
            blobs = [_blob(64 + i % 7, i) for i in range(n)]
            keys = [f"hs{n}-{i}" for i in range(n)]
            allocs = await b.allocate_many(
                [(k, x.nbytes, b"t" * (i % 3)) for i, (k, x) in enumerate(zip(keys, blobs, strict=True))]
            )
            await b.write_many(allocs, blobs)
            outs = [bytearray(x.nbytes) for x in blobs]
            got = await b.read_many(keys, into=outs)
            assert [bytes(g) for g in got] == [x.tobytes() for x in blobs]
            assert (len(staging._hdr_chunks), staging._free) == (chunks0, free0)
            await b.evict_many(keys)
        assert tiny._staging is not None and tiny._staging._hdr_chunks == []  # 1 MiB: nothing set aside
        assert clients.a._staging is not None and len(clients.a._staging._hdr_chunks) == 8


async def test_namespaces_isolate_blocks(clients: Clients) -> None:
    a, b = clients.a, clients.c
    await a.write(await a.allocate("same", 4), b"AAAA")
    assert not await b.contains("same")
    with pytest.raises(BlockNotFoundError):
        await b.read("same")
    await b.write(await b.allocate("same", 4), b"BBBB")
    assert bytes(await a.read("same")) == b"AAAA" and bytes(await b.read("same")) == b"BBBB"
    await a.evict("same")
    assert bytes(await b.read("same")) == b"BBBB"
    assert await b.evict("same") is True  # under a read lease: retried until it expired (force_evict false)


async def test_allocate_many_is_all_or_nothing(clients: Clients) -> None:
    b, c = clients.a, clients.c
    s0 = b.stats()
    with pytest.raises(BlockExistsError):
        await b.allocate_many([("aon1", 10, b""), ("aon2", 20, b"t"), ("aon1", 30, b"")])
    with pytest.raises(CapacityError):  # c: 1 MiB capacity
        await c.allocate_many([("aon3", 600_000, b""), ("aon4", 600_000, b"")])
    with pytest.raises(InputError):
        await b.allocate_many([("aon5", 10, b""), ("bad key!", 10, b"")])
    st = b.stats()
    assert (st.reserved_bytes, st.used_bytes) == (s0.reserved_bytes, s0.used_bytes) and c.stats().reserved_bytes == 0
    allocs = await b.allocate_many([("aon1", 3, b"t"), ("aon2", 4, b"")])  # nothing was left behind
    await b.write_many(allocs, [b"abc", b"defg"])
    assert [bytes(v) for v in await b.read_many(["aon1", "aon2"])] == [b"abc", b"defg"]
    assert await b.evict_many(["aon1", "aon2"]) == [True, True]


def test_checksum_parts_is_the_checksum_of_the_concatenation() -> None:
    payload = memoryview(_blob(100_000, 7).tobytes())
    for algo in (_ALGO_XXH3, _ALGO_CRC32):
        for parts in ([b"", payload], [b"tag", payload], [payload, b""], [b"", b""], [b"tag"], [b"a", b"", b"bc"]):
            whole = memoryview(b"".join(bytes(p) for p in parts))
            assert _checksum_parts(algo, parts) == _checksum(algo, whole)


async def test_run_waits_for_a_running_call_and_never_starts_a_cancelled_one(anyio_backend: str) -> None:
    b = RdmaBackend({"master": "127.0.0.1:1", "max_concurrency": 1, "timeout": 5.0})  # never opened
    ran: list[str] = []
    started, release = threading.Event(), threading.Event()

    def blocker() -> int:
        started.set()
        release.wait(5)
        ran.append("blocker")
        return 1

    async def run_blocker() -> None:
        await b._run(blocker, what="blocker")

    async with anyio.create_task_group() as tg:
        tg.start_soon(run_blocker)
        await anyio.to_thread.run_sync(started.wait, 5)
        with anyio.move_on_after(0.2):  # queued behind the only worker: cancelled before it starts
            await b._run(lambda: ran.append("never"), what="queued")
        threading.Timer(0.5, release.set).start()
        t0 = time.monotonic()
        tg.cancel_scope.cancel()  # the running call's caller returns only once the call is done
    assert time.monotonic() - t0 >= 0.4 and ran == ["blocker"]
    await anyio.sleep(0.1)
    assert ran == ["blocker"]
    # a call that outlives ``timeout`` is a BackendIOError (counted); the thread finishes on its own
    t = RdmaBackend({"master": "127.0.0.1:1", "timeout": 0.2})
    gate = threading.Event()
    with pytest.raises(BackendIOError, match="did not finish within"):
        await t._run(lambda: gate.wait(5), what="slow")
    gate.set()
    assert t.stats().details["timeouts"] == 1


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


async def test_remote_eviction_is_a_counted_miss(clients: Clients) -> None:
    a, other = clients.a, clients.other
    ev0 = a.stats().details["evicted_remotely"]
    await a.write(await a.allocate("rem", 1000), _blob(1000, 3))
    assert bytes(await other.read("rem")) == _blob(1000, 3).tobytes()  # shared pool
    assert await other.evict("rem") is True  # someone else removes it behind a's back
    with pytest.raises(BlockNotFoundError):
        await a.read("rem")
    with pytest.raises(BlockNotFoundError):
        await a.read("rem", into=bytearray(1000))
    st = a.stats()
    assert st.details["evicted_remotely"] == ev0 + 1 and not await a.contains("rem")
    # contains() notices a remote loss as well
    await a.write(await a.allocate("rem2", 10), b"0123456789")
    await other.evict("rem2")
    assert not await a.contains("rem2")
    assert a.stats().details["evicted_remotely"] == ev0 + 2


async def test_corrupted_or_replaced_object_is_never_served(clients: Clients) -> None:
    a, other = clients.a, clients.other
    f0 = a.stats().details["integrity_failures"]
    data = _blob(4096, 4)
    store = other._store
    for into in (None, bytearray(4096)):  # staged path and direct (TCP, into) path
        sfx = "d" if into is not None else "s"
        await a.write(await a.allocate(f"k{sfx}", data.nbytes), data)
        skey = f"tierkv/{clients.ns}/k{sfx}"
        assert store.remove(skey, True) == 0
        # an object of the right size whose header is not ours (zeros)
        assert store.put(skey, bytes(HEADER_BYTES + data.nbytes)) == 0
        with pytest.raises(IntegrityError):
            await a.read(f"k{sfx}", into=into)
        with pytest.raises(BlockNotFoundError):  # quarantined: never served again
            await a.read(f"k{sfx}", into=into)
        # flipped payload byte under a valid header -> checksum mismatch
        await a.write(await a.allocate(f"k3{sfx}", data.nbytes), data)
        k3 = f"tierkv/{clients.ns}/k3{sfx}"
        obj = bytearray(store.get(k3))
        obj[-1] ^= 0xFF
        store.remove(k3, True)
        assert store.put(k3, bytes(obj)) == 0
        with pytest.raises(IntegrityError, match="checksum"):
            await a.read(f"k3{sfx}", into=into)
        # replaced by another block's valid object of another size: header names another key
        await a.write(await a.allocate(f"k4{sfx}", 100), bytes(100))
        await a.write(await a.allocate(f"k5{sfx}", data.nbytes), data)
        k4, k5 = f"tierkv/{clients.ns}/k4{sfx}", f"tierkv/{clients.ns}/k5{sfx}"
        obj5 = bytes(store.get(k5))
        store.remove(k4, True)
        assert store.put(k4, obj5) == 0
        with pytest.raises(IntegrityError, match="another key"):
            await a.read(f"k4{sfx}", into=None if into is None else bytearray(data.nbytes))
        await a.evict(f"k5{sfx}")
    assert a.stats().details["integrity_failures"] == f0 + 6


async def test_evict_under_read_lease(clients: Clients) -> None:
    b = clients.a
    c0 = b.stats().details["lease_conflicts"]
    await b.write(await b.allocate("lease", 100), bytes(100))
    await b.read("lease")  # grants a 0.5 s read lease: a plain remove returns -706
    assert await b.evict("lease") is True
    assert b.stats().details["lease_conflicts"] >= c0 + 1
    assert not await b.contains("lease")
    c = clients.c  # force_evict=False, timeout 5 s
    await c.write(await c.allocate("lease", 100), bytes(100))
    await c.read("lease")
    t0 = time.monotonic()
    assert await c.evict("lease") is True  # retried until the lease expired
    assert time.monotonic() - t0 < 5.0


async def test_capacity_and_config_errors(clients: Clients, master: MasterProcess) -> None:
    b = clients.c  # capacity 1 MiB
    await b.allocate("cap-a", 600_000)
    with pytest.raises(CapacityError):
        await b.allocate("cap-b", 600_000)
    assert await b.evict("cap-a") is True
    await b.allocate("cap-b", 600_000)
    assert await b.evict("cap-b") is True
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
    t0 = time.monotonic()
    with pytest.raises(BackendIOError, match="not reachable"):  # refused before setup() (which would hang ~90 s)
        await RdmaBackend.open({"master": "127.0.0.1:1", "timeout": 15.0, "global_segment_size": "16MiB"})
    assert time.monotonic() - t0 < 15.0


async def test_start_master_default_options_and_raw_reference(tmp_path_factory: pytest.TempPathFactory) -> None:
    opts = RdmaBackend.default_options(tmp_path_factory.mktemp("own-master"))
    assert opts["start_master"] is True
    b = await RdmaBackend.open(opts)
    try:
        assert isinstance(b, SupportsRawReference)
        assert b.master_address.startswith("127.0.0.1:")
        await b.write(await b.allocate("k", 1 << 20), _blob(1 << 20, 9))
        for op in ("write", "read"):
            m = await b.raw_reference(op, 1 << 20, 12, 2)
            assert isinstance(m, RawMeasurement) and m.nbytes == 12 << 20 and m.gbps > 0
            assert "batches of 8" in m.method and "(fastest of 1/2)" in m.method
        with pytest.raises(InputError):
            await b.raw_reference("scan", 1 << 20, 3, 1)
        assert b.stats().blocks == 1  # raw objects are not accounted
    finally:
        await b.aclose()
    with pytest.raises(Exception, match="closed"):
        await b.read("k")
    assert b.stats().blocks == 1  # stats work after close
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
