"""The adaptive policy's recency shadows, unsampled, on the lab's traces: what each recency mode would score.

Each shadow is the library's own (:class:`~tierkv.scheduler.TauAdapter` with ``recency=True``, every
block sampled, counts never decayed): plain LRU, LRU with TinyLFU's admission filter, the same filter in
front of a segmented LRU by slowly aged counts (``slru``) and by freshly aged ones (``fslru``,
``FrequencySketch(fresh=True)``), and ARC; beside them the lab's W-TinyLFU. Prints the prefix hit rate
of the requests past ``--split`` of the trace's time, per trace and capacity, and the column sums. It
shows what a mode can reach, not what the adaptive policy gets (that is ``benchmarks/lab_table.py``).

Run: ``python benchmarks/shadow_table.py [--traces GLOB] [--capacities 1,5,10] [--split 0.4]``
(the default traces are the lab table's synthetic shapes at seeds 7, 11, 13, made by
``benchmarks/lab_table.py`` under the system's temporary directory; about a minute).
"""

from __future__ import annotations

import argparse
import glob
import os
import tempfile
from pathlib import Path

from tierkv.lab.policies.tinylfu import TinyLfuPolicy
from tierkv.lab.replay import Trace, load_trace
from tierkv.scheduler import TauAdapter

COLUMNS = ("lru", "adm", "slru", "fslru", "arc", "w-tinylfu")


def _shadows(tr: Trace, cap: int, split: float) -> dict[str, float]:
    # every block sampled, counts never decayed (the shadows do not depend on the mode chosen)
    ad = TauAdapter((300.0,), 300.0, cap, sample_blocks=cap, every=1, decay=1.0, mode_decay=1.0, recency=True)
    ref = TinyLfuPolicy(cap)
    t0, t1 = tr.times[0], tr.times[-1]
    cut = t0 + split * (t1 - t0)
    at: list[float] | None = None
    w = accesses = 0

    def counts() -> list[float]:
        return [ad._rec_hits, ad._adm_slow, ad._slru.slow, ad._fslru.slow, ad._arc_slow]

    for ids, t, tail in zip(tr.blocks, tr.times, tr.tail_partial, strict=True):
        if at is None and t >= cut:
            at = counts()
        for b in reversed(ids):
            ad.add(b, 0.0, t)
        ad.request(t)
        lead, _ = ref.request(ids, t, tail)
        if at is not None:
            w += lead
            accesses += len(ids)
    if at is None or accesses == 0:
        return dict.fromkeys(COLUMNS, 0.0)
    out = {name: (c - a) / accesses for name, c, a in zip(COLUMNS, counts(), at, strict=False)}
    out["w-tinylfu"] = w / accesses
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    default = os.path.join(tempfile.gettempdir(), "tierkv-lab-traces", "*.jsonl")
    ap.add_argument("--traces", default=default, help="a glob of Mooncake-format traces")
    ap.add_argument("--seeds", default="7,11,13", help="with the default glob: the seeds to keep")
    ap.add_argument("--capacities", default="1,5,10", help="percent of the distinct blocks")
    ap.add_argument("--split", type=float, default=0.4)
    args = ap.parse_args()
    paths = sorted(glob.glob(args.traces))
    if args.traces == default:
        seeds = {s.strip() for s in args.seeds.split(",")}
        paths = [p for p in paths if Path(p).stem.rsplit("-", 1)[-1] in seeds]
    if not paths:
        raise SystemExit(f"no trace matches {args.traces} (run benchmarks/lab_table.py once to make them)")
    caps = [float(c) for c in args.capacities.split(",")]
    print(f"{'trace':<22}{'cap':>5}" + "".join(f"{c:>11}" for c in COLUMNS))
    sums = dict.fromkeys(COLUMNS, 0.0)
    for p in paths:
        tr = load_trace(p)
        for c in caps:
            cap = max(1, round(c / 100 * tr.distinct))
            row = _shadows(tr, cap, args.split)
            for k in COLUMNS:
                sums[k] += row[k]
            print(f"{Path(p).stem:<22}{c:>4g}%" + "".join(f"{row[k]:>11.4f}" for k in COLUMNS))
    print(f"{'sum':<27}" + "".join(f"{sums[k]:>11.3f}" for k in COLUMNS))


if __name__ == "__main__":
    main()
