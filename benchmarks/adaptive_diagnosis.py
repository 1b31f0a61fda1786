"""Where the library's adaptive policy wins or loses against other policies on a trace, tenth by tenth.

Run: ``python benchmarks/adaptive_diagnosis.py TRACE.jsonl --capacity 5% [--versus lru,s3fifo]
[--policy tierkv-adaptive] [--block-tokens 512] [--trace-block-tokens 512] [--json OUT.json]``

Replays the whole trace (as ``tierkv replay`` does, capacity a fraction of the trace's distinct blocks) through
the library policy (``tierkv-adaptive``: a real TierKV under ``scheduler.policy = "adaptive"``) and each
``--versus`` policy, and prints per tenth of the trace (by time): the requests and block accesses, each
policy's prefix hit rate, and the share of the library policy's requests served in each mode of its
:class:`~tierkv.scheduler._tau.TauAdapter` (read before each request from ``policy.kv._sched.tau_adapter``):
``pred`` (the predictor's ranking, ``recency_mode`` false; with its ``tau`` in seconds), ``lru`` (recency),
``adm`` (recency with frequency admission, ``admit_mode``), ``seg`` (the segmented LRU, ``slru_mode``;
``fseg`` by the fresh counts, ``fresh_mode``),
``arc`` (ARC, ``arc_mode``), ``ses`` (the session shadow, ``session_mode``); then the adapter's
switches (``trace``: time and new ``tau``, ``inf`` = to recency). Reads the library, changes nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from tierkv.lab.policies.library import LibraryPolicy
from tierkv.lab.replay import load_trace, make_policy, replay


class _Recorder:
    """Wraps a :class:`LibraryPolicy`: the adapter's mode before each request."""

    def __init__(self, inner: LibraryPolicy) -> None:
        self.inner = inner
        self.modes: list[tuple[str, float]] = []

    def request(self, ids: Any, now: float, tail_partial: bool) -> tuple[int, int]:
        ad = self.inner.kv._sched.tau_adapter
        if ad is None:
            self.modes.append(("-", math.nan))
        elif not ad.recency_mode:
            self.modes.append(("pred", ad.tau))
        else:
            mode = (
                "adm"
                if ad.admit_mode
                else ("fseg" if ad.fresh_mode else "seg")
                if ad.slru_mode
                else "arc"
                if ad.arc_mode
                else "ses"
                if ad.session_mode
                else "lru"
            )
            self.modes.append((mode, ad.tau))
        return self.inner.request(ids, now, tail_partial)


def _fraction(text: str) -> float:
    return float(text[:-1]) / 100 if text.endswith("%") else float(text)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("trace")
    ap.add_argument("--capacity", default="5%")
    ap.add_argument("--policy", default="tierkv-adaptive", choices=("tierkv-adaptive", "tierkv"))
    ap.add_argument("--versus", default="lru,s3fifo")
    ap.add_argument("--block-tokens", type=int, default=512)
    ap.add_argument("--trace-block-tokens", type=int, default=512)
    ap.add_argument("--split", type=float, default=0.4, help="the replay's split, for the measured-part rates")
    ap.add_argument("--json", dest="json_out", default=None)
    args = ap.parse_args(argv)
    tr = load_trace(args.trace, args.block_tokens, args.trace_block_tokens)
    cap = max(1, round(_fraction(args.capacity) * tr.distinct))
    t0, t1 = tr.times[0], tr.times[-1]
    tenth = [min(9, int(10 * (t - t0) / (t1 - t0))) if t1 > t0 else 0 for t in tr.times]
    acc = [0] * 10
    reqs = [0] * 10
    for i, ids in enumerate(tr.blocks):
        acc[tenth[i]] += len(ids)
        reqs[tenth[i]] += 1
    leads: dict[str, list[int]] = {}
    versus = [v.strip() for v in args.versus.split(",") if v.strip()]
    for name in versus:
        pol = make_policy(name, cap, tr)
        leads[name] = replay(tr, pol, -math.inf)["leads"]
    lib = make_policy(args.policy, cap, tr)
    assert isinstance(lib, LibraryPolicy)
    rec = _Recorder(lib)
    try:
        leads[args.policy] = replay(tr, rec, -math.inf)["leads"]  # type: ignore[arg-type]
        ad = lib.kv._sched.tau_adapter
        switches = list(ad.trace) if ad is not None else []
    finally:
        lib.close()
    names = [args.policy, *versus]
    rows: list[dict[str, Any]] = []
    for k in range(10):
        idx = [i for i in range(len(tr.blocks)) if tenth[i] == k]
        modes = Counter(rec.modes[i][0] for i in idx)
        taus = Counter(rec.modes[i][1] for i in idx if rec.modes[i][0] == "pred")
        rows.append(
            {
                "tenth": k,
                "requests": reqs[k],
                "accesses": acc[k],
                "prefix_hit_rate": {n: sum(leads[n][i] for i in idx) / (acc[k] or 1) for n in names},
                "modes": {m: modes[m] / (len(idx) or 1) for m in ("pred", "lru", "adm", "seg", "fseg", "arc", "ses")},
                "pred_taus": {str(t): c for t, c in sorted(taus.items())},
            }
        )
    print(
        f"{Path(args.trace).name} @ {args.capacity} ({cap} blocks): prefix hit rate per tenth of the trace (time), "
        f"and {args.policy}'s modes (share of requests)"
    )
    print(
        f"{'tenth':>5}{'reqs':>7}{'accesses':>10}"
        + "".join(f"{n[:15]:>16}" for n in names)
        + f"{'pred':>7}{'lru':>7}{'adm':>7}{'seg':>7}{'fseg':>7}{'arc':>7}{'ses':>7}  taus while pred"
    )
    for r in rows:
        print(
            f"{r['tenth']:>5}{r['requests']:>7}{r['accesses']:>10}"
            + "".join(f"{r['prefix_hit_rate'][n]:>16.4f}" for n in names)
            + "".join(f"{r['modes'][m]:>7.2f}" for m in ("pred", "lru", "adm", "seg", "fseg", "arc", "ses"))
            + "  "
            + ", ".join(f"{t}:{c}" for t, c in r["pred_taus"].items())
        )
    t_split = t0 + args.split * (t1 - t0)
    late = [i for i in range(len(tr.blocks)) if tr.times[i] >= t_split]
    late_acc = sum(len(tr.blocks[i]) for i in late) or 1
    measured = {n: sum(leads[n][i] for i in late) / late_acc for n in names}
    print(
        f"{'measured part (t >= split ' + format(args.split, 'g') + ')':<22}"
        + "".join(f"{measured[n]:>16.4f}" for n in names)
    )
    print(f"adapter switches ({len(switches)}): " + ", ".join(f"{t - t0:.0f}s->{tau:g}" for t, tau in switches[:60]))
    if args.json_out:
        doc = {"trace": args.trace, "capacity": args.capacity, "capacity_blocks": cap, "tenths": rows}
        doc["measured_prefix_hit_rate"] = measured
        doc["switches"] = [[t - t0, tau if math.isfinite(tau) else "inf"] for t, tau in switches]
        Path(args.json_out).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
