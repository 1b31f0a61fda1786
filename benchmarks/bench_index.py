"""Index metadata bytes per block and eviction cost per victim at 10k, 100k and 1M blocks.

A component benchmark of the engine's index (``tierkv/_engine/_index.py`` over its columns,
``_columns.py``, and the tiers' residency, ``_residency.py``) and victim
selection (``Mover.pick_victims``), measured on a real ``TierKV``'s own structures: N
entries are indexed and placed on its DRAM tier as ``put`` does (``Entry``, ``Index.adopt``,
``Mover.rank_of``, ``Tier.place``), without writing block bytes (the backend is not
involved: this measures the metadata, not the data path). Each block has its own key, tag,
parent and CRC, as ``put`` gives them: sequences of 64 blocks chained by parent key, with
a root per sequence.

* bytes/block: ``tracemalloc`` growth while indexing N blocks, divided by N (target
  <= 200 B/block at 1M);
* victim us: the time to pick one victim (``pick_victims(tier, one block)``), median over
  repetitions, under ``scheduler.policy = "lru"``, ``"predictive"`` and ``"adaptive"`` (the
  default, which evicts as one of the two); the ranking is kept up to date on access, so it
  should not grow with N;
* re-key ms (ranked policies): what a switch of the adaptive ``tau`` costs the event loop once,
  every block re-keyed (``Mover.refresh_ranking``).

    python benchmarks/bench_index.py [--sizes 10000,100000,1000000] [--reps 2000]
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import math
import statistics
import time
import tracemalloc
import zlib
from pathlib import Path
from typing import Any

import anyio

from tierkv import TierKV
from tierkv._engine._index import Entry
from tierkv._engine._tags import ZERO16, ZERO32, pack_tag

SEQ = 64  # blocks per sequence

HF = json.loads((Path(__file__).resolve().parents[1] / "tests/data/hf_configs/smollm2-135m-instruct.json").read_text())


def config(policy: str) -> dict[str, Any]:
    return {
        "model": {"name": "smol", "revision": "bench", "hf_config": HF},
        "kv_dtype": "float16",
        "block_tokens": 16,
        "tiers": [{"name": "dram", "backend": "dram", "capacity": "16MiB"}],
        "scheduler": {"policy": policy},
        "telemetry": {"enabled": False},
    }


def fill(kv: TierKV, n: int) -> None:
    s = kv._s
    ms = s.model_scope
    tier = s.tiers[0]
    nb = s.block_nbytes
    parent, root = ZERO32, b""
    for i in range(n):
        pos = i % SEQ
        if pos == 0:
            parent, root = ZERO32, hashlib.sha256(b"root%d" % i).digest()[:8]
        kb = hashlib.sha256(b"block%d" % i).digest()
        crc = zlib.crc32(kb)
        tag = pack_tag(ms, ZERO16, parent, pos, crc, nb, root)
        e = Entry(kb.hex(), 0, nb, tag, ms, ZERO16, parent, pos, crc)
        e.t_last = float(i)
        e.cell = i % 7
        s.index.adopt(e, root)
        e.rank = s.mover.rank_of(e)
        tier.place(e)
        parent = kb


async def measure(n: int, policy: str, reps: int) -> tuple[float, float]:
    kv = await TierKV.open(config(policy))
    try:
        gc.collect()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        fill(kv, n)
        used = tracemalloc.get_traced_memory()[0] - base
        tracemalloc.stop()
        mover, need = kv._s.mover, kv._s.block_nbytes
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            victims = mover.pick_victims(0, need)
            times.append(time.perf_counter() - t0)
            assert len(victims) == 1
        rekey = math.nan
        if policy != "lru":
            kv._s.sched.tau_s /= 10  # what a switch of the adaptive tau does: every key changes
            t0 = time.perf_counter()
            mover.refresh_ranking()
            rekey = time.perf_counter() - t0
        return used / n, statistics.median(times) * 1e6, rekey * 1e3
    finally:
        await kv.aclose()


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="10000,100000,1000000")
    p.add_argument("--reps", type=int, default=2000)
    args = p.parse_args()
    print(f"{'blocks':>9} {'policy':>10} {'bytes/block':>12} {'victim us':>10} {'re-key ms':>10}")
    for n in (int(x) for x in args.sizes.split(",")):
        for policy in ("lru", "predictive", "adaptive"):
            per_block, victim_us, rekey_ms = await measure(n, policy, args.reps)
            print(f"{n:>9} {policy:>10} {per_block:>12.0f} {victim_us:>10.2f} {rekey_ms:>10.1f}", flush=True)


if __name__ == "__main__":
    anyio.run(main)
