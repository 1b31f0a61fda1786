"""Honest hardware detection for certificates.

Every probe reports what it found and where (``source``), or ``present: False``;
nothing is guessed. The parsing functions are pure (text in, dict out) and the
probes take a ``root`` directory so tests can point them at a recorded
``/proc`` + ``/sys`` tree. Detection never raises: an unreadable source is
reported as absent with the error in ``note``.
"""

from __future__ import annotations

import ctypes.util
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = [
    "detect_cpu",
    "detect_cxl",
    "detect_devdax",
    "detect_filesystem",
    "detect_gds",
    "detect_gpu",
    "detect_hardware",
    "detect_memory",
    "detect_numa",
    "detect_rdma",
    "parse_cpulist",
    "parse_cpuinfo",
    "parse_meminfo",
    "parse_mounts",
    "parse_nvidia_smi",
    "parse_rdma_rate",
]


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


# ----------------------------------------------------------------------------- parsers
def parse_cpuinfo(text: str) -> dict[str, Any]:
    """Model name and logical CPU count from ``/proc/cpuinfo`` text."""
    model = ""
    count = 0
    for line in text.splitlines():
        k, _, v = line.partition(":")
        k = k.strip()
        if k == "processor":
            count += 1
        elif k in ("model name", "Model", "cpu model") and not model:
            model = v.strip()
    return {"model": model, "logical_cpus": count}


def parse_meminfo(text: str) -> dict[str, int]:
    """``/proc/meminfo`` (or a sysfs node meminfo) as bytes per field."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.replace(":", " ").split()
        if parts and parts[0] == "Node" and len(parts) >= 4:  # "Node 0 MemTotal: 123 kB"
            parts = parts[2:]
        if len(parts) >= 2 and parts[1].isdigit():
            mult = 1024 if len(parts) > 2 and parts[2].lower() == "kb" else 1
            out[parts[0]] = int(parts[1]) * mult
    return out


def parse_cpulist(text: str) -> list[int]:
    """``0-3,8,10-11`` -> [0, 1, 2, 3, 8, 10, 11]; empty text -> []."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def _unescape_mount(s: str) -> str:
    return s.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def parse_mounts(text: str, path: str) -> dict[str, Any] | None:
    """The mount (longest mount-point prefix) holding absolute ``path``, from ``/proc/mounts`` text."""
    best: dict[str, Any] | None = None
    for line in text.splitlines():
        f = line.split()
        if len(f) < 4:
            continue
        mnt = _unescape_mount(f[1])
        if path == mnt or path.startswith(mnt.rstrip("/") + "/") or mnt == "/":
            if best is None or len(mnt) > len(best["mount_point"]):
                best = {"device": _unescape_mount(f[0]), "mount_point": mnt, "fs_type": f[2], "options": f[3]}
    return best


def parse_nvidia_smi(text: str) -> list[dict[str, str]]:
    """``nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader`` output."""
    gpus = []
    for line in text.strip().splitlines():
        f = [x.strip() for x in line.split(",")]
        if len(f) >= 3 and f[0]:
            gpus.append({"model": f[0], "driver": f[1], "memory": f[2]})
    return gpus


def parse_rdma_rate(text: str) -> float | None:
    """``/sys/class/infiniband/*/ports/*/rate`` ("100 Gb/sec (4X EDR)") -> 100.0 Gbit/s."""
    head = text.strip().split(" ", 1)[0]
    try:
        return float(head)
    except ValueError:
        return None


# ----------------------------------------------------------------------------- probes
def detect_cpu(root: Path = Path("/")) -> dict[str, Any]:
    text = _read(root / "proc/cpuinfo")
    if text is None:
        return {"present": True, "model": platform.processor(), "logical_cpus": os.cpu_count(), "source": "platform"}
    info = parse_cpuinfo(text)
    return {"present": True, **info, "arch": platform.machine(), "source": "/proc/cpuinfo"}


def detect_memory(root: Path = Path("/")) -> dict[str, Any]:
    text = _read(root / "proc/meminfo")
    if text is None:
        return {"present": False, "note": "/proc/meminfo unreadable"}
    m = parse_meminfo(text)
    return {
        "present": "MemTotal" in m,
        "total_bytes": m.get("MemTotal", 0),
        "available_bytes": m.get("MemAvailable", 0),
        "hugepages_total": m.get("HugePages_Total", 0),
        "source": "/proc/meminfo",
    }


def detect_filesystem(path: Path | str, root: Path = Path("/")) -> dict[str, Any]:
    """Filesystem type and size under ``path`` (longest mount prefix in /proc/mounts, statvfs)."""
    p = os.path.realpath(str(path))
    while p != "/" and not os.path.exists(p):
        p = os.path.dirname(p)
    text = _read(root / "proc/mounts")
    mount = parse_mounts(text, p) if text else None
    out: dict[str, Any] = {"present": mount is not None, "path": str(path), "source": "/proc/mounts"}
    if mount:
        out.update(mount)
    try:
        st = os.statvfs(p)
        out["size_bytes"] = st.f_frsize * st.f_blocks
        out["free_bytes"] = st.f_frsize * st.f_bavail
    except OSError as exc:
        out["note"] = f"statvfs failed: {exc}"
    return out


def detect_numa(root: Path = Path("/")) -> dict[str, Any]:
    base = root / "sys/devices/system/node"
    nodes = []
    if base.is_dir():
        for d in sorted(base.glob("node[0-9]*"), key=lambda x: int(x.name[4:])):
            cpus = parse_cpulist(_read(d / "cpulist") or "")
            mem = parse_meminfo(_read(d / "meminfo") or "").get("MemTotal", 0)
            nodes.append({"node": int(d.name[4:]), "cpus": len(cpus), "memory_bytes": mem})
    return {
        "present": bool(nodes),
        "nodes": nodes,
        "cpuless_nodes": [n["node"] for n in nodes if n["cpus"] == 0 and n["memory_bytes"] > 0],
        "source": "/sys/devices/system/node",
    }


def detect_gpu(root: Path = Path("/"), *, run_tools: bool = True) -> dict[str, Any]:
    """NVIDIA GPUs from nvidia-smi, else /proc/driver/nvidia; torch.cuda only if torch is already imported."""
    if run_tools and root == Path("/") and shutil.which("nvidia-smi"):
        try:
            cp = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
                check=False,
            )
            gpus = parse_nvidia_smi(cp.stdout) if cp.returncode == 0 else []
            if gpus:
                return {"present": True, "gpus": gpus, "driver": gpus[0]["driver"], "source": "nvidia-smi"}
        except (OSError, subprocess.SubprocessError):
            pass
    version = _read(root / "proc/driver/nvidia/version")
    gpus_dir = root / "proc/driver/nvidia/gpus"
    models = []
    if gpus_dir.is_dir():
        for g in sorted(gpus_dir.iterdir()):
            for line in (_read(g / "information") or "").splitlines():
                if line.startswith("Model:"):
                    models.append({"model": line.split(":", 1)[1].strip(), "bus": g.name})
    if version is not None or models:
        driver = ""
        if version:
            parts = version.split("Kernel Module", 1)
            driver = parts[1].split()[0] if len(parts) > 1 and parts[1].split() else ""
        return {"present": bool(models), "gpus": models, "driver": driver, "source": "/proc/driver/nvidia"}
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_available():
                n = torch.cuda.device_count()
                gpus = [{"model": torch.cuda.get_device_name(i)} for i in range(n)]
                return {"present": True, "gpus": gpus, "driver": "", "source": "torch.cuda"}
        except Exception as exc:  # torch reports a missing driver in many ways
            return {"present": False, "gpus": [], "note": f"torch.cuda: {exc}", "source": "torch.cuda"}
    return {"present": False, "gpus": [], "source": "nvidia-smi, /proc/driver/nvidia"}


def detect_gds(root: Path = Path("/")) -> dict[str, Any]:
    """GPUDirect Storage: libcufile, the nvidia-fs kernel driver, kvikio."""
    lib = ctypes.util.find_library("cufile") if root == Path("/") else None
    nvfs = (root / "proc/driver/nvidia-fs").exists() or (root / "sys/module/nvidia_fs").exists()
    kvikio = importlib.util.find_spec("kvikio") is not None if root == Path("/") else False
    cufile_json = (root / "etc/cufile.json").exists()
    if lib and nvfs:
        status = "present"
    elif lib:
        status = "library only (no nvidia-fs driver: compatibility mode, not GDS)"
    else:
        status = "absent"
    return {
        "present": bool(lib and nvfs),
        "status": status,
        "libcufile": lib or "",
        "nvidia_fs_driver": nvfs,
        "kvikio": kvikio,
        "cufile_json": cufile_json,
        "source": "ctypes.util.find_library('cufile'), /proc/driver/nvidia-fs",
    }


def detect_cxl(root: Path = Path("/")) -> dict[str, Any]:
    base = root / "sys/bus/cxl/devices"
    devices = sorted(p.name for p in base.iterdir()) if base.is_dir() else []
    memdevs = [d for d in devices if d.startswith("mem")]
    numa = detect_numa(root)
    return {
        "present": bool(memdevs),
        "devices": devices,
        "memdevs": memdevs,
        "cpuless_numa_nodes": numa["cpuless_nodes"],
        "source": "/sys/bus/cxl/devices, /sys/devices/system/node",
    }


def detect_devdax(root: Path = Path("/")) -> dict[str, Any]:
    base = root / "sys/bus/dax/devices"
    devices = []
    if base.is_dir():
        for d in sorted(base.iterdir()):
            size = (_read(d / "size") or "").strip()
            devices.append({"name": d.name, "size_bytes": int(size) if size.isdigit() else None})
    dev_nodes = sorted(str(p) for p in (root / "dev").glob("dax*")) if (root / "dev").is_dir() else []
    return {
        "present": bool(devices or dev_nodes),
        "devices": devices,
        "dev_nodes": dev_nodes,
        "source": "/sys/bus/dax, /dev/dax*",
    }


def detect_rdma(root: Path = Path("/")) -> dict[str, Any]:
    base = root / "sys/class/infiniband"
    devices: list[dict[str, Any]] = []
    if base.is_dir():
        for d in sorted(base.iterdir()):
            ports: list[dict[str, Any]] = []
            for p in sorted((d / "ports").glob("*")) if (d / "ports").is_dir() else []:
                rate_text = _read(p / "rate") or ""
                ports.append(
                    {
                        "port": p.name,
                        "state": (_read(p / "state") or "").strip(),
                        "phys_state": (_read(p / "phys_state") or "").strip(),
                        "rate": rate_text.strip(),
                        "rate_gbps": parse_rdma_rate(rate_text),
                        "link_layer": (_read(p / "link_layer") or "").strip(),
                    }
                )
            devices.append({"name": d.name, "ports": ports})
    active = any("ACTIVE" in p["state"] for d in devices for p in d["ports"])
    return {"present": bool(devices), "active_port": active, "devices": devices, "source": "/sys/class/infiniband"}


def detect_hardware(path: Path | str | None = None, root: Path = Path("/")) -> dict[str, Any]:
    """Everything above; ``path`` is the backend's storage path (filesystem entry)."""
    hw: dict[str, Any] = {
        "hostname": platform.node() if root == Path("/") else "",
        "kernel": platform.release() if root == Path("/") else "",
        "python": platform.python_version(),
        "cpu": detect_cpu(root),
        "memory": detect_memory(root),
        "numa": detect_numa(root),
        "gpu": detect_gpu(root),
        "gds": detect_gds(root),
        "cxl": detect_cxl(root),
        "devdax": detect_devdax(root),
        "rdma": detect_rdma(root),
    }
    hw["filesystem"] = detect_filesystem(path, root) if path is not None else {"present": False, "note": "no path"}
    return hw
