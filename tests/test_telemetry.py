"""OpenTelemetry spans and metrics of TierKV, read back through the SDK's
in-memory span exporter and metric reader, on real DRAM and PFS tiers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("opentelemetry.sdk")

from kvtest import BLOCK, BT, config, kv_for
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from tierkv_conformance import FaultInjectingBackend
from tierkv_conformance._faults import FaultConfig

from tierkv import GetResult, TierKV
from tierkv._config import Config
from tierkv._keys import block_keys, to_token_array
from tierkv._registry import load_backend_class
from tierkv._telemetry import DEFAULT_COST_PER_GB_HOUR, MISS_REASONS, Telemetry
from tierkv.backend import Backend

pytestmark = pytest.mark.anyio

DEFAULT_TENANT = "0" * 32


def low_watermark_config(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    """DRAM that sheds to PFS early (watermarks 0.3/0.2 of 8 MiB) and keeps free room for promotions
    (the DRAM arena rounds extents, so a nearly full arena may be too fragmented for one more block)."""
    cfg = config(tmp_path, dram="8MiB", **extra)
    cfg["tiers"][0].update(high_watermark=0.3, low_watermark=0.2)
    return cfg


class Otel:
    """An SDK tracer provider and meter provider that keep everything in memory."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    def spans(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if s.name == name]

    def attrs(self, name: str) -> list[dict[str, Any]]:
        return [dict(s.attributes or {}) for s in self.spans(name)]

    def metrics(self) -> dict[str, list[tuple[dict[str, Any], Any]]]:
        """metric name -> [(attributes, point)] of one collection (cumulative)."""
        out: dict[str, list[tuple[dict[str, Any], Any]]] = {}
        data = self.reader.get_metrics_data()
        if data is None:
            return out
        for rm in data.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    out.setdefault(m.name, []).extend((dict(p.attributes or {}), p) for p in m.data.data_points)
        return out

    def value(self, metrics: dict[str, list[tuple[dict[str, Any], Any]]], name: str, **match: Any) -> float:
        """Sum of the points of counter/gauge ``name`` whose attributes include ``match``."""
        return float(sum(p.value for a, p in metrics.get(name, []) if all(a.get(k) == v for k, v in match.items())))

    def shutdown(self) -> None:
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()


@pytest.fixture
def otel() -> Any:
    o = Otel()
    yield o
    o.shutdown()


async def wait_until(cond: Callable[[], bool]) -> None:
    """Poll ``cond`` (background work of the scheduler service); fail after 10 s."""
    with anyio.fail_after(10):
        while not cond():  # noqa: ASYNC110
            await anyio.sleep(0.01)


def open_kv(cfg: dict[str, Any], otel: Otel) -> Any:
    return TierKV.open(cfg, tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider)


def first_key(kv: TierKV, tokens: list[int], tenant: str | None = None, index: int = 0) -> str:
    """The backend key of block ``index`` of ``tokens`` (as the core computes it)."""
    keys = block_keys(kv.scope(tenant).digest(), to_token_array(tokens), kv.block_tokens)
    return keys[index].hex()


def tier_backend(kv: TierKV, name: str) -> Backend:
    """The backend under tier ``name`` (tests reach under the core on purpose)."""
    for t in kv._tiers:
        if t.name == name:
            return t.backend
    raise KeyError(name)


# ------------------------------------------------------------------ hit


async def test_hit_span_and_metrics(tmp_path: Path, otel: Otel) -> None:
    toks = list(range(100, 148))
    async with await open_kv(config(tmp_path), otel) as kv:
        await kv.put(toks, kv_for(48), tenant="alice")
        lk = await kv.lookup(toks, tenant="alice")
        g = await kv.get(toks, tenant="alice")
        assert g.tokens == 48 and lk.tokens == 48 and g.miss_reason == ""

    (put,) = otel.attrs("tierkv.put")
    assert put["tierkv.tokens"] == 48 and put["tierkv.new_blocks"] == 3
    assert put["tierkv.bytes"] == 3 * BLOCK and tuple(put["tierkv.codec"]) == ("raw",)
    tid = put["tierkv.tenant"]
    assert tid != "alice" and len(tid) == 32 and tid != DEFAULT_TENANT  # hashed, never the name
    (get,) = otel.attrs("tierkv.get")
    assert get["tierkv.tokens"] == 48 and get["tierkv.hit_tokens"] == 48
    assert list(get["tierkv.tiers_hit"]) == ["dram"]
    assert get["tierkv.bytes"] == 3 * BLOCK and tuple(get["tierkv.codec"]) == ("raw",)
    assert get["tierkv.tenant"] == tid and get["tierkv.miss_reason"] == ""
    (look,) = otel.attrs("tierkv.lookup")
    assert look["tierkv.hit_tokens"] == 48 and look["tierkv.miss_reason"] == ""
    # raw token ids never appear in any attribute
    for s in otel.exporter.get_finished_spans():
        for v in (s.attributes or {}).values():
            assert not (isinstance(v, (tuple, list)) and len(v) >= 16 and all(isinstance(x, int) for x in v))

    m = otel.metrics()
    assert otel.value(m, "tierkv.hits", tier="dram") == 3
    assert otel.value(m, "tierkv.bytes_read", tier="dram") == 3 * BLOCK
    assert otel.value(m, "tierkv.bytes_written", tier="dram") == 3 * BLOCK
    assert otel.value(m, "tierkv.tenant.tokens", tenant=tid, op="put") == 48
    assert otel.value(m, "tierkv.tenant.tokens", tenant=tid, op="hit") == 48
    assert otel.value(m, "tierkv.tokens_saved", tenant=tid) == 48
    assert otel.value(m, "tierkv.misses") == 0
    ops = {a["op"]: p for a, p in m["tierkv.operation.duration"]}
    assert {"put", "get", "lookup"} <= set(ops)
    assert ops["get"].count == 1 and ops["get"].sum > 0 and ops["put"].count == 1


# --------------------------------------------------------------- misses


async def test_miss_never_stored(tmp_path: Path, otel: Otel) -> None:
    async with await open_kv(config(tmp_path), otel) as kv:
        g = await kv.get(list(range(32)))
        assert g.tokens == 0 and g.miss_reason == "never_stored"
        await kv.lookup(list(range(32)))
    (get,) = otel.attrs("tierkv.get")
    assert get["tierkv.miss_reason"] == "never_stored" and get["tierkv.hit_tokens"] == 0
    assert otel.attrs("tierkv.lookup")[0]["tierkv.miss_reason"] == "never_stored"
    m = otel.metrics()
    assert otel.value(m, "tierkv.misses", reason="never_stored", tenant=DEFAULT_TENANT) == 1
    assert otel.value(m, "tierkv.hits") == 0


@pytest.mark.parametrize(
    ("reason", "tiers", "tier", "index", "hit_tokens"),
    [
        ("evicted_local", {"pfs": None}, "dram", 1, BT),
        # the PFS tier is shared: a block another process removed is an evicted_remote miss
        ("evicted_remote", {"dram": None}, "pfs", 0, 0),
    ],
    ids=["local", "remote"],
)
async def test_miss_evicted(
    tmp_path: Path, otel: Otel, reason: str, tiers: dict[str, None], tier: str, index: int, hit_tokens: int
) -> None:
    """Block ``index`` evicted under the core (the index still lists it): the get stops there."""
    toks = list(range(48))
    async with await open_kv(config(tmp_path, **tiers), otel) as kv:
        await kv.put(toks, kv_for(48))
        assert await tier_backend(kv, tier).evict(first_key(kv, toks, index=index))
        g = await kv.get(toks)
        assert g.tokens == hit_tokens and g.miss_reason == reason
    get = otel.attrs("tierkv.get")[-1]
    assert get["tierkv.miss_reason"] == reason and get["tierkv.hit_tokens"] == hit_tokens
    assert otel.value(otel.metrics(), "tierkv.misses", reason=reason) == 1


async def test_miss_integrity_corrupt_pfs_file(tmp_path: Path, otel: Otel) -> None:
    toks = list(range(48))
    async with await open_kv(config(tmp_path, dram=None), otel) as kv:
        await kv.put(toks, kv_for(48))
        files = sorted(p for p in (tmp_path / "pfs").rglob("*") if p.is_file() and p.stat().st_size >= BLOCK)
        assert files
        raw = bytearray(files[0].read_bytes())
        raw[1000] ^= 0xFF
        files[0].write_bytes(bytes(raw))
        g = await kv.get(toks)
        assert g.tokens < 48 and g.miss_reason == "integrity"
    get = otel.attrs("tierkv.get")[-1]
    assert get["tierkv.miss_reason"] == "integrity" and get["tierkv.hit_tokens"] == g.tokens
    assert otel.value(otel.metrics(), "tierkv.misses", reason="integrity") == 1


async def test_miss_other_tenant_is_never_stored_for_the_caller(tmp_path: Path, otel: Otel) -> None:
    """One tenant learns nothing of another's cache: bob asking for alice's prompt gets the
    same answer as for a prompt nobody stored; only the operator's metric knows better."""
    toks = list(range(48))
    async with await open_kv(config(tmp_path), otel) as kv:
        await kv.put(toks, kv_for(48), tenant="alice")
        g = await kv.get(toks, tenant="bob")
        assert g.tokens == 0 and g.miss_reason == "never_stored"
        nobody = await kv.get(list(range(5000, 5048)), tenant="bob")
        assert nobody.miss_reason == "never_stored"
        lk = await kv.lookup(toks, tenant="bob")
        assert lk.tokens == 0
        assert kv.misses_by_reason == {"different_scope": 1, "never_stored": 1}  # the operator's view
    get = otel.attrs("tierkv.get")[-2]
    assert get["tierkv.miss_reason"] == "never_stored"
    assert otel.attrs("tierkv.lookup")[-1]["tierkv.miss_reason"] == "never_stored"
    put_tid = otel.attrs("tierkv.put")[0]["tierkv.tenant"]
    assert get["tierkv.tenant"] != put_tid  # per-tenant, hashed
    m = otel.metrics()
    assert otel.value(m, "tierkv.misses", reason="different_scope", tenant=get["tierkv.tenant"]) == 1
    assert otel.value(m, "tierkv.misses", tenant=put_tid) == 0


async def test_miss_different_scope_of_the_same_tenant(tmp_path: Path, otel: Otel) -> None:
    """The same tenant's tokens stored under an older model revision: ``different_scope``."""
    toks = list(range(48))
    async with await open_kv(config(tmp_path), otel) as kv:
        await kv.put(toks, kv_for(48), tenant="alice", durable=True)
    newer = config(tmp_path)
    newer["model"] = {**newer["model"], "revision": "newer"}
    async with await open_kv(newer, otel) as kv:
        g = await kv.get(toks, tenant="alice")
        assert g.tokens == 0 and g.miss_reason == "different_scope"
        assert (await kv.get(toks, tenant="bob")).miss_reason == "never_stored"


async def gated_get(tmp_path: Path, otel: Otel, prefill_tokens_per_s: float) -> tuple[GetResult, dict[str, Any]]:
    """Put 64 tokens and get them with the gate on at this prefill rate: the get, and its gate span's attributes."""
    cfg = config(tmp_path, scheduler={"prefill_tokens_per_s": prefill_tokens_per_s})
    toks = list(range(64))
    async with await open_kv(cfg, otel) as kv:
        await kv.put(toks, kv_for(64))
        g = await kv.get(toks)
    (gate,) = otel.attrs("tierkv.gate")
    return g, gate


async def test_miss_gated_and_gate_span(tmp_path: Path, otel: Otel) -> None:
    # an absurd prefill rate: recomputing is always faster than reading
    g, gate = await gated_get(tmp_path, otel, 1e12)
    assert g.tokens == 0 and g.miss_reason == "gated"
    assert g.fetch_s is not None and g.recompute_s is not None and g.fetch_s > g.recompute_s
    assert gate["tierkv.decision"] == "recompute"
    assert gate["tierkv.fetch_s"] == pytest.approx(g.fetch_s)
    assert gate["tierkv.recompute_s"] == pytest.approx(g.recompute_s)
    assert otel.attrs("tierkv.get")[0]["tierkv.miss_reason"] == "gated"
    (gspan,) = otel.spans("tierkv.gate")
    (getspan,) = otel.spans("tierkv.get")
    assert gspan.parent is not None and gspan.parent.span_id == getspan.context.span_id  # nested in the get
    m = otel.metrics()
    assert otel.value(m, "tierkv.gate.decisions", decision="recompute") == 1
    assert otel.value(m, "tierkv.misses", reason="gated") == 1
    assert otel.value(m, "tierkv.hits") == 0


async def test_gated_fetch(tmp_path: Path, otel: Otel) -> None:
    # a slow engine: fetching is the better deal, the gate says fetch and the get hits
    g, gate = await gated_get(tmp_path, otel, 10.0)
    assert g.tokens == 64 and g.miss_reason == ""
    assert gate["tierkv.decision"] == "fetch" and gate["tierkv.fetch_s"] < gate["tierkv.recompute_s"]
    assert gate["tierkv.recompute_s"] == pytest.approx(64 / 10.0)
    assert gate["tierkv.tokens"] == 64
    m = otel.metrics()
    assert otel.value(m, "tierkv.gate.decisions", decision="fetch") == 1
    assert otel.value(m, "tierkv.gate.decisions", decision="recompute") == 0
    assert otel.value(m, "tierkv.hits", tier="dram") == 4


async def test_no_gate_span_without_prefill_rate(tmp_path: Path, otel: Otel) -> None:
    async with await open_kv(config(tmp_path), otel) as kv:
        await kv.put(list(range(32)), kv_for(32))
        await kv.get(list(range(32)))
    assert otel.spans("tierkv.gate") == []
    assert "tierkv.gate.decisions" not in otel.metrics()


# ------------------------------------------------------- unhealthy tier


async def open_faulty(tmp_path: Path, otel: Otel, **sched: Any) -> tuple[TierKV, FaultInjectingBackend]:
    """DRAM behind a fault injector, PFS below it; the breaker opens at the first failure."""
    cfg = Config.load(config(tmp_path, scheduler={"breaker": {"failure_threshold": 1, "cooldown_s": 0.05}, **sched}))
    backends: list[tuple[str, Backend]] = []
    for t in cfg.tiers:
        backends.append((t.name, await load_backend_class(t.backend).open(t.options, name=t.name)))
    faulty = FaultInjectingBackend(backends[0][1], FaultConfig(), name="dram")
    backends[0] = ("dram", faulty)
    tel = Telemetry(cfg.telemetry, tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider)
    kv = TierKV(cfg, backends, telemetry=tel)
    await kv._s.durable.recover()
    return kv, faulty


async def test_unhealthy_tier_miss_and_decision_spans(tmp_path: Path, otel: Otel) -> None:
    kv, faulty = await open_faulty(tmp_path, otel)
    toks = list(range(48))
    async with kv:
        await kv.put(toks, kv_for(48))
        assert kv.stats()["dram"].blocks == 3
        faulty.set_faults(FaultConfig(error_rate=1.0, ops=frozenset({"read", "contains"})))
        g = await kv.get(toks)
        assert g.tokens == 0 and g.miss_reason == "tier_unhealthy"
        assert not kv.stats()["dram"].healthy
        g2 = await kv.get(toks)  # the index knows the tier is out: no read attempted
        assert g2.miss_reason == "tier_unhealthy"
        lk = await kv.lookup(toks)
        assert lk.tokens == 0
        # heal the tier: the service's probe closes the breaker again
        faulty.set_faults(FaultConfig())
        await wait_until(lambda: kv.stats()["dram"].healthy)
        g3 = await kv.get(toks)
        assert g3.tokens == 48
    (down,) = otel.attrs("tierkv.decision.tier_unhealthy")
    assert down["tierkv.tier"] == "dram" and "injected fault" in down["tierkv.reason"]
    up = otel.attrs("tierkv.decision.tier_healthy")
    assert up and up[0]["tierkv.tier"] == "dram"
    gets = otel.attrs("tierkv.get")
    assert [a["tierkv.miss_reason"] for a in gets[:2]] == ["tier_unhealthy", "tier_unhealthy"]
    assert otel.attrs("tierkv.lookup")[0]["tierkv.miss_reason"] == "tier_unhealthy"
    m = otel.metrics()
    assert otel.value(m, "tierkv.misses", reason="tier_unhealthy") == 2
    assert otel.value(m, "tierkv.hits", tier="dram") == 3


# ------------------------------------------------- promotion / demotion


async def test_demotion_and_eviction_decisions(tmp_path: Path, otel: Otel) -> None:
    seqs = [list(range(i * 1000, i * 1000 + 32)) for i in range(6)]
    async with await open_kv(config(tmp_path, dram=str(BLOCK * 4)), otel) as kv:
        for i, s in enumerate(seqs):
            await kv.put(s, kv_for(32, i))
        # the service's demotions of the last puts are done (a loaded machine saw 9 spans, 8 counted)
        await kv.drain()
        demotions = kv.stats()["dram"].demotions
        assert demotions > 0
    dem = otel.attrs("tierkv.decision.demote")
    assert len(dem) == demotions
    for a in dem:
        assert a["tierkv.from_tier"] == "dram" and a["tierkv.to_tier"] == "pfs"
        assert a["tierkv.reason"].startswith("watermark")
        assert 0.0 <= a["tierkv.posterior"] <= 1.0 and 0.0 <= a["tierkv.confidence"] <= 1.0
        assert isinstance(a["tierkv.score"], float)
        assert a["tierkv.tau_s"] in (30.0, 60.0, 120.0, 300.0)  # the adaptive tau's candidates
        assert {"tierkv.value.dram", "tierkv.value.pfs"} <= set(a)
        assert len(a["tierkv.block"]) == 16
    m = otel.metrics()
    assert otel.value(m, "tierkv.demotions", **{"from": "dram", "to": "pfs"}) == demotions


async def test_eviction_at_the_bottom(tmp_path: Path, otel: Otel) -> None:
    async with await open_kv(config(tmp_path, dram=str(BLOCK * 3), pfs=None), otel) as kv:
        for i in range(5):
            await kv.put(list(range(i * 100, i * 100 + 16)), kv_for(16, i))
    ev = otel.attrs("tierkv.decision.evict")
    assert ev and all(a["tierkv.from_tier"] == "dram" and a["tierkv.to_tier"] == "" for a in ev)
    assert all(a["tierkv.reason"] == "watermark at the bottom tier" for a in ev)
    m = otel.metrics()
    assert otel.value(m, "tierkv.evictions", tier="dram") == len(ev)


async def test_promotion_by_prefetch(tmp_path: Path, otel: Otel) -> None:
    seqs = [list(range(i * 1000, i * 1000 + 32)) for i in range(6)]
    kv = await open_kv(low_watermark_config(tmp_path), otel)  # no service: prefetch promotes now
    try:
        for i, s in enumerate(seqs):
            await kv.put(s, kv_for(32, i))
        assert (await kv.lookup(seqs[0])).tiers == ("pfs",)
        n = await kv.prefetch(seqs[0], decode_position=0)
        assert n >= 1
        assert "dram" in (await kv.lookup(seqs[0])).tiers
        promoted = kv.stats()["dram"].promotions
        g = await kv.get(seqs[0])
        assert g.tokens == 32
    finally:
        await kv.aclose()
    pro = otel.attrs("tierkv.decision.promote")
    assert len(pro) == promoted == n
    for a in pro:
        assert a["tierkv.from_tier"] == "pfs" and a["tierkv.to_tier"] == "dram"
        assert a["tierkv.reason"] == "prefetch"
        assert {
            "tierkv.score",
            "tierkv.posterior",
            "tierkv.confidence",
            "tierkv.value.dram",
            "tierkv.value.pfs",
        } <= set(a)
    (pf,) = otel.attrs("tierkv.prefetch")
    assert pf["tierkv.decode_position"] == 0 and pf["tierkv.blocks"] == n
    m = otel.metrics()
    assert otel.value(m, "tierkv.promotions", **{"from": "pfs", "to": "dram"}) == n
    assert otel.value(m, "tierkv.prefetch", outcome="useful") >= 1  # the get used a prefetched block
    assert m["tierkv.operation.duration"] and any(a["op"] == "prefetch" for a, _ in m["tierkv.operation.duration"])


async def test_promotion_by_value_in_the_service(tmp_path: Path, otel: Otel) -> None:
    seqs = [list(range(i * 1000, i * 1000 + BT)) for i in range(10)]
    async with await open_kv(low_watermark_config(tmp_path), otel) as kv:
        for i, s in enumerate(seqs):
            await kv.put(s, kv_for(BT, i))
        # the service demotes in the background: wait until a demotion is indexed
        await wait_until(lambda: any(e.tier == 1 for e in kv._index.values()))
        cold = [s for s in seqs if (await kv.lookup(s)).tiers == ("pfs",)][0]  # noqa: RUF015
        g = await kv.get(cold)  # a hit from the slower tier: the service promotes it
        assert g.tiers == ("pfs",)
        await wait_until(lambda: kv.stats()["dram"].promotions > 0)
        assert (await kv.lookup(cold)).tiers == ("dram",)
    pro = [a for a in otel.attrs("tierkv.decision.promote") if a["tierkv.reason"] == "value"]
    assert pro and pro[0]["tierkv.from_tier"] == "pfs" and pro[0]["tierkv.to_tier"] == "dram"
    assert pro[0]["tierkv.value.dram"] > pro[0]["tierkv.value.pfs"]
    assert otel.value(otel.metrics(), "tierkv.promotions", **{"from": "pfs", "to": "dram"}) >= 1


async def test_bytes_metrics_match_tier_stats(tmp_path: Path, otel: Otel) -> None:
    seqs = [list(range(i * 1000, i * 1000 + 32)) for i in range(6)]
    async with await open_kv(config(tmp_path, dram=str(BLOCK * 4)), otel) as kv:
        for i, s in enumerate(seqs):
            await kv.put(s, kv_for(32, i))
        for s in seqs:
            await kv.get(s)
    st = kv.stats()  # after the service stopped: background moves in flight are included
    m = otel.metrics()
    for name, s in st.items():
        assert otel.value(m, "tierkv.bytes_written", tier=name) == s.bytes_in
        assert otel.value(m, "tierkv.bytes_read", tier=name) == s.bytes_out


async def test_prefetch_wasted(tmp_path: Path, otel: Otel) -> None:
    seqs = [list(range(i * 1000, i * 1000 + 32)) for i in range(16)]
    kv = await open_kv(low_watermark_config(tmp_path), otel)
    try:
        for i, s in enumerate(seqs[:6]):
            await kv.put(s, kv_for(32, i))
        assert await kv.prefetch(seqs[0], decode_position=0) >= 1
        for i, s in enumerate(seqs[6:]):  # push the prefetched blocks out before anyone reads them
            await kv.put(s, kv_for(32, 6 + i))
        assert (await kv.lookup(seqs[0])).block_tiers[0] == "pfs"
    finally:
        await kv.aclose()
    assert otel.value(otel.metrics(), "tierkv.prefetch", outcome="wasted") >= 1


async def test_predictor_calibration_bins(tmp_path: Path, otel: Otel) -> None:
    cfg = config(tmp_path, scheduler={"predictor": {"horizon_s": 0.01}})
    async with await open_kv(cfg, otel) as kv:
        toks = list(range(64))
        await kv.put(toks, kv_for(64))
        for _ in range(3):
            await kv.get(toks)
            await anyio.sleep(0.03)
        await kv.get(list(range(500, 532)))
    pts = otel.metrics().get("tierkv.predictor.calibration", [])
    assert pts and {"bin", "outcome"} <= set(pts[0][0])


# ------------------------------------------------------------ gauges, cost


async def test_tier_and_cost_gauges(tmp_path: Path, otel: Otel) -> None:
    cfg = config(
        tmp_path,
        telemetry={"cost_per_gb_hour": {"dram": 1.0}, "prefill_cost_per_million_tokens": 2.0},
    )
    async with await open_kv(cfg, otel) as kv:
        toks = list(range(64))
        await kv.put(toks, kv_for(64))
        await kv.get(toks)
        st = kv.stats()
        m = otel.metrics()
    assert otel.value(m, "tierkv.tier.capacity", tier="dram", kind="dram") == st["dram"].capacity_bytes
    assert otel.value(m, "tierkv.tier.used", tier="dram") == st["dram"].used_bytes == 4 * BLOCK
    assert otel.value(m, "tierkv.tier.blocks", tier="dram") == 4
    assert otel.value(m, "tierkv.tier.blocks", tier="pfs", kind="pfs") == 0
    assert otel.value(m, "tierkv.cost.storage", tier="dram") == pytest.approx(4 * BLOCK / 1e9 * 1.0)
    assert otel.value(m, "tierkv.cost.storage", tier="pfs") == 0.0
    net = otel.value(m, "tierkv.cost.net_per_million_tokens_saved")
    assert 0.0 < net <= 2.0  # prefill dollars saved per million tokens, minus a little storage


def test_cost_model_defaults_and_overrides() -> None:
    tel = Telemetry({"enabled": False, "cost_per_gb_hour": {"nvme": 0.5, "fast": 2.0}})
    assert tel.cost_per_gb_hour["nvme"] == 0.5
    assert tel.cost_per_gb_hour["dram"] == DEFAULT_COST_PER_GB_HOUR["dram"]
    assert tel.tier_cost_per_hour("fast", "dram", 10**9) == 2.0  # a tier name wins over its kind
    assert tel.tier_cost_per_hour("x", "nvme", 2 * 10**9) == 1.0
    assert tel.tier_cost_per_hour("x", "unknown", 10**9) == DEFAULT_COST_PER_GB_HOUR["other"]
    assert tel.dollars_per_million_saved([]) == 0.0
    tel.tokens_saved = 1_000_000
    assert tel.dollars_per_million_saved([]) == pytest.approx(tel.prefill_cost)
    assert set(MISS_REASONS) == {
        "overloaded",
        "never_stored",
        "evicted_local",
        "evicted_remote",
        "gated",
        "tier_unhealthy",
        "integrity",
        "different_scope",
        "tier_error",
    }


def test_bad_telemetry_config() -> None:
    from tierkv import ConfigError

    with pytest.raises(ConfigError):
        Telemetry({"cost_per_gb_hour": 3})
    with pytest.raises(ConfigError):
        Telemetry({"cost_per_gb_hour": {"dram": -1}})
    with pytest.raises(ConfigError):
        Telemetry({"enabled": "maybe"})


# ------------------------------------------------------------- disabled


async def test_disabled_produces_no_spans_or_metrics(tmp_path: Path, otel: Otel) -> None:
    cfg = config(
        tmp_path,
        dram=str(BLOCK * 4),
        telemetry={"enabled": False},
        scheduler={"prefill_tokens_per_s": 10.0},
    )
    seqs = [list(range(i * 1000, i * 1000 + 32)) for i in range(6)]
    async with await open_kv(cfg, otel) as kv:
        for i, s in enumerate(seqs):
            await kv.put(s, kv_for(32, i))
        await kv.lookup(seqs[0])
        assert (await kv.get(seqs[0])).tokens == 32
        await kv.get(list(range(9000, 9032)))
        await kv.prefetch(seqs[1], decode_position=0)
        assert kv.stats()["dram"].demotions > 0  # decisions happened, nothing traced
        assert kv.misses_by_reason == {"never_stored": 1}  # plain counters still work
    assert otel.exporter.get_finished_spans() == ()
    assert otel.metrics() == {}


async def test_enabled_without_sdk_providers_is_a_noop(tmp_path: Path) -> None:
    # the API's global providers (no SDK configured by this test): everything runs, nothing breaks
    async with await TierKV.open(config(tmp_path)) as kv:
        await kv.put(list(range(32)), kv_for(32))
        assert (await kv.get(list(range(32)))).tokens == 32
