"""Where the library replay's time goes: the shipped policy's own work against the store's bookkeeping.

Replays the first ``--requests`` requests of a trace through the replay harness (the lab's ``tierkv``
policy, :class:`~tierkv.lab.policies.library.LibraryPolicy`: a real ``TierKV``, lookup then put) under
cProfile, on the store's event-loop thread, and sums each function's own time by where it lives: the
scheduler (``tierkv/scheduler/``, ``tierkv/_scheduling.py``: the policy), the engine (``tierkv/_engine/``:
index, tiers, durability), the backends, the harness, and everything else (numpy, the standard library).
Prints each share and the block accesses per second the run would reach if it did only that part (from
the unprofiled speed of the same requests, replayed first): a floor for a replay of the policy object
without the store. cProfile costs more per call than per instruction, so the shares are estimates.

Run: ``python benchmarks/replay_cost_split.py [--trace PATH] [--capacity 0.05] [--requests 3000]``.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import pstats
import time
from pathlib import Path

from tierkv.lab.policies.library import LibraryPolicy
from tierkv.lab.replay import load_trace

DEFAULT = Path(__file__).resolve().parent.parent / "tests" / "data" / "traces" / "mooncake_conversation_trace.jsonl"


def _part(filename: str) -> str:
    if "/scheduler/" in filename or filename.endswith("_scheduling.py"):
        return "scheduler (policy)"
    if "/_engine/" in filename:
        return "engine (store)"
    if "tierkv_backends" in filename:
        return "backends"
    if "/lab/" in filename:
        return "harness"
    return "other"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", default=str(DEFAULT))
    ap.add_argument("--capacity", type=float, default=0.05)
    ap.add_argument("--requests", type=int, default=3000)
    args = ap.parse_args()
    tr = load_trace(args.trace)
    cap = max(1, round(args.capacity * tr.distinct))
    reqs = list(zip(tr.blocks, tr.times, tr.tail_partial, strict=True))[: args.requests]
    accesses = sum(len(ids) for ids, _, _ in reqs)

    def replay_once(profile: cProfile.Profile | None) -> float:
        pol = LibraryPolicy(cap)

        async def run() -> float:
            t0 = time.process_time()
            if profile is not None:
                profile.enable()
            for ids, now, tail in reqs:
                pol._clock[0] = now
                await pol._request(ids, tail)
            if profile is not None:
                profile.disable()
            return time.process_time() - t0

        try:
            return pol._sync.call(run)
        finally:
            pol.close()

    plain = replay_once(None)
    prof = cProfile.Profile()
    replay_once(prof)
    own: collections.Counter[str] = collections.Counter()
    for (filename, _, _), row in pstats.Stats(prof).stats.items():  # type: ignore[attr-defined]
        own[_part(filename)] += row[2]
    total = sum(own.values())
    speed = accesses / plain
    print(f"trace {Path(args.trace).name}: first {len(reqs)} requests, {accesses} block accesses, capacity {cap}")
    print(f"unprofiled: {speed:,.0f} acc/s (cpu)")
    print(f"{'part':<22}{'share':>8}{'acc/s if only this':>22}")
    for part, t in own.most_common():
        share = t / total
        print(f"{part:<22}{share:>8.1%}{speed / share:>22,.0f}")


if __name__ == "__main__":
    main()
