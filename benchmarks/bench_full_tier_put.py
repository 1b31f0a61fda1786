"""A put's cost per new block into a full tier and into one with room, on a real request stream.

Drives a real :class:`~tierkv.TierKV` as the replay's ``tierkv`` policy does
(:mod:`tierkv.lab.policies.library`: one DRAM tier of ``--capacity`` x the trace's distinct blocks,
4 KiB blocks of 16 tokens, the scheduler's clock set to the trace's timestamps, lookup then put per
request) over the first ``--warm`` requests of the trace, then times ``lookup`` and ``put`` over the
next ``--measure`` requests. Prints, per policy, the median over ``--reps`` of the put's time per
new block and the lookup's per block access, and the prefix hits of the measured requests (a
placement change shows there). Run:
``python benchmarks/bench_full_tier_put.py [--trace PATH] [--capacity 0.05] [--policies lru,predictive,default]``
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import anyio
import numpy as np

from tierkv import TierKV
from tierkv.lab.policies.library import library_config, tokens_of
from tierkv.lab.replay import load_trace

DEFAULT = Path(__file__).resolve().parent.parent / "tests" / "data" / "traces" / "mooncake_conversation_trace.jsonl"


async def one(trace: object, cap: int, policy: str | None, warm: int, measure: int) -> tuple[float, float, int]:
    kv = await TierKV.open(library_config(cap, policy))
    clock = [0.0]
    kv._sched.now = lambda: clock[0]  # type: ignore[method-assign]  # the trace's clock
    kv._sched.set_capacity_blocks(cap)
    put_s = look_s = 0.0
    new = acc = hits = 0
    try:
        reqs = list(zip(trace.times, trace.blocks, strict=True))[: warm + measure]  # type: ignore[attr-defined]
        for j, (t, ids) in enumerate(reqs):
            if not ids:
                continue
            clock[0] = t
            toks = tokens_of(ids)
            kv_zeros = np.zeros((1, 2, len(toks), 1, 64), dtype=np.float16)
            a = time.perf_counter()
            lead = (await kv.lookup(toks)).blocks
            b = time.perf_counter()
            res = await kv.put(toks, kv_zeros)
            c = time.perf_counter()
            if j >= warm:
                look_s += b - a
                put_s += c - b
                acc += len(ids)
                new += res.new_blocks
                hits += lead
    finally:
        await kv.aclose()
    return put_s / max(1, new), look_s / max(1, acc), hits


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", default=str(DEFAULT))
    ap.add_argument("--capacity", type=float, default=0.05, help="fraction of the trace's distinct blocks")
    ap.add_argument("--warm", type=int, default=3000)
    ap.add_argument("--measure", type=int, default=3000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--policies", default="lru,predictive,default")
    args = ap.parse_args()
    trace = load_trace(args.trace)
    cap = max(1, round(args.capacity * trace.distinct))
    print(f"trace {Path(args.trace).name}: capacity {cap} blocks, warm {args.warm}, measured {args.measure} requests")
    print(f"{'policy':<14}{'put us/new block':>18}{'lookup us/access':>18}{'prefix hits':>13}")
    for name in args.policies.split(","):
        policy = None if name == "default" else name
        runs = [anyio.run(one, trace, cap, policy, args.warm, args.measure) for _ in range(args.reps)]
        put = statistics.median(r[0] for r in runs) * 1e6
        look = statistics.median(r[1] for r in runs) * 1e6
        print(f"{name:<14}{put:>18.1f}{look:>18.1f}{runs[0][2]:>13,}")


if __name__ == "__main__":
    main()
