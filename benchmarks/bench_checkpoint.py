"""Dedup and delta savings of checkpoints on real KV (SmolLM2-135M over real ShareGPT conversations).

    python benchmarks/bench_checkpoint.py [--systems 3] [--convs 8] [--turns 2] [--dtype float16]
                                          [--max-tokens 384] [--json OUT]

``systems`` system prompts x ``convs`` conversations each (real multi-turn ShareGPT text), ``turns``
user turns per conversation. Round r prefills turn r of every conversation (the whole prompt so
far, under the chat template, system prompt first), puts its KV into a TierKV (dram + pfs), then
checkpoints. Reported: raw bytes (sum of the KV bytes of every put call), logical bytes stored
(distinct blocks x block bytes), PFS physical bytes (blocks shared by prefixes are stored once), and per
checkpoint the copied bytes (the delta) against its logical size.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SYSTEM_PROMPTS = (
    "You are a helpful assistant. Answer concisely and accurately.",
    "You are a senior software engineer. Explain your reasoning step by step and show code when useful.",
    "You are a friendly tutor for high-school students. Use simple words and short examples.",
)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from tierkv import TierKV
    from tierkv.demo.sharegpt import sharegpt_conversations
    from tierkv.demo.smollm2 import load_smollm2
    from tierkv.integrations.transformers import chat_prompt_ids, prefill

    t0 = time.perf_counter()
    m = await anyio.to_thread.run_sync(load_smollm2, args.dtype)
    convs = sharegpt_conversations(args.systems * args.convs, min_turns=2 * args.turns, seed=3)
    root = Path(tempfile.mkdtemp(prefix="tierkv-ckpt-"))
    cfg = {
        "model": {
            "name": m.name,
            "revision": m.revision,
            "weights_fingerprint": m.weights_fingerprint,
            "hf_config": m.hf_config,
        },
        "kv_dtype": args.dtype,
        "block_tokens": args.block_tokens,
        "tiers": [
            {"name": "dram", "backend": "dram", "capacity": "2GiB"},
            {"name": "pfs", "backend": "pfs", "path": str(root / "pfs"), "capacity": "8GiB"},
        ],
    }
    raw = 0
    rounds: list[dict[str, Any]] = []
    async with await TierKV.open(cfg) as kv:
        history: list[list[tuple[str, str]]] = [[] for _ in convs]
        for r in range(args.turns):
            round_raw = 0
            t_prefill = 0.0
            for i, conv in enumerate(convs):
                system = SYSTEM_PROMPTS[i // args.convs % len(SYSTEM_PROMPTS)]
                user = conv[2 * r]
                user_turn = (user[0], user[1][:2000])
                ids = chat_prompt_ids(m.tokenizer, [*history[i], user_turn], system)[: args.max_tokens]
                t1 = time.perf_counter()
                _, kvt = await anyio.to_thread.run_sync(prefill, m, ids)
                t_prefill += time.perf_counter() - t1
                data = np.ascontiguousarray(kvt.numpy())
                await kv.put(ids, data)
                round_raw += data.nbytes
                history[i] += [user_turn, (conv[2 * r + 1][0], conv[2 * r + 1][1][:2000])]
            raw += round_raw
            ck = await kv.checkpoint(f"round{r}")
            pfs = kv.stats()["pfs"]
            rounds.append(
                {
                    "round": r,
                    "raw_bytes": round_raw,
                    "checkpoint_blocks": ck.blocks,
                    "checkpoint_logical_bytes": ck.logical_bytes,
                    "copied_bytes": ck.copied_bytes,
                    "stored_bytes_delta": ck.stored_bytes_delta,
                    "distinct_contents": ck.distinct_contents,
                    "copied_vs_logical": ck.copied_bytes / max(1, ck.logical_bytes),
                    "pfs_used_bytes": pfs.used_bytes,
                    "prefill_s": t_prefill,
                }
            )
        pfs = kv.stats()["pfs"]
        logical = rounds[-1]["checkpoint_logical_bytes"]
        physical = pfs.used_bytes
    return {
        "model": m.name,
        "dtype": args.dtype,
        "block_tokens": args.block_tokens,
        "systems": args.systems,
        "convs_per_system": args.convs,
        "turns": args.turns,
        "max_tokens": args.max_tokens,
        "raw_bytes": raw,
        "logical_bytes": logical,
        "pfs_physical_bytes": physical,
        "stored_vs_raw": physical / raw,
        "rounds": rounds,
        "wall_s": time.perf_counter() - t0,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--systems", type=int, default=3)
    ap.add_argument("--convs", type=int, default=8)
    ap.add_argument("--turns", type=int, default=2)
    ap.add_argument("--dtype", default="float16", choices=["float16", "float32"])
    ap.add_argument("--block-tokens", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=384)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    res = anyio.run(run, args)
    mib = 1 << 20
    print(
        f"{res['model']} {res['dtype']}, {args.systems} system prompts x {args.convs} conversations x "
        f"{args.turns} turns, block {args.block_tokens} tokens"
    )
    print(
        f"{'round':>5}{'raw MiB':>10}{'ckpt blocks':>13}{'ckpt MiB':>10}{'copied MiB':>12}{'copied %':>10}"
        f"{'pfs MiB':>10}"
    )
    for r in res["rounds"]:
        print(
            f"{r['round']:>5}{r['raw_bytes'] / mib:>10.1f}{r['checkpoint_blocks']:>13}"
            f"{r['checkpoint_logical_bytes'] / mib:>10.1f}{r['copied_bytes'] / mib:>12.1f}"
            f"{100 * r['copied_vs_logical']:>9.1f}%{r['pfs_used_bytes'] / mib:>10.1f}"
        )
    print(
        f"raw (sum of put KV bytes) {res['raw_bytes'] / mib:.1f} MiB; stored on PFS {res['pfs_physical_bytes'] / mib:.1f}"
        f" MiB = {100 * res['stored_vs_raw']:.1f}% of raw; wall {res['wall_s']:.0f} s"
    )
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
