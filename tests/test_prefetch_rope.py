"""RoPE-aware prefetch: the planner's math (layer classes from the model spec, sinks, recent span,
importance, lookahead, budget, excluded blocks) and the public ``prefetch`` over DRAM above PFS/NVMe."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kvtest import dram_tier, nvme_tier, pfs_tier

from tierkv import ConfigError, InputError, ModelSpec, TierKV
from tierkv.scheduler import LayerClass, PrefetchPlanner, layer_classes

BT = 16
#: a Gemma-like pattern: five sliding layers to one global, window of 4 blocks
GEMMA = ModelSpec(
    name="gemma-like",
    num_layers=12,
    num_attention_heads=2,
    num_kv_heads=2,
    head_dim=8,
    attention="mha",
    layer_types=(("sliding_attention",) * 5 + ("full_attention",)) * 2,
    sliding_window=4 * BT,
)
SLIDING = ModelSpec(
    name="all-sliding",
    num_layers=4,
    num_attention_heads=2,
    num_kv_heads=2,
    head_dim=8,
    attention="mha",
    layer_types=("sliding_attention",) * 4,
    sliding_window=3 * BT,
)
GLOBAL = ModelSpec(name="all-global", num_layers=4, num_attention_heads=2, num_kv_heads=2, head_dim=8, attention="mha")


def test_layer_classes_come_from_the_spec() -> None:
    loc, glo = layer_classes(GEMMA)
    assert (loc.name, loc.layers, loc.first_layer, loc.window) == ("local", 10, 0, 4 * BT)
    assert (glo.name, glo.layers, glo.first_layer, glo.window) == ("global", 2, 5, None)
    assert [c.name for c in layer_classes(GLOBAL)] == ["global"] and layer_classes(GLOBAL)[0].layers == 4
    assert layer_classes(None) == (LayerClass("global", 1),)


def test_a_sliding_only_model_never_asks_for_blocks_before_the_window() -> None:
    p = PrefetchPlanner(BT, layer_classes(SLIDING))
    for n in (0, 5, 3 * BT, 7 * BT + 3, 20 * BT):
        plan = p.plan(n, 24)
        lo = max(0, n - 3 * BT) // BT  # the first block any layer can reach
        assert all(i >= lo for i in plan.order), (n, plan.order)
        assert plan.excluded == frozenset(range(min(lo, 24)))
        assert not plan.excluded & set(plan.order)
    # the observed span narrows what is needed, never widens it past the window
    p.observe_span("local", BT)
    assert p.plan(10 * BT, 10).order == (9,)
    p2 = PrefetchPlanner(BT, layer_classes(SLIDING))
    p2.observe_span("local", 100 * BT)
    assert p2.plan(10 * BT, 10).order == (9, 8, 7)


def test_global_classes_get_the_sink_first_then_the_recent_span_nearest_first() -> None:
    p = PrefetchPlanner(BT, layer_classes(GLOBAL), default_span=3 * BT)
    plan = p.plan(10 * BT, 10)
    assert plan.order == (0, 9, 8, 7)
    assert plan.layers == (4, 4, 4, 4) and plan.excluded == frozenset() and plan.lookahead == 0
    # a position inside a block: that block (part of it is before n) is the nearest
    assert p.plan(10 * BT + 5, 12).order[:3] == (0, 10, 9)


def test_blocks_needed_by_more_layers_come_first() -> None:
    p = PrefetchPlanner(BT, layer_classes(GEMMA), default_span=6 * BT)
    plan = p.plan(20 * BT, 20)
    # the local window (4 blocks, 10 layers) is also in the global span (2 layers): 12 layers
    assert plan.order[:4] == (19, 18, 17, 16) and plan.layers[:4] == (12,) * 4
    # then what only the global layers need: the sink first, then the rest of their span
    assert plan.order[4:] == (0, 15, 14) and plan.layers[4:] == (2, 2, 2)
    assert plan.excluded == frozenset()  # global layers reach everything before n


def test_importance_orders_the_far_blocks() -> None:
    p = PrefetchPlanner(BT, layer_classes(GLOBAL), default_span=2 * BT, far_blocks=3)
    imp = np.zeros(20)
    imp[[4, 11, 7, 2]] = [0.5, 0.9, 0.7, 0.1]
    imp[19] = 5.0  # in the recent span already: not counted twice
    plan = p.plan(20 * BT, 20, importance=imp)
    assert plan.order == (0, 19, 18, 11, 7, 4)
    # without evidence no far block is asked for
    assert p.plan(20 * BT, 20, importance=np.zeros(20)).order == (0, 19, 18)
    # a sliding class never takes far blocks
    ps = PrefetchPlanner(BT, layer_classes(SLIDING))
    assert ps.plan(20 * BT, 20, importance=imp).order == (19, 18, 17)


def test_lookahead_in_position_order_after_the_needed_blocks_and_only_stored_blocks() -> None:
    p = PrefetchPlanner(BT, layer_classes(GLOBAL), default_span=BT)
    plan = p.plan(4 * BT, 9)
    assert plan.order == (0, 3, 4, 5, 6, 7, 8) and plan.lookahead == 5
    assert plan.layers[-5:] == (0,) * 5
    gaps = p.plan(4 * BT, 9, stored={0, 5, 7, 3})
    assert gaps.order == (0, 3, 5, 7)
    # decode position 0: nothing is before it, the whole stored prefix is the lookahead
    assert p.plan(0, 3).order == (0, 1, 2)


def test_budget_keeps_the_most_urgent() -> None:
    p = PrefetchPlanner(BT, layer_classes(GEMMA), default_span=6 * BT)
    full = p.plan(20 * BT, 24)
    for b in (0, 1, 5, len(full.order), 100):
        cut = p.plan(20 * BT, 24, budget=b)
        assert cut.order == full.order[:b]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"n": -1}, "decode_position"),
        ({"n": 1.5}, "decode_position"),
        ({"n": True}, "decode_position"),
        ({"total_blocks": -2}, "total_blocks"),
        ({"budget": -1}, "budget"),
        ({"importance": [1.0, 2.0]}, "importance: expected one score per block"),
        ({"importance": [1.0, -1.0, 0.0, 0.0]}, "importance: scores must be finite"),
        ({"importance": [1.0, float("nan"), 0.0, 0.0]}, "importance: scores must be finite"),
    ],
)
def test_bad_plan_input_names_the_problem(kwargs: dict[str, Any], match: str) -> None:
    p = PrefetchPlanner(BT)
    args: dict[str, Any] = {"n": 2 * BT, "total_blocks": 4, **kwargs}
    with pytest.raises(InputError, match=match):
        p.plan(args.pop("n"), args.pop("total_blocks"), **args)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"block_tokens": 0}, "block_tokens"),
        ({"sink_blocks": -1}, "sink_blocks"),
        ({"far_blocks": -1}, "far_blocks"),
        ({"default_span": -1}, "default_span"),
        ({"classes": []}, "classes"),
        ({"classes": [LayerClass("a", 1), LayerClass("a", 2)]}, "classes"),
    ],
)
def test_bad_planner_parameters_are_config_errors(kwargs: dict[str, Any], match: str) -> None:
    args: dict[str, Any] = {"block_tokens": BT, **kwargs}
    with pytest.raises(ConfigError, match=match):
        PrefetchPlanner(args.pop("block_tokens"), **args)
    with pytest.raises(ConfigError, match="window"):
        LayerClass("local", 1, window=0)


# ------------------------------------------------------------------ through the public API


def model_config(tmp_path: Path, spec: ModelSpec, slow: str, **extra: Any) -> dict[str, Any]:
    block = 2 * spec.kv_layers * BT * spec.num_kv_heads * spec.head_dim * 2
    low = pfs_tier(tmp_path, "64MiB") if slow == "pfs" else nvme_tier(tmp_path, "16MiB", slot_bytes=block)
    return {
        "model": {"name": spec.name, "spec": spec.to_dict()},
        "kv_dtype": "float16",
        "block_tokens": BT,
        "tiers": [dram_tier("4MiB"), low],
        **extra,
    }


def kv_of(spec: ModelSpec, n: int, seed: int = 0) -> np.ndarray[Any, Any]:
    return np.random.default_rng(seed).standard_normal(spec.kv_shape(n)).astype(np.float16)


async def stored_in_slow_tier(kv: TierKV, toks: list[int], spec: ModelSpec) -> None:
    await kv.put(toks, kv_of(spec, len(toks)), durable=True)
    await kv.drain()
    for e in list(kv._index.values()):  # drop the DRAM copies (the durable copies stay)
        if e.tier == 0:
            await kv._s.mover.demote_to_backing(e)
    assert "dram" not in (await kv.lookup(toks)).tiers


def in_dram(tiers: tuple[str, ...]) -> set[int]:
    return {i for i, t in enumerate(tiers) if t == "dram"}


@pytest.mark.anyio
@pytest.mark.parametrize("slow", ["pfs", "nvme"])
@pytest.mark.parametrize("spec", [SLIDING, GEMMA], ids=["all-sliding", "gemma-like"])
async def test_prefetch_promotes_what_the_planner_names(tmp_path: Path, slow: str, spec: ModelSpec) -> None:
    """No service (promotions run now): after ``prefetch`` the planned blocks are in DRAM, the excluded
    ones and those the plan left out are not."""
    toks = list(range(16 * BT))
    n = 12 * BT
    kv = await TierKV.open(model_config(tmp_path, spec, slow))
    try:
        await stored_in_slow_tier(kv, toks, spec)
        plan = PrefetchPlanner(BT, layer_classes(spec)).plan(n, 16)
        assert plan.order  # something to promote
        done = await kv.prefetch(toks, decode_position=n)
        assert done == len(plan.order)
        tiers = (await kv.lookup(toks)).block_tiers
        assert in_dram(tiers) == set(plan.order)
        assert not in_dram(tiers) & plan.excluded
        if spec is SLIDING:  # blocks before n - window: no layer reads them
            assert plan.excluded == frozenset(range((n - 3 * BT) // BT))
        g = await kv.get(toks)
        assert g.tokens == len(toks) and g.kv.tobytes() == kv_of(spec, len(toks)).tobytes()
    finally:
        await kv.aclose()


@pytest.mark.anyio
async def test_prefetch_under_the_service_submits_in_urgency_order_within_the_budget(tmp_path: Path) -> None:
    toks = list(range(16 * BT))
    n = 12 * BT
    cfg = model_config(tmp_path, GEMMA, "pfs", scheduler={"prefetch_max_blocks": 3})
    async with await TierKV.open(cfg) as kv:
        await stored_in_slow_tier(kv, toks, GEMMA)
        submitted: list[str] = []
        real = kv._s.service.submit

        def spy(job: Any) -> None:
            submitted.append(job.key)
            real(job)

        kv._s.service.submit = spy  # type: ignore[method-assign]
        done = await kv.prefetch(toks, decode_position=n)
        kv._s.service.submit = real  # type: ignore[method-assign]
        await kv.drain()
        plan = PrefetchPlanner(BT, layer_classes(GEMMA)).plan(n, 16, budget=3)
        keys = [k.hex() for k in kv._s.keys(toks, None)[1]]
        assert done == 3 and submitted == [keys[i] for i in plan.order]
        assert plan.order == (11, 10, 9)  # the sliding window, nearest first (needed by all 12 layers)
        assert in_dram((await kv.lookup(toks)).block_tiers) == {11, 10, 9}


@pytest.mark.anyio
async def test_hint_decode_position_uses_the_plan_and_reports_refine_the_span(tmp_path: Path) -> None:
    toks = list(range(16 * BT))
    kv = await TierKV.open(model_config(tmp_path, SLIDING, "pfs"))
    try:
        await stored_in_slow_tier(kv, toks, SLIDING)
        # every sliding layer puts all its mass on the last block before n: the span shrinks to it
        n = 12 * BT
        pos = np.arange(n - 3 * BT, n)
        s = np.zeros((2, len(pos)))
        s[:, -BT:] = 1.0
        for layer in range(4):
            kv.report_attention(layer, s, pos, query_pos=n, tokens=toks)
        planner = kv._sched.prefetch_planner
        assert planner is not None and planner.spans.observed("local") is not None
        kv.hint(decode_position=n, tokens=toks)  # no service: only the plan is made, nothing moves
        assert await kv.prefetch(toks, decode_position=n) == len(planner.plan(n, 16).order)
        assert in_dram((await kv.lookup(toks)).block_tiers) == {11, 12, 13, 14, 15}
    finally:
        await kv.aclose()


def test_fill_reach_appends_the_rest_of_the_reach_before_the_lookahead() -> None:
    p = PrefetchPlanner(BT, layer_classes(GLOBAL), default_span=2 * BT)
    plan = p.plan(6 * BT, 8, fill_reach=True)
    assert plan.order == (0, 5, 4, 3, 2, 1, 6, 7) and plan.layers == (4, 4, 4, 0, 0, 0, 0, 0)
    # a sliding-only model: the reach ends at the window, the excluded blocks stay out
    ps = PrefetchPlanner(BT, layer_classes(SLIDING))
    ps.observe_span("local", BT)
    sp = ps.plan(10 * BT, 10, fill_reach=True)
    assert sp.order == (9, 8, 7) and not set(sp.order) & sp.excluded


def test_the_replay_lab_counts_what_its_policies_do() -> None:
    from tierkv.lab.prefetch_eval import POLICIES, Workload, gemma_like_spec, needed_loads, simulate, synth_positions

    w = Workload(sessions=6, requests=60, min_blocks=4, max_blocks=12)
    spec = gemma_like_spec(window=512)
    out = {pol: simulate(spec, w, 24, pol, seed=3) for pol in POLICIES}
    assert out["none"].promoted_gib == 0 and out["none"].wasted == 0
    assert all(0 <= r.hit <= 1 and 0 <= r.wasted <= 1 for r in out.values())
    assert out["rope"].promoted_gib > 0
    assert simulate(spec, w, 24, "rope", seed=3) == out["rope"]  # deterministic for a seed
    # ground truth of a sliding-only model: nothing before the window of the first decode position
    sliding = ModelSpec(
        name="s", num_layers=2, num_attention_heads=2, num_kv_heads=2, head_dim=8, attention="mha",
        layer_types=("sliding_attention",) * 2, sliding_window=512,
    )  # fmt: skip
    reqs, imp = synth_positions(w, 3)
    for r in reqs:
        need = needed_loads(r, layer_classes(sliding), w, imp[r.session], "dense")
        assert min(need) >= max(0, r.n - 512) // w.block_tokens
    with pytest.raises(InputError, match="policy"):
        simulate(spec, w, 24, "bogus", seed=0)
    with pytest.raises(InputError, match="reads"):
        simulate(spec, w, 24, "rope", seed=0, reads="half")
