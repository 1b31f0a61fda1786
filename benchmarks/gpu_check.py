"""GPU check: certify the hbm tier and the nvme tier through kvikio, then print a summary (< 5 min).

On a machine without a CUDA GPU it prints why and exits 0 without importing kvikio
(kvikio needs libcuda.so.1 even in compatibility mode). With a GPU it:

1. runs ``tierkv certify hbm`` and ``tierkv certify nvme`` (``--quick`` with ``--quick``) with
   ``io = "kvikio"`` (through ``tierkv_conformance._certify.main``), each in a
   subprocess with a time limit;
2. runs its own loop: HbmBackend host->device, device->device and device->host
   round trips, and NvmeBackend (kvikio) write/read of 2 MiB blocks from host
   buffers and from device buffers (``write_device`` / ``read_device``: cuFile
   moves the payload between GPU memory and the file), checking bytes;
3. drives the public API with CUDA tensors (``TierKV.put`` of a strided CUDA view, ``get(out=)``
   into a CUDA tensor) over a dram tier (one copy each way through the pinned arena), an hbm
   tier (the blocks stay on the device) and a pfs tier (staged through host memory), checking
   bytes and timing each beside a plain torch copy of the same bytes (medians of 3);
4. prints the io paths, verdicts and MB/s.

Usage: ``python benchmarks/gpu_check.py [--out DIR]``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tierkv_backends._gpu import cuda_usable, kvikio_installed


def certify(name: str, out: Path, config: str | None, limit: float, quick: bool) -> str:
    cmd = [
        sys.executable,
        "-c",
        "import sys; from tierkv_conformance._certify import main; sys.exit(main(sys.argv[1:]))",
    ]
    cmd += [name, "--out", str(out)] + (["--quick"] if quick else [])
    out.mkdir(parents=True, exist_ok=True)
    if config:
        cfg = out / f"{name}.toml"
        cfg.write_text(config)
        cmd += ["--config", str(cfg)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        return f"{name}: certify timed out after {limit:.0f}s"
    tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-6:])
    return f"{name}: certify exit {r.returncode}\n{tail}"


async def own_loops(workdir: Path) -> list[str]:
    import torch

    from tierkv_backends.hbm import HbmBackend
    from tierkv_backends.nvme import NvmeBackend

    lines: list[str] = []
    n, count = 2 << 20, 64
    host = torch.randint(0, 256, (n,), dtype=torch.uint8)
    dev = host.cuda()
    async with await HbmBackend.open({"capacity": "512MiB"}) as h:
        t = time.perf_counter()
        for i in range(count):
            await h.write(await h.allocate(f"h{i}", n), host.numpy())
        h2d = count * n / (time.perf_counter() - t) / 1e6
        t = time.perf_counter()
        for i in range(count):
            await h.write_device(await h.allocate(f"d{i}", n), dev)
        d2d = count * n / (time.perf_counter() - t) / 1e6
        out = torch.empty(n, dtype=torch.uint8, device="cuda")
        got = await h.read_device("d3", into=out)
        ok = torch.equal(got.cpu(), host) and bytes(await h.read("h5")) == host.numpy().tobytes()
        lines.append(f"hbm: {h.stats().io_path}; H2D {h2d:.0f} MB/s, D2D {d2d:.0f} MB/s, bytes ok={ok}")
    async with await NvmeBackend.open(
        {"path": str(workdir / "nvme-own"), "capacity": "512MiB", "slot_bytes": "2MiB", "io": "kvikio"}
    ) as b:
        data = host.numpy()
        t = time.perf_counter()
        for i in range(count):
            await b.write(await b.allocate(f"n{i}", n), data)
        wr = count * n / (time.perf_counter() - t) / 1e6
        buf = bytearray(n)
        t = time.perf_counter()
        for i in range(count):
            await b.read(f"n{i}", into=buf)
        rd = count * n / (time.perf_counter() - t) / 1e6
        ok = bytes(buf) == data.tobytes()
        lines.append(
            f"nvme host buffers: {b.stats().io_path}; write {wr:.0f} MB/s, read {rd:.0f} MB/s (QD1), bytes ok={ok}"
        )
        # device buffers <-> file through cuFile (write_device / read_device), wsum32 checked on the GPU
        t = time.perf_counter()
        for i in range(count):
            await b.write_device(await b.allocate(f"g{i}", n), dev)
        dwr = count * n / (time.perf_counter() - t) / 1e6
        dout = torch.empty(n, dtype=torch.uint8, device="cuda")
        t = time.perf_counter()
        for i in range(count):
            await b.read_device(f"g{i}", into=dout)
        drd = count * n / (time.perf_counter() - t) / 1e6
        ok = torch.equal(dout, dev) and bytes(await b.read("g7")) == data.tobytes()
        lines.append(
            f"nvme device buffers: {b.stats().io_path}; write_device {dwr:.0f} MB/s, "
            f"read_device {drd:.0f} MB/s (QD1), bytes ok={ok}"
        )
    return lines


async def api_device_path(workdir: Path) -> list[str]:
    """put/get(out=) of CUDA KV through the public API, per tier, beside torch's own copy."""
    import statistics

    import torch

    from tierkv import TierKV

    hf = {
        "model_type": "llama",
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "hidden_size": 576,
        "head_dim": 64,
    }
    n, bt = 4096, 256
    big = torch.randn((30, 2, n + 64, 3, 64), dtype=torch.float16, device="cuda")
    src = big[:, :, 32 : 32 + n]  # a strided view, as an engine's cache slice
    nbytes = src.numel() * 2
    lines = []
    tiers = {
        "dram": {"name": "dram", "backend": "dram", "capacity": "1GiB"},
        "hbm": {"name": "hbm", "backend": "hbm", "capacity": "1GiB"},
        "pfs": {"name": "pfs", "backend": "pfs", "path": str(workdir / "api-pfs"), "capacity": "2GiB"},
    }
    for name, tier in tiers.items():
        cfg = {"model": {"name": "gpu-check", "hf_config": hf}, "kv_dtype": "float16", "block_tokens": bt}
        cfg["tiers"] = [tier]
        tokens = list(range(1000, 1000 + n))
        out = torch.zeros_like(src)
        host = torch.empty(tuple(src.shape), dtype=torch.float16, pin_memory=True)
        puts, gets, d2h, h2d = [], [], [], []
        async with await TierKV.open(cfg) as kv:
            for _ in range(3):
                await kv.invalidate()
                torch.cuda.synchronize()
                t = time.perf_counter()
                await kv.put(tokens, src, durable=name == "pfs")
                puts.append(time.perf_counter() - t)
                t = time.perf_counter()
                g = await kv.get(tokens, out=out)
                gets.append(time.perf_counter() - t)
                t = time.perf_counter()
                host.copy_(src)
                torch.cuda.synchronize()
                d2h.append(time.perf_counter() - t)
                t = time.perf_counter()
                out.copy_(host)
                torch.cuda.synchronize()
                h2d.append(time.perf_counter() - t)
                g = await kv.get(tokens, out=out)
        ok = g.tokens == n and torch.equal(out, src)
        p, q = statistics.median(puts), statistics.median(gets)
        lines.append(
            f"api {name}: put {nbytes / p / 1e6:.0f} MB/s ({statistics.median(d2h) / p:.2f}x torch D2H), "
            f"get(out=cuda) {nbytes / q / 1e6:.0f} MB/s ({statistics.median(h2d) / q:.2f}x torch H2D), "
            f"tokens {g.tokens}/{n}, bytes ok={ok}"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--quick", action="store_true", help="one envelope repetition instead of five")
    args = ap.parse_args(argv)
    ok, why = cuda_usable()
    if not ok:
        print(f"gpu_check: no GPU here ({why}); nothing to certify. Run this on a machine with an NVIDIA GPU.")
        return 0
    if not kvikio_installed():
        print("gpu_check: kvikio is not installed; nvme will be certified on its O_DIRECT path only")
    import anyio
    import torch

    t0 = time.monotonic()
    out = args.out or Path(tempfile.mkdtemp(prefix="tierkv-gpu-check-"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"gpu_check: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, out={out}")
    summary = anyio.run(own_loops, out)
    summary += anyio.run(api_device_path, out)
    nvme_cfg = 'path = "{tmp_path}/nvme"\ncapacity = "256MiB"\nslot_bytes = "2MiB"\nio = "%s"\n' % (
        "kvikio" if kvikio_installed() else "posix"
    )
    summary.append(certify("hbm", out / "hbm", None, 170, args.quick))
    summary.append(certify("nvme", out / "nvme", nvme_cfg, 170, args.quick))
    print("\n=== summary ===")
    for line in summary:
        print(line)
    print(f"total {time.monotonic() - t0:.0f}s; KVIKIO_COMPAT_MODE={os.environ.get('KVIKIO_COMPAT_MODE', '(unset)')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
