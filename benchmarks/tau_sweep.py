"""Sensitivity of the tierkv replay policy to its recency time constant ``tau``.

    python -m tierkv.lab.synth /tmp/synthetic_mixed.jsonl --shape mixed --seed 7
    python benchmarks/tau_sweep.py /tmp/synthetic_mixed.jsonl --split 0.4
    python benchmarks/tau_sweep.py tests/data/traces/mooncake_conversation_trace.jsonl --until 0.4 --split 0.5

Prints, per capacity (fraction of the distinct blocks of the replayed part), the prefix hit rate
(leading cached blocks / blocks of the measured requests) of LRU, ARC and tierkv at each ``tau``.
An analysis tool, not a benchmark of speed: one replay per cell.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tierkv.lab.policies import TierKVOptions, TierKVPolicy
from tierkv.lab.replay import Trace, load_trace, make_policy, replay, truncate


def prefix_hit_rate(trace: Trace, frac: float, split: float, opts: TierKVOptions | None, name: str) -> float:
    cap = max(1, round(frac * trace.distinct))
    t0 = trace.times[0]
    policy = TierKVPolicy(cap, opts) if opts is not None else make_policy(name, cap, trace)
    raw = replay(trace, policy, t0 + split * (trace.times[-1] - t0))
    return float(sum(raw["leads"])) / max(1, raw["accesses"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--taus", default="30,60,120,300", help="seconds, comma-separated")
    ap.add_argument("--capacity", default="0.01,0.05,0.10")
    ap.add_argument("--split", type=float, default=0.4)
    ap.add_argument("--until", type=float, default=1.0)
    args = ap.parse_args()
    trace = load_trace(args.trace)
    if args.until < 1.0:
        trace = truncate(trace, args.until)
    taus = [float(t) for t in args.taus.split(",")]
    print(f"{'capacity':>8} {'lru':>7} {'arc':>7} " + " ".join(f"{'tau ' + format(t, 'g'):>8}" for t in taus))
    for frac in (float(c) for c in args.capacity.split(",")):
        base = [prefix_hit_rate(trace, frac, args.split, None, n) for n in ("lru", "arc")]
        row = [prefix_hit_rate(trace, frac, args.split, TierKVOptions(tau_s=t), "lab-tierkv") for t in taus]
        print(f"{frac:>8.0%} {base[0]:>7.4f} {base[1]:>7.4f} " + " ".join(f"{v:>8.4f}" for v in row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
