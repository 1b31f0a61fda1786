"""Envelope of the ``rdma`` backend against the raw Mooncake client, same run, same loopback.

Starts a private ``mooncake_master`` on 127.0.0.1, opens one RdmaBackend (protocol
auto: TCP here, which stands in for RDMA) and, for 1 MiB and 4 MiB blocks, moves
``--mib`` MiB per side and round, three sides interleaved in every round (the order
rotates and reverses from round to round, after one untimed warm-up round):

* tierkv: as the certify envelope drives a backend: batches of 8 MiB
  (``allocate_many`` + ``write_many``; ``read_many(into=...)`` into caller buffers
  allocated and touched before the clock starts) by ``max_concurrency`` tasks;
  every block carries its header and xxh3 checksum, every read is verified;
* raw: ``RdmaBackend.raw_reference``: the same client and batches, ``batch_put_from``
  / ``batch_get_into`` from/into the registered arena, on the thread count (1, 2 or 4)
  that is fastest for it; no header, no checksum, no bookkeeping;
* floor: what any anyio library pays at least on this path: the tier's batches by
  the same ``max_concurrency`` tasks, each batch one ``anyio.to_thread.run_sync``
  hop (with a limiter) around the tier's own TCP call
  (``batch_put_from_multi_buffers`` / ``batch_get_into_multi_buffers``: header
  from the arena, payload in place), nothing else: no header contents, no
  checksum, no bookkeeping, no error handling;
* raw+xxh3: the raw side plus one xxh3-64 pass over every byte it moved (of the
  source before each put, of each block after its get) on the same threads: what
  any client that checks every byte it returns must at least pay here, so the
  ceiling of a verifying tier on this machine.

Prints, per block size and op, the raw side's median (GB/s) and, for every other
side, the ratio of its median to raw's and the median of its per-round ratios.
Usage: ``python benchmarks/bench_rdma.py [--rounds 15] [--mib 128] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import numpy as np
import xxhash
from tierkv_conformance._envelope import batch_blocks

from tierkv_backends.rdma import RdmaBackend

SIDES = ("tierkv", "floor", "raw", "raw+xxh3")


async def _tierkv(b: RdmaBackend, size: int, count: int, rnd: int, pools: list[list[np.ndarray]]) -> dict[str, float]:
    data = np.random.default_rng(rnd + 1).integers(0, 256, size, dtype=np.uint8)
    keys = [f"bench{size}r{rnd + 1}b{i}" for i in range(count)]
    per = batch_blocks(size, count)
    out: dict[str, float] = {}
    for op in ("write", "read"):
        parts = iter([keys[i : i + per] for i in range(0, count, per)])

        async def worker(outs: list[np.ndarray], op: str = op, parts: Any = parts) -> None:
            for part in parts:
                if op == "write":
                    allocs = await b.allocate_many([(k, size, b"") for k in part])
                    await b.write_many(allocs, [data] * len(part))
                else:
                    await b.read_many(part, into=outs[: len(part)])

        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for outs in pools:
                tg.start_soon(worker, outs)
        out[op] = size * count / (time.perf_counter() - t0) / 1e9
    check = await b.read_many(keys[-per:], into=[np.empty(size, np.uint8) for _ in range(per)])
    if not all(bytes(v) == data.tobytes() for v in check):  # untimed
        raise SystemExit("wrong bytes")
    await b.evict_many(keys)
    return out


async def _floor(b: RdmaBackend, size: int, count: int, rnd: int, pools: list[list[np.ndarray]]) -> dict[str, float]:
    store, staging = b._store, b._staging
    assert store is not None and staging is not None
    data = np.random.default_rng(rnd + 7).integers(0, 256, size, dtype=np.uint8)
    src = int(data.ctypes.data)
    keys = [f"tierkv/{b.namespace}/__floor__{rnd + 1}.{i}" for i in range(count)]
    per = batch_blocks(size, count)
    conc = b.capabilities.max_concurrency
    limiter = anyio.CapacityLimiter(conc)
    head = 64
    hdr = staging.alloc_many([conc * per * head], time.monotonic() + 30)[0]
    out: dict[str, float] = {}
    try:
        for op in ("write", "read"):
            parts = iter([keys[i : i + per] for i in range(0, count, per)])

            async def worker(w: int, op: str = op, parts: Any = parts) -> None:
                dst = [int(o.ctypes.data) for o in pools[w]]
                hs = [staging.ptr + hdr + (w * per + j) * head for j in range(per)]
                for part in parts:
                    n = len(part)
                    if op == "write":
                        ptrs = [[hs[j], src] for j in range(n)]
                        call = partial(store.batch_put_from_multi_buffers, part, ptrs, [[head, size]] * n)
                    else:
                        ptrs = [[hs[j], dst[j]] for j in range(n)]
                        call = partial(store.batch_get_into_multi_buffers, part, ptrs, [[head, size]] * n)
                    await anyio.to_thread.run_sync(call, limiter=limiter)

            t0 = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for w in range(conc):
                    tg.start_soon(worker, w)
            out[op] = size * count / (time.perf_counter() - t0) / 1e9
    finally:
        store.batch_remove(keys, True)
        staging.free_many([hdr], [conc * per * head])
    return out


def _raw_xxh3(b: RdmaBackend, op: str, size: int, count: int, threads: int, rnd: int) -> float:
    """The raw client's batches on ``threads`` threads plus one xxh3 pass over every byte moved."""
    store, staging = b._store, b._staging
    assert store is not None and staging is not None
    per = batch_blocks(size, count)
    keys = [f"tierkv/{b.namespace}/__rawx__{rnd}.{i}" for i in range(count)]
    batches = [keys[i : i + per] for i in range(0, count, per)]
    offs = staging.alloc_many([per * size] * threads, time.monotonic() + 30)
    for off in offs:
        staging.array[off : off + per * size] = 0x5A
    try:
        if op == "read":
            for part in batches:
                store.batch_put_from(part, [staging.ptr + offs[0]] * len(part), [size] * len(part))
        todo = iter(batches)
        lock = threading.Lock()

        def worker(off: int) -> None:
            ptrs = [staging.ptr + off + j * size for j in range(per)]
            views = [staging.view[off + j * size : off + (j + 1) * size] for j in range(per)]
            while True:
                with lock:
                    part = next(todo, None)
                if part is None:
                    return
                n = len(part)
                if op == "write":
                    for _ in range(n):
                        xxhash.xxh3_64_intdigest(views[0])
                    store.batch_put_from(part, [ptrs[0]] * n, [size] * n)
                else:
                    store.batch_get_into(part, ptrs[:n], [size] * n)
                    for j in range(n):
                        xxhash.xxh3_64_intdigest(views[j])

        pool = [threading.Thread(target=worker, args=(off,)) for off in offs]
        t0 = time.perf_counter()
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        return size * count / (time.perf_counter() - t0) / 1e9
    finally:
        store.batch_remove(keys, True)
        staging.free_many(offs, [per * size] * threads)


async def _side(
    b: RdmaBackend, side: str, size: int, count: int, rnd: int, pools: list[list[np.ndarray]]
) -> dict[str, float]:
    conc = b.capabilities.max_concurrency
    if side == "tierkv":
        return await _tierkv(b, size, count, rnd, pools)
    if side == "floor":
        return await _floor(b, size, count, rnd, pools)
    out: dict[str, float] = {}
    for op in ("write", "read"):
        m = await b.raw_reference(op, size, count, conc)  # calibrates its thread count on first use
        if side == "raw":
            out[op] = m.gbps
        else:
            threads = int(m.method.split(" thread")[0].rsplit(" ", 1)[1])
            out[op] = await anyio.to_thread.run_sync(_raw_xxh3, b, op, size, count, threads, rnd)
    return out


def _q(xs: list[float]) -> tuple[float, float, float]:
    if len(xs) < 2:
        return xs[0], xs[0], xs[0]
    q = statistics.quantiles(xs, n=4)
    return q[0], statistics.median(xs), q[2]


async def run(rounds: int, mib: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-rdma-") as tmp:
        opts = RdmaBackend.default_options(Path(tmp))
        opts.update({"global_segment_size": "2GiB", "capacity": "1GiB"})
        b = await RdmaBackend.open(opts, name="rdma")
        try:
            st = b.stats()
            result: dict[str, Any] = {"io_path": st.io_path, "emulated": st.emulated, "rounds": rounds, "sizes": {}}
            for size in (1 << 20, 4 << 20):
                count = max(8, (mib << 20) // size)
                per = batch_blocks(size, count)
                # the caller's read buffers, allocated and touched before the clock starts, as the
                # raw side's registered arena is (first-touch page faults belong to the caller)
                pools = [[np.ones(size, np.uint8) for _ in range(per)] for _ in range(b.capabilities.max_concurrency)]
                got: dict[str, dict[str, list[float]]] = {s: {"write": [], "read": []} for s in SIDES}
                for side in SIDES:  # warm-up, untimed
                    await _side(b, side, size, count, -1, pools)
                for rnd in range(rounds):
                    order = list(SIDES[rnd % len(SIDES) :] + SIDES[: rnd % len(SIDES)])
                    for side in order[::-1] if rnd % 2 else order:
                        for op, g in (await _side(b, side, size, count, rnd, pools)).items():
                            got[side][op].append(g)
                row: dict[str, Any] = {"blocks": count, "batch": per}
                for op in ("write", "read"):
                    raw = got["raw"][op]
                    for side in SIDES:
                        row[f"{side}_{op}_gbps"] = statistics.median(got[side][op])
                        row[f"{side}_{op}_all"] = [round(x, 3) for x in got[side][op]]
                    for side in ("tierkv", "floor", "raw+xxh3"):
                        paired = [x / r for x, r in zip(got[side][op], raw, strict=True)]
                        row[f"{side}_{op}_ratio"] = statistics.median(got[side][op]) / statistics.median(raw)
                        row[f"{side}_{op}_paired"] = _q(paired)
                m = await b.raw_reference("read", size, count, b.capabilities.max_concurrency)
                row["raw_method"] = m.method
                result["sizes"][f"{size >> 20}MiB"] = row
            return result
        finally:
            await b.aclose()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--mib", type=int, default=128, help="MiB moved per side, op and round")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    res = anyio.run(run, args.rounds, args.mib)
    print(f"io_path={res['io_path']} emulated={res['emulated']} (medians of {args.rounds} interleaved rounds)")
    others = [x for x in SIDES if x != "raw"]
    print(
        f"{'block':>6} {'op':>5} {'raw GB/s':>8}  "
        + "  ".join(f"{x + '/raw':>16}" for x in others)
        + "   (each: ratio of medians [median of per-round ratios])"
    )
    for size, row in res["sizes"].items():
        for op in ("write", "read"):
            cells = [f"{row[f'{x}_{op}_ratio']:7.2f} [{row[f'{x}_{op}_paired'][1]:.2f}]" for x in others]
            print(f"{size:>6} {op:>5} {row[f'raw_{op}_gbps']:8.2f}  " + "  ".join(f"{c:>16}" for c in cells))
        print(f"{'':>6} raw reference: {row['raw_method']}")
    if args.json:
        args.json.write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
