"""Run vLLM (the CPU build, in process) over prompts given as token ids, with or without tierkv's connector.

Used by tests/engines/test_vllm_connector.py in process and, for the restart test, as a script in a NEW
process: ``python vllm_run.py SPEC.json OUT.json`` runs :func:`run_once` and writes its result as JSON.
"""

from __future__ import annotations

import gc
import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

CONNECTOR = "TierKVConnector"
MODULE = "tierkv.integrations.vllm"


def engine_env(cache_root: str) -> None:
    """The environment the CPU engine runs in here (set before vllm is imported)."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CACHE_ROOT", cache_root)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def engine_dtype() -> str:
    """``$TIERKV_VLLM_DTYPE``, else bf16 where the CPU computes it natively, else float32: the rule of
    :func:`tierkv.demo.vllm_engine.engine_dtype` (bf16 runs ~30x slower than fp32 on an AVX2-only CPU)."""
    from tierkv.demo.vllm_engine import engine_dtype as rule

    return rule()


def engine_kwargs(model_dir: str) -> dict[str, Any]:
    """The ``vllm.LLM`` arguments of the engine tests (as tests/engines/conftest.py's ``vllm_engine_kwargs``)."""
    return {
        "model": model_dir,
        "dtype": engine_dtype(),
        "enforce_eager": True,
        "block_size": 32,
        "max_model_len": 2048,
        "enable_prefix_caching": False,
        "disable_log_stats": False,
        "seed": 0,
    }


def make_llm(kwargs: Mapping[str, Any], tierkv_config: Mapping[str, Any] | str | None, **extra: Any) -> Any:
    """An engine with ``kwargs`` (``vllm.LLM``'s); with ``tierkv_config``, tierkv's connector (extra
    connector options in ``extra``), with vLLM recomputing blocks that fail to load."""
    from vllm import LLM
    from vllm.config import KVTransferConfig

    kw = dict(kwargs)
    if tierkv_config is not None:
        kw["kv_transfer_config"] = KVTransferConfig(
            kv_connector=CONNECTOR,
            kv_connector_module_path=MODULE,
            kv_role="kv_both",
            kv_load_failure_policy="recompute",
            kv_connector_extra_config={"tierkv_config": tierkv_config, **extra},
        )
    return LLM(**kw)


def generate(
    llm: Any, prompts: Sequence[Sequence[int]], *, max_tokens: int = 8, salts: Sequence[str | None] | None = None
) -> list[dict[str, Any]]:
    """Greedy generation, one request at a time (so each sees what the previous ones stored)."""
    from vllm import SamplingParams

    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    out = []
    for i, p in enumerate(prompts):
        prompt: dict[str, Any] = {"prompt_token_ids": list(p)}
        if salts is not None and salts[i] is not None:
            prompt["cache_salt"] = salts[i]
        (r,) = llm.generate([prompt], sp, use_tqdm=False)
        out.append({"tokens": list(r.outputs[0].token_ids), "num_cached_tokens": int(r.num_cached_tokens or 0)})
    return out


def close_llm(llm: Any) -> None:
    """Shut the engine down (its connectors release tierkv's store)."""
    try:
        llm.llm_engine.engine_core.shutdown()
    finally:
        del llm
        gc.collect()


def tier_hits() -> dict[str, int]:
    """Hits per tier of the stores tierkv's connectors of this process hold open."""
    from tierkv.integrations.vllm import tier_counters

    return {name: t["hits"] for name, t in tier_counters().items()}


def run_once(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Open an engine per ``spec`` (``engine_kwargs`` or ``model_dir``, ``tierkv_config``, ``prompts``,
    ``max_tokens``, ``salts``),
    generate, and return the outputs, the connector's counters and the tiers' hits."""
    from tierkv.integrations.vllm import connector_stats

    llm = make_llm(spec.get("engine_kwargs") or engine_kwargs(spec["model_dir"]), spec.get("tierkv_config"))
    try:
        before = connector_stats()
        outs = generate(llm, spec["prompts"], max_tokens=spec.get("max_tokens", 8), salts=spec.get("salts"))
        after = connector_stats()
        hits = tier_hits()
    finally:
        close_llm(llm)
    delta = {k: getattr(after, k) - getattr(before, k) for k in asdict(after)}
    return {"outputs": outs, "stats": delta, "tier_hits": hits}


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    engine_env(spec["cache_root"])
    result = run_once(spec)
    with open(sys.argv[2], "w") as f:
        json.dump(result, f)
