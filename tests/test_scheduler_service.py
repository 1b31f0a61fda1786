"""The predictive scheduler inside TierKV: the anyio service, promotions, prefetch,
the fetch-vs-recompute gate, circuit breakers with fault injection, hints."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import kvtest
import pytest
from kvtest import BLOCK, BT, kv_for
from tierkv_conformance import FaultConfig, FaultInjectingBackend

from tierkv import Config, InputError, LoadFailedError, SchedulerError, TierKV
from tierkv_backends.dram import DramBackend
from tierkv_backends.pfs import PfsBackend

pytestmark = pytest.mark.anyio


def config(tmp_path: Path, *, dram: int = 64 << 20, scheduler: dict[str, Any] | None = None) -> dict[str, Any]:
    return kvtest.config(tmp_path, dram=dram, pfs="512MiB", revision="r1", scheduler=scheduler or {})


async def wait_for(cond: Any, limit: float = 10.0) -> None:
    """Poll a condition on background work (the service has no event to wait on)."""
    with anyio.fail_after(limit):
        while not cond():  # noqa: ASYNC110
            await anyio.sleep(0.01)


async def test_service_lifecycle_and_single_instance(tmp_path: Path) -> None:
    async with await TierKV.open(config(tmp_path)) as kv:
        assert kv._s.service.running  # started by async with
        with pytest.raises(SchedulerError):
            await kv.run_scheduler()
    assert not kv._s.service.running and kv._service_tg is None
    kv2 = await TierKV.open(config(tmp_path / "b"))
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(kv2.run_scheduler)
            assert kv2._s.service.running
            await kv2.put(list(range(32)), kv_for(32))
            tg.cancel_scope.cancel()  # shutdown by cancellation
        assert not kv2._s.service.running
        assert (await kv2.get(list(range(32)))).tokens == 32  # still usable without the service
    finally:
        await kv2.aclose()


async def test_hits_in_a_slow_tier_are_promoted_in_the_background(tmp_path: Path) -> None:
    async with await TierKV.open(config(tmp_path, dram=BLOCK * 4, scheduler={"prefill_tokens_per_s": 50.0})) as kv:
        hot = list(range(32))
        await kv.put(hot, kv_for(32))
        for i in range(4):  # push the hot prefix down to PFS
            await kv.put(list(range(1000 * (i + 1), 1000 * (i + 1) + 32)), kv_for(32, i + 1))
        await wait_for(lambda: kv.stats()["dram"].used_bytes <= 0.9 * BLOCK * 4)
        assert "pfs" in (await kv.lookup(hot)).tiers
        for _ in range(3):  # repeated hits make its reuse value win over what sits in DRAM
            g = await kv.get(hot)
            assert g.kv.tobytes() == kv_for(32).tobytes()
        await wait_for(lambda: kv.stats()["dram"].promotions > 0)
        g = await kv.get(hot)
        assert g.kv.tobytes() == kv_for(32).tobytes()


async def test_a_prefix_larger_than_dram_is_not_swapped_back_and_forth(tmp_path: Path) -> None:
    """A prefix of 8 blocks over a DRAM tier of 4: every get hits half of it in DRAM and half in PFS.
    Promoting a PFS block would only push out a block the same request just used (a swap, two copies,
    nothing gained): no promotion happens however often the prefix is read. A hot prefix hit apart from
    a colder one still moves up (the test above)."""
    async with await TierKV.open(config(tmp_path, dram=BLOCK * 4, scheduler={"prefill_tokens_per_s": 50.0})) as kv:
        toks = list(range(8 * BT))
        await kv.put(toks, kv_for(8 * BT))
        await kv.drain()
        assert set((await kv.lookup(toks)).tiers) == {"dram", "pfs"}
        moved_before = kv.stats()["pfs"].bytes_out
        for _ in range(4):
            g = await kv.get(toks)
            assert g.tokens == 8 * BT and g.kv.tobytes() == kv_for(8 * BT).tobytes()
            await kv.drain()
        assert kv.stats()["dram"].promotions == 0
        # what was read from PFS is what the gets served from it, nothing more (no copies up)
        served_from_pfs = sum(1 for t in (await kv.lookup(toks)).block_tiers if t == "pfs")
        assert kv.stats()["pfs"].bytes_out - moved_before == 4 * served_from_pfs * BLOCK


async def test_prefetch_promotes_the_rope_window(tmp_path: Path) -> None:
    async with await TierKV.open(config(tmp_path)) as kv:
        toks = list(range(12 * BT))
        await kv.put(toks, kv_for(12 * BT), durable=True)
        # move everything to PFS by hand: drop the DRAM copies (the durable copies stay)
        for e in list(kv._index.values()):
            await kv._s.mover.demote_to_backing(e)
        assert (await kv.lookup(toks)).tiers == ("pfs",)
        # every layer of the model is global: the sink (block 0), the recent span (4 blocks by
        # default: 5..8) and the stored blocks past the position (9..11)
        n = await kv.prefetch(toks, decode_position=9 * BT)
        assert n == 8
        # with the service running the promotions happen in the background
        await wait_for(lambda: kv.prefetch_stats["issued"] == n)
        lk = await kv.lookup(toks)
        assert [t == "dram" for t in lk.block_tiers] == [True] + [False] * 4 + [True] * 7
        g = await kv.get(toks)
        assert g.kv.tobytes() == kv_for(12 * BT).tobytes()
        assert kv.prefetch_stats["useful"] == n
        with pytest.raises(Exception, match="decode_position"):
            await kv.prefetch(toks, decode_position=-1)


async def test_gate_boundaries(tmp_path: Path) -> None:
    toks = list(range(64))
    # recompute is near-free: reading DRAM cannot beat it -> gated miss with both estimates
    async with await TierKV.open(config(tmp_path / "a", scheduler={"prefill_tokens_per_s": 1e12})) as kv:
        await kv.put(toks, kv_for(64))
        g = await kv.get(toks)
        assert g.tokens == 0 and g.miss_reason == "gated"
        assert g.fetch_s is not None and g.recompute_s is not None and g.recompute_s < g.fetch_s
        assert kv._sched.gate_decisions["recompute"] == 1
    # recompute is slow: fetch wins
    async with await TierKV.open(config(tmp_path / "b", scheduler={"prefill_tokens_per_s": 100.0})) as kv:
        await kv.put(toks, kv_for(64))
        g = await kv.get(toks)
        assert g.tokens == 64 and g.miss_reason == ""
        assert kv._sched.gate_decisions["fetch"] == 1
        # a zero-length prefix is never fetched
        g0 = await kv.get(list(range(5)))
        assert g0.tokens == 0 and g0.kv is None


async def _faulty_kv(
    tmp_path: Path, policy: str = "recompute", *, verify_dram: bool | None = None
) -> tuple[TierKV, FaultInjectingBackend]:
    raw = config(tmp_path, scheduler={"breaker": {"failure_threshold": 2, "cooldown_s": 0.2}})
    if verify_dram is not None:
        raw["tiers"][0]["verify"] = verify_dram
    cfg = Config.load({**raw, "load_failure": policy})
    dram = FaultInjectingBackend(await DramBackend.open({"capacity": 64 << 20}, name="dram"), name="dram")
    pfs = await PfsBackend.open({"path": str(tmp_path / "pfs"), "capacity": "512MiB"}, name="pfs")
    kv = TierKV(cfg, [("dram", dram), ("pfs", pfs)])
    await kv._s.durable.recover()
    return kv, dram


async def test_failing_tier_is_marked_unhealthy_and_recovers(tmp_path: Path) -> None:
    kv, dram = await _faulty_kv(tmp_path)
    try:
        fast, durable = list(range(32)), list(range(500, 532))
        await kv.put(fast, kv_for(32))
        await kv.put(durable, kv_for(32, 1), durable=True)
        dram.set_faults(FaultConfig(error_rate=1.0, ops=frozenset({"read", "contains", "allocate", "write"})))
        g1 = await kv.get(fast)
        assert g1.tokens == 0 and g1.miss_reason in ("tier_error", "tier_unhealthy")
        await kv.get(fast)
        assert not kv.stats()["dram"].healthy  # breaker opened after 2 failures
        g = await kv.get(fast)
        assert g.tokens == 0 and g.miss_reason == "tier_unhealthy"
        # blocks with a durable copy on the healthy tier are still served, bit-exact
        g = await kv.get(durable)
        assert g.tokens == 32 and g.tiers == ("pfs",) and g.kv.tobytes() == kv_for(32, 1).tobytes()
        # new blocks go around the unhealthy tier
        r = await kv.put(list(range(900, 932)), kv_for(32, 2))
        assert r.tiers == ("pfs",)
        # recovery by probes once the faults stop
        dram.set_faults(FaultConfig())
        async with anyio.create_task_group() as tg:
            await tg.start(kv.run_scheduler)
            await wait_for(lambda: kv.stats()["dram"].healthy, limit=5)
            tg.cancel_scope.cancel()
        g = await kv.get(fast)
        assert g.tokens == 32 and g.kv.tobytes() == kv_for(32).tobytes()
    finally:
        await kv.aclose()


async def test_load_failure_policy_fail_raises_typed_error(tmp_path: Path) -> None:
    kv, dram = await _faulty_kv(tmp_path, policy="fail")
    try:
        await kv.put(list(range(32)), kv_for(32))
        dram.set_faults(FaultConfig(error_rate=1.0, ops=frozenset({"read"})))
        with pytest.raises(LoadFailedError):
            await kv.get(list(range(32)))
    finally:
        await kv.aclose()


async def test_torn_writes_are_never_served(tmp_path: Path) -> None:
    # a memory tier is verified only when configured to be (tiers[i].verify; see
    # test_checksum_policy): this one is, and every torn block is a miss
    kv, dram = await _faulty_kv(tmp_path, verify_dram=True)
    try:
        dram.set_faults(FaultConfig(torn_write_rate=1.0, seed=3))
        toks = list(range(48))
        await kv.put(toks, kv_for(48))
        assert dram.torn_keys
        g = await kv.get(toks)
        assert g.tokens == 0 and g.miss_reason == "integrity"
    finally:
        await kv.aclose()


async def test_hints_drive_the_markov_chain_and_tool_prefetch(tmp_path: Path) -> None:
    async with await TierKV.open(config(tmp_path)) as kv:
        with pytest.raises(InputError, match="transition"):
            kv.hint(transition="teleport")
        kv.hint(transition="tool_switch")
        kv.hint(tool="search")
        ctx = list(range(7000, 7032))
        await kv.put(ctx, kv_for(32, 9), block_type="tool_context", durable=True)
        for e in list(kv._index.values()):
            await kv._s.mover.demote_to_backing(e)
        kv.hint(tool="code")
        kv.hint(tool="search")  # search -> code -> search: after "search", "code" was seen once
        kv.hint(tool="code")
        # after "code" the chain predicts "search" (p = 1.0): its context is prefetched into DRAM
        await wait_for(lambda: kv._index[next(iter(kv._s.tool_blocks["search"]))].tier == 0)
        pred = kv._sched.chain.predict("code")
        assert pred is not None and pred[0] == "search" and pred[1] == 1.0
        with pytest.raises(InputError, match="block_type"):
            await kv.put(list(range(16)), kv_for(16), block_type="weird")
