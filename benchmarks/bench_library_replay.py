"""Prefix hit rate of the library itself (a real ``TierKV``) replaying a Mooncake-format trace, per policy.

Each request is driven through the public API the way an engine uses the cache: ``lookup(prompt)`` (its
leading hit blocks are the request's prefix hits), then ``put(prompt, kv)`` of the whole prompt. One DRAM tier
of ``capacity_blocks x block_nbytes`` bytes; telemetry off; the scheduler's clock is the trace's timestamp of
the request (``TierKV._sched.now`` replaced by the trace clock: the library has no clock option).

Watermarks: a tier past its high watermark sheds down to its low one after each put, and a put that finds the
tier full sheds one block's room per block. Shedding ranks the whole tier (``O(capacity)`` per shed), so
watermarks at 1.0 (one shed per new block) make a full replay take hours; the bench sets ``high = 1 - g`` and
``low = 1 - 2g`` with ``g = max(--headroom, 128 blocks / capacity)`` (default ``--headroom 0.01``): the cache
holds between ``1 - 2g`` and 100% of its capacity, the same for every policy, and the reference LRU below
replays exactly these mechanics.

Tokens: the trace's ``hash_ids`` are chained ids of 512-token blocks; trace block ``h`` becomes the 512 tokens
``h * 512 + [0, 512)`` (distinct per id, hence distinct per id chain), the prompt is the concatenation of its
blocks cut at ``input_length``, and the library keys whole ``--block-tokens`` blocks of it (128 by default:
four library blocks per trace block). The KV is zeros of a tiny model (1 layer, 1 KV head, head dim 8, fp16:
32 bytes per token), so a block is a few KiB and the replay measures the policy, not memory traffic.

Method as in the replay lab (:mod:`tierkv.lab.replay`): the whole trace is replayed, hit rates count
only requests at or after ``t0 + split * (t_end - t0)`` (``--split``, default 0.4: the held-out part);
capacities are fractions of the distinct library blocks of the trace. Beside each library row: the lab's
LRU on the same library-block id sequence (root-to-leaf touch order) and an independent LRU in the library's
touch order (a put touches the prompt's stored blocks, inserts its new ones, then re-touches all of them
leaf first), which the library's ``lru`` policy must match exactly.

Run: ``python benchmarks/bench_library_replay.py [TRACE ...] [--capacity 1%,5%,10%] [--policies ...]``
(default trace: ``/work/shared/traces/mooncake-fast25/conversation_trace.jsonl``, else the copy in
``tests/data/traces``). ``--until F`` replays only the first fraction ``F`` of the trace (time), for a
quick look; the published figures use the whole trace.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import numpy as np

from tierkv import TierKV
from tierkv.lab.policies import LruPolicy
from tierkv.lab.replay import Trace, load_trace, replay

SHARED = Path("/work/shared/traces/mooncake-fast25/conversation_trace.jsonl")
LOCAL = Path(__file__).resolve().parent.parent / "tests" / "data" / "traces" / "mooncake_conversation_trace.jsonl"
TRACE_BLOCK = 512
#: policies the library supports (``scheduler.policy``)
POLICIES = ("adaptive", "predictive", "lru")
HF = {
    "model_type": "bench",
    "num_hidden_layers": 1,
    "num_attention_heads": 1,
    "num_key_value_heads": 1,
    "hidden_size": 8,
}
KV_BYTES_PER_TOKEN = 1 * 2 * 1 * 8 * 2


def _parse_fractions(text: str) -> list[float]:
    out = []
    for part in text.split(","):
        part = part.strip()
        if part:
            out.append(float(part[:-1]) / 100 if part.endswith("%") else float(part))
    if not out or not all(0 < f <= 1 for f in out):
        raise SystemExit(f"--capacity: {text!r} is not a list of fractions in (0, 1]")
    return out


class Workload:
    """The trace as prompts (token arrays) and as library-block id sequences."""

    def __init__(self, trace: Trace, block_tokens: int, until: float) -> None:
        if TRACE_BLOCK % block_tokens:
            raise SystemExit(f"--block-tokens {block_tokens} must divide the trace's {TRACE_BLOCK}")
        per = TRACE_BLOCK // block_tokens
        n = len(trace.times)
        if until < 1.0:
            t_end = trace.times[0] + until * (trace.times[-1] - trace.times[0])
            n = max(1, sum(1 for t in trace.times if t < t_end))
        self.block_tokens = block_tokens
        self.times = trace.times[:n]
        self.lengths = trace.input_lengths[:n]
        self.hash_ids = trace.blocks[:n]
        # library block j of a prompt lies in trace block j // per at sub-block j % per
        self.ids: list[list[int]] = []
        for hids, n_in in zip(self.hash_ids, self.lengths, strict=True):
            nb = min(n_in, len(hids) * TRACE_BLOCK) // block_tokens
            self.ids.append([hids[j // per] * per + j % per for j in range(nb)])
        self.distinct = len({b for r in self.ids for b in r})
        self.accesses = sum(len(r) for r in self.ids)
        self.split_time = -math.inf

    def set_split(self, split: float) -> None:
        t0, t1 = self.times[0], self.times[-1]
        self.split_time = t0 + split * (t1 - t0) if split > 0 else -math.inf

    def tokens(self, i: int) -> np.ndarray[Any, np.dtype[np.int64]]:
        hids = np.asarray(self.hash_ids[i], dtype=np.int64)
        toks = (hids[:, None] * TRACE_BLOCK + np.arange(TRACE_BLOCK, dtype=np.int64)[None, :]).reshape(-1)
        return toks[: self.lengths[i]]

    def as_trace(self) -> Trace:
        return Trace(
            "library-blocks",
            self.times,
            self.lengths,
            self.ids,
            [n % self.block_tokens != 0 for n in self.lengths],
            self.block_tokens,
        )


def watermarks(capacity: int, headroom: float) -> tuple[float, float]:
    """(high, low) watermark fractions for a tier of ``capacity`` blocks; ``headroom`` 0: both at 1.0 (a block
    leaves only when a new one needs its room: exact, and slow)."""
    if headroom <= 0:
        return 1.0, 1.0
    g = min(0.25, max(headroom, 128 / capacity))
    return 1.0 - g, 1.0 - 2.0 * g


def reference_lru(w: Workload, capacity: int, headroom: float, block_nbytes: int) -> float:
    """An LRU over library-block ids in the library's touch order and with its watermark mechanics (see the
    module docstring); prefix hit rate of the measured part."""
    cache: OrderedDict[int, None] = OrderedDict()
    lead_sum = acc = 0
    move = cache.move_to_end
    hi, lo = watermarks(capacity, headroom)
    cap_bytes = capacity * block_nbytes
    for i, ids in enumerate(w.ids):
        lead = 0
        for b in ids:
            if b not in cache:
                break
            lead += 1
        if w.times[i] >= w.split_time:
            lead_sum += lead
            acc += len(ids)
        for b in ids:  # put: touch the stored ones, insert the new ones (root to leaf)
            if b in cache:
                move(b)
            else:
                if len(cache) >= capacity:
                    cache.popitem(last=False)
                cache[b] = None
        for b in reversed(ids):  # the put's access record: leaf first, the root most recent
            if b in cache:
                move(b)
        used = len(cache) * block_nbytes  # the put's rebalance (tierkv._placement.bytes_to_shed)
        if used > hi * cap_bytes:
            for _ in range(-(-int(used - lo * cap_bytes) // block_nbytes)):
                cache.popitem(last=False)
    return lead_sum / max(1, acc)


def lab_lru(w: Workload, capacity: int) -> float:
    raw = replay(w.as_trace(), LruPolicy(capacity), w.split_time)
    return float(sum(raw["leads"])) / max(1, int(raw["accesses"]))


async def library_replay(w: Workload, policy: str, capacity: int, headroom: float, progress: bool) -> dict[str, Any]:
    bt = w.block_tokens
    block_nbytes = bt * KV_BYTES_PER_TOKEN
    hi, lo = watermarks(capacity, headroom)
    cfg = {
        "model": {"name": "bench", "revision": "1", "hf_config": HF},
        "kv_dtype": "float16",
        "block_tokens": bt,
        "tiers": [
            {
                "name": "dram",
                "backend": "dram",
                "capacity": capacity * block_nbytes,
                "high_watermark": hi,
                "low_watermark": lo,
                "granule": min(4096, block_nbytes),
            }
        ],
        "scheduler": {"policy": policy},
        "telemetry": {"enabled": False},
    }
    kv = await TierKV.open(cfg)
    clock = [0.0]
    kv._sched.now = lambda: clock[0]  # type: ignore[method-assign]
    kv._sched.set_capacity_blocks(capacity)
    lead_sum = acc = 0
    t0 = time.perf_counter()
    n = len(w.ids)
    try:
        for i in range(n):
            clock[0] = w.times[i]
            toks = w.tokens(i)
            lk = await kv.lookup(toks)
            if w.times[i] >= w.split_time:
                lead_sum += lk.tokens // bt
                acc += len(w.ids[i])
            if len(toks) >= bt:
                await kv.put(toks, np.zeros((1, 2, len(toks), 1, 8), dtype=np.float16))
            if progress and i % 500 == 499:
                el = time.perf_counter() - t0
                sys.stderr.write(f"\r  {policy} cap {capacity}: {i + 1}/{n} requests, {el:.0f} s")
                sys.stderr.flush()
        blocks = kv.stats()["dram"].blocks
    finally:
        await kv.aclose()
    if progress:
        sys.stderr.write("\n")
    return {
        "prefix_hit_rate": lead_sum / max(1, acc),
        "seconds": time.perf_counter() - t0,
        "final_blocks": blocks,
    }


def run(path: Path, args: argparse.Namespace) -> list[str]:
    trace = load_trace(path, TRACE_BLOCK, TRACE_BLOCK)
    w = Workload(trace, args.block_tokens, args.until)
    w.set_split(args.split)
    lines = [
        f"trace {path} ({len(w.ids)} requests{'' if args.until >= 1 else f', first {args.until:g} of the time'}; "
        f"{args.block_tokens}-token blocks: {w.accesses} block accesses, {w.distinct} distinct; "
        f"measured from split {args.split:g})",
        f"{'capacity':>9}{'blocks':>8}" + "".join(f"{p:>12}" for p in args.policies) + f"{'lab lru':>10}"
        f"{'ref lru':>10}{'best':>12}",
    ]
    print(lines[0], flush=True)
    print(lines[1], flush=True)
    for f in args.capacity:
        cap = max(1, round(f * w.distinct))
        rates: dict[str, float] = {}
        for p in args.policies:
            r = anyio.run(library_replay, w, p, cap, args.headroom, not args.no_progress)
            rates[p] = r["prefix_hit_rate"]
            sys.stderr.write(f"  {p} @ {f * 100:g}%: {r['prefix_hit_rate']:.4f} in {r['seconds']:.0f} s\n")
        best = max(rates, key=lambda p: rates[p])
        line = (
            f"{f * 100:>8.3g}%{cap:>8}"
            + "".join(f"{rates[p]:>12.4f}" for p in args.policies)
            + f"{lab_lru(w, cap):>10.4f}{reference_lru(w, cap, args.headroom, args.block_tokens * KV_BYTES_PER_TOKEN):>10.4f}{best:>12}"
        )
        print(line, flush=True)
        lines.append(line)
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", nargs="*", type=Path)
    ap.add_argument("--capacity", default="1%,5%,10%")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--block-tokens", type=int, default=128)
    ap.add_argument("--split", type=float, default=0.4)
    ap.add_argument("--until", type=float, default=1.0)
    ap.add_argument("--headroom", type=float, default=0.01, help="watermark gap g (fraction of capacity)")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    args.capacity = _parse_fractions(args.capacity)
    args.policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    traces = args.traces or [SHARED if SHARED.exists() else LOCAL]
    for path in traces:
        run(path, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
