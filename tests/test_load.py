"""Concurrent load over dram + nvme + pfs with the scheduler service running (benchmarks/bench_load.py).

64 client tasks share a mixed workload (get checked bit for bit, lookup, put, durable put) inside
``anyio.fail_after`` (a deadlock fails the test). The default target runs 640 operations per
async backend; the slow target runs the full 10,000, and a miss storm (restart with an empty
DRAM, every block in nvme/pfs) with admission control on, as a plain concurrency limit and with a
wait budget (``scheduler.fetch_wait_s``). A get answered ``overloaded`` is a legitimate miss: it
must carry no KV, and every durably stored prefix must still be served whole afterwards. No
timing is asserted here: latency figures come from the benchmark.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from tierkv import TierKV

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from bench_load import LoadResult, load_config, populate, run_load
from crash_workload import MAX_BLOCKS, SEEDS, TENANTS

pytestmark = pytest.mark.anyio


def _wrong_bytes(res: LoadResult) -> list[str]:
    return [p for p in res.problems if p.startswith(("wrong bytes", "odd prefix", "kv for an empty"))]


def _check_accounting(res: LoadResult) -> None:
    # every block a get served counted one hit on its tier; every get short of its request, one miss reason
    assert res.hits_delta == res.blocks_served
    assert sum(res.misses_by_reason.values()) == res.gets_with_miss


async def _load(root: Path, ops: int) -> tuple[LoadResult, int]:
    """Run the load; returns the result and the number of stale LRU keys (white-box: keys in a
    tier's LRU that are not indexed, or indexed under another tier). Every indexed block must be in
    the LRU of the tier that serves it (else it can never be demoted): those count as stale too."""
    async with await TierKV.open(load_config(root)) as kv:
        res = await run_load(kv, clients=64, ops=ops, deadline_s=240)
        stale = sum(1 for k, e in kv._index.items() if k not in kv._tiers[e.tier].lru)
        stale += sum(
            1 for ti, t in enumerate(kv._tiers) for k in t.lru if k not in kv._index or kv._index[k].tier != ti
        )
    return res, stale


async def test_64_clients_serve_only_right_bytes_and_count_consistently(tmp_path: Path) -> None:
    res, _ = await _load(tmp_path, 640)
    assert len(res.samples) + sum(res.errors.values()) == 640
    assert _wrong_bytes(res) == []
    _check_accounting(res)
    assert res.blocks_served > 0


async def test_64_clients_lose_no_durable_prefix_and_raise_nothing(tmp_path: Path) -> None:
    res, stale = await _load(tmp_path, 640)
    assert stale == 0
    assert res.errors == {}
    assert res.problems == []


async def test_miss_storm_with_wait_budget_answers_overloaded_and_loses_nothing(tmp_path: Path) -> None:
    await populate(tmp_path / "kv")
    # one fetch slot, a 1 ms budget, 64 clients on an empty DRAM: most gets cannot start in time
    async with await TierKV.open(load_config(tmp_path / "kv", max_fetches=1, fetch_wait_s=0.001)) as kv:
        assert kv.stats()["dram"].blocks == 0
        res = await run_load(kv, clients=64, ops=640, seed=1, deadline_s=240, durable0=True)
    assert res.errors == {}
    # no wrong bytes, overloaded answers carry 0 tokens, every other get serves the whole durable
    # prefix, and re-reading every durable prefix after the run serves it whole and right
    assert res.problems == []
    assert res.overloaded > 0
    assert res.misses_by_reason.get("overloaded", 0) == res.overloaded
    assert res.verified_prefixes == len(TENANTS) * SEEDS
    _check_accounting(res)
    gets = sum(1 for kind, _, _ in res.samples if kind == "get")
    assert res.blocks_served == (gets - res.overloaded) * MAX_BLOCKS  # every admitted get served the whole sequence


@pytest.mark.slow
async def test_full_10k_ops_and_miss_storm_with_admission_control(tmp_path: Path, anyio_backend: str) -> None:
    if anyio_backend != "asyncio":
        pytest.skip("the full run once (asyncio); the default target covers trio")
    res, stale = await _load(tmp_path / "steady", 10_000)
    assert _wrong_bytes(res) == []
    _check_accounting(res)
    await populate(tmp_path / "template")
    storms = []
    for i, wait in enumerate((None, 0.005)):
        shutil.copytree(
            tmp_path / "template", tmp_path / f"storm{i}", symlinks=True
        )  # pfs hard-link records become plain copies: each still a whole content file
        async with await TierKV.open(load_config(tmp_path / f"storm{i}", max_fetches=4, fetch_wait_s=wait)) as kv:
            assert kv.stats()["dram"].blocks == 0  # the restart left the fast tier empty
            storms.append(await run_load(kv, clients=64, ops=10_000, seed=1, deadline_s=240, durable0=True))
    assert res.errors == {} and res.problems == [] and stale == 0
    for storm in storms:
        assert _wrong_bytes(storm) == []
        _check_accounting(storm)
        assert storm.errors == {} and storm.problems == []
        assert storm.verified_prefixes == len(TENANTS) * SEEDS
    assert storms[0].overloaded == 0  # no wait budget: a get waits for its slot, never answered overloaded
