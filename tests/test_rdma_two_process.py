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

import anyio
import numpy as np
import pytest
from kvtest import BT, kv_for, smol_config

pytest.importorskip("mooncake.store", reason="needs mooncake-transfer-engine-non-cuda and libibverbs1")

from tierkv.errors import BackendIOError, BlockNotFoundError, CapacityError, IntegrityError
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


@pytest.fixture(scope="module")
def shared_master(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MasterProcess]:
    """One master for the non-slow tests (the failure test kills its own)."""
    m = MasterProcess(log_dir=tmp_path_factory.mktemp("mooncake"), lease_ttl_ms=1000, client_ttl_s=3)
    with m:
        yield m


def _pool_opts(master: MasterProcess, ns: str) -> dict[str, object]:
    """The options every process joining the pool ``ns`` opens its rdma backend with."""
    return {"master": master.address, "namespace": ns, "global_segment_size": "64MiB", "staging_bytes": "16MiB"}


def _spawn_writer(master: MasterProcess, ns: str) -> tuple[subprocess.Popen[str], list[str]]:
    opts = _pool_opts(master, ns)
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
    _reap(p, 10)
    raise AssertionError("writer process did not become ready")


def _reap(p: subprocess.Popen[str], timeout: float) -> None:
    """Wait for the writer and close its pipes (an unclosed pipe is a ResourceWarning: an error)."""
    p.wait(timeout=timeout)
    for pipe in (p.stdin, p.stdout):
        if pipe is not None:
            pipe.close()


def _b_opts(master: MasterProcess, ns: str) -> dict[str, object]:
    # B contributes a segment too, so that the pool survives A's death for new writes
    return {**_pool_opts(master, ns), "timeout": 10.0}


async def test_block_written_by_a_is_read_bit_exact_by_b(shared_master: MasterProcess, anyio_backend: str) -> None:
    master = shared_master
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
            assert await b.tag_of(keys[0]) == b"from-A" and await b.tag_of("nope") is None
        async with await RdmaBackend.open(_b_opts(master, ns + "-other")) as c:
            assert not await c.contains(keys[0])
    finally:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
        _reap(proc, 30)


@pytest.mark.slow
async def test_peer_death_then_master_death_bounded_and_recovers(master: MasterProcess, anyio_backend: str) -> None:
    ns = f"fail-{anyio_backend}"
    proc, keys = _spawn_writer(master, ns)
    async with await RdmaBackend.open(_b_opts(master, ns)) as b:
        assert bytes(await b.read(keys[0])) == _expected(0, 1 << 20)
        # --- the peer holding the blocks dies (SIGKILL: no unmount) ---
        proc.send_signal(signal.SIGKILL)
        _reap(proc, 10)
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


# ------------------------------------------------------------------ TierKV level
_REPO = str(Path(__file__).resolve().parents[1])

_READER = textwrap.dedent(
    """
    import sys, json, hashlib, anyio
    from tierkv import TierKV

    async def main():
        cfg, toks, other = json.loads(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3])
        kv = await TierKV.open(cfg)
        try:
            lk = await kv.lookup(toks)
            lk_other = await kv.lookup(other)
            g = await kv.get(toks)
            res = {
                "lookup_tokens": lk.tokens, "lookup_tiers": list(lk.tiers), "other_tokens": lk_other.tokens,
                "get_tokens": g.tokens, "miss_reason": g.miss_reason,
                "sha256": hashlib.sha256(g.kv.tobytes()).hexdigest() if g.kv is not None else "",
            }
            print("RESULT " + json.dumps(res), flush=True)
        finally:
            await kv.aclose()

    anyio.run(main)
    """
)


def _tierkv_config(master: MasterProcess, ns: str) -> dict[str, object]:
    """One rdma tier: the child process B gets this config (as JSON) and opens the same pool."""
    pool = {"name": "pool", "backend": "rdma", **_pool_opts(master, ns), "capacity": "32MiB"}
    return smol_config([pool], revision="two-process")


async def test_tierkv_put_in_a_lookup_and_get_in_b(shared_master: MasterProcess, anyio_backend: str) -> None:
    """Process A (this one) puts through TierKV; process B (a child) has an empty
    index, finds the prefix on the shared tier (``SupportsTagLookup``) and gets
    bit-identical KV."""
    import hashlib

    from tierkv import TierKV

    cfg = _tierkv_config(shared_master, f"tkv-{anyio_backend}")
    toks = list(range(5000, 5000 + 4 * BT + 5))
    kv_data = kv_for(len(toks), 7)
    other = list(toks)
    other[2 * BT + 3] = 1  # diverges in block 2: only blocks 0 and 1 are shared
    async with await TierKV.open(cfg) as kv:
        r = await kv.put(toks, kv_data)
        assert (r.tokens, r.new_blocks, r.tiers) == (4 * BT, 4, ("pool",))
        env = dict(os.environ, PYTHONPATH=_REPO)
        args = [json.dumps(cfg), json.dumps(toks), json.dumps(other)]
        proc = await anyio.run_process([sys.executable, "-c", _READER, *args], env=env, check=False)
        out = proc.stdout.decode()
        lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
        assert proc.returncode == 0 and lines, proc.stderr.decode()[-2000:]
        res = json.loads(lines[0][7:])
    want = hashlib.sha256(np.ascontiguousarray(kv_data[:, :, : 4 * BT]).tobytes()).hexdigest()
    assert res["lookup_tokens"] == 4 * BT and res["lookup_tiers"] == ["pool"]
    assert res["other_tokens"] == 2 * BT
    assert (res["get_tokens"], res["miss_reason"], res["sha256"]) == (4 * BT, "", want)
