"""The lab table of issue 22: the shipped library's prefix hit rate on every synthetic shape at several
seeds and on the whole Mooncake conversation and synthetic traces, beside the classical policies and Belady.

Per trace and capacity (``--capacities``, in percent of its distinct blocks: 1 / 5 / 10 by default; split
0.4): LRU, ARC, S3-FIFO and W-TinyLFU (each of the last two also in a common variant, ``s3fifo-2`` and
``tinylfu-reset``: the best classical policy is the best of all six) and Belady (the lab's independent
implementations), and ``--policy`` (default ``tierkv-adaptive``: a real
``TierKV`` with the default policy, driven request by request), its margin over the best classical policy
in points, and the fraction of the LRU -> Belady gap it closes (where Belady is > 2 points above LRU). The
summary line counts the rows below the best classical policy (by more than 0.05 points), the worst
margin and the mean gap closed.

Synthetic traces are generated into ``--dir`` when missing (``python -m tierkv.lab.synth``; sessions per
shape as in ``benchmarks/results/2026-12-03-session8.txt``: bursty 1500, rag 2000, agent_tools 100, chat
1500, mixture 1500; and sysprompt 12000 requests, added in ``2026-12-04-session12.txt``). Rows run in ``--jobs`` processes. Run:
``python benchmarks/lab_table.py [--seeds 7,11,13] [--shapes ...] [--no-mooncake] [--jobs 2] [--until F]
[--capacities 1,5,10]``
(``--no-mooncake``: neither Mooncake trace; about 5-6 minutes on the 2-vCPU development VM). ``--until F``
replays only each trace's first ``F`` of its time span (``tierkv.lab.replay.truncate``), as a trace of its
own: capacities from its distinct blocks, the split at 0.4 of its span. Short traces are a check of their
own: an adaptive policy has only a few decisions to learn from (``--until 0.08``: 150-1,200 requests).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from multiprocessing import Pool
from pathlib import Path

from tierkv.lab.policies import next_use_index
from tierkv.lab.replay import CLASSICAL, load_trace, make_policy, replay, truncate

SESSIONS = {"bursty": 1500, "rag": 2000, "agent_tools": 100, "chat": 1500, "mixture": 1500, "sysprompt": 12000}
_TRACES = Path(__file__).resolve().parent.parent / "tests" / "data" / "traces"
MOONCAKE = _TRACES / "mooncake_conversation_trace.jsonl"
#: the release's synthetic workload (public datasets, Poisson arrivals), added in session 18
MOONCAKE_SYNTHETIC = _TRACES / "mooncake_synthetic_trace.jsonl"


def _row(job: tuple[str, str, float, str, float]) -> tuple[str, float, dict[str, float]]:
    label, path, cap, policy, until = job
    tr = load_trace(path)
    if until < 1.0:
        tr = truncate(tr, until)
    c = max(1, round(cap * tr.distinct))
    split = tr.times[0] + 0.4 * (tr.times[-1] - tr.times[0])
    nu = next_use_index(tr.blocks)
    out: dict[str, float] = {}
    for name in (*CLASSICAL, "belady", policy):
        pol = make_policy(name, c, tr, nu)
        try:
            raw = replay(tr, pol, split_time=split)
        finally:
            close = getattr(pol, "close", None)
            if close is not None:
                close()
        out[name] = sum(raw["leads"]) / max(1, raw["accesses"])
    return label, cap, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="7,11,13")
    ap.add_argument("--shapes", default=",".join(SESSIONS))
    ap.add_argument("--policy", default="tierkv-adaptive")
    ap.add_argument("--dir", default="/tmp/tierkv-lab-traces")
    ap.add_argument("--no-mooncake", action="store_true")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--until", type=float, default=1.0, help="replay each trace's first fraction of time only")
    ap.add_argument("--capacities", default="1,5,10", help="capacities in percent of each trace's distinct blocks")
    args = ap.parse_args()
    if not 0.0 < args.until <= 1.0:
        ap.error("--until must be in (0, 1]")
    try:
        caps = tuple(float(c) / 100.0 for c in args.capacities.split(","))
    except ValueError:
        ap.error("--capacities must be numbers separated by commas")
    if not all(0.0 < c <= 1.0 for c in caps):
        ap.error("--capacities must be in (0, 100]")
    caps = tuple(sorted(set(caps)))
    d = Path(args.dir)
    d.mkdir(parents=True, exist_ok=True)
    traces: list[tuple[str, str]] = (
        []
        if args.no_mooncake
        else [("mooncake (whole)", str(MOONCAKE)), ("mooncake-synth (whole)", str(MOONCAKE_SYNTHETIC))]
    )
    for seed in args.seeds.split(","):
        for shape in args.shapes.split(","):
            p = d / f"{shape}-{seed}.jsonl"
            if not p.exists():
                cmd = [sys.executable, "-m", "tierkv.lab.synth", str(p), "--shape", shape, "--seed", seed]
                subprocess.run(
                    [*cmd, "--sessions", str(SESSIONS[shape])],
                    check=True,
                    stdout=subprocess.DEVNULL,
                )
            traces.append((f"{shape} (seed {seed})", str(p)))
    if args.until < 1.0:
        first = f"first {100 * args.until:g}%"
        traces = [
            (label.replace("whole", first) if "whole" in label else label.replace(")", f", {first})"), path)
            for label, path in traces
        ]
    jobs = [(label, path, cap, args.policy, args.until) for label, path in traces for cap in caps]
    with Pool(args.jobs) as pool:
        rows = pool.map(_row, jobs, chunksize=1)
    w = max(22, *(len(label) + 1 for label, _ in traces))
    print(
        f"{'trace':<{w}}{'cap':>4} {'lru':>7} {'best classical':>20} {'belady':>7} {args.policy:>16} {'vs best':>8} {'gap':>5}"
    )
    below, worst, gaps = 0, 0.0, []
    for label, cap, r in rows:
        best = max(CLASSICAL, key=r.__getitem__)
        v = r[args.policy]
        margin = 100 * (v - r[best])
        span = r["belady"] - r["lru"]
        gap = (v - r["lru"]) / span if span > 0.02 else None
        if gap is not None:
            gaps.append(gap)
        below += margin < -0.05
        worst = min(worst, margin)
        print(
            f"{label:<{w}}{cap * 100:>3g}% {r['lru']:>7.4f} {best:>13} {r[best]:.4f} {r['belady']:>7.4f} {v:>16.4f}"
            f" {margin:>+8.1f} {'-' if gap is None else f'{100 * gap:.0f}%':>5}"
        )
    mean = 100 * sum(gaps) / len(gaps) if gaps else float("nan")
    print(
        f"{len(rows)} rows: {below} below the best classical policy by > 0.05 points, worst {worst:+.1f} points;"
        f" mean LRU->Belady gap closed {mean:.1f}% over the {len(gaps)} rows where Belady is > 2 points above LRU"
    )


if __name__ == "__main__":
    main()
