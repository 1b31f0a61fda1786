"""A closed TierKV is freed: telemetry's observable gauges must not keep it (and its tiers' memory and
file descriptors) alive, whether they are registered on an SDK meter provider or on the API's global one."""

from __future__ import annotations

import gc
import os
import weakref
from pathlib import Path
from typing import Any

import kvtest
import pytest
from kvtest import kv_for

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from tierkv import TierKV
from tierkv._telemetry import Telemetry

pytestmark = pytest.mark.anyio

CYCLES = 200
DRAM = 4 << 20  # bytes: each cycle maps a fresh DRAM arena of this size


def config(tmp_path: Path) -> dict[str, Any]:
    return kvtest.config(tmp_path, dram=DRAM, pfs="64MiB")


def rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


KV = kv_for(32)
TOKENS = list(range(32))


async def cycle(cfg: dict[str, Any], meter_provider: Any) -> weakref.ref[TierKV]:
    kv = await TierKV.open(cfg, meter_provider=meter_provider)
    await kv.put(TOKENS, KV)
    assert (await kv.get(TOKENS)).tokens == 32
    await kv.aclose()
    return weakref.ref(kv)


@pytest.mark.parametrize("provider", ["sdk", "global"])
async def test_open_close_cycles_are_flat(tmp_path: Path, provider: str) -> None:
    """200 open/put/get/aclose cycles: RSS and open fds stay flat (small fixed slack), and every closed
    TierKV is collected. Before the fix every cycle kept its TierKV (a DRAM arena and two pfs directory
    descriptors) alive through the gauge callbacks."""
    reader = InMemoryMetricReader()
    mp = MeterProvider(metric_readers=[reader]) if provider == "sdk" else None
    cfg = config(tmp_path)
    try:
        for _ in range(5):  # warm-up: imports, caches, thread pool
            await cycle(cfg, mp)
        gc.collect()
        rss0, fds0 = rss_bytes(), open_fds()
        refs = [await cycle(cfg, mp) for _ in range(CYCLES)]
        gc.collect()
        alive = sum(r() is not None for r in refs)
        assert alive == 0, f"{alive} of {CYCLES} closed TierKVs are still alive"
        assert open_fds() - fds0 <= 8, f"open fds grew by {open_fds() - fds0} over {CYCLES} cycles"
        grew = rss_bytes() - rss0
        # a leaked store is at least one DRAM arena: 200 of them would be 800 MiB
        assert grew < 64 << 20, f"RSS grew by {grew / 2**20:.0f} MiB over {CYCLES} cycles"
        if mp is not None:
            assert reader.get_metrics_data() is not None  # collecting with no live store is harmless
    finally:
        if mp is not None:
            mp.shutdown()


async def test_live_stores_share_a_provider_and_close_unregisters(tmp_path: Path) -> None:
    """Two live stores on one SDK provider both report their tier gauges (before, the second store's
    callbacks were dropped as duplicate instruments); after aclose (Telemetry.close) a store reports
    nothing and is collected."""
    reader = InMemoryMetricReader()
    mp = MeterProvider(metric_readers=[reader])

    def used_by_tier() -> dict[str, float]:
        data = reader.get_metrics_data()
        out: dict[str, float] = {}
        if data is None:
            return out
        for rm in data.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    if m.name == "tierkv.tier.used":
                        for p in m.data.data_points:
                            attrs = dict(p.attributes or {})
                            out[str(attrs["tier"])] = float(p.value)  # type: ignore[union-attr]
        return out

    a_cfg, b_cfg = config(tmp_path / "a"), config(tmp_path / "b")
    b_cfg["tiers"][0]["name"] = "dram_b"
    b_cfg["tiers"][1]["name"] = "pfs_b"
    try:
        a = await TierKV.open(a_cfg, meter_provider=mp)
        b = await TierKV.open(b_cfg, meter_provider=mp)
        await a.put(TOKENS, KV)
        await b.put(TOKENS, KV)
        seen = used_by_tier()
        assert seen.get("dram", 0) > 0 and seen.get("dram_b", 0) > 0
        await a.aclose()
        a._s.tel.close()  # what TierKV.aclose calls (idempotent)
        seen = used_by_tier()
        assert "dram" not in seen and seen.get("dram_b", 0) > 0
        ref = weakref.ref(a)
        del a
        gc.collect()
        assert ref() is None
        await b.aclose()
    finally:
        mp.shutdown()


def test_gauge_callback_holds_the_store_weakly() -> None:
    """The gauges hold a bound ``observe`` method weakly: once its owner is gone the rows vanish."""
    reader = InMemoryMetricReader()
    mp = MeterProvider(metric_readers=[reader])

    class Owner:
        def rows(self) -> list[tuple[str, str, int, int, int]]:
            return [("t", "dram", 100, 10, 1)]

    tel = Telemetry({}, meter_provider=mp)
    owner = Owner()
    tel.register_tier_gauges(owner.rows)
    ref = weakref.ref(owner)
    del owner
    gc.collect()
    assert ref() is None
    data = reader.get_metrics_data()
    names = [m.name for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics] if data else []
    assert "tierkv.tier.capacity" not in names
    tel.close()
    tel.close()  # idempotent
    mp.shutdown()
