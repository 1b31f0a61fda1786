"""Queue-depth sweep of the NVMe tier against raw O_DIRECT preadv/pwritev in the same run.

For each block size (256 KiB, 2 MiB) and queue depth (1, 2, 4, 8, 16) it measures,
as the median of several repetitions over the same data volume:

* raw read:   ``os.preadv`` of page-aligned buffers from an O_DIRECT file, QD threads
* raw write:  ``os.pwritev`` + ``os.fdatasync`` per block (the durable reference: the
              backend acknowledges a write only once it is durable), QD threads
* raw write (no sync): ``os.pwritev`` alone, printed for information
* nvme read / write: NvmeBackend with ``queue_depth=QD`` and ``slot_bytes=BS``, QD
              concurrent tasks, page-aligned source and ``into=`` buffers

and prints MB/s and the ratios backend / raw. Target: >= 0.9 for 256 KiB and 2 MiB.
Run: ``python benchmarks/bench_nvme.py [--dir DIR] [--reps N] [--mib MiB]``.
"""

from __future__ import annotations

import argparse
import mmap
import os
import shutil
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anyio

from tierkv_backends.nvme import NvmeBackend

SIZES = [256 * 1024, 2 * 1024 * 1024]
QDS = [1, 2, 4, 8, 16]


def make_file(path: Path, nbytes: int) -> None:
    with open(path, "wb") as f:
        f.write(os.urandom(1 << 20) * (nbytes >> 20))
        f.flush()
        os.fsync(f.fileno())


def raw_pass(path: Path, bs: int, qd: int, nops: int, mode: str) -> float:
    fd = os.open(path, os.O_RDWR | os.O_DIRECT)
    bufs = [mmap.mmap(-1, bs) for _ in range(qd)]
    for b in bufs:
        b.write(os.urandom(64) * (bs // 64))

    def run(w: int) -> None:
        buf = [memoryview(bufs[w])]
        for i in range(w, nops, qd):
            off = i * bs
            if mode == "read":
                os.preadv(fd, buf, off)
            else:
                os.pwritev(fd, buf, off)
                if mode == "write":
                    os.fdatasync(fd)

    try:
        with ThreadPoolExecutor(qd) as ex:
            t0 = time.perf_counter()
            list(ex.map(run, range(qd)))
            dt = time.perf_counter() - t0
    finally:
        os.close(fd)
    return nops * bs / dt / 1e6


async def backend_pass(b: NvmeBackend, bs: int, qd: int, nops: int, mode: str, srcs: list[mmap.mmap]) -> float:
    keys = [f"blk{i}" for i in range(nops)]
    if mode == "write":
        for k in keys:
            await b.evict(k)

    async def worker(w: int) -> None:
        buf = memoryview(srcs[w])
        for i in range(w, nops, qd):
            if mode == "read":
                await b.read(keys[i], into=buf)
            else:
                a = await b.allocate(keys[i], bs)
                await b.write(a, buf)

    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for w in range(qd):
            tg.start_soon(worker, w)
    return nops * bs / (time.perf_counter() - t0) / 1e6


async def bench(root: Path, reps: int, mib: int) -> None:
    print(f"nvme queue-depth sweep in {root} ({mib} MiB per pass, median of {reps})")
    hdr = (
        f"{'block':>8} {'QD':>3} | {'raw rd':>8} {'nvme rd':>8} {'ratio':>6} | "
        f"{'raw wr+sync':>11} {'nvme wr':>8} {'ratio':>6} | {'raw wr nosync':>13}"
    )
    print(hdr)
    print("-" * len(hdr))
    rows = []
    for bs in SIZES:
        nops = max(16, (mib << 20) // bs)
        raw = root / f"raw-{bs}.bin"
        await anyio.to_thread.run_sync(make_file, raw, nops * bs)
        for qd in QDS:
            d = root / f"nvme-{bs}-{qd}"
            opts = {"path": str(d), "capacity": nops * bs, "slot_bytes": bs, "queue_depth": qd}
            b = await NvmeBackend.open(opts)
            srcs = [mmap.mmap(-1, bs) for _ in range(qd)]
            for s in srcs:
                s.write(os.urandom(64) * (bs // 64))
            m: dict[str, list[float]] = {k: [] for k in ("rr", "rw", "rwn", "br", "bw")}
            try:
                for _ in range(reps):
                    m["rw"].append(await anyio.to_thread.run_sync(raw_pass, raw, bs, qd, nops, "write"))
                    m["bw"].append(await backend_pass(b, bs, qd, nops, "write", srcs))
                    m["rr"].append(await anyio.to_thread.run_sync(raw_pass, raw, bs, qd, nops, "read"))
                    m["br"].append(await backend_pass(b, bs, qd, nops, "read", srcs))
                    m["rwn"].append(await anyio.to_thread.run_sync(raw_pass, raw, bs, qd, nops, "write-nosync"))
            finally:
                await b.aclose()
                shutil.rmtree(d, ignore_errors=True)
            med = {k: statistics.median(v) for k, v in m.items()}
            rr, rw = med["br"] / med["rr"], med["bw"] / med["rw"]
            rows.append((bs, qd, rr, rw))
            print(
                f"{bs >> 10:>6}Ki {qd:>3} | {med['rr']:>8.0f} {med['br']:>8.0f} {rr:>6.2f} | "
                f"{med['rw']:>11.0f} {med['bw']:>8.0f} {rw:>6.2f} | {med['rwn']:>13.0f}"
            )
        raw.unlink()
    worst = min(min(r[2], r[3]) for r in rows)
    print(f"MB/s; ratios = nvme / raw O_DIRECT at the same block size and QD. worst ratio {worst:.2f} (target 0.9)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default=None, help="directory on the NVMe filesystem (default: a temp dir)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--mib", type=int, default=128)
    args = ap.parse_args()
    root = Path(args.dir or tempfile.mkdtemp(prefix="tierkv-bench-nvme-", dir="/var/tmp"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        anyio.run(bench, root, args.reps, args.mib)
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
