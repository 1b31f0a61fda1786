"""benchmarks/bench_library_replay.py on a 300-request slice: the library's ``lru`` policy, driven through a
real TierKV, matches the independent reference LRU exactly (same block ids, touch order and watermarks)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from tierkv.lab.replay import load_trace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

bench: Any = importlib.import_module("bench_library_replay")

SLICE = ROOT / "tests" / "data" / "traces" / "mooncake_conversation_slice300.jsonl"


@pytest.mark.parametrize("block_tokens", [512])
def test_library_lru_matches_reference_lru(block_tokens: int) -> None:
    w = bench.Workload(load_trace(SLICE, 512, 512), block_tokens, until=1.0)
    w.set_split(0.4)
    cap = max(1, round(0.05 * w.distinct))
    lib = anyio.run(bench.library_replay, w, "lru", cap, 0.01, False)
    ref = bench.reference_lru(w, cap, 0.01, block_tokens * bench.KV_BYTES_PER_TOKEN)
    assert lib["prefix_hit_rate"] > 0
    assert lib["prefix_hit_rate"] == pytest.approx(ref, abs=1e-12)
    assert lib["final_blocks"] <= cap
