"""One table from ``tierkv replay --json`` outputs: per trace and capacity, the prefix hit rate of the
classical baselines, Belady, and one policy (the shipped one), its margin over the best classical policy
and the fraction of the LRU -> Belady gap it closes.

Run: ``python benchmarks/replay_table.py [--policy tierkv-adaptive] OUT1.json [OUT2.json ...]``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

CLASSICAL = ("lru", "arc", "s3fifo", "tinylfu")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--policy", default="tierkv-adaptive")
    ap.add_argument("json", nargs="+")
    args = ap.parse_args()
    cols = (*CLASSICAL, "belady", args.policy)
    print(
        f"{'trace':<28}{'cap':>5}" + "".join(f"{c[:14]:>15}" for c in cols) + f"{'vs best cl.':>13}{'gap closed':>12}"
    )
    worst, gaps = 1.0, []
    for path in args.json:
        d = json.loads(Path(path).read_text())
        name = Path(d["trace"]).stem[:27]
        by: dict[float, dict[str, float]] = {}
        for r in d["results"]:
            by.setdefault(r["capacity_fraction"], {})[r["policy"]] = r["prefix_hit_rate"]
        for cap in sorted(by):
            row = by[cap]
            if args.policy not in row:
                continue
            best = max(row[c] for c in CLASSICAL if c in row)
            margin = row[args.policy] - best
            worst = min(worst, margin)
            gap = row.get("belady", 0.0) - row["lru"]
            closed = (row[args.policy] - row["lru"]) / gap if gap > 0.01 else None
            if closed is not None:
                gaps.append(closed)
            cells = "".join(f"{row[c]:>15.4f}" if c in row else f"{'-':>15}" for c in cols)
            print(
                f"{name:<28}{cap * 100:>4.0f}%{cells}{margin:>+13.4f}"
                + (f"{closed * 100:>11.1f}%" if closed is not None else f"{'-':>12}")
            )
    if gaps:
        print(
            f"# worst margin over the best classical policy: {worst:+.4f}; mean gap closed "
            f"(Belady > LRU + 0.01): {100 * sum(gaps) / len(gaps):.1f}% over {len(gaps)} rows"
        )


if __name__ == "__main__":
    main()
