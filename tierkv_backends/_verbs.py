"""RDMA device discovery (pyverbs when importable, sysfs otherwise) and a
one-sided RDMA READ microbenchmark.

Discovery lists devices, ports, port state, link layer, active speed and width,
MTU and GIDs, and :func:`choose_devices` picks the ``rdma_devices`` string for
Mooncake. The parsing functions are pure and unit-tested against recorded sysfs
trees and recorded ``ibv_devinfo`` / pyverbs outputs.

Facts this module is honest about:

* ``pyverbs.device.get_device_list()`` *raises* (``PyverbsRDMAError: Failed to
  get devices list``) on a kernel without RDMA support instead of returning an
  empty list; :func:`discover` treats that as "no RDMA device".
* PyPI ``pyverbs`` builds from source only; Debian's ``python3-pyverbs`` imports
  for the system interpreter. Discovery therefore always has the sysfs path.

:func:`rdma_read_bench` needs a real device (or Soft-RoCE); it raises
:class:`RdmaUnavailable` otherwise. Nothing here runs at import time.
"""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "SYSFS_ROOT",
    "Discovery",
    "RdmaDevice",
    "RdmaPort",
    "RdmaUnavailable",
    "choose_devices",
    "discover",
    "from_pyverbs_port",
    "parse_ibv_devinfo",
    "parse_rate",
    "parse_state",
    "parse_sysfs",
    "rdma_read_bench",
]

SYSFS_ROOT = Path("/sys/class/infiniband")

_ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
_MTU_ENUM = {1: 256, 2: 512, 3: 1024, 4: 2048, 5: 4096}
_WIDTH_ENUM = {1: 1, 2: 4, 4: 8, 8: 12, 16: 2}
# ibv_port_attr.active_speed -> (name, Gb/s per lane)
_SPEED_ENUM = {
    1: ("SDR", 2.5),
    2: ("DDR", 5.0),
    4: ("QDR", 10.0),
    8: ("FDR10", 10.0),
    16: ("FDR", 14.0),
    32: ("EDR", 25.0),
    64: ("HDR", 50.0),
    128: ("NDR", 100.0),
    256: ("XDR", 200.0),
}
_STATE_ENUM = {0: "NOP", 1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}
_LINK_ENUM = {0: "Unspecified", 1: "InfiniBand", 2: "Ethernet"}


class RdmaUnavailable(RuntimeError):
    """No usable RDMA device (or pyverbs) for the requested operation."""


@dataclass(frozen=True, slots=True)
class RdmaPort:
    """One port of an RDMA device."""

    device: str
    port: int
    state: str  # "ACTIVE", "DOWN", ...
    link_layer: str  # "InfiniBand" | "Ethernet" (RoCE) | ...
    rate_gbps: float = 0.0  # active speed x width
    width: int = 0  # lanes (1X, 4X, ...)
    speed: str = ""  # "EDR", "HDR", ...
    mtu: int = 0  # active MTU in bytes (0 = unknown)
    lid: int = 0
    gids: tuple[tuple[int, str], ...] = ()  # (index, gid) for non-zero GIDs

    @property
    def active(self) -> bool:
        return self.state == "ACTIVE"

    def as_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "port": self.port,
            "state": self.state,
            "link_layer": self.link_layer,
            "rate_gbps": self.rate_gbps,
            "width": self.width,
            "speed": self.speed,
            "mtu": self.mtu,
            "lid": self.lid,
            "gids": [list(g) for g in self.gids],
        }


@dataclass(frozen=True, slots=True)
class RdmaDevice:
    """One RDMA device (HCA / RNIC) and its ports."""

    name: str
    ports: tuple[RdmaPort, ...] = ()
    node_type: str = ""
    fw_ver: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "node_type": self.node_type,
            "fw_ver": self.fw_ver,
            "ports": [p.as_dict() for p in self.ports],
        }


@dataclass(frozen=True, slots=True)
class Discovery:
    """The result of :func:`discover`: devices, which source answered, and why none when empty."""

    devices: tuple[RdmaDevice, ...]
    source: str  # "pyverbs" | "sysfs" | "none"
    reason: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def found(self) -> bool:
        return bool(self.devices)

    def summary(self) -> str:
        if not self.devices:
            return f"no RDMA device ({self.reason})"
        parts = []
        for d in self.devices:
            for p in d.ports:
                parts.append(f"{d.name}:{p.port} {p.state} {p.link_layer} {p.rate_gbps:g} Gb/s mtu {p.mtu}")
        return "; ".join(parts)

    def as_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "reason": self.reason,
            "notes": list(self.notes),
            "devices": [d.as_dict() for d in self.devices],
            "selected": choose_devices(self.devices),
        }


# ------------------------------------------------------------------ parsing
def parse_state(text: str) -> str:
    """``"4: ACTIVE"`` -> ``"ACTIVE"``; ``"ACTIVE"`` stays; numbers map through the enum."""
    t = text.strip()
    m = re.match(r"^(\d+)\s*:\s*(\S+)", t)
    if m:
        return m.group(2).upper()
    if t.isdigit():
        return _STATE_ENUM.get(int(t), t)
    return t.upper().removeprefix("PORT_")


def parse_rate(text: str) -> tuple[float, int, str]:
    """``"100 Gb/sec (4X EDR)"`` -> ``(100.0, 4, "EDR")``. Unknown parts are 0 / ''."""
    t = text.strip()
    m = re.match(r"^([0-9.]+)\s*Gb/sec(?:\s*\((\d+)X\s*([A-Za-z0-9]*)\))?", t)
    if not m:
        return 0.0, 0, ""
    return float(m.group(1)), int(m.group(2) or 0), (m.group(3) or "").upper()


def _read(path: Path) -> str:
    try:
        return path.read_text("utf-8", "replace").strip()
    except OSError:
        return ""


def parse_sysfs(root: Path = SYSFS_ROOT, *, net_root: Path | None = None) -> list[RdmaDevice]:
    """Read ``root/<dev>/ports/<n>/{state,rate,link_layer,lid,gids/*}``.

    The MTU is not in the port directory: for RoCE ports it is taken from the
    net device bound to GID 0 (``gid_attrs/ndevs/0`` -> ``net_root/<ndev>/mtu``,
    capped at 4096, the largest RDMA MTU); for InfiniBand it stays 0 (unknown)
    unless pyverbs answers. A missing or empty ``root`` gives ``[]``.
    """
    net_root = net_root if net_root is not None else root.parent / "net"
    devices: list[RdmaDevice] = []
    if not root.is_dir():
        return devices
    for dev_dir in sorted(p for p in root.iterdir() if p.is_dir() or p.is_symlink()):
        ports: list[RdmaPort] = []
        ports_dir = dev_dir / "ports"
        if ports_dir.is_dir():
            for port_dir in sorted(ports_dir.iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else 0):
                if not port_dir.name.isdigit():
                    continue
                rate, width, speed = parse_rate(_read(port_dir / "rate"))
                gids: list[tuple[int, str]] = []
                gdir = port_dir / "gids"
                if gdir.is_dir():
                    for g in sorted(gdir.iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else 0):
                        val = _read(g)
                        if g.name.isdigit() and val and val != _ZERO_GID:
                            gids.append((int(g.name), val))
                mtu = 0
                ndev = _read(port_dir / "gid_attrs" / "ndevs" / "0")
                if ndev:
                    raw = _read(net_root / ndev / "mtu")
                    if raw.isdigit():
                        mtu = max((m for m in _MTU_ENUM.values() if m <= int(raw)), default=0)
                lid_raw = _read(port_dir / "lid")
                ports.append(
                    RdmaPort(
                        device=dev_dir.name,
                        port=int(port_dir.name),
                        state=parse_state(_read(port_dir / "state")),
                        link_layer=_read(port_dir / "link_layer") or "Unspecified",
                        rate_gbps=rate,
                        width=width,
                        speed=speed,
                        mtu=mtu,
                        lid=int(lid_raw, 16) if lid_raw.startswith("0x") else 0,
                        gids=tuple(gids),
                    )
                )
        devices.append(
            RdmaDevice(
                name=dev_dir.name,
                ports=tuple(ports),
                node_type=_read(dev_dir / "node_type"),
                fw_ver=_read(dev_dir / "fw_ver"),
            )
        )
    return devices


def parse_ibv_devinfo(text: str) -> list[RdmaDevice]:
    """Parse the text of ``ibv_devinfo -v`` (rdma-core's verbs tool).

    Reads ``hca_id``, ``fw_ver``, each ``port:`` block's ``state``,
    ``active_mtu``, ``active_width``, ``active_speed``, ``link_layer``,
    ``port_lid`` and ``GID[  i]:`` lines. "No IB devices found" gives ``[]``.
    """
    devices: list[RdmaDevice] = []
    name = fw = ""
    ports: list[RdmaPort] = []
    cur: dict[str, Any] | None = None

    def flush_port() -> None:
        nonlocal cur
        if cur is not None:
            ports.append(RdmaPort(device=name, **cur))
            cur = None

    def flush_dev() -> None:
        nonlocal ports
        flush_port()
        if name:
            devices.append(RdmaDevice(name=name, ports=tuple(ports), fw_ver=fw))
        ports = []

    for line in text.splitlines():
        s = line.strip()
        if s.startswith("hca_id:"):
            flush_dev()
            name, fw = s.split(":", 1)[1].strip(), ""
        elif s.startswith("fw_ver:") and cur is None:
            fw = s.split(":", 1)[1].strip()
        elif re.match(r"^port:\s*\d+$", s):
            flush_port()
            cur = {"port": int(s.split(":")[1]), "state": "", "link_layer": "Unspecified"}
        elif cur is not None and ":" in s:
            k, v = (x.strip() for x in s.split(":", 1))
            if k == "state":
                cur["state"] = parse_state(v.split("(")[0])
            elif k == "active_mtu":
                m = re.match(r"^(\d+)", v)
                cur["mtu"] = int(m.group(1)) if m else 0
            elif k == "active_width":
                m = re.match(r"^(\d+)X", v)
                cur["width"] = int(m.group(1)) if m else 0
            elif k == "active_speed":
                m = re.match(r"^([0-9.]+)\s*Gbps(?:\s*\((\d+)\))?", v)
                if m and m.group(2):
                    cur["speed"] = _SPEED_ENUM.get(int(m.group(2)), ("", 0.0))[0]
            elif k == "link_layer":
                cur["link_layer"] = v
            elif k == "port_lid":
                cur["lid"] = int(v) if v.isdigit() else 0
            elif k.startswith("GID["):
                idx = int(re.sub(r"\D", "", k) or 0)
                gid = v.split(",")[0].strip()
                if gid and gid != _ZERO_GID and not gid.startswith("::"):
                    cur["gids"] = (*cur.get("gids", ()), (idx, gid))
    flush_dev()
    return _apply_lane_rates(devices, text)


def _apply_lane_rates(devices: list[RdmaDevice], text: str) -> list[RdmaDevice]:
    # second pass: per-lane speed x width -> total rate, keyed by (device, port)
    lanes: dict[tuple[str, int], float] = {}
    dev = ""
    port = 0
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("hca_id:"):
            dev = s.split(":", 1)[1].strip()
        elif re.match(r"^port:\s*\d+$", s):
            port = int(s.split(":")[1])
        elif s.startswith("active_speed:"):
            m = re.match(r"^active_speed:\s*([0-9.]+)\s*Gbps", s)
            if m:
                lanes[(dev, port)] = float(m.group(1))
    fixed: list[RdmaDevice] = []
    for d in devices:
        ports = []
        for p in d.ports:
            lane = lanes.get((d.name, p.port), 0.0)
            ports.append(
                RdmaPort(
                    device=p.device,
                    port=p.port,
                    state=p.state,
                    link_layer=p.link_layer,
                    rate_gbps=lane * (p.width or 1) if lane else 0.0,
                    width=p.width,
                    speed=p.speed,
                    mtu=p.mtu,
                    lid=p.lid,
                    gids=p.gids,
                )
            )
        fixed.append(RdmaDevice(name=d.name, ports=tuple(ports), node_type=d.node_type, fw_ver=d.fw_ver))
    return fixed


def from_pyverbs_port(device: str, port: int, attr: Any, gids: Iterable[tuple[int, str]] = ()) -> RdmaPort:
    """Build an :class:`RdmaPort` from a pyverbs ``PortAttr`` (or any object with
    the same ``state``, ``link_layer``, ``active_mtu``, ``active_width``,
    ``active_speed``, ``lid`` integer fields)."""
    width = _WIDTH_ENUM.get(int(getattr(attr, "active_width", 0)), 0)
    speed_name, lane = _SPEED_ENUM.get(int(getattr(attr, "active_speed", 0)), ("", 0.0))
    return RdmaPort(
        device=device,
        port=port,
        state=_STATE_ENUM.get(int(getattr(attr, "state", 0)), "UNKNOWN"),
        link_layer=_LINK_ENUM.get(int(getattr(attr, "link_layer", 0)), "Unspecified"),
        rate_gbps=lane * width,
        width=width,
        speed=speed_name,
        mtu=_MTU_ENUM.get(int(getattr(attr, "active_mtu", 0)), 0),
        lid=int(getattr(attr, "lid", 0)),
        gids=tuple((i, g) for i, g in gids if g and g != _ZERO_GID and g != "::"),
    )


# ---------------------------------------------------------------- selection
def choose_devices(devices: Iterable[RdmaDevice], *, link_layer: str | None = None) -> list[str]:
    """Names of the devices Mooncake should use (its ``rdma_devices``).

    A device qualifies when one of its ports is ACTIVE and, for RoCE
    (Ethernet), has at least one non-zero GID. Among those, the devices whose
    best port has the highest rate are chosen (several equal NICs are all
    used). ``link_layer`` restricts to ``"InfiniBand"`` or ``"Ethernet"``.
    Returns ``[]`` when nothing qualifies.
    """
    best: dict[str, float] = {}
    for d in devices:
        for p in d.ports:
            if not p.active:
                continue
            if link_layer and p.link_layer.lower() != link_layer.lower():
                continue
            if p.link_layer == "Ethernet" and not p.gids:
                continue
            best[d.name] = max(best.get(d.name, -1.0), p.rate_gbps)
    if not best:
        return []
    top = max(best.values())
    return sorted(n for n, r in best.items() if r == top)


# ---------------------------------------------------------------- discovery
def _pyverbs_devices() -> list[RdmaDevice]:
    from pyverbs.device import Context, get_device_list

    out: list[RdmaDevice] = []
    for dev in get_device_list():
        raw = dev.name
        name = raw.decode() if isinstance(raw, bytes) else str(raw)
        with Context(name=name) as ctx:
            dattr = ctx.query_device()
            ports = []
            for port in range(1, int(dattr.phys_port_cnt) + 1):
                pattr = ctx.query_port(port)
                gids = []
                for i in range(min(int(getattr(pattr, "gid_tbl_len", 0)), 16)):
                    try:
                        gids.append((i, str(ctx.query_gid(port, i).gid)))
                    except Exception:
                        continue
                ports.append(from_pyverbs_port(name, port, pattr, gids))
            out.append(RdmaDevice(name=name, ports=tuple(ports), fw_ver=str(getattr(dattr, "fw_ver", ""))))
    return out


def discover(sysfs_root: Path = SYSFS_ROOT, *, use_pyverbs: bool = True) -> Discovery:
    """List RDMA devices: pyverbs first (when importable), sysfs otherwise.

    Never raises for a machine without RDMA: the result is empty and
    ``reason`` says why ("kernel has no RDMA support", ...).
    """
    notes: list[str] = []
    if use_pyverbs:
        try:
            devs = _pyverbs_devices()
        except ImportError as exc:
            notes.append(f"pyverbs not importable ({exc}); using sysfs")
        except Exception as exc:
            notes.append(f"pyverbs get_device_list() raised {type(exc).__name__}: {exc}")
        else:
            if devs:
                return Discovery(tuple(devs), "pyverbs", notes=tuple(notes))
            notes.append("pyverbs found no device")
    devs = parse_sysfs(sysfs_root)
    if devs:
        return Discovery(tuple(devs), "sysfs", notes=tuple(notes))
    if not sysfs_root.exists():
        reason = f"{sysfs_root} does not exist: this kernel has no RDMA support loaded"
    else:
        reason = f"{sysfs_root} lists no device"
    return Discovery((), "none", reason=reason, notes=tuple(notes))


# ------------------------------------------------------------ microbenchmark
def rdma_read_bench(
    device: str | None = None,
    *,
    port: int = 1,
    gid_index: int | None = None,
    block_bytes: int = 1 << 20,
    iterations: int = 200,
    depth: int = 16,
    repetitions: int = 5,
) -> Mapping[str, float]:
    """One-sided RDMA READ between two RC queue pairs on the same device (loopback).

    Registers two buffers, connects QP A to QP B through the port (GID-routed
    for RoCE), posts ``iterations`` signalled ``IBV_WR_RDMA_READ`` of
    ``block_bytes`` with up to ``depth`` in flight, and returns the median GB/s
    of ``repetitions`` runs (``{"gbps": ..., "runs": n, "block_bytes": ...}``).
    This is the raw fabric reference for a certificate's envelope.

    Raises RdmaUnavailable without pyverbs or a usable device.
    """
    try:
        import pyverbs.enums as e
        from pyverbs.addr import AHAttr, GlobalRoute
        from pyverbs.cq import CQ
        from pyverbs.device import Context
        from pyverbs.mr import MR
        from pyverbs.pd import PD
        from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
        from pyverbs.wr import SGE, SendWR
    except ImportError as exc:
        raise RdmaUnavailable(f"pyverbs is not importable: {exc}") from exc
    found = discover()
    if device is None:
        chosen = choose_devices(found.devices)
        if not chosen:
            raise RdmaUnavailable(found.summary())
        device = chosen[0]
    dev = next((d for d in found.devices if d.name == device), None)
    pinfo = next((p for p in dev.ports if p.port == port), None) if dev else None
    if pinfo is None or not pinfo.active:
        raise RdmaUnavailable(f"{device}:{port} is not an active RDMA port ({found.summary()})")
    access = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_READ | e.IBV_ACCESS_REMOTE_WRITE
    mtu_enum = {v: k for k, v in _MTU_ENUM.items()}.get(pinfo.mtu or 1024, 3)
    with Context(name=device) as ctx, PD(ctx) as pd:
        src = MR(pd, block_bytes, access)
        dst = MR(pd, block_bytes, access)
        src.write(bytes(range(256)) * (block_bytes // 256) + bytes(block_bytes % 256), block_bytes)
        cq = CQ(ctx, max(depth * 2, 64))
        cap = QPCap(max_send_wr=depth, max_recv_wr=1, max_send_sge=1, max_recv_sge=1)
        qa = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap))
        qb = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap))
        roce = pinfo.link_layer == "Ethernet"
        gidx = gid_index if gid_index is not None else (pinfo.gids[-1][0] if pinfo.gids else 0)
        for local, remote in ((qa, qb), (qb, qa)):
            attr = QPAttr()
            attr.qp_access_flags = access
            attr.path_mtu = mtu_enum
            attr.dest_qp_num = remote.qp_num
            attr.rq_psn = 0
            attr.sq_psn = 0
            attr.max_dest_rd_atomic = min(depth, 16)
            attr.max_rd_atomic = min(depth, 16)
            attr.min_rnr_timer = 12
            attr.timeout = 14
            attr.retry_cnt = 7
            attr.rnr_retry = 7
            if roce:
                gid = ctx.query_gid(port, gidx)
                attr.ah_attr = AHAttr(port_num=port, is_global=1, gr=GlobalRoute(dgid=gid, sgid_index=gidx))
            else:
                attr.ah_attr = AHAttr(port_num=port, dlid=pinfo.lid)
            local.to_rts(attr)
        runs: list[float] = []
        for _ in range(repetitions):
            posted = done = 0
            t0 = time.perf_counter()
            while done < iterations:
                while posted < iterations and posted - done < depth:
                    wr = SendWR(
                        wr_id=posted,
                        opcode=e.IBV_WR_RDMA_READ,
                        num_sge=1,
                        sg=[SGE(dst.buf, block_bytes, dst.lkey)],
                        send_flags=e.IBV_SEND_SIGNALED,
                    )
                    wr.set_wr_rdma(src.rkey, src.buf)
                    qa.post_send(wr)
                    posted += 1
                n, wcs = cq.poll(num_entries=depth)
                for wc in wcs[:n]:
                    if wc.status != e.IBV_WC_SUCCESS:
                        raise RdmaUnavailable(f"RDMA READ completion failed with status {wc.status}")
                done += n
            runs.append(iterations * block_bytes / (time.perf_counter() - t0) / 1e9)
        if dst.read(256, 0) != bytes(range(256)):
            raise RdmaUnavailable("RDMA READ returned wrong bytes")
        for obj in (qa, qb, cq, src, dst):
            obj.close()
    return {"gbps": statistics.median(runs), "runs": float(len(runs)), "block_bytes": float(block_bytes)}
