"""Load: 64 concurrent clients x 10,000 mixed operations over dram + nvme + pfs, and a miss storm.

    python benchmarks/bench_load.py [--clients 64] [--ops 10000] [--storm-ops N] [--slots 4]
                                    [--fetch-wait S] [--json OUT] [--png OUT] [--dir DIR]

Part 1 (steady load): a TierKV over dram + nvme + pfs with the scheduler service running;
``clients`` tasks share ``ops`` operations: get 45 % (every result checked bit for bit against
the deterministic KV of tests/crash_workload.py), lookup 20 %, put 25 %, put(durable=True) 10 %.
Reports p50/p99 latency per operation kind, and checks the accounting (hits, misses by reason).

Part 2 (miss storm): the same key space is first stored durably, the process "restarts" (a new
TierKV on the same nvme/pfs directories: DRAM is empty, every block sits in nvme or pfs), and
the same load runs at once. It runs on identical copies of the directories in three variants:

(a) no admission control: ``scheduler.max_concurrent_fetches`` = 1024;
(b) a concurrency limit only: ``max_concurrent_fetches`` = ``--slots`` (a get waits for a slot);
(c) the same limit plus ``scheduler.fetch_wait_s``: a get that cannot get a slot within that
    budget is answered at once as a miss with ``miss_reason == "overloaded"`` (the engine
    recomputes). Default budget: 2 x the median latency of an uncontended cold get (nvme/pfs),
    calibrated on a fourth copy before the storms.

For each variant: get latency p50/p99 (all gets, and gets that were not answered ``overloaded``),
the fraction of gets answered ``overloaded``, KV blocks served from the cache, throughput, and the
get latency over time (p50/p99 of the gets that *ended* in each ``--window`` s window), printed
and drawn (PNG, matplotlib, one line per variant).

Correctness failures (wrong bytes, a durable prefix not served, an exception) are reported and
make the exit status 1. An ``overloaded`` answer is a legitimate miss (0 tokens, no KV), not
lost data: after each run every durably stored prefix is read back sequentially and checked, so
data that an ``overloaded`` answer skipped is shown to still be there. Figures depend on this
machine (2 cores, ext4, possibly shared with other jobs); compare the variants, not absolute numbers.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
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
OVERLOADED = "overloaded"


@dataclass
class LoadResult:
    """Per-operation samples ``(kind, end_s, latency_s)`` and what went wrong.

    A get answered ``overloaded`` is sampled under the kind ``get`` and listed (by its end time)
    in ``overloaded_ends``; it is a miss like any other in ``gets_with_miss`` and
    ``misses_by_reason``.
    """

    samples: list[tuple[str, float, float]] = field(default_factory=list)
    overloaded_ends: set[float] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    blocks_served: int = 0
    gets_with_miss: int = 0
    overloaded: int = 0
    hits_delta: int = 0
    misses_by_reason: dict[str, int] = field(default_factory=dict)
    verified_prefixes: int = 0
    loop_lag: list[float] = field(default_factory=list)
    wall_s: float = 0.0

    def percentiles(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for kind in sorted({k for k, _, _ in self.samples}):
            lat = sorted(v for k, _, v in self.samples if k == kind)
            out[kind] = {"n": len(lat), "p50_ms": _pct(lat, 0.50) * 1e3, "p99_ms": _pct(lat, 0.99) * 1e3}
        return out

    def get_summary(self) -> dict[str, float]:
        """Get latency (all gets / gets not answered overloaded), overloaded fraction, throughput."""
        gets = sorted(v for k, _, v in self.samples if k == "get")
        served = sorted(v for k, t, v in self.samples if k == "get" and t not in self.overloaded_ends)
        over = sorted(v for k, t, v in self.samples if k == "get" and t in self.overloaded_ends)
        lag = sorted(self.loop_lag)
        return {
            "gets": len(gets),
            "p50_ms": _pct(gets, 0.50) * 1e3,
            "p99_ms": _pct(gets, 0.99) * 1e3,
            "max_ms": (gets[-1] if gets else float("nan")) * 1e3,
            "fetched_p50_ms": _pct(served, 0.50) * 1e3,
            "fetched_p99_ms": _pct(served, 0.99) * 1e3,
            "overloaded_p50_ms": _pct(over, 0.50) * 1e3,
            "overloaded_p99_ms": _pct(over, 0.99) * 1e3,
            "overloaded_frac": self.overloaded / len(gets) if gets else 0.0,
            "loop_lag_p50_ms": _pct(lag, 0.50) * 1e3,
            "loop_lag_p99_ms": _pct(lag, 0.99) * 1e3,
            "ops_per_s": len(self.samples) / self.wall_s if self.wall_s else 0.0,
            "gets_per_s": len(gets) / self.wall_s if self.wall_s else 0.0,
            "blocks_served": self.blocks_served,
            "blocks_per_get": self.blocks_served / len(gets) if gets else 0.0,
            "wall_s": self.wall_s,
        }

    def curve(self, window_s: float) -> list[dict[str, float]]:
        """Per window: get p50/p99, gets, overloaded fraction of gets, throughput of all ops."""
        if not self.samples:
            return []
        end = max(t for _, t, _ in self.samples)
        rows = []
        for w in range(int(end / window_s) + 1):
            lo, hi = w * window_s, (w + 1) * window_s
            ops = [(k, t, v) for k, t, v in self.samples if lo <= t < hi]
            lat = sorted(v for k, _, v in ops if k == "get")
            over = sum(1 for k, t, _ in ops if k == "get" and t in self.overloaded_ends)
            rows.append(
                {
                    "t_s": lo,
                    "gets": len(lat),
                    "p50_ms": _pct(lat, 0.5) * 1e3,
                    "p99_ms": _pct(lat, 0.99) * 1e3,
                    "overloaded_frac": over / len(lat) if lat else 0.0,
                    "ops_per_s": len(ops) / window_s,
                }
            )
        return rows


def _pct(sorted_vals: list[float], q: float) -> float:
    if not sorted_vals:
        return float("nan")
    return sorted_vals[min(len(sorted_vals) - 1, int(q * len(sorted_vals)))]


async def run_load(
    kv: Any, *, clients: int, ops: int, seed: int = 0, deadline_s: float = 600.0, durable0: bool = False
) -> LoadResult:
    """Run ``ops`` mixed operations from ``clients`` tasks on an open ``kv`` (scheduler running).

    ``durable0``: every sequence of the key space was stored durably in full before (the miss
    storm), so every get must serve it whole unless answered ``overloaded``. After the run (and
    after the stats deltas are taken) every durably stored prefix is read back sequentially and
    checked: an ``overloaded`` answer must not have cost any data.

    Raises TimeoutError (via anyio.fail_after) if the whole run exceeds ``deadline_s``: a deadlock.
    """
    res = LoadResult()
    durable: dict[tuple[int, int], int] = {}
    if durable0:
        durable = {(t, s): MAX_BLOCKS for t in range(len(TENANTS)) for s in range(SEEDS)}
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
            overloaded = False
            start = time.perf_counter()
            try:
                if kind == "get":
                    g = await kv.get(tokens_of(s, MAX_BLOCKS), tenant=TENANTS[t])
                    bad = check_get(t, s, g.tokens, g.kv)
                    if bad:
                        res.problems.append(bad)
                    overloaded = g.miss_reason == OVERLOADED
                    if overloaded:
                        # a legitimate miss (the engine recomputes); the data is checked after the run
                        res.overloaded += 1
                        if g.tokens:
                            res.problems.append(f"overloaded answer with {g.tokens} tokens")
                    elif g.tokens < want * BT:
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
            if overloaded:
                res.overloaded_ends.add(end - t0)

    async def lag_probe() -> None:
        # event-loop lag: how late a 10 ms sleep wakes up (64 clients share one loop on 2 cores)
        while True:
            start = time.perf_counter()
            await anyio.sleep(0.01)
            res.loop_lag.append(time.perf_counter() - start - 0.01)

    with anyio.fail_after(deadline_s):
        async with anyio.create_task_group() as outer:
            outer.start_soon(lag_probe)
            async with anyio.create_task_group() as tg:
                for c in range(clients):
                    tg.start_soon(client, c, per[c])
            outer.cancel_scope.cancel()
    res.wall_s = time.perf_counter() - t0
    res.hits_delta = sum(s.hits for s in kv.stats().values()) - hits0
    res.misses_by_reason = {k: v - miss0.get(k, 0) for k, v in kv.misses_by_reason.items() if v - miss0.get(k, 0)}
    with anyio.fail_after(deadline_s):
        await _verify_durable(kv, durable, res)
    return res


async def _verify_durable(kv: Any, durable: dict[tuple[int, int], int], res: LoadResult) -> None:
    """Read every durably stored prefix back, one get at a time: right bytes, whole prefix."""
    for (t, s), want in sorted(durable.items()):
        for _ in range(3):  # uncontended: an admission slot is free unless the budget is ~0
            g = await kv.get(tokens_of(s, MAX_BLOCKS), tenant=TENANTS[t])
            if g.miss_reason != OVERLOADED:
                break
        bad = check_get(t, s, g.tokens, g.kv)
        if bad:
            res.problems.append(f"after the run: {bad}")
        if g.tokens < want * BT:
            res.problems.append(
                f"after the run: durable prefix of {want * BT} tokens served as {g.tokens} ({g.miss_reason})"
            )
        res.verified_prefixes += 1


def load_config(root: Path, *, max_fetches: int = 64, fetch_wait_s: float | None = None) -> dict[str, Any]:
    cfg = config(root, dram_blocks=24, nvme="16MiB")
    cfg["scheduler"] = {"max_concurrent_fetches": max_fetches}
    if fetch_wait_s is not None:
        cfg["scheduler"]["fetch_wait_s"] = fetch_wait_s
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


async def calibrate(root: Path) -> float:
    """Median latency (s) of an uncontended cold get after a restart (every block in nvme/pfs)."""
    from tierkv import TierKV

    lat = []
    async with await TierKV.open(load_config(root, max_fetches=1024)) as kv:
        assert kv.stats()["dram"].blocks == 0
        for t, tenant in enumerate(TENANTS):
            for s in range(SEEDS):
                start = time.perf_counter()
                g = await kv.get(tokens_of(s, MAX_BLOCKS), tenant=tenant)
                lat.append(time.perf_counter() - start)
                assert not check_get(t, s, g.tokens, g.kv) and g.tokens == MAX_BLOCKS * BT
    return statistics.median(lat)


async def storm(root: Path, clients: int, ops: int, max_fetches: int, fetch_wait_s: float | None) -> LoadResult:
    from tierkv import TierKV

    async with await TierKV.open(load_config(root, max_fetches=max_fetches, fetch_wait_s=fetch_wait_s)) as kv:
        assert kv.stats()["dram"].blocks == 0
        return await run_load(kv, clients=clients, ops=ops, seed=1, durable0=True)


def print_table(title: str, res: LoadResult) -> None:
    print(f"\n{title}: {len(res.samples)} ops in {res.wall_s:.1f} s ({len(res.samples) / res.wall_s:.0f} ops/s)")
    print(f"  {'op':<12}{'n':>7}{'p50 ms':>10}{'p99 ms':>10}")
    for kind, row in res.percentiles().items():
        print(f"  {kind:<12}{row['n']:>7}{row['p50_ms']:>10.2f}{row['p99_ms']:>10.2f}")
    print(
        f"  errors {res.errors or 'none'}; problems {len(res.problems)}; misses by reason {res.misses_by_reason}; "
        f"durable prefixes re-read after the run {res.verified_prefixes}"
    )


def print_storm_summary(storms: dict[str, LoadResult]) -> None:
    print("\nmiss storm, get latency per variant (fetched = gets not answered overloaded)")
    head = (
        f"  {'variant':<34}{'gets':>6}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}{'fetched p99':>13}"
        f"{'overloaded':>12}{'ovl p50/p99':>13}{'loop lag p50/p99':>18}{'ops/s':>8}{'gets/s':>8}{'blocks/get':>12}"
        f"{'wall s':>8}"
    )
    print(head)
    for lab, r in storms.items():
        s = r.get_summary()
        print(
            f"  {lab:<34}{s['gets']:>6}{s['p50_ms']:>9.1f}{s['p99_ms']:>9.1f}{s['max_ms']:>9.1f}"
            f"{s['fetched_p99_ms']:>13.1f}{s['overloaded_frac']:>11.1%} {s['overloaded_p50_ms']:>6.1f}/{s['overloaded_p99_ms']:>6.1f}"
            f"{s['loop_lag_p50_ms']:>11.1f}/{s['loop_lag_p99_ms']:>6.1f}{s['ops_per_s']:>8.0f}{s['gets_per_s']:>8.0f}"
            f"{s['blocks_per_get']:>12.2f}{s['wall_s']:>8.1f}"
        )


def print_curves(curves: dict[str, list[dict[str, float]]], window: float) -> None:
    labels = list(curves)
    print(f"\nmiss-storm get latency over time (gets ending in each {window} s window; ovl = overloaded share)")
    print(f"  {'t s':>6}" + "".join(f"  {lab.split(':')[0] + ' p50/p99 ms, ovl, ops/s':>38}" for lab in labels))
    for i in range(max(len(c) for c in curves.values())):
        row = f"  {i * window:>6.1f}"
        for lab in labels:
            c = curves[lab]
            if i < len(c):
                w = c[i]
                row += (
                    f"  {w['p50_ms']:>11.1f} /{w['p99_ms']:>7.1f},{w['overloaded_frac']:>5.0%},{w['ops_per_s']:>6.0f}"
                )
            else:
                row += f"  {'':>38}"
        print(row)


def draw(curves: dict[str, list[dict[str, float]]], png: Path, title: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no PNG")
        return
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    for lab, c in curves.items():
        ts = [row["t_s"] for row in c]
        ax.plot(ts, [row["p99_ms"] for row in c], marker=".", label=lab)
        ax2.plot(ts, [100 * row["overloaded_frac"] for row in c], marker=".", label=lab)
    ax.set_ylabel("get p99 per window (ms)")
    ax.set_yscale("log")
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    ax2.set_xlabel("time since restart (s)")
    ax2.set_ylabel("overloaded (% gets)")
    ax2.grid(True, alpha=0.3)
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    print(f"curve written to {png}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--ops", type=int, default=10_000)
    ap.add_argument("--storm-ops", type=int, default=0, help="ops of each miss-storm run (default: --ops)")
    ap.add_argument("--slots", type=int, default=4, help="max_concurrent_fetches of variants (b) and (c)")
    ap.add_argument("--fetch-wait", type=float, help="fetch_wait_s of variant (c) (default: 2 x calibrated get)")
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
        shutil.copytree(
            work / "template", work / "calibrate", symlinks=True
        )  # pfs hard-link records become plain copies: each still a whole content file
        cold_get_s = anyio.run(calibrate, work / "calibrate")
        wait_s = args.fetch_wait if args.fetch_wait is not None else 2 * cold_get_s
        print(
            f"\nuncontended cold get (nvme/pfs, {MAX_BLOCKS} blocks): median {cold_get_s * 1e3:.2f} ms; "
            f"variant (c) fetch_wait_s = {wait_s * 1e3:.2f} ms"
        )
        variants = {
            "(a) no admission control (1024)": (1024, None),
            f"(b) limit {args.slots}": (args.slots, None),
            f"(c) limit {args.slots} + wait {wait_s * 1e3:.1f} ms": (args.slots, wait_s),
        }
        storms: dict[str, LoadResult] = {}
        for i, (label, (mf, fw)) in enumerate(variants.items()):
            d = work / f"storm{i}"
            shutil.copytree(work / "template", d, symlinks=True)
            storms[label] = anyio.run(storm, d, args.clients, args.storm_ops or args.ops, mf, fw)
            print_table(f"miss storm, {label}", storms[label])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_storm_summary(storms)
    curves = {label: r.curve(args.window) for label, r in storms.items()}
    print_curves(curves, args.window)
    draw(
        curves, args.png, f"miss storm: {args.clients} clients, empty DRAM after restart (get p99 per {args.window} s)"
    )
    if args.json:
        out = {
            "clients": args.clients,
            "ops": args.ops,
            "storm_ops": args.storm_ops or args.ops,
            "window_s": args.window,
            "cold_get_median_ms": cold_get_s * 1e3,
            "fetch_wait_s": wait_s,
            "slots": args.slots,
            "steady": {
                "percentiles": steady_res.percentiles(),
                "errors": steady_res.errors,
                "problems": len(steady_res.problems),
                "wall_s": steady_res.wall_s,
            },
            "storm": {
                lab: {
                    "summary": r.get_summary(),
                    "percentiles": r.percentiles(),
                    "misses_by_reason": r.misses_by_reason,
                    "curve": curves[lab],
                    "errors": r.errors,
                    "problems": len(r.problems),
                    "verified_prefixes": r.verified_prefixes,
                }
                for lab, r in storms.items()
            },
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1))
    bad = steady_res.problems + [p for r in storms.values() for p in r.problems]
    errs = {**steady_res.errors, **{k: v for r in storms.values() for k, v in r.errors.items()}}
    if bad or errs:
        print(f"\nCORRECTNESS FAILURES: {len(bad)} problems (first: {bad[:3]}), errors {errs}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
