"""The conformance tooling itself: fault injection, hardware parsing, verdicts, and the suite catching broken backends."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conformance_ref import RefMemoryBackend
from tierkv_conformance import FaultConfig, FaultInjectingBackend
from tierkv_conformance._certify import build_verdict, render_markdown
from tierkv_conformance._envelope import IoMemory, _measure_backend, raw_memcpy, raw_odirect
from tierkv_conformance._hardware import (
    detect_cxl,
    detect_devdax,
    detect_gpu,
    detect_hardware,
    detect_numa,
    detect_rdma,
    parse_cpuinfo,
    parse_cpulist,
    parse_meminfo,
    parse_mounts,
    parse_nvidia_smi,
    parse_rdma_rate,
)

from tierkv import BackendIOError, BlockNotFoundError, ConfigError

TESTS = Path(__file__).parent


# ------------------------------------------------------------------------------ faults
@pytest.mark.anyio
async def test_fault_wrapper_errors_release_reservations() -> None:
    b = FaultInjectingBackend(await RefMemoryBackend.open({"capacity": "8MiB"}), FaultConfig(error_rate=0.5, seed=7))
    errors = ok = 0
    for i in range(200):
        key = f"k{i}"
        try:
            a = await b.allocate(key, 1000)
            await b.write(a, b"x" * 1000)
        except BackendIOError:
            errors += 1
            assert not await b.inner.contains(key)
            continue
        ok += 1
        assert bytes(await b.inner.read(key)) == b"x" * 1000
        await b.inner.evict(key)
    s = b.stats()
    assert errors > 20 and ok > 20
    assert s.used_bytes == 0 and s.reserved_bytes == 0
    assert s.details["faults"]["errors"] == b.fault_stats().errors == errors
    await b.aclose()
    assert b.inner.closed


@pytest.mark.anyio
async def test_fault_wrapper_torn_writes_are_silent_and_recorded() -> None:
    b = FaultInjectingBackend(await RefMemoryBackend.open({}), FaultConfig(torn_write_rate=1.0, seed=3))
    data = bytes(range(256)) * 16
    a = await b.allocate("t", len(data))
    await b.write(a, data)  # returns normally
    got = bytes(await b.read("t"))
    assert len(got) == len(data) and got != data
    cut = next(i for i in range(len(data)) if got[i] != data[i])
    assert got[cut:] == bytes(len(data) - cut)  # zeroed tail
    assert "t" in b.torn_keys and b.fault_stats().torn_writes == 1
    await b.evict("t")
    assert "t" not in b.torn_keys
    await b.aclose()


@pytest.mark.anyio
async def test_fault_wrapper_is_deterministic_and_validates() -> None:
    async def run(seed: int) -> list[bool]:
        b = FaultInjectingBackend(
            await RefMemoryBackend.open({}), FaultConfig(error_rate=0.3, seed=seed, ops=frozenset({"read"}))
        )
        a = await b.allocate("k", 1)
        await b.write(a, b"z")
        out = []
        for _ in range(50):
            try:
                await b.read("k")
                out.append(True)
            except BackendIOError:
                out.append(False)
        assert bytes(await b.inner.read("k")) == b"z"  # a failed read changes nothing
        await b.aclose()
        return out

    assert await run(1) == await run(1)
    assert await run(1) != await run(2)
    with pytest.raises(ConfigError):
        FaultConfig(error_rate=1.5)
    with pytest.raises(ConfigError):
        FaultConfig(ops=frozenset({"explode"}))


@pytest.mark.anyio
async def test_fault_wrapper_latency_and_failed_evict_keeps_block() -> None:
    b = FaultInjectingBackend(await RefMemoryBackend.open({}), FaultConfig(latency_rate=1.0, latency_s=(0.001, 0.002)))
    a = await b.allocate("k", 2)
    await b.write(a, b"ok")
    assert b.fault_stats().delays == 2
    b.set_faults(FaultConfig(error_rate=1.0, ops=frozenset({"evict"})))
    with pytest.raises(BackendIOError):
        await b.evict("k")
    assert bytes(await b.read("k")) == b"ok"
    b.set_faults(FaultConfig())
    assert await b.evict("k")
    with pytest.raises(BlockNotFoundError):
        await b.read("k")
    await b.aclose()


# ---------------------------------------------------------------------------- hardware
CPUINFO = "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n\nprocessor\t: 1\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n"
MOUNTS = """/dev/nvme0n1p2 / ext4 rw,relatime 0 0
tmpfs /tmp tmpfs rw,nosuid 0 0
10.0.0.1@o2ib:/lustre /mnt/lustre lustre rw,flock 0 0
/dev/md0 /mnt/my\\040data xfs rw 0 0
"""


def test_parsers() -> None:
    assert parse_cpuinfo(CPUINFO) == {"model": "Intel(R) Xeon(R) Platinum 8480+", "logical_cpus": 2}
    assert parse_meminfo("MemTotal:       16384 kB\nHugePages_Total:       4\n") == {
        "MemTotal": 16384 * 1024,
        "HugePages_Total": 4,
    }
    assert parse_meminfo("Node 1 MemTotal:  1024 kB\n")["MemTotal"] == 1024 * 1024
    assert parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11] and parse_cpulist("\n") == []
    assert parse_mounts(MOUNTS, "/mnt/lustre/job/kv")["fs_type"] == "lustre"  # type: ignore[index]
    assert parse_mounts(MOUNTS, "/tmp/x")["fs_type"] == "tmpfs"  # type: ignore[index]
    assert parse_mounts(MOUNTS, "/tmpfoo")["fs_type"] == "ext4"  # type: ignore[index]
    assert parse_mounts(MOUNTS, "/mnt/my data/a")["fs_type"] == "xfs"  # type: ignore[index]
    assert parse_nvidia_smi("NVIDIA H100 80GB HBM3, 550.54.15, 81559 MiB\n") == [
        {"model": "NVIDIA H100 80GB HBM3", "driver": "550.54.15", "memory": "81559 MiB"}
    ]
    assert parse_rdma_rate("200 Gb/sec (4X HDR)\n") == 200.0 and parse_rdma_rate("junk") is None


def _write(root: Path, rel: str, text: str) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def test_recorded_sysfs_tree(tmp_path: Path) -> None:
    r = tmp_path
    _write(r, "sys/devices/system/node/node0/cpulist", "0-31\n")
    _write(r, "sys/devices/system/node/node0/meminfo", "Node 0 MemTotal: 1048576 kB\n")
    _write(r, "sys/devices/system/node/node2/cpulist", "\n")
    _write(r, "sys/devices/system/node/node2/meminfo", "Node 2 MemTotal: 2097152 kB\n")
    (r / "sys/bus/cxl/devices/mem0").mkdir(parents=True)
    (r / "sys/bus/cxl/devices/decoder0.0").mkdir(parents=True)
    _write(r, "sys/bus/dax/devices/dax0.0/size", "17179869184\n")
    _write(r, "sys/class/infiniband/mlx5_0/ports/1/state", "4: ACTIVE\n")
    _write(r, "sys/class/infiniband/mlx5_0/ports/1/rate", "400 Gb/sec (4X NDR)\n")
    _write(r, "sys/class/infiniband/mlx5_0/ports/1/link_layer", "InfiniBand\n")
    _write(
        r, "proc/driver/nvidia/version", "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar 5 2024\n"
    )
    _write(r, "proc/driver/nvidia/gpus/0000:17:00.0/information", "Model: \t\t NVIDIA H200\nIRQ: 1\n")
    numa = detect_numa(r)
    assert [n["node"] for n in numa["nodes"]] == [0, 2] and numa["cpuless_nodes"] == [2]
    cxl = detect_cxl(r)
    assert cxl["present"] and cxl["memdevs"] == ["mem0"] and cxl["cpuless_numa_nodes"] == [2]
    dax = detect_devdax(r)
    assert dax["present"] and dax["devices"] == [{"name": "dax0.0", "size_bytes": 17179869184}]
    rdma = detect_rdma(r)
    port = rdma["devices"][0]["ports"][0]
    assert rdma["active_port"] and port["rate_gbps"] == 400.0 and port["link_layer"] == "InfiniBand"
    gpu = detect_gpu(r)
    assert gpu["present"] and gpu["gpus"][0]["model"] == "NVIDIA H200" and gpu["driver"] == "550.54.15"


def test_empty_tree_reports_absent(tmp_path: Path) -> None:
    hw = detect_hardware(None, root=tmp_path)
    for part in ("numa", "gpu", "gds", "cxl", "devdax", "rdma", "filesystem"):
        assert hw[part]["present"] is False, part


def test_this_machine(tmp_path: Path) -> None:
    hw = detect_hardware(tmp_path)
    assert hw["cpu"]["logical_cpus"] == os.cpu_count()
    assert hw["memory"]["total_bytes"] > 0
    assert hw["filesystem"]["fs_type"]
    json.dumps(hw)


# ----------------------------------------------------------------------- raw + verdict
def test_raw_references(tmp_path: Path) -> None:
    assert raw_memcpy("write", 65536, 64).nbytes == 65536 * 64
    m = raw_odirect(tmp_path, "read", 65536, 32, 2)
    assert m.nbytes == 65536 * 32 and m.seconds > 0 and "preadv" in m.method
    assert not list(tmp_path.iterdir())


def test_raw_odirect_moves_the_rows_shared_memory(tmp_path: Path) -> None:
    """With an IoMemory the raw reference writes from and reads into its rings (the buffers
    the backend side of the row uses), and refuses memory of another shape."""
    size, per = 65536, 4
    mem = IoMemory.allocate(size, 2, per)
    mem.src[:] = os.urandom(size)
    sources = set()
    for ring in mem.rings:
        for buf in ring:
            buf[:] = os.urandom(size)
            sources.add(bytes(buf))
    keep = tmp_path / "raw"
    w = raw_odirect(tmp_path, "write", size, 16, 2, 4, keep=keep, memory=mem)
    data = keep.read_bytes()
    written = {data[i * size : (i + 1) * size] for i in range(16)}
    assert written <= sources and len(written) > 2  # from the ring buffers, not from src
    for ring in mem.rings:
        for buf in ring:
            buf[:] = bytes(size)
    r = raw_odirect(tmp_path, "read", size, 16, 2, keep=keep, memory=mem)
    assert w.nbytes == r.nbytes == size * 16 and "fdatasync" in w.method
    assert all(bytes(buf) in written for ring in mem.rings for buf in ring)  # every ring buffer was read into
    assert keep.stat().st_size >= size * 16
    with pytest.raises(ValueError, match="memory"):
        raw_odirect(tmp_path, "read", size * 2, 4, 2, keep=tmp_path / "other", memory=mem)
    with pytest.raises(ValueError, match="memory"):
        raw_odirect(tmp_path, "read", size, 4, 3, keep=tmp_path / "other", memory=mem)


@pytest.mark.anyio
async def test_backend_side_uses_the_rows_shared_memory() -> None:
    """The envelope's backend side reads into the IoMemory rings, and writes from them with
    bytes of its own per block (a deduplicating backend stores every one)."""
    b = await RefMemoryBackend.open({"capacity": "64MiB"})
    try:
        size = 1 << 20
        mem = IoMemory.allocate(size, 2, 8)  # a batch's worth (8 MiB: 8 blocks here) per task
        await _measure_backend(b, "read", size, 16, 2, 3, memory=mem)
        # two batches of 8 read into the rings of whichever tasks took them: 16 buffers filled
        filled = [bytes(buf) == bytes(mem.src) for ring in mem.rings for buf in ring]
        assert sum(filled) == 16 or (sum(filled) == 8 and all(filled[:8]) != all(filled[8:]))
        assert bytes(mem.src) == np.random.default_rng(3).integers(0, 256, size, dtype=np.uint8).tobytes()
        seen: list[bytes] = []
        real = b.write_many

        async def spy(allocs: Any, datas: Any) -> None:
            seen.extend(hashlib.sha256(bytes(d)).digest() for d in datas)
            await real(allocs, datas)

        b.write_many = spy  # type: ignore[method-assign]
        await _measure_backend(b, "write", size, 16, 2, 4, memory=mem)
        assert len(set(seen)) >= 16  # the 16 timed blocks all differ (latency samples may repeat)
    finally:
        await b.aclose()


def test_verdicts() -> None:
    ok = {"passed": 10, "failed": 0, "skipped": 1, "pytest_exit_code": 0}
    rows = [{"block_bytes": 16384, "op": "read", "ratio": 0.95}]
    assert build_verdict(ok, False, rows, 0.8)[0] == "CERTIFIED"
    assert build_verdict(ok, True, rows, 0.8)[0] == "PASSED-EMULATED"  # never CERTIFIED on emulation
    assert build_verdict(ok, False, [{**rows[0], "ratio": 0.5}], 0.8)[0] == "FAILED"
    assert build_verdict(ok, False, [{**rows[0], "ratio": None}], 0.8)[0] == "FAILED"
    assert build_verdict({**ok, "failed": 1}, True, rows, 0.8)[0] == "FAILED"
    assert build_verdict(ok, False, rows, 0.8, error="boom")[0] == "FAILED"


# ------------------------------------------------------------- the suite catches bugs
def _run_suite_on(spec: str, tmp_path: Path) -> dict[str, object]:
    out = tmp_path / "result.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    cmd = [
        sys.executable,
        "-m",
        "tierkv_conformance._runner",
        spec,
        "--workdir",
        str(tmp_path / "w"),
        "--json",
        str(out),
        "--quick",
    ]
    subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, timeout=600, check=False)
    return json.loads(out.read_text())  # type: ignore[no-any-return]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("spec", "caught", "unaffected"),
    [
        (
            "conformance_ref:StaleAfterEvictBackend",
            ("test_no_stale_data_after_evict", "test_concurrent_readers_racing_evict"),
            "test_round_trip[asyncio-max]",
        ),
        (
            "conformance_ref:LeakyCancelBackend",
            ("test_cancelled_write_is_atomic", "test_concurrent_write_racing_evict_of_its_reservation"),
            "test_no_stale_data_after_evict[asyncio]",
        ),
    ],
    ids=["stale-data-after-evict", "leaked-reservation-on-cancel"],
)
def test_suite_catches_a_broken_backend(tmp_path: Path, spec: str, caught: tuple[str, ...], unaffected: str) -> None:
    """A backend that breaks one rule fails the tests of that rule, under both event loops,
    and only those: a test of another rule passes."""
    res = _run_suite_on(spec, tmp_path)
    failed = {n.split("::")[-1] for n in res["failures"]}  # type: ignore[attr-defined]
    for test in caught:
        assert f"{test}[asyncio]" in failed and f"{test}[trio]" in failed
    assert unaffected not in failed  # only the broken rule fails
    assert res["passed"] > 40  # type: ignore[operator]


@pytest.mark.slow
def test_suite_passes_the_reference_backend_and_certifies(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    cmd = [
        sys.executable,
        "-m",
        "tierkv_conformance._certify",
        "conformance_ref:RefFileBackend",
        "--out",
        str(tmp_path),
        "--quick",
    ]
    cp = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False)
    cert = json.loads((tmp_path / "certificate.json").read_text())
    assert cert["tests"]["failed"] == 0 and cert["tests"]["passed"] > 50
    assert {r["block_bytes"] for r in cert["envelope"]} == {16384, 262144, 2097152}
    assert all(r["raw_gbps"] for r in cert["envelope"])
    assert cert["verdict"] in ("CERTIFIED", "FAILED")  # real ext4/tmpfs; the ratio decides
    assert (cp.returncode == 1) == (cert["verdict"] == "FAILED")
    assert "[tierkv certify]" in cp.stdout
    md = (tmp_path / "certificate.md").read_text()
    assert cert["verdict"] in md and "| 16 KiB |" in md
    assert render_markdown(cert) == md


def test_paired_ratio_compares_each_repetition_with_its_own_raw_run() -> None:
    from tierkv_conformance._envelope import paired_ratio

    # a medium that drifts between 1 and 3 GB/s, the backend at 0.95x of raw in every pair
    raw = [1.0, 3.0, 2.6, 1.2, 3.0]
    backend = [0.95 * r for r in raw]
    med, lo, hi = paired_ratio(backend, raw)
    assert med is not None and lo is not None and hi is not None
    assert abs(med - 0.95) < 1e-9 and abs(lo - 0.95) < 1e-9 and abs(hi - 0.95) < 1e-9
    assert paired_ratio([1.0, 2.0, 4.0], [1.0, 1.0, 2.0]) == (2.0, 1.0, 2.0)
    # pairs, not medians: the medians would give 2.0 / 3.0, the pairs are 1.0, 1.0 and 0.5
    assert paired_ratio([3.0, 1.0, 2.0], [3.0, 1.0, 4.0]) == (1.0, 0.5, 1.0)
    assert paired_ratio([1.0], [0.0]) == (None, None, None)
    with pytest.raises(ValueError, match="2 backend figures but 1 raw"):
        paired_ratio([1.0, 1.0], [1.0])
