"""Queue-depth sweep of the NVMe tier's batch calls against raw O_DIRECT preadv/pwritev in the same run.

For each block size (256 KiB, 2 MiB) and queue depth (1, 2, 4, 8, 16) it moves the same
bytes, in batches of ``--batch-mib`` MiB, through:

* raw read:  a thread pool of QD workers doing ``os.preadv`` of page-aligned buffers from
             an O_DIRECT file on the same filesystem
* raw write: a thread pool of QD workers doing ``os.pwritev`` of every block of the batch,
             then one ``os.fdatasync`` per batch (the durable reference: the tier
             acknowledges a batch only once it is durable)
* nvme read / write: ``NvmeBackend(queue_depth=QD, slot_bytes=BS)``:
             ``read_many(keys, into=...)`` and ``allocate_many`` + ``write_many`` per batch,
             page-aligned source and destination buffers

Every figure is the median of ``--reps`` (>= 5) repetitions, raw and tier interleaved;
ratio = tier MB/s / raw MB/s at the same block size and QD. Target: >= 0.9 for both sizes.
Run: ``python benchmarks/bench_nvme.py [--dir DIR] [--reps N] [--mib MiB] [--batch-mib MiB] [--qd 1,4]``.
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
        f.write(os.urandom(1 << 20) * max(1, nbytes >> 20))
        f.flush()
        os.fsync(f.fileno())


def raw_pass(path: Path, bs: int, qd: int, nops: int, per_batch: int, mode: str, bufs: list[mmap.mmap]) -> float:
    """MB/s of QD threads doing O_DIRECT preadv (read) or pwritev + one fdatasync per batch (write)."""
    fd = os.open(path, os.O_RDWR | os.O_DIRECT)
    views = [[memoryview(b)] for b in bufs]

    def one(i: int) -> None:
        iov = views[i % len(views)]
        if mode == "read":
            os.preadv(fd, iov, i * bs)
        else:
            os.pwritev(fd, iov, i * bs)

    try:
        with ThreadPoolExecutor(qd) as ex:
            t0 = time.perf_counter()
            for start in range(0, nops, per_batch):
                list(ex.map(one, range(start, min(nops, start + per_batch))))
                if mode == "write":
                    os.fdatasync(fd)
            dt = time.perf_counter() - t0
    finally:
        os.close(fd)
    return nops * bs / dt / 1e6


async def tier_pass(b: NvmeBackend, bs: int, nops: int, per_batch: int, mode: str, bufs: list[mmap.mmap]) -> float:
    keys = [f"blk{i}" for i in range(nops)]
    views = [memoryview(bufs[i % len(bufs)]) for i in range(nops)]
    if mode == "write":
        await b.evict_many(keys)
    t0 = time.perf_counter()
    for start in range(0, nops, per_batch):
        ks = keys[start : start + per_batch]
        vs = views[start : start + per_batch]
        if mode == "read":
            await b.read_many(ks, into=vs)
        else:
            allocs = await b.allocate_many([(k, bs, b"") for k in ks])
            await b.write_many(allocs, vs)
    return nops * bs / (time.perf_counter() - t0) / 1e6


async def bench(root: Path, reps: int, mib: int, batch_mib: int, qds: list[int]) -> None:
    print(
        f"nvme batch calls vs raw O_DIRECT in {root} ({mib} MiB per pass, batches of {batch_mib} MiB, median of {reps})"
    )
    hdr = f"{'block':>8} {'QD':>3} | {'raw rd':>8} {'nvme rd':>8} {'ratio':>6} | {'raw wr+sync':>11} {'nvme wr':>8} {'ratio':>6}"
    print(hdr)
    print("-" * len(hdr))
    rows = []
    for bs in SIZES:
        nops = max(16, (mib << 20) // bs)
        per_batch = max(1, (batch_mib << 20) // bs)
        raw = root / f"raw-{bs}.bin"
        await anyio.to_thread.run_sync(make_file, raw, nops * bs)
        # one page-aligned buffer per block of a batch, as a caller's batch would have
        bufs = [mmap.mmap(-1, bs) for _ in range(min(per_batch, nops))]
        for s in bufs:
            s.write(os.urandom(64) * (bs // 64))
        for qd in qds:
            d = root / f"nvme-{bs}-{qd}"
            opts = {"path": str(d), "capacity": nops * bs, "slot_bytes": bs, "queue_depth": qd}
            b = await NvmeBackend.open(opts)
            m: dict[str, list[float]] = {k: [] for k in ("rr", "rw", "br", "bw")}
            try:
                for _ in range(reps):
                    m["rw"].append(
                        await anyio.to_thread.run_sync(raw_pass, raw, bs, qd, nops, per_batch, "write", bufs)
                    )
                    m["bw"].append(await tier_pass(b, bs, nops, per_batch, "write", bufs))
                    m["rr"].append(await anyio.to_thread.run_sync(raw_pass, raw, bs, qd, nops, per_batch, "read", bufs))
                    m["br"].append(await tier_pass(b, bs, nops, per_batch, "read", bufs))
            finally:
                await b.aclose()
                shutil.rmtree(d, ignore_errors=True)
            med = {k: statistics.median(v) for k, v in m.items()}
            rr, rw = med["br"] / med["rr"], med["bw"] / med["rw"]
            rows.append((bs, qd, rr, rw))
            print(
                f"{bs >> 10:>6}Ki {qd:>3} | {med['rr']:>8.0f} {med['br']:>8.0f} {rr:>6.2f} | "
                f"{med['rw']:>11.0f} {med['bw']:>8.0f} {rw:>6.2f}",
                flush=True,
            )
        raw.unlink()
    worst = min(min(r[2], r[3]) for r in rows)
    print(f"MB/s; ratios = nvme / raw O_DIRECT at the same block size, QD and batch. worst {worst:.2f} (target 0.9)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default=None, help="directory on the NVMe filesystem (default: a temp dir in /var/tmp)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--mib", type=int, default=128, help="MiB moved per pass")
    ap.add_argument("--batch-mib", type=int, default=16, help="MiB per batch call (and per raw fdatasync)")
    ap.add_argument("--qd", default=",".join(map(str, QDS)), help="comma-separated queue depths")
    args = ap.parse_args()
    root = Path(args.dir or tempfile.mkdtemp(prefix="tierkv-bench-nvme-", dir="/var/tmp"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        anyio.run(bench, root, max(5, args.reps), args.mib, args.batch_mib, [int(q) for q in args.qd.split(",")])
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
