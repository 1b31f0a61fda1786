"""Every model-config field that changes a KV byte changes every block key (issue 18, item 14).

Before: the scope held only ``attention:L:H:D:R`` of the spec, so editing ``rope_theta``,
``rope_scaling``, ``sliding_window`` or ``num_attention_heads`` in ``hf_config`` kept the
keys and served the old model's KV. Now :meth:`ModelSpec.kv_digest` (the geometry plus
:attr:`ModelSpec.forward_config`) is part of the scope.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kvtest import BT, HF, dram_tier, kv_for, pfs_tier

from tierkv import Config, TierKV
from tierkv._keys import block_keys
from tierkv._model import NON_KV_CONFIG_FIELDS, ModelSpec

CONFIGS = Path(__file__).parent / "data" / "hf_configs"
GQA = HF  # SmolLM2-135M: 30 layers, 9 heads, 3 KV heads
MLA = json.loads((CONFIGS / "deepseek-v3.json").read_text())

Mutation = Callable[[dict[str, Any], st.DataObject], None]


def _floats(lo: float, hi: float) -> st.SearchStrategy[float]:
    return st.floats(lo, hi, allow_nan=False, allow_infinity=False)


def _set(key: str, strategy: st.SearchStrategy[Any]) -> Mutation:
    def mutate(cfg: dict[str, Any], data: st.DataObject) -> None:
        old = cfg.get(key)
        cfg[key] = data.draw(strategy.filter(lambda v: v != old and v is not None), label=key)

    return mutate


def _heads(cfg: dict[str, Any], data: st.DataObject) -> None:
    cfg["head_dim"] = cfg["hidden_size"] // cfg["num_attention_heads"]  # keep head_dim, change the head count
    cfg["num_attention_heads"] = data.draw(st.sampled_from([3, 6, 12, 18, 27]), label="num_attention_heads")


def _sliding(cfg: dict[str, Any], data: st.DataObject) -> None:
    cfg["sliding_window"] = data.draw(st.integers(1, 1 << 16), label="sliding_window")
    cfg["use_sliding_window"] = True
    cfg["max_window_layers"] = data.draw(st.integers(0, cfg["num_hidden_layers"] - 1), label="max_window_layers")


def _rope_scaling(cfg: dict[str, Any], data: st.DataObject) -> None:
    kind = data.draw(st.sampled_from(["linear", "dynamic", "yarn", "llama3"]), label="rope_type")
    cfg["rope_scaling"] = {"rope_type": kind, "factor": data.draw(_floats(1.5, 64.0), label="factor")}


def _max_pos_with_scaling(cfg: dict[str, Any], data: st.DataObject) -> None:
    if not cfg.get("rope_scaling"):
        cfg["rope_scaling"] = {"rope_type": "dynamic", "factor": 2.0}
        return
    old = cfg["max_position_embeddings"]
    cfg["max_position_embeddings"] = data.draw(st.integers(1, 1 << 20).filter(lambda v: v != old), label="max_pos")


def _scaling_factor(cfg: dict[str, Any], data: st.DataObject) -> None:
    old = cfg["rope_scaling"]["factor"]
    cfg["rope_scaling"] = dict(cfg["rope_scaling"], factor=data.draw(_floats(1.0, 100.0).filter(lambda v: v != old)))


def _unanticipated(cfg: dict[str, Any], data: st.DataObject) -> None:
    """A field nobody listed: conservative rule, it changes the keys too."""
    key = data.draw(
        st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=12).filter(
            lambda k: not k.startswith("_") and k not in cfg and k not in NON_KV_CONFIG_FIELDS
        ),
        label="key",
    )
    # (a string with NUL is a config error of its own: tests/test_layout_input.py)
    text = st.text().filter(lambda v: "\x00" not in v)
    cfg[key] = data.draw(st.one_of(st.integers(), text, st.booleans(), _floats(-1e9, 1e9)), label="value")


GQA_MUTATIONS: dict[str, Mutation] = {
    "rope_theta": _set("rope_theta", _floats(1e3, 1e7)),
    "rope_scaling": _rope_scaling,
    "partial_rotary_factor": _set("partial_rotary_factor", _floats(0.05, 0.95)),
    "sliding_window": _sliding,
    "num_attention_heads": _heads,
    "num_key_value_heads": _set("num_key_value_heads", st.sampled_from([1, 9])),
    "head_dim": _set("head_dim", st.sampled_from([32, 48, 128])),
    "num_hidden_layers": _set("num_hidden_layers", st.integers(1, 64)),
    "max_position_embeddings (with rope scaling)": _max_pos_with_scaling,
    "rms_norm_eps": _set("rms_norm_eps", _floats(1e-8, 1e-3)),
    "hidden_act": _set("hidden_act", st.sampled_from(["gelu", "relu", "gelu_pytorch_tanh"])),
    "attention_bias": _set("attention_bias", st.just(True)),
    "intermediate_size": _set("intermediate_size", st.integers(1, 1 << 16)),
    "torch_dtype": _set("torch_dtype", st.sampled_from(["float16", "float32"])),
    "model_type": _set("model_type", st.sampled_from(["mistral", "qwen2", "olmo2"])),
    "unanticipated field": _unanticipated,
}
MLA_MUTATIONS: dict[str, Mutation] = {
    "kv_lora_rank": _set("kv_lora_rank", st.integers(1, 2048)),
    "qk_rope_head_dim": _set("qk_rope_head_dim", st.integers(0, 256)),
    "qk_nope_head_dim": _set("qk_nope_head_dim", st.integers(1, 256)),
    "v_head_dim": _set("v_head_dim", st.integers(1, 256)),
    "num_attention_heads": _set("num_attention_heads", st.integers(1, 256)),
    "rope_theta": _set("rope_theta", _floats(1e3, 1e7)),
    "rope_scaling.factor": _scaling_factor,
    "max_position_embeddings (with rope scaling)": _max_pos_with_scaling,
    "num_experts_per_tok": _set("num_experts_per_tok", st.integers(1, 16)),
    "routed_scaling_factor": _set("routed_scaling_factor", _floats(0.1, 10.0)),
    "unanticipated field": _unanticipated,
}


def config(hf: dict[str, Any], **extra: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "model": {"name": "m", "revision": "r", "hf_config": hf},
        "block_tokens": BT,
        "tiers": [dram_tier()],
    }
    cfg.update(extra)
    return cfg


def keys(hf: dict[str, Any], tokens: np.ndarray[Any, Any]) -> list[bytes]:
    cfg = Config.load(config(hf), env={})
    return block_keys(cfg.scope().digest(), tokens, cfg.effective_block_tokens)


def _check_every_key_changes(base: dict[str, Any], mutation: Mutation, data: st.DataObject) -> None:
    tokens = np.asarray(data.draw(st.lists(st.integers(0, 50_000), min_size=BT, max_size=8 * BT)), dtype=np.int64)
    changed = copy.deepcopy(base)
    mutation(changed, data)
    before, after = keys(base, tokens), keys(changed, tokens)
    assert len(before) == len(after) >= 1
    assert all(a != b for a, b in zip(before, after, strict=True))
    # the tenant-free model scope differs too (what invalidate() and the pfs tag compare)
    a, b = Config.load(config(base), env={}), Config.load(config(changed), env={})
    assert a.model.kv_digest() != b.model.kv_digest()
    assert a.scope().with_tenant("").digest() != b.scope().with_tenant("").digest()


@settings(max_examples=150, deadline=None)
@given(name=st.sampled_from(sorted(GQA_MUTATIONS)), data=st.data())
def test_every_kv_relevant_field_changes_every_key_gqa(name: str, data: st.DataObject) -> None:
    _check_every_key_changes(GQA, GQA_MUTATIONS[name], data)


@settings(max_examples=100, deadline=None)
@given(name=st.sampled_from(sorted(MLA_MUTATIONS)), data=st.data())
def test_every_kv_relevant_field_changes_every_key_mla(name: str, data: st.DataObject) -> None:
    _check_every_key_changes(MLA, MLA_MUTATIONS[name], data)


@pytest.mark.parametrize(
    "field", ["rope_theta", "rope_scaling", "sliding_window", "num_attention_heads"]
)  # the four fields of the report
def test_the_reported_fields_change_the_scope(field: str) -> None:
    changed = copy.deepcopy(GQA)
    {
        "rope_theta": lambda c: c.update(rope_theta=500_000.0),
        "rope_scaling": lambda c: c.update(rope_scaling={"rope_type": "linear", "factor": 4.0}),
        "sliding_window": lambda c: c.update(sliding_window=4096, use_sliding_window=True),
        "num_attention_heads": lambda c: c.update(num_attention_heads=18, head_dim=64),
    }[field](changed)
    assert Config.load(config(changed), env={}).scope() != Config.load(config(GQA), env={}).scope()
    assert Config.load(config(changed), env={}).scope().digest() != Config.load(config(GQA), env={}).scope().digest()


@pytest.mark.parametrize(
    "mutate",
    [
        lambda c: c.update(eos_token_id=7),
        lambda c: c.update(transformers_version="9.9.9"),
        lambda c: c.update(_name_or_path="somewhere/else"),
        lambda c: c.update(use_cache=False),
        lambda c: c.update(vocab_size=50_000),
        lambda c: c.update(max_position_embeddings=1 << 17),  # no rope scaling: it changes no KV byte
        lambda c: c.update(rope_theta=100_000.0),  # 100000.0 is 100000
        lambda c: c.update(new_field=None),  # null reads as absent
        lambda c: c.update(num_key_value_heads=3, head_dim=64),  # a spelling of the same geometry
    ],
)
def test_fields_that_change_no_kv_byte_keep_the_keys(mutate: Callable[[dict[str, Any]], None]) -> None:
    changed = copy.deepcopy(GQA)
    mutate(changed)
    tokens = np.arange(4 * BT, dtype=np.int64)
    assert keys(changed, tokens) == keys(GQA, tokens)


def test_a_spec_given_field_by_field_can_carry_forward_fields() -> None:
    base = {"name": "m", "num_layers": 2, "num_attention_heads": 4, "head_dim": 8, "attention": "mha"}
    a = ModelSpec.from_dict(base)
    b = ModelSpec.from_dict({**base, "forward_config": {"rope_theta": 1e6}})
    assert a.kv_digest() != b.kv_digest()
    assert ModelSpec.from_dict(b.to_dict()) == b
    assert ModelSpec.from_dict({**base, "forward_config": {"rope_theta": 1000000}}) == b
    ca = Config.load({"model": {"name": "m", "spec": base}, "tiers": [{"backend": "dram"}]}, env={})
    cb = Config.load({"model": {"name": "m", "spec": b.to_dict()}, "tiers": [{"backend": "dram"}]}, env={})
    assert ca.scope().digest() != cb.scope().digest()


@pytest.mark.anyio
async def test_a_changed_model_finds_none_of_the_old_blocks(tmp_path: Path) -> None:
    """Through a real TierKV with a persistent tier: restart with a changed rope_theta -> lookup 0 tokens."""

    def cfg(hf: dict[str, Any]) -> dict[str, Any]:
        return config(hf, tiers=[dram_tier(), pfs_tier(tmp_path)])

    toks = list(range(100, 100 + 4 * BT))
    kv_data = kv_for(len(toks))
    async with await TierKV.open(cfg(GQA)) as kv:
        r = await kv.put(toks, kv_data, durable=True)
        assert r.tokens == len(toks)
    for field, value in [("rope_theta", 500_000.0), ("rope_scaling", {"rope_type": "linear", "factor": 2.0})]:
        changed = dict(copy.deepcopy(GQA), **{field: value})
        async with await TierKV.open(cfg(changed)) as kv:
            assert (await kv.lookup(toks)).tokens == 0, field
            assert (await kv.get(toks)).tokens == 0, field
    async with await TierKV.open(cfg(GQA)) as kv:  # the original model still finds its blocks
        assert (await kv.lookup(toks)).tokens == len(toks)
        g = await kv.get(toks)
        assert g.tokens == len(toks) and g.kv.tobytes() == kv_data.tobytes()
