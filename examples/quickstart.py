"""Quickstart: store the KV of a prompt in DRAM + a PFS directory, find and fetch its prefix.

Run: python examples/quickstart.py
"""

from __future__ import annotations

import tempfile

import anyio
import numpy as np

from tierkv import TierKV

# The fields of the model's config.json that size its KV cache (SmolLM2-135M here).
HF_CONFIG = {
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "hidden_size": 576,
    "head_dim": 64,
}


async def main() -> None:
    with tempfile.TemporaryDirectory() as pfs_dir:
        config = {
            "model": {"name": "HuggingFaceTB/SmolLM2-135M-Instruct", "revision": "main", "hf_config": HF_CONFIG},
            "kv_dtype": "float16",
            "tiers": [
                {"name": "dram", "backend": "dram", "capacity": "256MiB"},
                {"name": "pfs", "backend": "pfs", "path": pfs_dir, "capacity": "4GiB"},
            ],
        }
        async with await TierKV.open(config) as kv:
            tokens = np.arange(1000, 1300)  # token ids of the prompt
            # layout: (layers, K/V, tokens, kv_heads, head_dim)
            kv_data = np.random.default_rng(0).standard_normal((30, 2, 300, 3, 64)).astype(np.float16)
            put = await kv.put(tokens, kv_data)
            print(f"stored {put.tokens} tokens in {put.new_blocks} blocks ({put.tail_tokens} tail tokens not stored)")

            follow_up = np.concatenate([tokens, np.arange(7, 50)])
            hit = await kv.lookup(follow_up)
            print(f"lookup: {hit.tokens} leading tokens stored, in tiers {hit.tiers}")
            got = await kv.get(follow_up)
            assert got.kv.tobytes() == kv_data[:, :, : got.tokens].tobytes()
            print(f"get: {got.tokens} tokens, bit-identical, served from {got.tiers}")
            for name, s in kv.stats().items():
                print(f"  {name}: {s.blocks} blocks, {s.used_bytes}/{s.capacity_bytes} bytes, hits={s.hits}")


if __name__ == "__main__":
    anyio.run(main)
