"""TIERKV_... environment overrides applied by Config.load (issue 18, item 17)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kvtest import HF, dram_tier, pfs_tier, smol_config

from tierkv import Config, ConfigError, TierKV


def base() -> dict[str, Any]:
    """DRAM over a PFS tier never opened, no block_tokens (an override sets it); the model's
    hf_config is a copy, so an override that leaked into it could not reach other tests."""
    cfg = smol_config([dram_tier(), pfs_tier(Path("/tmp/unused"), "1GiB")], revision="r1", block_tokens=None)
    cfg["model"]["hf_config"] = dict(HF)
    return cfg


def test_overrides_apply_over_a_mapping() -> None:
    src = base()
    cfg = Config.load(
        src,
        env={
            "TIERKV_TIERS__0__CAPACITY": "1GiB",
            "TIERKV_TIERS__PFS__FSYNC": "false",
            "TIERKV_SCHEDULER__POLICY": "lru",
            "TIERKV_KV_DTYPE": "bfloat16",
            "TIERKV_BLOCK_TOKENS": "32",
            "TIERKV_TIERS__0__HIGH_WATERMARK": "0.5",
            "TIERKV_TELEMETRY__ENABLED": "false",
            "TIERKV_SCHEDULER__BREAKER__COOLDOWN_S": "5",
        },
    )
    assert cfg.tiers[0].options["capacity"] == "1GiB"
    assert cfg.tiers[1].options["fsync"] is False
    assert cfg.scheduler["policy"] == "lru"
    assert cfg.scheduler["breaker"] == {"cooldown_s": 5}
    assert cfg.kv_dtype == "bfloat16" and cfg.block_tokens == 32
    assert cfg.tiers[0].high_watermark == 0.5
    assert cfg.telemetry["enabled"] is False
    assert src["tiers"][0]["capacity"] == "64MiB" and "scheduler" not in src  # the caller's mapping is untouched


def test_overrides_apply_over_a_toml_file(tmp_path: Path) -> None:
    p = tmp_path / "c.toml"
    p.write_text(
        """
kv_dtype = "float16"
[model]
name = "smol"
hf_config = { num_hidden_layers = 30, num_attention_heads = 9, num_key_value_heads = 3, hidden_size = 576 }
[[tiers]]
name = "dram"
backend = "dram"
capacity = "64MiB"
"""
    )
    cfg = Config.load(p, env={"TIERKV_TIERS__0__CAPACITY": "2GiB", "TIERKV_MODEL__REVISION": '"1234"'})
    assert cfg.tiers[0].options["capacity"] == "2GiB"
    assert cfg.model_revision == "1234"  # a quoted TOML string stays a string


def test_values_are_toml_when_they_parse() -> None:
    cfg = Config.load(
        base(),
        env={
            "TIERKV_SHARE_ACROSS_TENANTS": "true",
            "TIERKV_SCHEDULER__TAU_CANDIDATES_S": "[10, 20.5]",
            "TIERKV_OBJECT_GROUP": "kv-prod",  # not TOML: a plain string
            "TIERKV_MODEL__HF_CONFIG__ROPE_THETA": "1000000.0",
        },
    )
    assert cfg.share_across_tenants is True
    assert cfg.scheduler["tau_candidates_s"] == [10, 20.5]
    assert cfg.object_group == "kv-prod"
    assert json.loads(cfg.model.forward_config)["rope_theta"] == 1_000_000
    assert cfg.scope() != Config.load(base(), env={}).scope()  # the override reaches the key scope


@pytest.mark.parametrize(
    ("env", "field"),
    [
        ({"TIERKV_TELEMETRY__FOO": "1"}, "telemetry.foo"),
        ({"TIERKV_SCHEDULER__POLCY": "lru"}, "scheduler.polcy"),
        ({"TIERKV_MODEL__EXTRA": "1"}, "model.extra"),
        ({"TIERKV_TIERZ__0__CAPACITY": "1GiB"}, "tierz"),
        ({"TIERKV_CODECS__LZ4__LEVEL": "1"}, "codecs"),
        ({"TIERKV_KV_DTYPE": "float17"}, "kv_dtype"),
        ({"TIERKV_TIERS__0__CAPACITY": "0"}, "tiers[0].capacity"),
        ({"TIERKV_TIERS__0__HIGH_WATERMARK": "2"}, "tiers[0].high_watermark"),
    ],
)
def test_unknown_or_bad_overrides_name_the_variable(env: dict[str, str], field: str) -> None:
    with pytest.raises(ConfigError) as ei:
        Config.load(base(), env=env)
    assert ei.value.field == field
    (var,) = env
    assert var in str(ei.value)


@pytest.mark.parametrize(
    "env",
    [
        {"TIERKV_TIERS__2__CAPACITY": "1GiB"},  # index out of range
        {"TIERKV_TIERS__NVME__CAPACITY": "1GiB"},  # no tier of that name
        {"TIERKV_MODEL__NAME__X": "1"},  # a path through a value
        {"TIERKV_TIERS____CAPACITY": "1"},  # an empty segment
        {"TIERKV_KV_DTYP": "float16"},  # a misspelt top-level field
        {"TIERKV_BLOCK_TOKEN": "32"},
    ],
)
def test_paths_that_name_no_field_are_errors_naming_the_variable(env: dict[str, str]) -> None:
    with pytest.raises(ConfigError) as ei:
        Config.load(base(), env=env)
    (var,) = env
    assert ei.value.field == var


def test_unrelated_tierkv_variables_and_other_variables_are_ignored() -> None:
    env = {"TIERKV_TEST_VENV": ".venv-test", "TIERKV_CRASH_KILLS": "5", "HOME": "/root", "tierkv_kv_dtype": "x"}
    assert Config.load(base(), env=env) == Config.load(base(), env={})


def test_a_config_object_is_returned_as_is() -> None:
    cfg = Config.load(base(), env={})
    assert Config.load(cfg, env={"TIERKV_KV_DTYPE": "bfloat16"}) is cfg


def test_the_process_environment_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIERKV_TIERS__0__CAPACITY", "3GiB")
    assert Config.load(base()).tiers[0].options["capacity"] == "3GiB"
    monkeypatch.setenv("TIERKV_TELEMETRY__NOPE", "1")
    with pytest.raises(ConfigError, match="TIERKV_TELEMETRY__NOPE"):
        Config.load(base())


@pytest.mark.anyio
async def test_open_applies_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = base()
    cfg["tiers"] = cfg["tiers"][:1]
    monkeypatch.setenv("TIERKV_TIERS__DRAM__CAPACITY", "32MiB")
    async with await TierKV.open(cfg) as kv:
        assert kv.config.tiers[0].options["capacity"] == "32MiB"
        assert kv.stats()["dram"].capacity_bytes == 32 << 20
