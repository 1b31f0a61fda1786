"""Config parsing: dict, TOML path, Config object; every bad field names itself."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kvtest import HF, dram_tier, smol_config

from tierkv import Config, ConfigError


def base() -> dict[str, Any]:
    """One DRAM tier, no block_tokens: the model's default block size is under test."""
    return smol_config([dram_tier()], revision="r1", block_tokens=None)


def test_dict_and_defaults() -> None:
    cfg = Config.load(base())
    assert cfg.model.attention == "gqa"
    assert cfg.effective_block_tokens == 128  # GQA default
    assert cfg.tiers[0].options["capacity"] == "64MiB"
    assert Config.load(cfg) is cfg


def test_toml(tmp_path: Path) -> None:
    p = tmp_path / "c.toml"
    hf = ", ".join(f"{k} = {json.dumps(v)}" for k, v in HF.items() if isinstance(v, (int, str)))
    p.write_text(
        f"""
kv_dtype = "bfloat16"
block_tokens = 32
[model]
name = "smol"
hf_config = {{ {hf} }}
[[tiers]]
name = "fast"
backend = "dram"
capacity = "1GiB"
high_watermark = 0.5
"""
    )
    cfg = Config.load(p)
    assert cfg.kv_dtype == "bfloat16" and cfg.block_tokens == 32
    assert cfg.tiers[0].name == "fast" and cfg.tiers[0].high_watermark == 0.5
    assert cfg.tiers[0].low_watermark == 0.5


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda c: c.update(kv_dtype="int4"), "kv_dtype"),
        (lambda c: c.update(block_tokens=-1), "block_tokens"),
        (lambda c: c.update(block_tokens="8"), "block_tokens"),
        (lambda c: c.update(tiers=[]), "tiers"),
        (lambda c: c.update(tiers=["dram"]), "tiers[0]"),
        (lambda c: c["tiers"][0].update(high_watermark=1.5), "tiers[0].high_watermark"),
        (lambda c: c["tiers"][0].update(low_watermark=0.95), "tiers[0].low_watermark"),
        (lambda c: c["tiers"].append({"name": "dram", "backend": "pfs"}), "tiers[1].name"),
        (lambda c: c["tiers"][0].pop("backend"), "tiers[0].backend"),
        (lambda c: c.update(bogus=1), "bogus"),
        (lambda c: c["model"].pop("name"), "model.name"),
        (lambda c: c["model"].pop("hf_config"), "model.hf_config"),
        (lambda c: c["model"].update(extra=1), "model.extra"),
        (lambda c: c.update(load_failure="retry"), "load_failure"),
        (lambda c: c.update(share_across_tenants="yes"), "share_across_tenants"),
        (lambda c: c.update(world_size=2, kv_rank=2), "kv_rank"),
        (lambda c: c["model"]["hf_config"].pop("num_hidden_layers"), "num_hidden_layers"),
    ],
)
def test_bad_fields_name_themselves(mutate: Any, field: str) -> None:
    c = base()
    c["model"]["hf_config"] = dict(HF)
    mutate(c)
    with pytest.raises(ConfigError) as ei:
        Config.load(c)
    assert field in str(ei.value)
    assert "allowed" in str(ei.value)


def test_bad_sources(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="TOML"):
        Config.load(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("this is = = not toml")
    with pytest.raises(ConfigError, match="valid TOML"):
        Config.load(bad)
    with pytest.raises(ConfigError):
        Config.load(42)  # type: ignore[arg-type]


def test_scope_reflects_config() -> None:
    a = Config.load(base()).scope()
    c = base()
    c["model"]["revision"] = "r2"
    b = Config.load(c).scope()
    assert a.digest() != b.digest()
    assert a.block_tokens == 128 and a.kv_dtype == "float16"


# ---------------------------------------------------------------- unknown keys (issue 18, item 17)


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda c: c.update(telemetry={"enabled": True, "foo": 1}), "telemetry.foo"),
        (lambda c: c.update(telemetry={"enabeld": False}), "telemetry.enabeld"),
        (lambda c: c.update(codecs={"lz4": {"level": 1}}), "codecs"),
        (lambda c: c.update(codecs={}), "codecs"),
        (lambda c: c.update(scheduler={"polcy": "lru"}), "scheduler.polcy"),
        (lambda c: c.update(scheduler={"predictor": {"alpha": 1.0}}), "scheduler.predictor.alpha"),
        (lambda c: c.update(scheduler={"placement": {"margin": 1.0}}), "scheduler.placement.margin"),
        (lambda c: c.update(scheduler={"breaker": {"threshold": 3}}), "scheduler.breaker.threshold"),
        (lambda c: c.update(scheduler={"predictor": 3}), "scheduler.predictor"),
        (lambda c: c.update(model={"name": "m", "spec": {"name": "m", "layers": 2}}), "model.spec.layers"),
    ],
)
def test_unknown_keys_anywhere_name_their_dotted_path(mutate: Any, field: str) -> None:
    c = base()
    mutate(c)
    with pytest.raises(ConfigError) as ei:
        Config.load(c, env={})
    assert ei.value.field == field
    assert repr(field) in str(ei.value)


def test_codecs_error_says_where_codecs_go() -> None:
    c = base()
    c["codecs"] = {"lz4": {}}
    with pytest.raises(ConfigError, match=r"tiers\[0\]\.codec"):
        Config.load(c, env={})


def test_hf_config_errors_are_under_model_hf_config() -> None:
    c = base()
    c["model"]["hf_config"] = dict(HF, num_key_value_heads=4)  # not a divisor of 9 heads
    with pytest.raises(ConfigError) as ei:
        Config.load(c, env={})
    assert ei.value.field == "model.hf_config.num_key_value_heads"


def test_config_path_prefixes_fields_once() -> None:
    from tierkv.backend import config_path, opt_size, reject_unknown

    with pytest.raises(ConfigError) as ei, config_path("tiers[0]"):
        reject_unknown({"capcity": "1GiB"}, frozenset({"capacity"}))
    assert ei.value.field == "tiers[0].capcity"
    assert "'tiers[0].capcity'" in str(ei.value)
    assert isinstance(ei.value.__cause__, ConfigError) and ei.value.__cause__.field == "capcity"
    with pytest.raises(ConfigError) as ei, config_path("tiers[0]"):
        opt_size({"capacity": 0}, "capacity", prefix="tiers[0]", minimum=1)  # already under the prefix
    assert ei.value.field == "tiers[0].capacity"


@pytest.mark.anyio
@pytest.mark.parametrize("backend", ["dram", "pfs"])
async def test_tier_option_errors_name_the_tier_path(tmp_path: Path, backend: str) -> None:
    from tierkv import TierKV

    c = base()
    tier: dict[str, Any] = {"name": "t", "backend": backend, "capcity": "64MiB"}
    if backend == "pfs":
        tier["path"] = str(tmp_path / "pfs")
    c["tiers"].append(tier)
    with pytest.raises(ConfigError) as ei:
        await TierKV.open(c)
    assert ei.value.field == "tiers[1].capcity"
    assert "'tiers[1].capcity'" in str(ei.value)
