"""Model-aware sizing: ModelSpec from real Hugging Face configs, sizes, batch budget, (de)serialisation, errors."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tierkv._model import ModelSpec
from tierkv.errors import ConfigError, InputError

CONFIGS = Path(__file__).parent / "data" / "hf_configs"
FP16 = 2


def hf(name: str) -> dict[str, Any]:
    with open(CONFIGS / f"{name}.json", encoding="utf-8") as f:
        data: dict[str, Any] = json.load(f)
    return data


def spec(name: str) -> ModelSpec:
    return ModelSpec.from_hf_config(hf(name), name=name)


# ---------------------------------------------------------------- the published figures


def test_llama_3_1_70b_fp16_bytes_per_token() -> None:
    s = spec("llama-3.1-70b")
    assert (s.attention, s.num_layers, s.num_kv_heads, s.head_dim) == ("gqa", 80, 8, 128)
    assert s.bytes_per_token(FP16) == 327_680


@pytest.mark.parametrize(
    ("name", "per_layer", "mha_equivalent"),
    [
        ("deepseek-v3", 1_152, 65_536),
        ("llama-3-70b", 4_096, 32_768),
        ("llama-3.1-70b", 4_096, 32_768),
        ("mixtral-8x22b", 4_096, 24_576),
        ("qwen2.5-72b", 4_096, 32_768),
    ],
)
def test_bytes_per_token_per_layer_and_mha_equivalent(name: str, per_layer: int, mha_equivalent: int) -> None:
    s = spec(name)
    assert s.bytes_per_token_per_layer(FP16) == per_layer
    assert s.mha_equivalent_bytes_per_token_per_layer(FP16) == mha_equivalent


def test_mla_ratio_is_57x() -> None:
    s = spec("deepseek-v3")
    ratio = s.mha_equivalent_bytes_per_token_per_layer() / s.bytes_per_token_per_layer()
    assert 56.8 < ratio < 56.9
    assert round(ratio) == 57


def test_gqa_ratio_is_8x() -> None:
    s = spec("llama-3-70b")
    assert s.mha_equivalent_bytes_per_token_per_layer() / s.bytes_per_token_per_layer() == 8
    assert s.mha_equivalent_bytes_per_token_per_layer() // s.bytes_per_token_per_layer() == 8


def test_dtype_bytes_scales_linearly() -> None:
    s = spec("llama-3.1-70b")
    assert s.bytes_per_token(1) == 163_840
    assert s.bytes_per_token(4) == 655_360
    assert s.bytes_per_token_per_layer(1) * 2 == s.bytes_per_token_per_layer(2)


# ---------------------------------------------------------------- detection


def test_deepseek_v3_is_mla() -> None:
    s = spec("deepseek-v3")
    assert s.attention == "mla"
    assert (s.num_layers, s.num_attention_heads, s.num_kv_heads) == (61, 128, 1)
    assert (s.kv_lora_rank, s.qk_rope_head_dim, s.latent_dim, s.head_dim) == (512, 64, 576, 128)
    assert s.kv_layers == 61
    assert s.bytes_per_token(FP16) == 61 * 1_152


def test_mixtral_and_qwen_are_gqa_without_window() -> None:
    mix = spec("mixtral-8x22b")
    assert (mix.attention, mix.num_layers, mix.num_attention_heads, mix.num_kv_heads, mix.head_dim) == (
        "gqa",
        56,
        48,
        8,
        128,
    )
    qwen = spec("qwen2.5-72b")
    # sliding_window is set in the file but use_sliding_window is false: every layer is full attention
    assert qwen.layer_types == () and qwen.sliding_window is None
    assert qwen.bytes_per_token(FP16) == 80 * 4_096
    assert qwen.bytes_per_token(FP16, context=1_000_000) == qwen.bytes_per_token(FP16)


def test_smollm2_demo_model() -> None:
    s = spec("smollm2-135m-instruct")
    assert (s.num_layers, s.num_attention_heads, s.num_kv_heads, s.head_dim, s.hidden_size) == (30, 9, 3, 64, 576)
    assert s.attention == "gqa"
    assert s.bytes_per_token_per_layer() == 2 * 3 * 64 * 2 == 768
    assert s.bytes_per_token() == 30 * 768 == 23_040
    assert s.default_block_tokens() == 128
    assert s.kv_shape(2_000) == (30, 2, 2_000, 3, 64)


def test_gpt_oss_sliding_window_on_half_the_layers() -> None:
    s = spec("gpt-oss-120b")
    assert (s.num_layers, s.num_attention_heads, s.num_kv_heads, s.head_dim) == (36, 64, 8, 64)
    assert s.attention == "gqa"
    assert s.sliding_window == 128
    assert s.sliding_layers == 18 and s.kv_layers == 36
    assert s.layer_type(0) == "sliding_attention" and s.layer_type(1) == "full_attention"
    per_layer = 2 * 8 * 64 * 2
    assert s.bytes_per_token_per_layer() == per_layer == 2_048
    # stored layout: every KV layer carries every token
    assert s.bytes_per_token() == 36 * per_layer
    # resident memory: the 18 sliding layers stop growing at 128 tokens
    assert s.bytes_per_token(context=128) == 36 * per_layer
    assert s.bytes_per_sequence(8_192) == (18 * 8_192 + 18 * 128) * per_layer
    assert s.bytes_per_token(context=8_192) == math.ceil((18 * 8_192 + 18 * 128) * per_layer / 8_192)
    assert s.bytes_per_token(context=8_192) < s.bytes_per_token()


def test_qwen3_next_hybrid_from_full_attention_interval() -> None:
    s = spec("qwen3-next-80b-a3b-instruct")
    assert (s.num_layers, s.num_attention_heads, s.num_kv_heads, s.head_dim) == (48, 16, 2, 256)
    assert s.attention == "gqa"
    assert s.kv_layers == 12
    assert [s.layer_type(i) for i in range(4)] == ["linear_attention"] * 3 + ["full_attention"]
    assert s.layer_types.count("linear_attention") == 36
    assert s.bytes_per_token_per_layer() == 2 * 2 * 256 * 2 == 2_048
    assert s.bytes_per_token() == 12 * 2_048
    assert s.kv_shape(10) == (12, 2, 10, 2, 256)


def test_qwen3_5_hybrid_in_nested_text_config() -> None:
    s = ModelSpec.from_hf_config(hf("qwen3.5-397b-a17b"))
    assert s.name == "qwen3_5_moe"  # model_type of the outer config when no name is given
    assert (s.num_layers, s.num_attention_heads, s.num_kv_heads, s.head_dim, s.hidden_size) == (60, 32, 2, 256, 4096)
    assert s.kv_layers == 15
    assert s.bytes_per_token() == 15 * 2 * 2 * 256 * 2


def test_nested_text_config_equals_flat() -> None:
    flat = hf("llama-3.1-70b")
    nested = {"model_type": "llava", "text_config": flat}
    assert ModelSpec.from_hf_config(nested, name="x") == ModelSpec.from_hf_config(flat, name="x")


def test_layer_types_and_interval_agree() -> None:
    cfg = hf("qwen3-next-80b-a3b-instruct")
    explicit = dict(
        cfg, layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"] * 12
    )
    del explicit["full_attention_interval"]
    assert ModelSpec.from_hf_config(explicit, name="q") == ModelSpec.from_hf_config(cfg, name="q")


def base_cfg(**kw: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "model_type": "test",
        "num_hidden_layers": 8,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "hidden_size": 512,
    }
    cfg.update(kw)
    return {k: v for k, v in cfg.items() if v is not ...}


@pytest.mark.parametrize(
    ("kv_heads", "kind", "block"),
    [(8, "mha", 64), (None, "mha", 64), (..., "mha", 64), (2, "gqa", 128), (1, "mqa", 128)],
)
def test_attention_kind_and_default_block(kv_heads: Any, kind: str, block: int) -> None:
    s = ModelSpec.from_hf_config(base_cfg(num_key_value_heads=kv_heads))
    assert s.attention == kind
    assert s.head_dim == 64  # 512 // 8, head_dim absent
    assert s.default_block_tokens() == block
    assert s.name == "test"


def test_mla_default_block() -> None:
    assert spec("deepseek-v3").default_block_tokens() == 512


def test_mistral_style_window_applies_to_every_layer() -> None:
    s = ModelSpec.from_hf_config(base_cfg(sliding_window=4096))
    assert s.sliding_layers == 8 and s.kv_layers == 8 and s.sliding_window == 4096
    assert s.bytes_per_sequence(10_000) == 8 * 4_096 * s.bytes_per_token_per_layer()


def test_qwen2_style_max_window_layers() -> None:
    s = ModelSpec.from_hf_config(base_cfg(sliding_window=1024, use_sliding_window=True, max_window_layers=6))
    assert [s.layer_type(i) for i in range(8)] == ["full_attention"] * 6 + ["sliding_attention"] * 2


def test_gemma_style_sliding_window_pattern() -> None:
    s = ModelSpec.from_hf_config(base_cfg(num_hidden_layers=12, sliding_window=512, sliding_window_pattern=6))
    assert s.sliding_layers == 10
    assert s.layer_type(5) == "full_attention" and s.layer_type(11) == "full_attention"


def test_jamba_style_attention_period() -> None:
    s = ModelSpec.from_hf_config(base_cfg(num_hidden_layers=32, attn_layer_period=8, attn_layer_offset=4))
    assert s.kv_layers == 4
    assert s.layer_type(4) == "full_attention" and s.layer_type(0) == "mamba"
    assert s.kv_shape(3) == (4, 2, 3, 8, 64)


def test_legacy_attention_layer_type_is_full_attention() -> None:
    s = ModelSpec.from_hf_config(base_cfg(num_hidden_layers=2, layer_types=["attention", "mamba"]))
    assert s.layer_types == ("full_attention", "mamba")


def test_window_without_sliding_layers_is_dropped() -> None:
    s = ModelSpec.from_hf_config(base_cfg(layer_types=["full_attention"] * 8, sliding_window=128))
    assert s.layer_types == () and s.sliding_window is None


# ---------------------------------------------------------------- shapes, blocks, batch


def test_kv_shape_layouts() -> None:
    assert spec("llama-3.1-70b").kv_shape(256) == (80, 2, 256, 8, 128)
    assert spec("deepseek-v3").kv_shape(512) == (61, 512, 576)
    assert spec("llama-3.1-70b").kv_shape(0) == (80, 2, 0, 8, 128)


@pytest.mark.parametrize("name", ["llama-3.1-70b", "deepseek-v3", "gpt-oss-120b", "qwen3-next-80b-a3b-instruct"])
def test_kv_shape_matches_bytes(name: str) -> None:
    s = spec(name)
    n = 37
    assert math.prod(s.kv_shape(n)) * FP16 == n * s.bytes_per_token(FP16) == s.bytes_per_block(n, FP16)


def test_bytes_per_block() -> None:
    s = spec("llama-3.1-70b")
    assert s.bytes_per_block(128) == 128 * 327_680 == 41_943_040
    assert spec("deepseek-v3").bytes_per_block(512) == 512 * 61 * 1_152


def test_max_batch_formula() -> None:
    s = spec("llama-3.1-70b")
    n_max = 8_192
    per_seq = s.kv_layers * n_max * s.bytes_per_token_per_layer()  # L x B(n_max)
    assert per_seq == 2_684_354_560  # 2.5 GiB per 8k-token sequence
    m = 80 * 2**30
    assert s.max_batch(m, n_max) == m // per_seq == 32
    assert s.max_batch(per_seq, n_max) == 1
    assert s.max_batch(per_seq - 1, n_max) == 0
    assert s.max_batch(0, n_max) == 0
    assert s.max_batch(m, n_max, dtype_bytes=1) == 64


def test_max_batch_counts_windows_and_hybrid_layers() -> None:
    oss = spec("gpt-oss-120b")
    m = 10 * 2**30
    per_seq = (18 * 32_768 + 18 * 128) * oss.bytes_per_token_per_layer()
    assert oss.max_batch(m, 32_768) == m // per_seq
    assert oss.max_batch(m, 32_768) > m // (36 * 32_768 * oss.bytes_per_token_per_layer())
    nxt = spec("qwen3-next-80b-a3b-instruct")
    assert nxt.max_batch(m, 4_096) == m // (12 * 4_096 * 2_048)


@given(
    layers=st.integers(1, 128),
    kv_heads=st.integers(1, 16),
    group=st.integers(1, 8),
    head_dim=st.sampled_from([32, 64, 80, 96, 128, 256]),
    block=st.integers(1, 4_096),
    dtype_bytes=st.sampled_from([1, 2, 4]),
)
def test_bytes_per_block_is_block_tokens_times_bytes_per_token(
    layers: int, kv_heads: int, group: int, head_dim: int, block: int, dtype_bytes: int
) -> None:
    heads = kv_heads * group
    kind = "mha" if group == 1 else "mqa" if kv_heads == 1 else "gqa"
    s = ModelSpec("m", layers, heads, kv_heads, head_dim, kind)  # type: ignore[arg-type]
    assert s.bytes_per_block(block, dtype_bytes) == block * s.bytes_per_token(dtype_bytes)
    assert s.bytes_per_token(dtype_bytes) == layers * 2 * kv_heads * head_dim * dtype_bytes
    assert s.bytes_per_token(dtype_bytes, context=block) == s.bytes_per_token(dtype_bytes)
    assert s.mha_equivalent_bytes_per_token_per_layer(dtype_bytes) == group * s.bytes_per_token_per_layer(dtype_bytes)


@given(
    layers=st.integers(1, 64),
    kv_heads=st.sampled_from([1, 2, 4, 8]),
    head_dim=st.sampled_from([64, 128]),
    memory=st.integers(0, 2**40),
    n_max=st.integers(1, 200_000),
)
def test_max_batch_is_the_largest_batch_that_fits(
    layers: int, kv_heads: int, head_dim: int, memory: int, n_max: int
) -> None:
    kind = "mqa" if kv_heads == 1 else "gqa"
    s = ModelSpec("m", layers, 16, kv_heads, head_dim, kind)  # type: ignore[arg-type]
    b = s.max_batch(memory, n_max)
    per_seq = layers * n_max * s.bytes_per_token_per_layer()
    assert b * per_seq <= memory < (b + 1) * per_seq


# ---------------------------------------------------------------- (de)serialisation


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.json")), ids=lambda p: p.stem)
def test_to_dict_from_dict_round_trip(path: Path) -> None:
    s = spec(path.stem)
    d = s.to_dict()
    assert json.loads(json.dumps(d)) == d  # plain JSON values
    assert ModelSpec.from_dict(json.loads(json.dumps(d))) == s
    assert hash(ModelSpec.from_dict(d)) == hash(s)


def test_from_dict_defaults_and_canonical_form() -> None:
    s = ModelSpec.from_dict({"name": "x", "num_layers": 2, "num_attention_heads": 4, "head_dim": 8, "attention": "mha"})
    assert s.num_kv_heads == 4 and s.layer_types == () and s.sliding_window is None
    explicit = ModelSpec.from_dict(dict(s.to_dict(), layer_types=["full_attention", "full_attention"]))
    assert explicit == s and explicit.to_dict() == s.to_dict()
    mla = ModelSpec.from_dict(
        {"name": "d", "num_layers": 2, "num_attention_heads": 4, "head_dim": 8, "attention": "mla", "kv_lora_rank": 16}
    )
    assert mla.num_kv_heads == 1 and mla.latent_dim == 16


def test_from_dict_errors_name_the_field() -> None:
    good = spec("smollm2-135m-instruct").to_dict()
    with pytest.raises(ConfigError) as e:
        ModelSpec.from_dict(dict(good, bogus=1), prefix="model")
    assert e.value.field == "model.bogus"
    with pytest.raises(ConfigError) as e:
        ModelSpec.from_dict({k: v for k, v in good.items() if k != "head_dim"}, prefix="model")
    assert e.value.field == "model.head_dim"
    with pytest.raises(ConfigError) as e:
        ModelSpec.from_dict(dict(good, num_layers="30"), prefix="model")
    assert e.value.field == "model.num_layers" and e.value.value == "30"
    with pytest.raises(ConfigError) as e:
        ModelSpec.from_dict(dict(good, layer_types="full_attention"))
    assert e.value.field == "layer_types"
    with pytest.raises(ConfigError):
        ModelSpec.from_dict([("name", "x")])  # type: ignore[arg-type]


# ---------------------------------------------------------------- error paths


def test_missing_num_hidden_layers() -> None:
    cfg = hf("llama-3.1-70b")
    del cfg["num_hidden_layers"]
    with pytest.raises(ConfigError) as e:
        ModelSpec.from_hf_config(cfg, name="x")
    assert e.value.field == "num_hidden_layers"
    assert "num_hidden_layers" in str(e.value)


def test_missing_field_in_text_config_is_prefixed() -> None:
    cfg = hf("qwen3.5-397b-a17b")
    del cfg["text_config"]["num_attention_heads"]
    with pytest.raises(ConfigError) as e:
        ModelSpec.from_hf_config(cfg)
    assert e.value.field == "text_config.num_attention_heads"


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"num_attention_heads": 0}, "num_attention_heads"),
        ({"num_attention_heads": -8}, "num_attention_heads"),
        ({"num_attention_heads": True}, "num_attention_heads"),
        ({"num_hidden_layers": 0}, "num_hidden_layers"),
        ({"num_hidden_layers": "80"}, "num_hidden_layers"),
        ({"num_key_value_heads": 0}, "num_key_value_heads"),
        ({"num_key_value_heads": 3}, "num_key_value_heads"),  # 8 heads not divisible by 3
        ({"num_key_value_heads": 16}, "num_key_value_heads"),  # more KV heads than heads
        ({"head_dim": 0}, "head_dim"),
        ({"hidden_size": 500}, "head_dim"),  # 500 // 8 is not exact and no head_dim
        ({"hidden_size": ...}, "head_dim"),  # nothing to derive head_dim from
        ({"hidden_size": 2.5}, "hidden_size"),
        ({"sliding_window": 0}, "sliding_window"),
        ({"sliding_window": 64, "use_sliding_window": "yes"}, "use_sliding_window"),
        ({"layer_types": ["full_attention"] * 7}, "layer_types"),
        ({"layer_types": "full_attention"}, "layer_types"),
        ({"layer_types": ["full_attention"] * 7 + ["cross_attention"]}, "layer_types[7]"),
        ({"layer_types": ["mamba"] * 8}, "layer_types"),  # no KV layer at all
        ({"layer_types": ["sliding_attention"] * 8}, "sliding_window"),  # sliding layers, no window
        ({"full_attention_interval": 0}, "full_attention_interval"),
        ({"attn_layer_period": 4, "attn_layer_offset": 4}, "attn_layer_offset"),
        ({"kv_lora_rank": 512}, "qk_rope_head_dim"),
        ({"qk_rope_head_dim": 64}, "kv_lora_rank"),
        ({"kv_lora_rank": 0, "qk_rope_head_dim": 64}, "kv_lora_rank"),
        ({"text_config": [1, 2]}, "text_config"),
    ],
)
def test_hf_config_errors_name_the_field(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as e:
        ModelSpec.from_hf_config(base_cfg(**changes))
    assert e.value.field == field
    assert field in str(e.value)


def test_hf_config_needs_a_name() -> None:
    cfg = base_cfg()
    del cfg["model_type"]
    with pytest.raises(ConfigError) as e:
        ModelSpec.from_hf_config(cfg)
    assert e.value.field == "name"
    assert ModelSpec.from_hf_config(cfg, name="mine").name == "mine"
    assert ModelSpec.from_hf_config(dict(cfg, _name_or_path="org/model")).name == "org/model"
    with pytest.raises(ConfigError):
        ModelSpec.from_hf_config("not a mapping")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"num_layers": 0}, "num_layers"),
        ({"num_attention_heads": 0}, "num_attention_heads"),
        ({"num_kv_heads": 0}, "num_kv_heads"),
        ({"head_dim": -1}, "head_dim"),
        ({"name": ""}, "name"),
        ({"attention": "flash"}, "attention"),
        ({"attention": "gqa"}, "attention"),  # 8 == 8 heads: that is MHA
        ({"num_kv_heads": 3}, "num_kv_heads"),
        ({"kv_lora_rank": 512}, "kv_lora_rank"),  # MLA field on an MHA spec
        ({"hidden_size": -1}, "hidden_size"),
        ({"sliding_window": 0}, "sliding_window"),
        ({"layer_types": ("full_attention",)}, "layer_types"),
    ],
)
def test_post_init_validates(kwargs: dict[str, Any], field: str) -> None:
    args: dict[str, Any] = {
        "name": "m",
        "num_layers": 4,
        "num_attention_heads": 8,
        "num_kv_heads": 8,
        "head_dim": 64,
        "attention": "mha",
    }
    args.update(kwargs)
    with pytest.raises(ConfigError) as e:
        ModelSpec(**args)
    assert e.value.field == field


def test_post_init_mla_rules() -> None:
    with pytest.raises(ConfigError) as e:
        ModelSpec("d", 4, 8, 8, 64, "mla", kv_lora_rank=16)
    assert e.value.field == "num_kv_heads"
    with pytest.raises(ConfigError) as e:
        ModelSpec("d", 4, 8, 1, 64, "mla")
    assert e.value.field == "kv_lora_rank"


def test_bad_method_arguments_raise_input_error() -> None:
    s = spec("smollm2-135m-instruct")
    with pytest.raises(InputError):
        s.kv_shape(-1)
    with pytest.raises(InputError):
        s.bytes_per_token(0)
    with pytest.raises(InputError):
        s.bytes_per_token(context=0)
    with pytest.raises(InputError):
        s.bytes_per_block(0)
    with pytest.raises(InputError):
        s.max_batch(-1, 10)
    with pytest.raises(InputError):
        s.max_batch(10, 0)
    with pytest.raises(InputError):
        s.layer_type(30)
    with pytest.raises(InputError):
        s.bytes_per_token_per_layer(True)


def test_spec_is_frozen_and_hashable() -> None:
    s = spec("smollm2-135m-instruct")
    with pytest.raises(AttributeError):
        s.num_layers = 1  # type: ignore[misc]
    assert len({s, spec("smollm2-135m-instruct")}) == 1


# ---------------------------------------------------------------- cross-check against transformers


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.json")), ids=lambda p: p.stem)
def test_layer_plan_agrees_with_transformers(path: Path) -> None:
    """transformers' own config classes derive the same layer plan and head counts from each fixture."""
    transformers = pytest.importorskip("transformers")
    data = hf(path.stem)
    theirs = transformers.AutoConfig.for_model(**data).get_text_config()
    ours = ModelSpec.from_hf_config(data)
    assert ours.num_layers == theirs.num_hidden_layers
    assert ours.num_attention_heads == theirs.num_attention_heads
    if ours.attention != "mla":
        assert ours.num_kv_heads == theirs.num_key_value_heads
        assert ours.head_dim == (getattr(theirs, "head_dim", None) or theirs.hidden_size // theirs.num_attention_heads)
    plan = [ours.layer_type(i) for i in range(ours.num_layers)]
    their_plan = getattr(theirs, "layer_types", None) or ["full_attention"] * theirs.num_hidden_layers
    assert plan == list(their_plan)
    if ours.sliding_layers:
        assert ours.sliding_window == theirs.sliding_window


# ---------------------------------------------------------------- tensor parallelism (issue 18, item 21)


def test_deepseek_v3_tp8_worked_example_mla_aware() -> None:
    """The design's worked example: DeepSeek-V3, 30e9 bytes (30 GB, decimal) of KV per GPU, n_max 4,096, TP 8.

    The MLA latent (512 + 64 = 576 elements x 2 bytes = 1,152 bytes per token per layer) is
    replicated on every rank, so TP does not change it: 30e9 / (61 x 1,152 x 4,096) = 104.2.
    """
    s = spec("deepseek-v3")
    assert s.bytes_per_token_per_layer(FP16, tp=8) == 1_152 == s.bytes_per_token_per_layer(FP16)
    assert s.kv_heads_per_rank(8) == 1
    memory = 30 * 10**9  # bytes
    assert 104.2 < memory / (61 * 1_152 * 4_096) < 104.3
    assert s.max_batch(memory, 4_096, FP16, tp=8) == 104
    assert s.max_batch(memory, 4_096, FP16, tp=8) == s.max_batch(memory, 4_096, FP16)


def test_deepseek_v3_tp8_worked_example_mha_equivalent_both_units() -> None:
    """MHA-equivalent: the 128 heads sharded 8 ways, 16 per rank: 2 x 16 x 128 x 2 = 8,192 bytes per token
    per layer per GPU. 30e9 bytes gives 14.66 -> 14; 30 GiB (30 x 2**30 bytes) gives 15.74 -> 15."""
    s = spec("deepseek-v3")
    assert s.mha_equivalent_bytes_per_token_per_layer(FP16, tp=8) == 8_192
    per_seq = 61 * 8_192 * 4_096
    assert s.bytes_per_sequence(4_096, FP16, tp=8, mha_equivalent=True) == per_seq
    assert 14.65 < 30 * 10**9 / per_seq < 14.67
    assert 15.73 < 30 * 2**30 / per_seq < 15.75
    assert s.max_batch(30 * 10**9, 4_096, FP16, tp=8, mha_equivalent=True) == 14
    assert s.max_batch(30 * 2**30, 4_096, FP16, tp=8, mha_equivalent=True) == 15
    # MLA-aware against MHA-equivalent with the same (decimal) budget: 104 against 14
    assert (
        s.max_batch(30 * 10**9, 4_096, FP16, tp=8) // s.max_batch(30 * 10**9, 4_096, FP16, tp=8, mha_equivalent=True)
        == 7
    )


def test_gqa_heads_are_sharded_and_replicated_when_fewer_than_ranks() -> None:
    s = spec("llama-3.1-70b")  # 8 KV heads, head_dim 128
    assert [s.kv_heads_per_rank(t) for t in (1, 2, 3, 4, 8, 16, 64)] == [8, 4, 3, 2, 1, 1, 1]
    assert s.bytes_per_token_per_layer(FP16, tp=8) == 2 * 1 * 128 * 2
    assert s.bytes_per_token_per_layer(FP16, tp=16) == 2 * 1 * 128 * 2  # a replica of one head per rank
    n_max = 8_192
    m = 80 * 2**30
    assert s.max_batch(m, n_max, tp=8) == m // (80 * n_max * 512) == 8 * s.max_batch(m, n_max)
    assert s.max_batch(m, n_max, tp=16) == s.max_batch(m, n_max, tp=8)
    assert s.max_batch(m, n_max, tp=1) == s.max_batch(m, n_max) == 32


@pytest.mark.parametrize("tp", [0, -1, 1.5, True, "8"])
def test_tp_must_be_a_positive_int(tp: Any) -> None:
    s = spec("llama-3.1-70b")
    with pytest.raises(InputError, match="tp"):
        s.max_batch(2**30, 1_024, tp=tp)
    with pytest.raises(InputError, match="tp"):
        s.kv_heads_per_rank(tp)
    with pytest.raises(InputError, match="tp"):
        spec("deepseek-v3").bytes_per_token_per_layer(tp=tp)


@given(
    kv_heads=st.sampled_from([1, 2, 4, 8, 16]),
    group=st.sampled_from([1, 2, 4]),
    tp=st.integers(1, 64),
    memory=st.integers(0, 2**40),
    n_max=st.integers(1, 100_000),
)
def test_tp_per_rank_bytes_cover_the_shard(kv_heads: int, group: int, tp: int, memory: int, n_max: int) -> None:
    heads = kv_heads * group
    kind = "mha" if group == 1 else "mqa" if kv_heads == 1 else "gqa"
    s = ModelSpec("m", 4, heads, kv_heads, 64, kind)  # type: ignore[arg-type]
    per_rank = s.bytes_per_token_per_layer(FP16, tp=tp)
    assert per_rank * tp >= s.bytes_per_token_per_layer(FP16)  # the ranks together hold every head
    assert per_rank >= 2 * 64 * FP16  # at least one head per rank
    if kv_heads % tp == 0:
        assert per_rank * tp == s.bytes_per_token_per_layer(FP16)
    b = s.max_batch(memory, n_max, FP16, tp=tp)
    assert b * 4 * n_max * per_rank <= memory < (b + 1) * 4 * n_max * per_rank
    assert b >= s.max_batch(memory, n_max, FP16)  # sharding never lowers the batch
