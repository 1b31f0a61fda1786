"""The replay's ``tierkv`` policy is the shipped library: replaying a short trace through the
replay harness gives, request by request, the same prefix hits as driving a real TierKV directly
(one DRAM tier of the same capacity in blocks, lookup then put, the scheduler clock = trace time)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tierkv import TierKV
from tierkv.lab.policies.library import LibraryPolicy, library_config, tokens_of
from tierkv.lab.policies.lru import LruPolicy
from tierkv.lab.replay import load_trace, replay, truncate

TRACE = Path(__file__).parent / "data" / "traces" / "mooncake_conversation_trace.jsonl"


def short_trace() -> object:
    trace = load_trace(TRACE, 512, 512)
    return truncate(trace, 0.03)


async def direct(trace: object, capacity: int, policy: str | None) -> list[int]:
    """Prefix hits per request of a TierKV driven directly (no replay harness)."""
    kv = await TierKV.open(library_config(capacity, policy))
    clock = [0.0]
    kv._sched.now = lambda: clock[0]  # type: ignore[method-assign]
    kv._sched.set_capacity_blocks(capacity)
    leads = []
    try:
        for t, ids, tail in zip(trace.times, trace.blocks, trace.tail_partial, strict=True):  # type: ignore[attr-defined]
            if not ids:
                leads.append(0)
                continue
            clock[0] = t
            toks = tokens_of(ids, tail)  # a partial last block: a tail (the store keeps partial blocks)
            found = await kv.lookup(toks)
            leads.append(found.blocks + (1 if found.tail_tokens else 0))
            await kv.put(toks, np.zeros((1, 2, len(toks), 1, 64), dtype=np.float16))
    finally:
        await kv.aclose()
    return leads


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # an equivalence of placements, not of event loops
@pytest.mark.parametrize(
    "policy", [None, pytest.param("lru", marks=pytest.mark.slow), pytest.param("predictive", marks=pytest.mark.slow)]
)  # ~30 s each on two cores: the default policy in the default target, the others in the slow one
async def test_replay_harness_and_library_agree_block_for_block(policy: str | None, anyio_backend: str) -> None:
    trace = short_trace()
    capacity = 200
    assert len(trace.blocks) >= 100  # type: ignore[attr-defined]
    want = await direct(trace, capacity, policy)
    lib = LibraryPolicy(capacity, policy=policy)
    try:
        raw = replay(trace, lib, split_time=trace.times[0])  # type: ignore[arg-type, attr-defined]
    finally:
        lib.close()
    assert raw["leads"] == want
    assert sum(want) > 0  # the trace reuses prefixes at this capacity: the comparison has content


def test_library_lru_equals_the_lab_lru_at_exact_capacity() -> None:
    """With watermarks 1.0 the library's LRU keeps exactly what an LRU of that many blocks keeps, at a
    capacity above the longest request. (A request longer than the cache is where they part: a classic
    LRU keeps its last blocks, which no later lookup reaches; the library keeps its leading ones, as
    a put never drops its own chain to store the rest.)"""
    trace = short_trace()
    cap = max(len(b) for b in trace.blocks) + 1  # type: ignore[attr-defined]
    lib = LibraryPolicy(cap, policy="lru")
    try:
        a = replay(trace, lib, split_time=trace.times[0])  # type: ignore[arg-type, attr-defined]
    finally:
        lib.close()
    b = replay(trace, LruPolicy(cap), split_time=trace.times[0])  # type: ignore[arg-type, attr-defined]
    assert sum(a["leads"]) > 0
    assert a["leads"] == b["leads"]
    # below the longest request the library's prefix hits are at least the classic LRU's
    small = LibraryPolicy(200, policy="lru")
    try:
        c = replay(trace, small, split_time=trace.times[0])  # type: ignore[arg-type, attr-defined]
    finally:
        small.close()
    d = replay(trace, LruPolicy(200), split_time=trace.times[0])  # type: ignore[arg-type, attr-defined]
    assert sum(c["leads"]) >= sum(d["leads"])
