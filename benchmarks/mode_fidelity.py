"""Fidelity of the adaptive policy's recency modes: each shadow beside the library held in its mode.

The adaptive policy picks a recency mode by the hits of its shadow; a shadow is only as good as its
model of what the library does in that mode. Per trace and capacity this prints, for each recency mode
(LRU, LRU with admission, segmented by slow and by fresh counts, ARC, session), the prefix hit rate of
its unsampled shadow (``benchmarks/shadow_table.py``'s, the session policy as ``lab-tierkv-session``)
and of a real ``TierKV`` (``LibraryPolicy``, the lab's ``tierkv-adaptive``) held in that mode from the
first request (the adapter's choices switched off), over the requests past ``--split`` of the trace's
time. A large gap means the mode is chosen on a wrong estimate.

Run: ``python benchmarks/mode_fidelity.py TRACE [TRACE ...] [--capacities 1,5,10] [--split 0.4]``
(a library replay per mode and capacity: minutes per trace).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tierkv.lab.policies.library import LibraryPolicy
from tierkv.lab.replay import Trace, load_trace, make_policy, replay
from tierkv.scheduler import TauAdapter

sys.path.insert(0, str(Path(__file__).resolve().parent))
from shadow_table import _shadows  # a sibling script

#: (column, TauAdapter._set_recency's number, shadow_table's column)
MODES = (
    ("lru", 0, "lru"),
    ("adm", 1, "adm"),
    ("seg", 2, "slru"),
    ("fseg", 5, "fslru"),
    ("arc", 3, "arc"),
    ("ses", 4, ""),
)


def _rate(raw: dict[str, object]) -> float:
    leads = raw["leads"]
    assert isinstance(leads, list)
    return sum(leads) / max(1, int(raw["accesses"]))  # type: ignore[call-overload]


def held(tr: Trace, cap: int, mode: int, split_time: float) -> float:
    """The library held in recency mode ``mode`` over the whole trace: its prefix hit rate."""
    choose_mode, choose_recency = TauAdapter._choose_mode, TauAdapter._choose_recency
    TauAdapter._choose_mode = lambda self, now, cur: None  # type: ignore[method-assign,assignment,return-value]
    TauAdapter._choose_recency = lambda self: None  # type: ignore[method-assign]
    pol = LibraryPolicy(cap, policy="adaptive", name="held")
    try:
        sched = pol.kv._sched
        ad = sched.tau_adapter
        assert ad is not None
        ad.recency_mode = sched.recency = True
        ad._set_recency(mode)
        return _rate(replay(tr, pol, split_time=split_time))
    finally:
        pol.close()
        TauAdapter._choose_mode, TauAdapter._choose_recency = choose_mode, choose_recency  # type: ignore[method-assign]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--capacities", default="1,5,10", help="percent of the distinct blocks")
    ap.add_argument("--split", type=float, default=0.4)
    args = ap.parse_args()
    print(f"{'trace':<24}{'cap':>5}" + "".join(f"{m + ' shadow/held':>22}" for m, _, _ in MODES))
    for p in args.traces:
        tr = load_trace(p)
        split_time = tr.times[0] + args.split * (tr.times[-1] - tr.times[0])
        for c in (float(x) for x in args.capacities.split(",")):
            cap = max(1, round(c / 100 * tr.distinct))
            shadows = _shadows(tr, cap, args.split)
            ses = _rate(replay(tr, make_policy("lab-tierkv-session", cap, tr), split_time=split_time))
            cells = []
            for _, mode, col in MODES:
                s = shadows[col] if col else ses
                cells.append(f"{s:.4f}/{held(tr, cap, mode, split_time):.4f}")
            print(f"{Path(p).stem:<24}{c:>4g}%" + "".join(f"{x:>22}" for x in cells), flush=True)


if __name__ == "__main__":
    main()
