"""Two separate processes share one Mooncake pool through the rdma backend.

Process A (a child python) writes blocks; this process (B) finds and reads them
bit-exact. Then the failures: the peer holding the block dies, and the master
dies: B gets misses or typed errors within a bounded time (never a hang, never
wrong bytes) and recovers when the master returns.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mooncake.store", reason="needs mooncake-transfer-engine-non-cuda and libibverbs1")

from tierkv._errors import BackendIOError, BlockNotFoundError, CapacityError, IntegrityError
from tierkv_backends._mooncake import MasterProcess
from tierkv_backends.rdma import RdmaBackend

pytestmark = pytest.mark.anyio

_WRITER = textwrap.dedent(
    """
    import sys, json, anyio, numpy as np
    from tierkv_backends.rdma import RdmaBackend

    async def main():
        opts = json.loads(sys.argv[1])
        b = await RdmaBackend.open(opts)
        keys = []
        for i, n in enumerate((1 << 20, 4 << 20, 12345)):
            data = np.random.default_rng(100 + i).integers(0, 256, n, dtype=np.uint8)
            await b.write(await b.allocate(f"blk{i}", n, tag=b"from-A"), data)
            keys.append(f"blk{i}")
        print("READY " + json.dumps(keys), flush=True)
        await anyio.to_thread.run_sync(sys.stdin.readline)  # hold the segment until told to go
        await b.aclose()
        print("CLOSED", flush=True)

    anyio.run(main)
    """
)


def _expected(i: int, n: int) -> bytes:
    return np.random.default_rng(100 + i).integers(0, 256, n, dtype=np.uint8).tobytes()


@pytest.fixture
def master(tmp_path: Path) -> Iterator[MasterProcess]:
    m = MasterProcess(log_dir=tmp_path, lease_ttl_ms=1000, client_ttl_s=3)
    with m:
        yield m


def _spawn_writer(master: MasterProcess, ns: str) -> tuple[subprocess.Popen[str], list[str]]:
    opts = {"master": master.address, "namespace": ns, "global_segment_size": "64MiB", "staging_bytes": "16MiB"}
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    p = subprocess.Popen(
        [sys.executable, "-c", _WRITER, json.dumps(opts)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    assert p.stdout is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        if line.startswith("READY "):
            return p, json.loads(line[6:])
        if not line and p.poll() is not None:
            break
    p.kill()
    raise AssertionError("writer process did not become ready")


def _b_opts(master: MasterProcess, ns: str) -> dict[str, object]:
    # B contributes a segment too, so that the pool survives A's death for new writes
    return {
        "master": master.address,
        "namespace": ns,
        "global_segment_size": "64MiB",
        "staging_bytes": "16MiB",
        "timeout": 10.0,
    }


async def test_block_written_by_a_is_read_bit_exact_by_b(master: MasterProcess, anyio_backend: str) -> None:
    ns = f"two-{anyio_backend}"
    proc, keys = _spawn_writer(master, ns)
    try:
        async with await RdmaBackend.open(_b_opts(master, ns)) as b:
            sizes = (1 << 20, 4 << 20, 12345)
            for i, (k, n) in enumerate(zip(keys, sizes, strict=True)):
                assert await b.contains(k)
                assert bytes(await b.read(k)) == _expected(i, n)
            got = await b.read_many(keys)
            assert [bytes(g) for g in got] == [_expected(i, n) for i, n in enumerate(sizes)]
            assert b.stats().blocks == 0  # B's accounting counts only what B wrote
            # a different namespace does not see A's blocks
            async with await RdmaBackend.open(_b_opts(master, ns + "-other")) as c:
                assert not await c.contains(keys[0])
    finally:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
        proc.wait(timeout=30)


@pytest.mark.slow
async def test_peer_death_then_master_death_bounded_and_recovers(master: MasterProcess, anyio_backend: str) -> None:
    ns = f"fail-{anyio_backend}"
    proc, keys = _spawn_writer(master, ns)
    async with await RdmaBackend.open(_b_opts(master, ns)) as b:
        assert bytes(await b.read(keys[0])) == _expected(0, 1 << 20)
        # --- the peer holding the blocks dies (SIGKILL: no unmount) ---
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        t0 = time.monotonic()
        outcomes = []
        while time.monotonic() - t0 < 20:
            try:
                data = bytes(await b.read(keys[0]))
            except (BlockNotFoundError, BackendIOError) as exc:
                outcomes.append(type(exc).__name__)
                if isinstance(exc, BlockNotFoundError):
                    break
            except IntegrityError:
                outcomes.append("IntegrityError")
            else:
                assert data == _expected(0, 1 << 20)  # served bytes are never wrong
                outcomes.append("ok")
            import anyio

            await anyio.sleep(0.2)
        detect = time.monotonic() - t0
        print(f"peer death: outcomes {outcomes[:3]}...{outcomes[-1:]} miss after {detect:.2f}s")
        assert outcomes and outcomes[-1] == "BlockNotFoundError"
        # B's own blocks still work
        await b.write(await b.allocate("mine", 1000), bytes(range(256)) * 3 + bytes(232))
        assert bytes(await b.read("mine"))[:256] == bytes(range(256))
        # --- the master dies ---
        master.kill()
        for op in ("read", "write"):
            t1 = time.monotonic()
            with pytest.raises((BackendIOError, BlockNotFoundError)):
                if op == "read":
                    await b.read("mine")
                else:
                    await b.write(await b.allocate("new", 10), bytes(10))
            dt = time.monotonic() - t1
            print(f"master death: {op} -> typed error after {dt:.2f}s")
            assert dt < 12.0
        master.restart()
        t2 = time.monotonic()
        while True:
            try:
                await b.write(await b.allocate("again", 10), b"0123456789")
                break
            except (BackendIOError, CapacityError):
                if time.monotonic() - t2 > 60:
                    raise
                import anyio

                await anyio.sleep(0.5)
        print(f"recovered {time.monotonic() - t2:.2f}s after the master restarted")
        assert bytes(await b.read("again")) == b"0123456789"
        with pytest.raises(BlockNotFoundError):
            await b.read("mine")  # lost with the old master: a counted miss
        assert b.stats().details["evicted_remotely"] >= 1
