"""Load: 64 concurrent clients x 10,000 mixed operations over dram + nvme + pfs, and a miss storm.

    python benchmarks/bench_load.py [--clients 64] [--ops 10000] [--json OUT] [--png OUT] [--dir DIR]

Part 1 (steady load): a TierKV over dram + nvme + pfs with the scheduler service running;
``clients`` tasks share ``ops`` operations: get 45 % (every result checked bit for bit against
the deterministic KV of tests/crash_workload.py), lookup 20 %, put 25 %, put(durable=True) 10 %.
Reports p50/p99 latency per operation kind, and checks the accounting (hits, misses by reason).

Part 2 (miss storm): the same key space is first stored durably, the process "restarts" (a new
TierKV on the same nvme/pfs directories: DRAM is empty, every block sits in nvme or pfs), and
the same load runs at once. It runs twice on identical copies of the directories: admission
control on (``scheduler.max_concurrent_fetches`` = 4) and off (1024). Latency per time window
(p50/p99 of every operation that *ended* in the window) is printed and drawn (PNG, matplotlib).

Correctness failures (wrong bytes, a durable prefix not served, an exception) are reported and
make the exit status 1. Figures depend on this machine (2 cores, ext4); compare the two modes,
not absolute numbers.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from crash_workload import BT, MAX_BLOCKS, SEEDS, TENANTS, check_get, config, kv_of, tokens_of

MIX = (("get", 0.45), ("lookup", 0.20), ("put", 0.25), ("put_durable", 0.10))


@dataclass
class LoadResult:
    """Per-operation samples ``(kind, end_s, latency_s)`` and what went wrong."""

    samples: list[tuple[str, float, float]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    blocks_served: int = 0
    gets_with_miss: int = 0
    hits_delta: int = 0
    misses_by_reason: dict[str, int] = field(default_factory=dict)
    wall_s: float = 0.0

    def percentiles(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for kind in sorted({k for k, _, _ in self.samples}):
            lat = sorted(v for k, _, v in self.samples if k == kind)
            out[kind] = {"n": len(lat), "p50_ms": _pct(lat, 0.50) * 1e3, "p99_ms": _pct(lat, 0.99) * 1e3}
        return out

    def curve(self, window_s: float) -> list[dict[str, float]]:
        if not self.samples:
            return []
        end = max(t for _, t, _ in self.samples)
        rows = []
        for w in range(int(end / window_s) + 1):
            lat = sorted(v for _, t, v in self.samples if w * window_s <= t < (w + 1) * window_s)
            if lat:
                rows.append(
                    {
                        "t_s": w * window_s,
                        "n": len(lat),
                        "p50_ms": _pct(lat, 0.5) * 1e3,
                        "p99_ms": _pct(lat, 0.99) * 1e3,
                    }
                )
        return rows


def _pct(sorted_vals: list[float], q: float) -> float:
    if not sorted_vals:
        return float("nan")
    return sorted_vals[min(len(sorted_vals) - 1, int(q * len(sorted_vals)))]


async def run_load(kv: Any, *, clients: int, ops: int, seed: int = 0, deadline_s: float = 600.0) -> LoadResult:
    """Run ``ops`` mixed operations from ``clients`` tasks on an open ``kv`` (scheduler running).

    Raises TimeoutError (via anyio.fail_after) if the whole run exceeds ``deadline_s``: a deadlock.
    """
    res = LoadResult()
    durable: dict[tuple[int, int], int] = {}
    hits0 = sum(s.hits for s in kv.stats().values())
    miss0 = dict(kv.misses_by_reason)
    per = [ops // clients + (1 if i < ops % clients else 0) for i in range(clients)]
    kinds = [k for k, _ in MIX]
    weights = [w for _, w in MIX]
    t0 = time.perf_counter()

    async def client(c: int, n: int) -> None:
        rng = random.Random(seed * 100_003 + c)
        for _ in range(n):
            kind = rng.choices(kinds, weights)[0]
            t = rng.randrange(len(TENANTS))
            s = rng.randrange(SEEDS)
            blocks = rng.randint(1, MAX_BLOCKS)
            want = durable.get((t, s), 0)
            start = time.perf_counter()
            try:
                if kind == "get":
                    g = await kv.get(tokens_of(s, MAX_BLOCKS), tenant=TENANTS[t])
                    bad = check_get(t, s, g.tokens, g.kv)
                    if bad:
                        res.problems.append(bad)
                    if g.tokens < want * BT:
                        res.problems.append(
                            f"durable prefix of {want * BT} tokens served as {g.tokens} ({g.miss_reason})"
                        )
                    res.blocks_served += g.tokens // BT
                    res.gets_with_miss += 1 if g.miss_reason else 0
                elif kind == "lookup":
                    lk = await kv.lookup(tokens_of(s, MAX_BLOCKS), tenant=TENANTS[t])
                    if lk.tokens % BT or lk.tokens < want * BT:
                        res.problems.append(f"lookup {lk.tokens} tokens, durable {want * BT}")
                else:
                    data = kv_of(t, s, blocks)
                    start = time.perf_counter()  # the deterministic data is not part of the latency
                    await kv.put(tokens_of(s, blocks), data, tenant=TENANTS[t], durable=kind == "put_durable")
                    if kind == "put_durable":
                        durable[(t, s)] = max(durable.get((t, s), 0), blocks)
            except Exception as exc:  # counted: any exception under load is a finding
                name = f"{kind}:{type(exc).__name__}"
                res.errors[name] = res.errors.get(name, 0) + 1
                continue
            end = time.perf_counter()
            res.samples.append((kind, end - t0, end - start))

    with anyio.fail_after(deadline_s):
        async with anyio.create_task_group() as tg:
            for c in range(clients):
                tg.start_soon(client, c, per[c])
    res.wall_s = time.perf_counter() - t0
    res.hits_delta = sum(s.hits for s in kv.stats().values()) - hits0
    res.misses_by_reason = {k: v - miss0.get(k, 0) for k, v in kv.misses_by_reason.items() if v - miss0.get(k, 0)}
    return res


def load_config(root: Path, *, max_fetches: int = 64) -> dict[str, Any]:
    cfg = config(root, dram_blocks=24, nvme="16MiB")
    cfg["scheduler"] = {"max_concurrent_fetches": max_fetches}
    return cfg


async def steady(root: Path, clients: int, ops: int) -> LoadResult:
    from tierkv import TierKV

    async with await TierKV.open(load_config(root)) as kv:
        return await run_load(kv, clients=clients, ops=ops)


async def populate(root: Path) -> None:
    """Store every sequence of the key space durably, then close (a restart follows)."""
    from tierkv import TierKV

    async with await TierKV.open(load_config(root)) as kv:
        for t, tenant in enumerate(TENANTS):
            for s in range(SEEDS):
                await kv.put(tokens_of(s, MAX_BLOCKS), kv_of(t, s, MAX_BLOCKS), tenant=tenant, durable=True)


async def storm(root: Path, clients: int, ops: int, max_fetches: int) -> LoadResult:
    from tierkv import TierKV

    async with await TierKV.open(load_config(root, max_fetches=max_fetches)) as kv:
        assert kv.stats()["dram"].blocks == 0
        return await run_load(kv, clients=clients, ops=ops, seed=1)


def print_table(title: str, res: LoadResult) -> None:
    print(f"\n{title}: {len(res.samples)} ops in {res.wall_s:.1f} s ({len(res.samples) / res.wall_s:.0f} ops/s)")
    print(f"  {'op':<12}{'n':>7}{'p50 ms':>10}{'p99 ms':>10}")
    for kind, row in res.percentiles().items():
        print(f"  {kind:<12}{row['n']:>7}{row['p50_ms']:>10.2f}{row['p99_ms']:>10.2f}")
    print(f"  errors {res.errors or 'none'}; problems {len(res.problems)}; misses by reason {res.misses_by_reason}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--ops", type=int, default=10_000)
    ap.add_argument("--storm-ops", type=int, default=0, help="ops of each miss-storm run (default: --ops)")
    ap.add_argument("--window", type=float, default=0.5, help="seconds per curve window")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--png", type=Path, default=Path("benchmarks/results/load_miss_storm.png"))
    ap.add_argument("--dir", type=Path, help="work directory (default: a temporary one)")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="tierkv-load-", dir=args.dir))
    try:
        steady_res = anyio.run(steady, work / "steady", args.clients, args.ops)
        print_table(f"steady load, {args.clients} clients", steady_res)
        anyio.run(populate, work / "template")
        storms: dict[str, LoadResult] = {}
        for label, mf in (("admission on (max_concurrent_fetches=4)", 4), ("admission off (1024)", 1024)):
            d = work / f"storm{mf}"
            shutil.copytree(work / "template", d)
            storms[label] = anyio.run(storm, d, args.clients, args.storm_ops or args.ops, mf)
            print_table(f"miss storm, {label}", storms[label])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nmiss-storm latency over time (all operations ending in each {args.window} s window)")
    curves = {label: r.curve(args.window) for label, r in storms.items()}
    labels = list(curves)
    print(f"  {'t s':>6}" + "".join(f"{'p50/p99 ms ' + lab.split(' (')[0]:>34}" for lab in labels))
    for i in range(max(len(c) for c in curves.values())):
        row = f"  {i * args.window:>6.1f}"
        for lab in labels:
            c = curves[lab]
            row += f"{c[i]['p50_ms']:>22.1f} / {c[i]['p99_ms']:>8.1f}" if i < len(c) else f"{'':>33}"
        print(row)
    for lab, r in storms.items():
        lat = sorted(v for _, _, v in r.samples)
        print(
            f"  {lab}: overall p50 {_pct(lat, 0.5) * 1e3:.1f} ms, p99 {_pct(lat, 0.99) * 1e3:.1f} ms, "
            f"max {lat[-1] * 1e3:.1f} ms, wall {r.wall_s:.1f} s"
        )
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(8, 4.5))
        for lab, c in curves.items():
            ts = [row["t_s"] for row in c]
            (line,) = ax.plot(ts, [row["p99_ms"] for row in c], label=f"p99, {lab}")
            ax.plot(ts, [row["p50_ms"] for row in c], "--", color=line.get_color(), label=f"p50, {lab}")
        ax.set_xlabel("time since restart (s)")
        ax.set_ylabel("latency (ms)")
        ax.set_yscale("log")
        ax.set_title(f"miss storm: {args.clients} clients, empty DRAM after restart")
        ax.legend(fontsize=7)
        args.png.parent.mkdir(parents=True, exist_ok=True)
        fig.tight_layout()
        fig.savefig(args.png, dpi=110)
        print(f"curve written to {args.png}")
    except ImportError:
        print("matplotlib not installed: no PNG")
    if args.json:
        out = {
            "clients": args.clients,
            "ops": args.ops,
            "steady": {
                "percentiles": steady_res.percentiles(),
                "errors": steady_res.errors,
                "problems": len(steady_res.problems),
                "wall_s": steady_res.wall_s,
            },
            "storm": {
                lab: {
                    "percentiles": r.percentiles(),
                    "curve": curves[lab],
                    "errors": r.errors,
                    "problems": len(r.problems),
                    "wall_s": r.wall_s,
                }
                for lab, r in storms.items()
            },
        }
        args.json.write_text(json.dumps(out, indent=1))
    bad = steady_res.problems + [p for r in storms.values() for p in r.problems]
    errs = {**steady_res.errors, **{k: v for r in storms.values() for k, v in r.errors.items()}}
    if bad or errs:
        print(f"\nCORRECTNESS FAILURES: {len(bad)} problems (first: {bad[:3]}), errors {errs}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
