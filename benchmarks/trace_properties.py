"""What a Mooncake-format trace is like, in the terms a workload is described by: prompt lengths, the LRU stack
distances of its reuses (in blocks) and how much of it is reuse, before and after the replay's split.

Run: ``python benchmarks/trace_properties.py TRACE.jsonl [--split 0.4] [--block-tokens 512]
[--trace-block-tokens 512] [--json OUT.json]``

* prompt tokens: median (and 10th/90th percentiles) of ``input_length``, over the whole trace, the part
  before the split time ``t0 + split * (t_end - t0)`` and the part at or after it (the replay's measured part);
* LRU stack distance of a reuse: the number of distinct blocks accessed since the block's previous access
  (the smallest LRU cache, in blocks, that hits it), over every access of a block seen before, in the order
  the replay serves them (time order, each request's blocks root first); percentiles and the share within
  4,000-14,000 blocks, per part (a reuse belongs to the part of the request that makes it);
* reuse fraction: accesses of a block seen before / accesses (the hit rate of an infinite cache), per part.

The capacities the replay uses (1%, 5%, 10% of the distinct blocks) are printed beside them, in blocks.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from tierkv.lab.replay import load_trace
from tierkv.lab.synth import stack_distances


def _pct(xs: list[int], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return float(s[min(len(s) - 1, int(q * len(s)))])


def properties(path: str, split: float, block_tokens: int, trace_block_tokens: int) -> dict[str, Any]:
    tr = load_trace(path, block_tokens, trace_block_tokens)
    t0, t1 = tr.times[0], tr.times[-1]
    t_split = t0 + split * (t1 - t0)
    dists = stack_distances(tr.blocks)
    distinct = tr.distinct
    doc: dict[str, Any] = {
        "trace": path,
        "block_tokens": block_tokens,
        "requests": len(tr.blocks),
        "accesses": tr.accesses,
        "distinct_blocks": distinct,
        "capacity_blocks": {f"{p}%": round(p / 100 * distinct) for p in (1, 5, 10)},
        "span_s": t1 - t0,
        "parts": {},
    }
    for name, keep in (
        ("all", lambda t: True),
        (f"before {split:g}", lambda t: t < t_split),
        (f"after {split:g}", lambda t: t >= t_split),
    ):
        idx = [i for i, t in enumerate(tr.times) if keep(t)]
        lens = [tr.input_lengths[i] for i in idx]
        d = [x for i in idx for x in dists[i]]
        acc = sum(len(tr.blocks[i]) for i in idx)
        doc["parts"][name] = {
            "requests": len(idx),
            "accesses": acc,
            "prompt_tokens_median": statistics.median(lens) if lens else float("nan"),
            "prompt_tokens_p10": _pct(lens, 0.1),
            "prompt_tokens_p90": _pct(lens, 0.9),
            "reuse_fraction": len(d) / acc if acc else float("nan"),
            "stack_distance_percentiles": {f"p{q}": _pct(d, q / 100) for q in (5, 10, 25, 50, 75, 90, 95)},
            "stack_distance_in_4000_14000": sum(1 for x in d if 4000 <= x <= 14000) / len(d) if d else float("nan"),
        }
    return doc


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("trace")
    ap.add_argument("--split", type=float, default=0.4)
    ap.add_argument("--block-tokens", type=int, default=512)
    ap.add_argument("--trace-block-tokens", type=int, default=512)
    ap.add_argument("--json", dest="json_out", default=None)
    args = ap.parse_args(argv)
    doc = properties(args.trace, args.split, args.block_tokens, args.trace_block_tokens)
    caps = ", ".join(f"{k} = {v}" for k, v in doc["capacity_blocks"].items())
    print(
        f"{doc['trace']}: {doc['requests']} requests, {doc['accesses']} block accesses of {doc['block_tokens']} "
        f"tokens, {doc['distinct_blocks']} distinct blocks (capacities {caps}), span {doc['span_s']:.0f} s"
    )
    print(
        f"{'part':<12}{'requests':>9}{'accesses':>10}{'prompt p10/p50/p90 tokens':>28}{'reuse':>7}"
        f"{'stack distance of reuses p5/p10/p25/p50/p75/p90/p95 (blocks)':>64}{'in 4k-14k':>10}"
    )
    for name, p in doc["parts"].items():
        sd = "/".join(f"{v:.0f}" for v in p["stack_distance_percentiles"].values())
        pr = f"{p['prompt_tokens_p10']:.0f}/{p['prompt_tokens_median']:.0f}/{p['prompt_tokens_p90']:.0f}"
        print(
            f"{name:<12}{p['requests']:>9}{p['accesses']:>10}{pr:>28}{p['reuse_fraction']:>7.3f}{sd:>64}"
            f"{p['stack_distance_in_4000_14000']:>10.3f}"
        )
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
