"""Cost of one chunk put on a growing prefix, by prefix length (issue 20, "new block").

An engine stores each new 256-token block of a sequence as it completes it with
``put(tokens[:m], kv_of_that_block, start=m - 256)``. This measures the time of such a put
at the start of a sequence and deep into it, with a one-layer model whose blocks are tiny
(4 KiB), so the figure is the API's own work per new block, not the copy. Side by side in one
run: the library as shipped (a chunk whose parent was accessed within
``Reader.CHUNK_REFRESH_S`` places its blocks below the parent, O(new blocks)) and with that
window set to -1 s (every chunk put re-walks and re-touches the whole prefix, as before).

    python benchmarks/bench_chunk_put.py [--tokens 131072] [--reps 3]

Prints, per mode, the median over repetitions of the p50 put time over the first and the last
eighth of the sequence's blocks.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import numpy as np

from tierkv import TierKV

BT = 256
HF = {"num_hidden_layers": 1, "num_attention_heads": 1, "num_key_value_heads": 1, "hidden_size": 8}


async def one_run(n: int, refresh_s: float) -> tuple[float, float]:
    kv_all = np.zeros((1, 2, n, 1, 8), np.float16)
    tokens = np.arange(1000, 1000 + n, dtype=np.int64)
    cfg = {
        "model": {"name": "bench", "revision": "1", "hf_config": HF},
        "kv_dtype": "float16",
        "block_tokens": BT,
        "tiers": [{"name": "dram", "backend": "dram", "capacity": 4 * kv_all.nbytes + (64 << 20)}],
        "telemetry": {"enabled": False},
    }
    async with await TierKV.open(cfg) as kv:
        kv._s.reader.CHUNK_REFRESH_S = refresh_s  # type: ignore[misc]
        per = []
        for b in range(1, n // BT + 1):
            m = b * BT
            t0 = time.perf_counter()
            await kv.put(tokens[:m], kv_all[:, :, m - BT : m], start=m - BT)
            per.append(time.perf_counter() - t0)
    k = max(1, len(per) // 8)
    return statistics.median(per[:k]), statistics.median(per[-k:])


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=131072)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    res: dict[str, list[tuple[float, float]]] = {"shipped": [], "full refresh": []}
    for _ in range(a.reps):  # interleaved: both modes see the machine at the same speed
        res["shipped"].append(await one_run(a.tokens, 1.0))
        res["full refresh"].append(await one_run(a.tokens, -1.0))
    print(f"# chunk put of one 256-token block, 1-layer model (4 KiB blocks), {a.tokens} tokens, reps {a.reps}")
    print(f"{'mode':>14} {'first 1/8 (p50)':>16} {'last 1/8 (p50)':>15}")
    for mode, rows in res.items():
        first = statistics.median(r[0] for r in rows) * 1e3
        last = statistics.median(r[1] for r in rows) * 1e3
        print(f"{mode:>14} {first:>13.3f} ms {last:>12.3f} ms")


if __name__ == "__main__":
    asyncio.run(main())
