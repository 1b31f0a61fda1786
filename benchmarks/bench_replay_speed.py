"""Replay speed of each policy on the Mooncake conversation trace (block accesses per second).

Prints, per policy, the median over ``--reps`` repetitions of wall-clock and CPU accesses/s at one capacity,
and the ratio to the 200,000 accesses/s target of issue 4. Run:
``python benchmarks/bench_replay_speed.py [--trace PATH] [--capacity 0.05] [--reps 3]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from tierkv.lab.policies import next_use_index
from tierkv.lab.replay import load_trace, make_policy, replay

TARGET = 200_000.0
DEFAULT = Path(__file__).resolve().parent.parent / "tests" / "data" / "traces" / "mooncake_conversation_trace.jsonl"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", default=str(DEFAULT))
    ap.add_argument("--capacity", type=float, default=0.05)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--policies", default="lru,tinylfu,belady,tierkv,lab-tierkv")
    args = ap.parse_args()
    tr = load_trace(args.trace)
    cap = max(1, round(args.capacity * tr.distinct))
    nu = next_use_index(tr.blocks)
    print(f"trace {Path(args.trace).name}: {tr.accesses} accesses, capacity {cap} blocks, {args.reps} reps")
    print(f"{'policy':<28}{'wall acc/s':>14}{'cpu acc/s':>14}{'cpu / target':>14}")
    for name in args.policies.split(","):
        wall, cpu = [], []
        for _ in range(args.reps):
            pol = make_policy(name, cap, tr, nu)
            c0 = time.process_time()
            try:
                raw = replay(tr, pol, split_time=float("inf"))
            finally:
                close = getattr(pol, "close", None)
                if close is not None:
                    close()  # the library policy runs an event-loop thread
            cpu.append(tr.accesses / (time.process_time() - c0))
            wall.append(tr.accesses / raw["seconds"])
        w, c = statistics.median(wall), statistics.median(cpu)
        print(f"{name:<28}{w:>14,.0f}{c:>14,.0f}{c / TARGET:>14.2f}")


if __name__ == "__main__":
    main()
