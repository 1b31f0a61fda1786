"""Overhead of telemetry on batched DRAM get/put through TierKV.

    python benchmarks/bench_telemetry_overhead.py [--reps 9] [--seqs 64] [--blocks 4] [--layers 30] [--json OUT]

Three TierKV instances on the same DRAM-only configuration, differing only in telemetry:

* (a) ``[telemetry] enabled = false`` — tierkv never calls OpenTelemetry;
* (b) enabled, no SDK providers configured — the API's no-op tracer and meter
  (what a library user who never installs the SDK gets);
* (c) enabled with the SDK: a ``TracerProvider`` with ``SimpleSpanProcessor`` +
  ``InMemorySpanExporter`` and a ``MeterProvider`` with an ``InMemoryMetricReader``
  (every span is built and exported; the cost of really tracing).

Each repetition, in rotating order over (a, b, c): put a batch of ``--seqs`` sequences of
``--blocks`` blocks (new keys), then get all of them (hits), then invalidate (untimed).
Figures are medians of ``--reps`` (>= 7) repetitions; ratios b/a and c/a are printed side
by side. ``--layers`` shrinks the model (fewer layers -> smaller blocks -> per-call overhead
weighs more); 30 is SmolLM2-135M.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tierkv import TierKV

HF = json.loads(
    (Path(__file__).resolve().parents[1] / "tests" / "data" / "hf_configs" / "smollm2-135m-instruct.json").read_text()
)
BT = 16


def config(layers: int, enabled: bool) -> dict[str, Any]:
    hf = dict(HF, num_hidden_layers=layers)
    return {
        "model": {"name": "smol-bench", "revision": "bench", "hf_config": hf},
        "kv_dtype": "float16",
        "block_tokens": BT,
        "tiers": [{"name": "dram", "backend": "dram", "capacity": "1GiB"}],
        "telemetry": {"enabled": enabled},
    }


def sdk_providers() -> tuple[Any, Any, Any]:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    mp = MeterProvider(metric_readers=[InMemoryMetricReader()])
    return tp, mp, exporter


async def one_rep(kv: TierKV, seqs: list[list[int]], data: np.ndarray[Any, Any]) -> tuple[float, float]:
    t0 = time.perf_counter()
    for s in seqs:
        await kv.put(s, data)
    t1 = time.perf_counter()
    for s in seqs:
        g = await kv.get(s)
        assert g.tokens == len(s)
    t2 = time.perf_counter()
    await kv.invalidate(all_tenants=True)
    return t1 - t0, t2 - t1


async def run(args: argparse.Namespace) -> dict[str, Any]:
    tp, mp, exporter = sdk_providers()
    kvs = {
        "a": await TierKV.open(config(args.layers, False)),
        "b": await TierKV.open(config(args.layers, True)),
        "c": await TierKV.open(config(args.layers, True), tracer_provider=tp, meter_provider=mp),
    }
    tokens = args.blocks * BT
    data = np.random.default_rng(0).standard_normal((args.layers, 2, tokens, 3, 64)).astype(np.float16)
    times: dict[str, dict[str, list[float]]] = {m: {"put": [], "get": []} for m in kvs}
    order = list(kvs)
    try:
        for rep in range(args.reps + 1):  # repetition 0 warms up and is discarded
            for m in order[rep % 3 :] + order[: rep % 3]:
                base = (rep * 3 + order.index(m)) * 1_000_000
                seqs = [list(range(base + i * tokens, base + (i + 1) * tokens)) for i in range(args.seqs)]
                put_s, get_s = await one_rep(kvs[m], seqs, data)
                if rep:
                    times[m]["put"].append(put_s)
                    times[m]["get"].append(get_s)
                exporter.clear()
    finally:
        for kv in kvs.values():
            await kv.aclose()
        tp.shutdown()
        mp.shutdown()
    med = {m: {op: statistics.median(v) for op, v in ops.items()} for m, ops in times.items()}
    block_bytes = data.nbytes // args.blocks
    return {"params": vars(args) | {"block_bytes": block_bytes}, "median_s": med}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=9)
    p.add_argument("--seqs", type=int, default=64)
    p.add_argument("--blocks", type=int, default=4)
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    if args.reps < 7:
        p.error("--reps must be at least 7")
    res = anyio.run(run, args)
    med = res["median_s"]
    ops = args.seqs
    print(
        f"telemetry overhead: {args.seqs} sequences x {args.blocks} blocks of "
        f"{res['params']['block_bytes'] / 1024:.0f} KiB, DRAM, medians of {args.reps} reps"
    )
    print(f"{'op':<4} {'(a) off':>12} {'(b) API no-op':>14} {'(c) SDK':>12} {'b/a':>7} {'c/a':>7}")
    for op in ("put", "get"):
        a, b, c = (med[m][op] for m in "abc")
        print(
            f"{op:<4} {a / ops * 1e6:>9.1f} us {b / ops * 1e6:>11.1f} us {c / ops * 1e6:>9.1f} us "
            f"{b / a:>7.3f} {c / a:>7.3f}"
        )
    if args.json:
        args.json.write_text(json.dumps(res, indent=2, default=str))


if __name__ == "__main__":
    main()
