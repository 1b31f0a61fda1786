"""CxlBackend: sysfs detection on recorded trees, emulation round trips, unavailability."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tierkv.backend import TierKind
from tierkv.errors import ConfigError, PluginUnavailableError
from tierkv_backends.cxl import (
    CxlBackend,
    detect_cxl,
    parse_cpulist,
    parse_distance,
    parse_meminfo_total,
)

pytestmark = pytest.mark.anyio

# Recorded text of a 2-socket host with one CXL type-3 expander online as system RAM
# (node 2, no CPUs) and a second region configured as device-DAX (dax1.0).
NODE_FILES = {
    "node0": {
        "cpulist": "0-15,32-47\n",
        "distance": "10 21 14 24\n",
        "meminfo": "Node 0 MemTotal:       263842716 kB\n",
    },
    "node1": {
        "cpulist": "16-31,48-63\n",
        "distance": "21 10 24 14\n",
        "meminfo": "Node 1 MemTotal:       264191888 kB\n",
    },
    "node2": {"cpulist": "\n", "distance": "14 24 10 26\n", "meminfo": "Node 2 MemTotal:       134217728 kB\n"},
    "node3": {"cpulist": "\n", "distance": "24 14 26 10\n", "meminfo": "Node 3 MemTotal:              0 kB\n"},
}


def make_sysfs(root: Path, *, with_cxl: bool = True) -> tuple[Path, Path]:
    sys_root, dev_root = root / "sys", root / "dev"
    for node, files in NODE_FILES.items():
        d = sys_root / "devices/system/node" / node
        d.mkdir(parents=True)
        for name, text in files.items():
            (d / name).write_text(text)
    (sys_root / "devices/system/node/online").write_text("0-3\n")
    dev_root.mkdir(parents=True)
    if with_cxl:
        for name in ("mem0", "region0", "region1", "decoder0.0", "root0"):
            (sys_root / "bus/cxl/devices" / name).mkdir(parents=True)
        dax = sys_root / "bus/dax/devices/dax1.0"
        dax.mkdir(parents=True)
        (dax / "size").write_text("68719476736\n")
        (dax / "align").write_text("2097152\n")
        (dax / "target_node").write_text("3\n")
        (dev_root / "dax1.0").write_text("")
    else:
        (sys_root / "bus/dax/devices").mkdir(parents=True)
    return sys_root, dev_root


def test_parse_cpulist_distance_meminfo() -> None:
    assert parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpulist("\n") == []
    assert parse_cpulist("") == []
    assert parse_distance("10 21 14 24\n") == [10, 21, 14, 24]
    assert parse_meminfo_total("Node 2 MemTotal:       134217728 kB\nNode 2 MemFree: 1 kB\n") == 134217728 * 1024
    assert parse_meminfo_total("garbage") == 0


def test_detect_recorded_cxl_host(tmp_path: Path) -> None:
    sys_root, dev_root = make_sysfs(tmp_path)
    topo = detect_cxl(sys_root, dev_root)
    assert topo.cxl_devices == ("decoder0.0", "mem0", "region0", "region1", "root0")
    assert [n.node for n in topo.cpuless_nodes] == [2]  # node3 has no memory
    assert topo.cpuless_nodes[0].distances == (14, 24, 10, 26)
    assert topo.cpuless_nodes[0].mem_bytes == 128 << 30
    (d,) = topo.dax_devices
    assert (d.name, d.size, d.align, d.target_node, d.present) == ("dax1.0", 64 << 30, 2 << 20, 3, True)
    assert d.path == str(dev_root / "dax1.0")
    assert topo.usable


def test_detect_plain_host(tmp_path: Path) -> None:
    sys_root, dev_root = make_sysfs(tmp_path, with_cxl=False)
    (sys_root / "devices/system/node/node2/meminfo").write_text("Node 2 MemTotal: 0 kB\n")
    topo = detect_cxl(sys_root, dev_root)
    assert topo.cxl_devices == () and topo.dax_devices == () and topo.cpuless_nodes == ()
    assert not topo.usable
    assert "0 device-DAX" in topo.describe()


def test_probe_is_honest_here() -> None:
    topo = detect_cxl()
    av = CxlBackend.probe()
    assert av.usable == topo.usable
    if not av.usable:
        assert "no CXL memory" in av.reason and "emulation_path" in av.hint


async def test_open_without_hardware_or_emulation_is_unavailable() -> None:
    if detect_cxl().usable:
        pytest.skip("this machine has CXL memory")
    with pytest.raises(PluginUnavailableError) as ei:
        await CxlBackend.open({"capacity": "4MiB"})
    assert "emulation_path" in str(ei.value)


def _size(path: str) -> int | None:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return None


def _shm_path(tmp_path: Path) -> str:
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else tmp_path
    return str(base / f"tierkv-test-cxl-{os.getpid()}-{abs(hash(str(tmp_path))) % 10**8}")


async def test_emulated_round_trip_and_stats(tmp_path: Path) -> None:
    path = _shm_path(tmp_path)
    b = await CxlBackend.open({"capacity": "8MiB", "emulation_path": path})
    try:
        st = b.stats()
        assert st.emulated and st.kind is TierKind.CXL and "emulated" in st.io_path
        assert b.capabilities.tier_kind is TierKind.CXL
        for n in (0, 1, 4095, 4096, 4097, 1 << 20):
            data = os.urandom(n)
            a = await b.allocate(f"k{n}", n, tag=b"t")
            await b.write(a, data)
            assert bytes(await b.read(f"k{n}")) == data
            into = bytearray(n + 1)
            assert bytes(await b.read(f"k{n}", into=into)) == data
        assert await b.evict("k1") is True
        assert not await b.contains("k1")
        assert b.stats().blocks == 5
        assert _size(path) == 8 << 20  # the arena lives in the emulation file
    finally:
        await b.aclose()
    assert _size(path) is None  # created by the backend, removed on close


async def test_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        CxlBackend({"mode": "emulation"})
    with pytest.raises(ConfigError):
        CxlBackend({"pin": True, "emulation_path": "/dev/shm/x"})
    with pytest.raises(ConfigError):
        CxlBackend({"mode": "bogus"})
    with pytest.raises(ConfigError):
        CxlBackend({"emulation_path": "/dev/shm/x", "unknown": 1})


async def test_default_options_are_emulation(tmp_path: Path) -> None:
    opts = CxlBackend.default_options(tmp_path)
    assert opts["emulation_path"].startswith("/dev/shm/")
    async with await CxlBackend.open({**opts, "capacity": "4MiB"}) as b:
        assert b.stats().emulated
