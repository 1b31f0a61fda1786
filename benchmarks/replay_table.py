"""One table from ``tierkv replay --json`` outputs: per trace and capacity, the prefix hit rate of the
classical baselines (those the outputs have of LRU, ARC, S3-FIFO, W-TinyLFU and the variants ``s3fifo-2`` and
``tinylfu-reset``), Belady, and one policy (the shipped one), its margin over the best classical policy
and the fraction of the LRU -> Belady gap it closes.

Run: ``python benchmarks/replay_table.py [--policy tierkv-adaptive] [--per-shape] OUT1.json [OUT2.json ...]``;
``--per-shape`` adds, under each trace's rows, one row per (shape, capacity) from the rows' ``per_shape``
(traces whose requests carry ``shape``), named by the shape, indented; the summary line counts the trace rows
only.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tierkv.lab.replay import CLASSICAL


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--policy", default="tierkv-adaptive")
    ap.add_argument("--per-shape", action="store_true", help="also one row per shape of each trace")
    ap.add_argument("json", nargs="+")
    args = ap.parse_args()
    cols = (*CLASSICAL, "belady", args.policy)
    print(
        f"{'trace':<28}{'cap':>5}" + "".join(f"{c[:14]:>15}" for c in cols) + f"{'vs best cl.':>13}{'gap closed':>12}"
    )
    worst, gaps = 1.0, []
    for path in args.json:
        d = json.loads(Path(path).read_text())
        stem = Path(d["trace"]).stem
        name = stem[:27]
        views: dict[str, dict[float, dict[str, float]]] = {name: {}}
        for r in d["results"]:
            views[name].setdefault(r["capacity_fraction"], {})[r["policy"]] = r["prefix_hit_rate"]
            if args.per_shape and "tiers" not in r:
                for shape, m in r.get("per_shape", {}).items():
                    view = views.setdefault(f"  {shape}"[:27], {})
                    view.setdefault(r["capacity_fraction"], {})[r["policy"]] = m["prefix_hit_rate"]
        for label, by in views.items():
            for cap in sorted(by):
                row = by[cap]
                if args.policy not in row:
                    continue
                best = max(row[c] for c in CLASSICAL if c in row)
                margin = row[args.policy] - best
                gap = row.get("belady", 0.0) - row["lru"]
                closed = (row[args.policy] - row["lru"]) / gap if gap > 0.01 else None
                if label == name:
                    worst = min(worst, margin)
                    if closed is not None:
                        gaps.append(closed)
                cells = "".join(f"{row[c]:>15.4f}" if c in row else f"{'-':>15}" for c in cols)
                print(
                    f"{label:<28}{cap * 100:>4.0f}%{cells}{margin:>+13.4f}"
                    + (f"{closed * 100:>11.1f}%" if closed is not None else f"{'-':>12}")
                )
    if gaps:
        print(
            f"# worst margin over the best classical policy: {worst:+.4f}; mean gap closed "
            f"(Belady > LRU + 0.01): {100 * sum(gaps) / len(gaps):.1f}% over {len(gaps)} rows"
        )


if __name__ == "__main__":
    main()
