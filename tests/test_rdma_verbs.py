"""RDMA discovery: parsing and selection against recorded sysfs trees and verbs outputs."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from tierkv_backends._verbs import (
    RdmaDevice,
    RdmaPort,
    RdmaUnavailable,
    choose_devices,
    discover,
    from_pyverbs_port,
    parse_ibv_devinfo,
    parse_rate,
    parse_state,
    parse_sysfs,
    rdma_read_bench,
)

DATA = Path(__file__).parent / "data" / "rdma"
SYSFS = DATA / "sysfs" / "class" / "infiniband"


def test_parse_state_and_rate() -> None:
    assert parse_state("4: ACTIVE\n") == "ACTIVE"
    assert parse_state("1: DOWN") == "DOWN"
    assert parse_state("PORT_ACTIVE") == "ACTIVE"
    assert parse_state("4") == "ACTIVE"
    assert parse_rate("100 Gb/sec (4X EDR)") == (100.0, 4, "EDR")
    assert parse_rate("25 Gb/sec (1X EDR)") == (25.0, 1, "EDR")
    assert parse_rate("10 Gb/sec") == (10.0, 0, "")
    assert parse_rate("garbage") == (0.0, 0, "")


def test_parse_recorded_sysfs() -> None:
    devs = {d.name: d for d in parse_sysfs(SYSFS)}
    assert sorted(devs) == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "rxe0"]
    ib = devs["mlx5_0"].ports[0]
    assert (ib.state, ib.link_layer, ib.rate_gbps, ib.width, ib.speed, ib.lid) == (
        "ACTIVE",
        "InfiniBand",
        100.0,
        4,
        "EDR",
        0x12,
    )
    assert ib.gids == ((0, "fe80:0000:0000:0000:0c42:a103:0065:4a10"),)  # zero GID 1 dropped
    assert devs["mlx5_0"].fw_ver == "16.35.2000"
    roce = devs["mlx5_1"].ports[0]
    assert roce.link_layer == "Ethernet" and roce.rate_gbps == 200.0 and roce.speed == "HDR"
    assert [i for i, _ in roce.gids] == [0, 1]
    assert roce.mtu == 4096  # netdev MTU 9000 capped at the largest RDMA MTU
    assert devs["mlx5_2"].ports[0].mtu == 1024  # netdev MTU 1500 -> 1024
    assert devs["mlx5_3"].ports[0].state == "DOWN"
    assert devs["rxe0"].ports[0].gids == ()


def test_choose_devices_prefers_fastest_active_ports() -> None:
    devs = parse_sysfs(SYSFS)
    assert choose_devices(devs) == ["mlx5_1", "mlx5_2"]  # two 200G RoCE NICs
    assert choose_devices(devs, link_layer="InfiniBand") == ["mlx5_0"]
    # a down port and a RoCE port without GIDs never qualify
    down = [d for d in devs if d.name in ("mlx5_3", "rxe0")]
    assert choose_devices(down) == []
    assert choose_devices([]) == []


def test_parse_recorded_ibv_devinfo() -> None:
    devs = {d.name: d for d in parse_ibv_devinfo((DATA / "ibv_devinfo.txt").read_text())}
    assert sorted(devs) == ["mlx5_0", "mlx5_1", "mlx5_3"]
    p = devs["mlx5_0"].ports[0]
    assert (p.state, p.mtu, p.width, p.speed, p.rate_gbps, p.lid) == ("ACTIVE", 4096, 4, "EDR", 100.0, 18)
    assert devs["mlx5_0"].fw_ver == "16.35.2000"
    r = devs["mlx5_1"].ports[0]
    assert (r.link_layer, r.mtu, r.speed, r.rate_gbps) == ("Ethernet", 1024, "HDR", 200.0)
    assert [i for i, _ in r.gids] == [0]  # "::ffff:10.0.0.5" style IPv4-mapped text is not a raw GID
    assert devs["mlx5_3"].ports[0].state == "DOWN"
    assert choose_devices(devs.values()) == ["mlx5_1"]
    assert parse_ibv_devinfo("No IB devices found\n") == []


def test_from_pyverbs_port_enums() -> None:
    # values as pyverbs' PortAttr reports them (ibv_port_attr enums)
    attr = SimpleNamespace(state=4, link_layer=2, active_mtu=5, active_width=2, active_speed=64, lid=0)
    p = from_pyverbs_port("mlx5_1", 1, attr, [(0, "fe80::1"), (1, "0000:0000:0000:0000:0000:0000:0000:0000")])
    assert p == RdmaPort("mlx5_1", 1, "ACTIVE", "Ethernet", 200.0, 4, "HDR", 4096, 0, ((0, "fe80::1"),))
    down = from_pyverbs_port(
        "x", 1, SimpleNamespace(state=1, link_layer=1, active_mtu=3, active_width=1, active_speed=1)
    )
    assert (down.state, down.link_layer, down.mtu, down.rate_gbps) == ("DOWN", "InfiniBand", 1024, 2.5)
    assert choose_devices([RdmaDevice("x", (down,)), RdmaDevice("mlx5_1", (p,))]) == ["mlx5_1"]


def test_discover_here_says_no_device_honestly(tmp_path: Path) -> None:
    d = discover(tmp_path / "nope", use_pyverbs=False)
    assert not d.found and d.source == "none"
    assert "no RDMA support" in d.reason and d.summary().startswith("no RDMA device")
    recorded = discover(SYSFS, use_pyverbs=False)
    assert recorded.source == "sysfs" and recorded.as_dict()["selected"] == ["mlx5_1", "mlx5_2"]


def test_discover_on_this_machine_never_raises() -> None:
    d = discover()
    if not Path("/sys/class/infiniband").exists():
        assert not d.found and "no RDMA" in d.summary()


def test_rdma_read_bench_refuses_without_device() -> None:
    if Path("/sys/class/infiniband").exists() and discover().found:
        pytest.skip("a real RDMA device exists here; the benchmark is exercised by benchmarks/")
    with pytest.raises(RdmaUnavailable):
        rdma_read_bench()
