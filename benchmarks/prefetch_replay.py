"""RoPE-aware prefetch measured in a replay of decode-resume requests that carry positions.

    python benchmarks/prefetch_replay.py --seeds 0,1,2 --capacity 64,256,768

Per model spec (a Gemma-like 5 sliding : 1 global with window 1024, and the same geometry all global),
per global-layer read model (``sparse``: sinks + recent span + important blocks; ``dense``: every block)
and per fast-tier capacity (blocks), the mean (and standard deviation over the seeds) of: the fraction of
needed block-layer loads found in the fast tier at need time, the fraction of prefetched blocks wasted,
GiB promoted by the prefetch and GiB the misses loaded; for no prefetch, the old readahead [n, n + w],
the planner without and with head importance (:mod:`tierkv.lab.prefetch_eval`). An analysis, not a
benchmark of speed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tierkv.lab.prefetch_eval import POLICIES, Workload, all_global_spec, gemma_like_spec, mean_sd, simulate


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--capacity", default="64,256,768", help="fast-tier capacities in blocks")
    ap.add_argument("--budget", type=int, default=32, help="planner budget in blocks")
    ap.add_argument("--requests", type=int, default=1500)
    ap.add_argument("--lead", type=int, default=4, help="requests between a prefetch and its need")
    ap.add_argument("--reads", default="sparse,dense")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    w = Workload(requests=args.requests, lead=args.lead)
    print(
        f"workload: {w}\nbudget {args.budget} blocks, seeds {seeds}; "
        "cells: mean (sd) over seeds; hit = needed block-layer loads in the fast tier at need time"
    )
    for spec in (gemma_like_spec(), all_global_spec()):
        for reads in args.reads.split(","):
            print(f"\n== {spec.name}, global reads {reads} ==")
            print(f"{'capacity':>8} {'policy':>11} {'hit':>15} {'wasted':>15} {'promoted GiB':>14} {'demand GiB':>12}")
            for cap in (int(c) for c in args.capacity.split(",")):
                for policy in POLICIES:
                    rs = [simulate(spec, w, cap, policy, s, reads=reads, budget=args.budget) for s in seeds]
                    h, hs = mean_sd([r.hit for r in rs])
                    wa, ws = mean_sd([r.wasted for r in rs])
                    pg, _ = mean_sd([r.promoted_gib for r in rs])
                    dg, _ = mean_sd([r.demand_gib for r in rs])
                    print(
                        f"{cap:>8} {policy:>11} {h:>7.4f} ({hs:.4f}) {wa:>7.4f} ({ws:.4f}) {pg:>14.1f} {dg:>12.1f}",
                        flush=True,
                    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
