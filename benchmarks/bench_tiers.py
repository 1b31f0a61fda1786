"""Throughput of the DRAM and PFS tiers against the raw operation they wrap.

    python benchmarks/bench_tiers.py [--quick] [--json OUT] [--pfs-dir DIR]

DRAM: batched ``allocate_many + write_many`` (put) and ``read_many(into=...)``
(get) against ``np.copyto`` of the same blocks into a preallocated destination.
PFS: batched put (sha256 content address, a content file per block published with
``O_TMPFILE`` + ``linkat``, a hard-link record, fsync) against ``os.pwrite`` + ``fsync``
of one new file per block; a third put side, the floor, does the raw put with a
sha256 of each block first (what any sha256-addressed store must add); and batched get (read + xxh3 check) against
``os.preadv`` of the same files, both into preallocated caller buffers, hot (page cache) and cold (pages dropped with
``posix_fadvise(DONTNEED)`` before each repetition, for both sides). The tier keeps
descriptors of records it has read open (``open_files``) while the raw reference opens
each file per read, as a plain file-per-block client does; an informative fourth hot
side reads the raw files through descriptors opened before the timing. The raw
side is the faster of one thread and the tier's concurrency (8 threads). The PFS
sides (raw on 1 thread, raw on 8, the tier) are interleaved repetition by
repetition in a rotating order, so that drift of the machine moves all alike.
Every figure is the median of at least 5 repetitions; ratio = raw time / tier time.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anyio
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tierkv_backends.dram import DramBackend
from tierkv_backends.pfs import PfsBackend

KiB, MiB = 1 << 10, 1 << 20
SIZES = (16 * KiB, 256 * KiB, 2 * MiB)


def _timed(fn: Callable[[], None], setup: Callable[[], None] | None = None) -> float:
    if setup is not None:
        setup()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


async def _atimed(fn: Callable[[], Any], setup: Callable[[], Any] | None = None) -> float:
    if setup is not None:
        await setup()
    t0 = time.perf_counter()
    await fn()
    return time.perf_counter() - t0


async def bench_dram(total: int, reps: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    b = await DramBackend.open({"capacity": 2 * total + 64 * MiB})
    rng = np.random.default_rng(0)
    for size in SIZES:
        n = max(1, total // size)
        srcs = [rng.integers(0, 256, size, dtype=np.uint8) for _ in range(n)]
        dsts = [np.empty(size, dtype=np.uint8) for _ in range(n)]
        for d in dsts:
            d.fill(1)
        keys = [f"b{size}-{i}" for i in range(n)]
        items = [(k, size, b"") for k in keys]

        def raw_copy(srcs: list[Any] = srcs, dsts: list[Any] = dsts) -> None:
            for s, d in zip(srcs, dsts, strict=True):
                np.copyto(d, s)

        raw_copy()
        t_raws: list[float] = []
        t_puts: list[float] = []
        t_gets: list[float] = []
        for _ in range(reps):  # interleaved so that drift of the VM hits both sides alike
            t0 = time.perf_counter()
            raw_copy()
            t1 = time.perf_counter()
            allocs = await b.allocate_many(items)
            await b.write_many(allocs, srcs)
            t2 = time.perf_counter()
            await b.read_many(keys, into=dsts)
            t3 = time.perf_counter()
            await b.evict_many(keys)
            t_raws.append(t1 - t0)
            t_puts.append(t2 - t1)
            t_gets.append(t3 - t2)
        raw, t_put, t_get = (statistics.median(x) for x in (t_raws, t_puts, t_gets))
        assert all(np.array_equal(s, d) for s, d in zip(srcs, dsts, strict=True))
        rows.append(
            {
                "tier": "dram",
                "block_bytes": size,
                "blocks_per_call": n,
                "raw": "np.copyto",
                "raw_GBps": n * size / raw / 1e9,
                "put_GBps": n * size / t_put / 1e9,
                "get_GBps": n * size / t_get / 1e9,
                "put_ratio": raw / t_put,
                "get_ratio": raw / t_get,
                "put_us_per_block": t_put / n * 1e6,
                "get_us_per_block": t_get / n * 1e6,
                "raw_us_per_block": raw / n * 1e6,
            }
        )
    await b.aclose()
    return rows


def _drop_cache(paths: list[Path]) -> None:
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


async def bench_pfs(root: Path, total: int, reps: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    b = await PfsBackend.open({"path": str(root / "store"), "capacity": 4 * total + 64 * MiB})
    pool = ThreadPoolExecutor(b.capabilities.max_concurrency)
    rawdir = root / "raw"
    rawdir.mkdir(exist_ok=True)
    rng = np.random.default_rng(1)
    for size in SIZES:
        n = max(4, min(1024, total // size))
        srcs = [rng.integers(0, 256, size, dtype=np.uint8) for _ in range(n)]
        keys = [f"p{size}-{i}" for i in range(n)]
        items = [(k, size, b"") for k in keys]
        rawpaths = [rawdir / f"{size}-{i}" for i in range(n)]

        def put_one(p: Path, s: Any) -> None:
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.pwrite(fd, s.data, 0)
                os.fsync(fd)
            finally:
                os.close(fd)

        # both sides read into preallocated caller buffers (an engine reads into its KV buffers)
        dsts = [np.empty(size, dtype=np.uint8) for _ in range(n)]
        slot = {p: d for p, d in zip(rawpaths, dsts, strict=True)}

        def get_one(p: Path, slot: dict[Path, Any] = slot) -> None:
            fd = os.open(p, os.O_RDONLY)
            try:
                os.preadv(fd, [slot[p]], 0)
            finally:
                os.close(fd)

        def raw_put(rawpaths: list[Path] = rawpaths, srcs: list[Any] = srcs) -> None:
            for p, s in zip(rawpaths, srcs, strict=True):
                put_one(p, s)

        def raw_get(rawpaths: list[Path] = rawpaths) -> None:
            for p in rawpaths:
                get_one(p)

        held: list[int] = []

        def open_raw(rawpaths: list[Path] = rawpaths, held: list[int] = held) -> None:
            held[:] = [os.open(p, os.O_RDONLY) for p in rawpaths]

        def close_raw(held: list[int] = held) -> None:
            for fd in held:
                os.close(fd)
            held.clear()

        def raw_get_fd(held: list[int] = held, dsts: list[Any] = dsts) -> None:
            preadv = os.preadv
            for fd, dst in zip(held, dsts, strict=True):
                preadv(fd, [dst], 0)

        def raw_put_par(rawpaths: list[Path] = rawpaths, srcs: list[Any] = srcs) -> None:
            list(pool.map(put_one, rawpaths, srcs))

        def put_one_sha(p: Path, s: Any) -> None:
            hashlib.sha256(s).digest()
            put_one(p, s)

        def floor_put(rawpaths: list[Path] = rawpaths, srcs: list[Any] = srcs) -> None:
            list(pool.map(put_one_sha, rawpaths, srcs))

        def raw_get_par(rawpaths: list[Path] = rawpaths) -> None:
            list(pool.map(get_one, rawpaths))

        async def put(items: list[tuple[str, int, bytes]] = items, srcs: list[Any] = srcs) -> None:
            allocs = await b.allocate_many(items)
            await b.write_many(allocs, srcs)

        async def clear(keys: list[str] = keys) -> None:
            await b.evict_many(keys)

        async def get(keys: list[str] = keys, dsts: list[Any] = dsts) -> None:
            await b.read_many(keys, into=dsts)

        def drop_raw(rawpaths: list[Path] = rawpaths) -> None:
            _drop_cache(rawpaths)

        def unlink_raw(rawpaths: list[Path] = rawpaths) -> None:
            for p in rawpaths:
                p.unlink(missing_ok=True)

        async def drop_tier() -> None:
            _drop_cache([p for p in (root / "store" / "objects").rglob("*") if p.is_file()])

        # The three sides of each figure (raw on 1 thread, raw on the tier's concurrency,
        # the tier) are interleaved repetition by repetition, in an order that rotates, so
        # that a machine whose speed drifts (this one's does, from second to second) moves
        # all of them alike; the raw reference is the better of its two medians.
        # A put stores new blocks on both sides: the tier's keys are evicted after each of its
        # puts and the raw files are removed after each raw put (both untimed), so every raw put
        # creates its files, as a file-per-block store does for new blocks (rewriting existing
        # files would skip the inode allocation the tier pays for its record links).
        t: dict[str, list[float]] = {}

        async def side(name: str, t: dict[str, list[float]] = t) -> None:
            op, who = name.split(":")
            if who == "tier":
                if op == "put":
                    v = await _atimed(put)
                    await clear()
                elif op == "hot":
                    v = await _atimed(get)
                else:
                    v = await _atimed(get, drop_tier)
            else:
                fn = {
                    ("put", "1"): raw_put,
                    ("put", "8"): raw_put_par,
                    ("put", "sha"): floor_put,
                    ("hot", "1"): raw_get,
                    ("hot", "8"): raw_get_par,
                    ("hot", "fd"): raw_get_fd,
                    ("cold", "1"): raw_get,
                    ("cold", "8"): raw_get_par,
                }[(op, who)]
                v = _timed(fn, drop_raw if op == "cold" else None)
                if op == "put":
                    unlink_raw()
            t.setdefault(name, []).append(v)

        for op in ("put", "hot", "cold"):
            if op != "put":
                await put()  # the tier's blocks for the reads
                await get()
                if not rawpaths[0].exists():
                    raw_put()  # the raw files for the reads
            os.sync()  # start each figure with nothing left to write back (both sides alike)
            names = [f"{op}:1", f"{op}:8", f"{op}:tier"] + (["put:sha"] if op == "put" else [])
            if op == "hot":
                names.append("hot:fd")
                open_raw()
            for rep in range(reps):
                k = rep % len(names)
                for name in (names[k:] + names[:k])[:: -1 if rep % 2 else 1]:
                    await side(name)
            if op == "hot":
                close_raw()
            if op != "put":
                await clear()
        med = {k: statistics.median(v) for k, v in t.items()}
        t_raw_put = min(med["put:1"], med["put:8"])
        t_raw_get = min(med["hot:1"], med["hot:8"])
        t_raw_cold = min(med["cold:1"], med["cold:8"])
        t_put, t_get, t_cold = med["put:tier"], med["hot:tier"], med["cold:tier"]
        rows.append(
            {
                "tier": "pfs",
                "block_bytes": size,
                "blocks_per_call": n,
                "raw": "os.pwrite+fsync / os.pread, the better of 1 thread and 8 threads",
                "raw_open_fds": "os.preadv on descriptors opened before the timing, 1 thread (informative)",
                "raw_put_MBps": n * size / t_raw_put / 1e6,
                "put_MBps": n * size / t_put / 1e6,
                "raw_get_hot_MBps": n * size / t_raw_get / 1e6,
                "get_hot_MBps": n * size / t_get / 1e6,
                "raw_get_hot_open_fds_MBps": n * size / med["hot:fd"] / 1e6,
                "get_hot_ratio_open_fds": med["hot:fd"] / t_get,
                "raw_get_cold_MBps": n * size / t_raw_cold / 1e6,
                "get_cold_MBps": n * size / t_cold / 1e6,
                "floor_put_MBps": n * size / med["put:sha"] / 1e6,
                "put_ratio": t_raw_put / t_put,
                "floor_put_ratio": t_raw_put / med["put:sha"],
                "get_hot_ratio": t_raw_get / t_get,
                "get_cold_ratio": t_raw_cold / t_cold,
            }
        )
    await b.aclose()
    pool.shutdown()
    return rows


def _fmt(size: int) -> str:
    return f"{size // MiB} MiB" if size >= MiB else f"{size // KiB} KiB"


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    reps = max(5, args.reps)
    total = (16 if args.quick else 64) * MiB
    rows = await bench_dram(total, reps)
    print(f"DRAM tier vs np.copyto (batched calls of {total // MiB} MiB, median of {reps})")
    print(
        f"{'block':>8} {'blocks':>6} {'raw GB/s':>9} {'put GB/s':>9} {'get GB/s':>9} {'put x':>6} {'get x':>6}"
        f" {'put us/blk':>10} {'get us/blk':>10} {'raw us/blk':>10}"
    )
    for r in rows:
        print(
            f"{_fmt(r['block_bytes']):>8} {r['blocks_per_call']:>6} {r['raw_GBps']:>9.2f} {r['put_GBps']:>9.2f}"
            f" {r['get_GBps']:>9.2f} {r['put_ratio']:>6.2f} {r['get_ratio']:>6.2f} {r['put_us_per_block']:>10.1f}"
            f" {r['get_us_per_block']:>10.1f} {r['raw_us_per_block']:>10.1f}"
        )
    with tempfile.TemporaryDirectory(dir=args.pfs_dir) as d:
        # 256 MiB per figure (up to 1024 blocks): 32 MiB of page-cache reads took 2-4 ms, too
        # short to tell the tier from fixed costs and the machine's hiccups
        prow = await bench_pfs(Path(d), (8 if args.quick else 256) * MiB, reps)
    where = args.pfs_dir or tempfile.gettempdir()
    print(
        f"\nPFS tier vs os.pwrite+fsync / os.pread on {where} (median of {reps}; get = read + xxh3 verify;"
        " raw = best of 1 and 8 threads; floor = raw put on 8 threads + sha256 of each block;"
        " fd hot = raw hot gets on descriptors opened before the timing, as the tier's open_files holds them)"
    )
    print(
        f"{'block':>8} {'blocks':>6} {'rawput MB/s':>11} {'put MB/s':>9} {'put x':>6} {'floor x':>7} {'rawget hot':>10}"
        f" {'get hot':>8} {'hot x':>6} {'fd hot':>7} {'fd x':>5} {'rawget cold':>11} {'get cold':>8} {'cold x':>6}"
    )
    for r in prow:
        print(
            f"{_fmt(r['block_bytes']):>8} {r['blocks_per_call']:>6} {r['raw_put_MBps']:>11.0f} {r['put_MBps']:>9.0f}"
            f" {r['put_ratio']:>6.2f} {r['floor_put_ratio']:>7.2f} {r['raw_get_hot_MBps']:>10.0f} {r['get_hot_MBps']:>8.0f}"
            f" {r['get_hot_ratio']:>6.2f} {r['raw_get_hot_open_fds_MBps']:>7.0f} {r['get_hot_ratio_open_fds']:>5.2f}"
            f" {r['raw_get_cold_MBps']:>11.0f} {r['get_cold_MBps']:>8.0f}"
            f" {r['get_cold_ratio']:>6.2f}"
        )
    return rows + prow


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smaller batches")
    p.add_argument("--reps", type=int, default=7, help="repetitions per figure (at least 5)")
    p.add_argument("--json", metavar="OUT", help="write the rows as JSON")
    p.add_argument("--pfs-dir", default=None, help="directory for the PFS runs (default: the temp dir)")
    args = p.parse_args(argv)
    rows = anyio.run(main_async, args)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
