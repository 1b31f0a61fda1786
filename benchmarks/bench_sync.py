"""What the synchronous facade (``TierKV.open_sync``) adds per call, beside the floor of a thread hop.

For each loop backend (asyncio, trio) a dram-only store (SmolLM2-135M-shaped KV) holds a
1,024-token prefix; per repetition it measures, side by side:

* ``direct``: ``await kv.aio.lookup(tokens)`` in a loop on the facade's own event loop;
* ``facade``: ``kv.lookup(tokens)`` from the calling thread (one portal hop each);
* ``noop``: ``kv.call(lambda: None)``, the facade's hop alone;
* ``floor``: the cheapest possible hop on this machine, ``loop.call_soon_threadsafe`` of a
  function that sets a ``concurrent.futures.Future`` the caller waits on (asyncio only).

It prints the medians over repetitions (each the median of ``--calls`` calls), in µs, and the
overhead ``facade - direct``. Target (issue: engine-shaped data path): overhead <= 50 µs.

    python benchmarks/bench_sync.py [--reps 7] [--calls 300]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np

from tierkv import TierKV

HF = {"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 576}
BT = 16


def config(root: Path) -> dict[str, Any]:
    return {
        "model": {"name": "smol", "revision": "bench", "hf_config": HF},
        "kv_dtype": "float16",
        "block_tokens": BT,
        "tiers": [{"name": "dram", "backend": "dram", "capacity": "256MiB"}],
        "telemetry": {"enabled": False},
    }


def timed(fn: Callable[[], object], calls: int) -> float:
    xs = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        xs.append(time.perf_counter() - t0)
    return statistics.median(xs) * 1e6


def floor_us(calls: int) -> float:
    loop = asyncio.new_event_loop()
    th = threading.Thread(target=loop.run_forever, daemon=True)
    th.start()

    def hop() -> None:
        fut: Future[None] = Future()
        loop.call_soon_threadsafe(fut.set_result, None)
        fut.result()

    try:
        return timed(hop, calls)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        th.join()
        loop.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--calls", type=int, default=300)
    a = ap.parse_args()
    tokens = np.arange(64 * BT, dtype=np.int64)
    kv_data = np.zeros((30, 2, len(tokens), 3, 64), np.float16)
    print(f"# python benchmarks/bench_sync.py --reps {a.reps} --calls {a.calls}")
    print(f"{'backend':>8} {'direct':>8} {'facade':>8} {'noop':>8} {'floor':>8} {'overhead':>9}   (us, medians)")
    with tempfile.TemporaryDirectory() as d:
        for backend in ("asyncio", "trio"):
            with TierKV.open_sync(config(Path(d)), backend=backend, scheduler=True) as kv:  # type: ignore[arg-type]
                kv.put(tokens, kv_data)

                async def direct(n: int, kv: Any = kv) -> float:
                    xs = []
                    for _ in range(n):
                        t0 = time.perf_counter()
                        await kv.aio.lookup(tokens)
                        xs.append(time.perf_counter() - t0)
                    return statistics.median(xs) * 1e6

                rows: list[tuple[float, float, float, float]] = []
                for _ in range(a.reps):
                    dr = float(kv.call(direct, a.calls))
                    fa = timed(lambda kv=kv: kv.lookup(tokens), a.calls)
                    no = timed(lambda kv=kv: kv.call(lambda: None), a.calls)
                    fl = floor_us(a.calls) if backend == "asyncio" else float("nan")
                    rows.append((dr, fa, no, fl))
                med = [statistics.median(r[i] for r in rows) for i in range(4)]
                over = statistics.median(r[1] - r[0] for r in rows)
                print(f"{backend:>8} {med[0]:8.1f} {med[1]:8.1f} {med[2]:8.1f} {med[3]:8.1f} {over:9.1f}")


if __name__ == "__main__":
    main()
