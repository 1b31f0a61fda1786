"""``tierkv stats`` over a TOML configuration whose PFS tier holds data from an earlier process."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest
from kvtest import BLOCK, BT, HF, kv_for

from tierkv import TierKV
from tierkv._cli import main as cli_main
from tierkv._statsview import main


def hf_table() -> str:
    """The model's config.json as TOML key/value lines (JSON scalars are valid TOML; nulls dropped)."""
    return "\n".join(f"{k} = {json.dumps(v)}" for k, v in HF.items() if v is not None)


def write_config(tmp_path: Path) -> Path:
    cfg = tmp_path / "tierkv.toml"
    cfg.write_text(
        f"""
kv_dtype = "float16"
block_tokens = {BT}

[model]
name = "smol"
revision = "test"

[model.hf_config]
{hf_table()}

[telemetry]
cost_per_gb_hour = {{ pfs = 1.0 }}

[[tiers]]
name = "dram"
backend = "dram"
capacity = "16MiB"

[[tiers]]
name = "pfs"
backend = "pfs"
path = {json.dumps(str(tmp_path / "pfs"))}
capacity = "64MiB"
"""
    )
    return cfg


def fill(cfg: Path) -> None:
    async def run() -> None:
        kv = await TierKV.open(cfg)
        try:
            data = kv_for(48)
            await kv.put(list(range(48)), data, durable=True)  # 3 blocks on DRAM, durable copies on PFS
        finally:
            await kv.aclose()

    anyio.run(run)


def test_stats_json_warm_starts_pfs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = write_config(tmp_path)
    fill(cfg)
    assert main(["--config", str(cfg), "--json"]) == 0
    snap = json.loads(capsys.readouterr().out)
    tiers = {r["name"]: r for r in snap["tiers"]}
    assert list(tiers) == ["dram", "pfs"]
    assert tiers["dram"]["blocks"] == 0  # volatile: empty in a new process
    assert tiers["pfs"]["blocks"] == 3 and tiers["pfs"]["used_bytes"] >= 3 * BLOCK
    assert tiers["pfs"]["kind"] == "pfs" and tiers["pfs"]["backend"] == "pfs" and tiers["pfs"]["healthy"]
    assert tiers["pfs"]["used_pct"] == pytest.approx(100 * tiers["pfs"]["used_bytes"] / (64 << 20))
    assert snap["cost_per_hour_usd"]["pfs"] == pytest.approx(tiers["pfs"]["used_bytes"] / 1e9)  # $1/GB/h
    assert snap["cost_per_hour_usd"]["dram"] == 0.0
    assert snap["total_cost_per_hour_usd"] == pytest.approx(sum(snap["cost_per_hour_usd"].values()))
    assert snap["miss_reasons"] == {}


def test_stats_table_via_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = write_config(tmp_path)
    fill(cfg)
    assert cli_main(["stats", "--config", str(cfg)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    header = lines[0].split()
    for col in ("TIER", "BACKEND", "KIND", "CAPACITY", "USED", "%", "BLOCKS", "HITS", "MISSES", "IN", "OUT"):
        assert col in header
    assert "EMULATED" in lines[0] and "HEALTHY" in lines[0] and "IO PATH" in lines[0]
    pfs = next(line for line in lines if line.startswith("pfs"))
    assert " 3 " in pfs and "64.0 MiB" in pfs and "yes" in pfs
    assert any(line.startswith("miss reasons:") for line in lines)
    assert any(line.startswith("storage cost per hour: $") for line in lines)


def test_stats_bad_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('block_tokens = "many"\n')
    assert main(["--config", str(bad)]) == 2
    assert "tierkv stats:" in capsys.readouterr().err
    assert main(["--config", str(tmp_path / "missing.toml")]) == 2
