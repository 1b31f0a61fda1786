"""A short tierkv workload shared by the telemetry examples: hits, misses of several kinds,
demotions from a small DRAM tier to PFS, and a prefetch that promotes blocks back.

Not an example on its own; ``telemetry_console.py``, ``telemetry_otlp.py`` and
``telemetry_prometheus.py`` call :func:`run_workload` with their providers.
"""

from __future__ import annotations

import tempfile
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from tierkv import TierKV

# The fields of the model's config.json that size its KV cache (SmolLM2-135M).
HF_CONFIG = {
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "hidden_size": 576,
    "head_dim": 64,
}
BLOCK_TOKENS = 16


def config(pfs_dir: str) -> dict[str, Any]:
    return {
        "model": {"name": "HuggingFaceTB/SmolLM2-135M-Instruct", "revision": "main", "hf_config": HF_CONFIG},
        "kv_dtype": "float16",
        "block_tokens": BLOCK_TOKENS,
        "tiers": [
            # a small DRAM tier that sheds to PFS early, so demotions and promotions happen
            {"name": "dram", "backend": "dram", "capacity": "8MiB", "high_watermark": 0.3, "low_watermark": 0.2},
            {"name": "pfs", "backend": "pfs", "path": pfs_dir, "capacity": "1GiB"},
        ],
        "telemetry": {"cost_per_gb_hour": {"dram": 0.004, "pfs": 0.0001}, "prefill_cost_per_million_tokens": 0.10},
    }


async def run_workload(
    requests: int,
    *,
    tracer_provider: Any = None,
    meter_provider: Any = None,
    while_open: Callable[[dict[str, int]], Awaitable[None]] | None = None,
) -> dict[str, int]:
    """Run ``requests`` prompts (2 blocks each) and return the misses by reason.

    A store reports its tier gauges only while it is open (a closed one is freed), so the
    final metrics are flushed before it closes, and ``while_open(misses)`` (a scrape window,
    say) runs with the store still open."""
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as pfs_dir:
        kv = await TierKV.open(config(pfs_dir), tracer_provider=tracer_provider, meter_provider=meter_provider)
        async with kv:
            prompts = [np.arange(i * 1000, i * 1000 + 2 * BLOCK_TOKENS) for i in range(requests)]
            for p in prompts:
                data = rng.standard_normal((30, 2, len(p), 3, 64)).astype(np.float16)
                await kv.put(p, data, tenant="team-a")
            for p in prompts:
                await kv.get(p, tenant="team-a")  # hits, some served from PFS after demotion
            await kv.get(np.arange(900_000, 900_032), tenant="team-a")  # never stored
            await kv.get(prompts[0], tenant="team-b")  # same tokens, other tenant: different scope
            await kv.lookup(prompts[-1], tenant="team-a")
            await kv.prefetch(prompts[0], decode_position=0, tenant="team-a")  # promote back ahead of need
            misses = dict(kv.misses_by_reason)
            if while_open is not None:
                await while_open(misses)
            if meter_provider is not None and hasattr(meter_provider, "force_flush"):
                meter_provider.force_flush()  # export while the tier gauges still report
            return misses
