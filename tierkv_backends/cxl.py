"""The CXL memory tier: the DRAM tier's arena placed in CXL-attached memory.

CXL memory shows up in one of two ways, both detected from sysfs (never guessed):

* a **device-DAX** character device ``/dev/daxX.Y`` (``/sys/bus/dax/devices/daxX.Y``
  with ``size``, ``align`` and ``target_node``), mapped with ``mmap(MAP_SHARED)``;
* a **CPU-less NUMA node** (``/sys/devices/system/node/nodeN/cpulist`` empty, memory
  in ``meminfo``; its ``distance`` row says how far it is), where an anonymous
  mapping is bound with ``mbind(MPOL_BIND)`` (libnuma's ``numa_tonode_memory``
  through ctypes, or the raw syscall) before it is touched.

``/sys/bus/cxl/devices`` (memdevs, regions, decoders) is reported as evidence.

With neither present the backend is unusable: :meth:`CxlBackend.probe` says why
and :meth:`CxlBackend.open` raises PluginUnavailableError, unless the options
name an ``emulation_path`` (e.g. a file in ``/dev/shm``), in which case the arena
is an ``mmap`` of that file and ``stats().emulated`` is true and ``io_path`` says
``"memcpy (emulated CXL: /dev/shm file)"``.

The allocator, bookkeeping, copies and concurrency are those of
:class:`~tierkv_backends.dram.DramBackend` (this class subclasses it and only
replaces where the arena's memory comes from); see that module for the contract.

Options: ``capacity`` (size, default 256 MiB), ``mode`` (``auto`` | ``devdax`` |
``numa`` | ``emulation``), ``device`` (a ``/dev/daxX.Y`` path), ``numa_node`` (int),
``emulation_path`` (file path; created and removed by the backend if absent),
plus every DRAM option except ``pin``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import mmap
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tierkv.backend import Availability, BackendStats, TierKind, opt_choice, opt_int, opt_str, os_error
from tierkv.errors import ConfigError, PluginUnavailableError

from .dram import DramBackend

__all__ = [
    "CxlBackend",
    "CxlTopology",
    "DaxDevice",
    "NumaNode",
    "detect_cxl",
    "parse_cpulist",
    "parse_distance",
    "parse_meminfo_total",
]

_U8 = np.ndarray[Any, np.dtype[np.uint8]]
_CXL_KEYS = frozenset({"mode", "device", "numa_node", "emulation_path"})
_MPOL_BIND = 2
_SYS_MBIND = {"x86_64": 237, "aarch64": 235}
_PROBE_NAME = "cxl"


# ----------------------------------------------------------------------------- sysfs parsing
def parse_cpulist(text: str) -> list[int]:
    """Parse a sysfs cpulist (``"0-3,8,10-11"``; empty for a CPU-less node)."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            cpus.extend(range(int(lo), int(hi) + 1))
        else:
            cpus.append(int(part))
    return cpus


def parse_distance(text: str) -> list[int]:
    """Parse a node's ``distance`` row (``"10 21 14"``)."""
    return [int(x) for x in text.split()]


def parse_meminfo_total(text: str) -> int:
    """Bytes of ``MemTotal`` in a node's ``meminfo`` (``"Node 2 MemTotal:  16777216 kB"``)."""
    m = re.search(r"MemTotal:\s+(\d+)\s*kB", text)
    return int(m.group(1)) * 1024 if m else 0


@dataclass(frozen=True, slots=True)
class NumaNode:
    """A NUMA node with memory and no CPUs (how CXL memory in system-RAM mode appears)."""

    node: int
    mem_bytes: int
    distances: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class DaxDevice:
    """A device-DAX instance: ``name`` (``dax0.0``), its ``/dev`` path, size, alignment, target node."""

    name: str
    path: str
    size: int
    align: int
    target_node: int
    present: bool


@dataclass(frozen=True, slots=True)
class CxlTopology:
    """What sysfs says about CXL on this machine."""

    cxl_devices: tuple[str, ...]
    dax_devices: tuple[DaxDevice, ...]
    cpuless_nodes: tuple[NumaNode, ...]

    @property
    def usable(self) -> bool:
        return any(d.present for d in self.dax_devices) or bool(self.cpuless_nodes)

    def describe(self) -> str:
        parts = [
            f"{len(self.cxl_devices)} CXL bus device(s)",
            f"{sum(d.present for d in self.dax_devices)} device-DAX",
            f"{len(self.cpuless_nodes)} CPU-less NUMA node(s) with memory",
        ]
        return ", ".join(parts)


def _read(p: Path) -> str:
    try:
        return p.read_text()
    except OSError:
        return ""


def _int(text: str, default: int = 0) -> int:
    t = text.strip()
    try:
        return int(t, 0)
    except ValueError:
        return default


def detect_cxl(sys_root: Path = Path("/sys"), dev_root: Path = Path("/dev")) -> CxlTopology:
    """Read CXL evidence from a sysfs tree (``sys_root`` may be a recorded copy in tests)."""
    cxl_dir = sys_root / "bus" / "cxl" / "devices"
    cxl = tuple(sorted(p.name for p in cxl_dir.iterdir())) if cxl_dir.is_dir() else ()
    dax: list[DaxDevice] = []
    dax_dir = sys_root / "bus" / "dax" / "devices"
    if dax_dir.is_dir():
        for p in sorted(dax_dir.iterdir()):
            if not re.fullmatch(r"dax\d+\.\d+", p.name):
                continue
            dax.append(
                DaxDevice(
                    name=p.name,
                    path=str(dev_root / p.name),
                    size=_int(_read(p / "size")),
                    align=_int(_read(p / "align"), 2 << 20) or (2 << 20),
                    target_node=_int(_read(p / "target_node"), -1),
                    present=(dev_root / p.name).exists(),
                )
            )
    nodes: list[NumaNode] = []
    node_dir = sys_root / "devices" / "system" / "node"
    if node_dir.is_dir():
        for p in sorted(node_dir.iterdir(), key=lambda q: q.name):
            m = re.fullmatch(r"node(\d+)", p.name)
            if not m or not (p / "cpulist").exists():
                continue
            if parse_cpulist(_read(p / "cpulist")):
                continue
            mem = parse_meminfo_total(_read(p / "meminfo"))
            if mem <= 0:
                continue
            nodes.append(NumaNode(int(m.group(1)), mem, tuple(parse_distance(_read(p / "distance")))))
    return CxlTopology(cxl, tuple(dax), tuple(nodes))


# ----------------------------------------------------------------------------- NUMA binding
def _bind_to_node(buf: mmap.mmap, node: int) -> str:
    """Bind ``buf``'s pages to ``node`` before they are touched; returns what was used."""
    addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    size = len(buf)
    libnuma = ctypes.util.find_library("numa")
    if libnuma:
        lib = ctypes.CDLL(libnuma, use_errno=True)
        if lib.numa_available() >= 0:
            lib.numa_tonode_memory.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            lib.numa_tonode_memory(ctypes.c_void_p(addr), ctypes.c_size_t(size), ctypes.c_int(node))
            return "libnuma numa_tonode_memory"
    nr = _SYS_MBIND.get(os.uname().machine)
    if nr is None:
        raise OSError(f"no mbind syscall number known for {os.uname().machine}")
    libc = ctypes.CDLL(None, use_errno=True)
    maxnode = node + 2
    words = (maxnode + 63) // 64
    mask = (ctypes.c_ulong * words)()
    mask[node // 64] = 1 << (node % 64)
    rc = libc.syscall(
        ctypes.c_long(nr),
        ctypes.c_void_p(addr),
        ctypes.c_ulong(size),
        ctypes.c_int(_MPOL_BIND),
        mask,
        ctypes.c_ulong(maxnode),
        ctypes.c_uint(0),
    )
    if rc != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"mbind to node {node}: {os.strerror(e)}")
    return "mbind syscall"


# ----------------------------------------------------------------------------- backend
class CxlBackend(DramBackend):
    """CXL memory tier (see the module docstring). Not persistent, not shared."""

    def __init__(self, options: Mapping[str, Any] | None = None, *, name: str = "") -> None:
        full = dict(options or {})
        if "pin" in full:
            raise ConfigError("pin", full["pin"], "not settable for cxl (the arena is a mapping, never pinned)")
        dram_opts = {k: v for k, v in full.items() if k not in _CXL_KEYS}
        dram_opts["pin"] = "false"
        super().__init__(dram_opts, name=name or "cxl")
        self.options = full
        self._mode = opt_choice(full, "mode", ("auto", "devdax", "numa", "emulation"), "auto")
        self._device = opt_str(full, "device") if "device" in full else None
        self._node = opt_int(full, "numa_node", minimum=0) if "numa_node" in full else None
        self._emulation_path = opt_str(full, "emulation_path") if "emulation_path" in full else None
        if self._mode == "emulation" and self._emulation_path is None:
            raise ConfigError("emulation_path", None, "a file path (required with mode='emulation')")
        self._caps = dataclasses.replace(self._caps, tier_kind=TierKind.CXL)
        self._map: mmap.mmap | None = None
        self._created_file: Path | None = None
        self._source_desc = ""
        self._emulated = False

    @classmethod
    def probe(cls) -> Availability:
        topo = detect_cxl()
        if topo.usable:
            return Availability(True, f"CXL memory found: {topo.describe()}")
        return Availability(
            False,
            f"no CXL memory: no /dev/dax* device and no CPU-less NUMA node with memory ({topo.describe()})",
            "on real hardware configure the region as devdax or system-ram; "
            "to emulate, set emulation_path (e.g. a file in /dev/shm)",
        )

    @classmethod
    def default_options(cls, workdir: Path) -> dict[str, Any]:
        tag = abs(hash(str(workdir.resolve()))) % (1 << 32)
        return {"capacity": "256MiB", "emulation_path": f"/dev/shm/tierkv-cxl-emulation-{os.getpid()}-{tag:08x}"}

    # ------------------------------------------------------------------ memory
    def _unavailable(self, why: str) -> PluginUnavailableError:
        return PluginUnavailableError(
            f"cxl: {why}",
            group="tierkv.backends",
            name=self.name,
            hint="set emulation_path (e.g. /dev/shm/tierkv-cxl) to run on an emulation file",
        )

    def _make_buffer(self) -> tuple[_U8, bool]:
        mode = self._mode
        if mode == "auto":
            if self._emulation_path is not None:
                mode = "emulation"
            else:
                topo = detect_cxl()
                if self._device is not None or any(d.present for d in topo.dax_devices):
                    mode = "devdax"
                elif self._node is not None or topo.cpuless_nodes:
                    mode = "numa"
                else:
                    raise self._unavailable(f"no CXL memory on this machine ({topo.describe()})")
        try:
            if mode == "emulation":
                return self._map_emulation(), False
            if mode == "devdax":
                return self._map_devdax(), False
            return self._map_numa(), False
        except OSError as exc:
            raise os_error(exc, f"cannot map CXL memory ({mode})", tier=self.name) from exc

    def _as_array(self, m: mmap.mmap) -> _U8:
        self._map = m
        return np.frombuffer(m, dtype=np.uint8, count=self._capacity)

    def _map_emulation(self) -> _U8:
        assert self._emulation_path is not None
        p = Path(self._emulation_path)
        if not p.exists():
            self._created_file = p
        fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size < self._capacity:
                os.ftruncate(fd, self._capacity)
            m = mmap.mmap(fd, self._capacity, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self._emulated = True
        self._source_desc = f"memcpy (emulated CXL: file {p})"
        return self._as_array(m)

    def _map_devdax(self) -> _U8:
        topo = detect_cxl()
        devs = [d for d in topo.dax_devices if d.present and (self._device is None or d.path == self._device)]
        if self._device is not None and not devs:
            if not Path(self._device).exists():
                raise self._unavailable(f"device {self._device} does not exist")
            devs = [DaxDevice(Path(self._device).name, self._device, 0, 2 << 20, -1, True)]
        if not devs:
            raise self._unavailable("no device-DAX device present")
        d = devs[0]
        if d.size and self._capacity > d.size:
            raise ConfigError("capacity", self._capacity, f"at most the size of {d.path} ({d.size} bytes)")
        length = (self._capacity + d.align - 1) // d.align * d.align
        fd = os.open(d.path, os.O_RDWR)
        try:
            m = mmap.mmap(fd, length, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self._source_desc = f"memcpy (CXL devdax {d.path}, node {d.target_node})"
        return self._as_array(m)

    def _map_numa(self) -> _U8:
        topo = detect_cxl()
        nodes = [n for n in topo.cpuless_nodes if self._node is None or n.node == self._node]
        if not nodes:
            raise self._unavailable(
                f"NUMA node {self._node} is not a CPU-less node with memory"
                if self._node is not None
                else "no CPU-less NUMA node"
            )
        n = nodes[0]
        m = mmap.mmap(-1, self._capacity, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        how = _bind_to_node(m, n.node)
        self._source_desc = f"memcpy (CXL NUMA node {n.node}, {how})"
        return self._as_array(m)

    async def _close(self) -> None:
        await super()._close()
        self._map = None  # the GC unmaps once no in-flight copy holds a view
        if self._created_file is not None:
            try:
                self._created_file.unlink()
            except OSError:
                pass
            self._created_file = None

    def stats(self) -> BackendStats:
        s = super().stats()
        details = dict(s.details)
        details["source"] = self._source_desc
        details.pop("pinned", None)
        return dataclasses.replace(
            s,
            kind=TierKind.CXL,
            io_path=self._source_desc or ("memcpy (emulated CXL)" if self._emulated else "memcpy"),
            emulated=self._emulated,
            details=details,
        )
