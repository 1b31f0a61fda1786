"""Hostile inputs get typed errors, never a silent reinterpretation (issue 18, item 16).

Before: a big-endian ``>f2`` KV array was viewed as native float16 (1.0 came back as
3.6e-06), a ``meta``-device token tensor raised ``NotImplementedError``, a NUL in a path
raised a bare ``ValueError`` from the OS layer, and ``capacity = 0`` was accepted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kvtest import BT, dram_tier, kv_for, pfs_tier, smol_config

from tierkv import Config, ConfigError, KVLayoutError, TierKV, TokensError
from tierkv._layout import as_numpy_kv
from tierkv._model import ModelSpec
from tierkv.backend import opt_path, opt_str

SPEC = ModelSpec("m", 2, 4, 2, 8, "gqa")


def config(tmp_path: Path, **pfs_options: Any) -> dict[str, Any]:
    """DRAM over PFS, ``pfs_options`` replacing the PFS tier's (a hostile path or capacity)."""
    return smol_config([dram_tier(), {**pfs_tier(tmp_path), **pfs_options}])


# ------------------------------------------------------------------ byte order


@pytest.mark.parametrize(("kv_dtype", "dtype"), [("float16", ">f2"), ("float32", ">f4"), ("bfloat16", ">u2")])
def test_byte_swapped_kv_is_rejected_not_reinterpreted(kv_dtype: str, dtype: str) -> None:
    arr = np.ones(SPEC.kv_shape(4), dtype=dtype)
    with pytest.raises(KVLayoutError) as info:
        as_numpy_kv(arr, SPEC, kv_dtype, 4)
    assert "byte" in str(info.value) or "dtype" in str(info.value)
    # native order of the same data is accepted and keeps its values
    native = arr.astype(arr.dtype.newbyteorder("="))
    assert as_numpy_kv(native, SPEC, kv_dtype, 4).ravel()[0] == 1


def test_byte_swapped_float16_message_says_byte_order() -> None:
    with pytest.raises(KVLayoutError, match="byte order") as info:
        as_numpy_kv(np.ones(SPEC.kv_shape(4), dtype=">f2"), SPEC, "float16", 4)
    assert info.value.what == "byte order"


@pytest.mark.anyio
async def test_put_and_get_out_reject_big_endian(tmp_path: Path) -> None:
    async with await TierKV.open(config(tmp_path)) as kv:
        toks = list(range(2 * BT))
        data = np.ones((30, 2, 2 * BT, 3, 64), dtype=">f2")
        with pytest.raises(KVLayoutError, match="byte order"):
            await kv.put(toks, data)
        assert (await kv.lookup(toks)).tokens == 0  # nothing was stored from it
        good = kv_for(2 * BT)
        await kv.put(toks, good)
        out = np.zeros((30, 2, 2 * BT, 3, 64), dtype=">f2")
        with pytest.raises(KVLayoutError, match="byte order"):
            await kv.get(toks, out=out)
        assert not out.any()  # the caller's buffer was not written in the wrong byte order
        g = await kv.get(toks)
        assert g.kv.tobytes() == good.tobytes()


# ------------------------------------------------------------------ meta tensors


def test_meta_kv_tensor_is_a_layout_error() -> None:
    torch = pytest.importorskip("torch")
    t = torch.empty(SPEC.kv_shape(4), dtype=torch.float16, device="meta")
    with pytest.raises(KVLayoutError, match="meta"):
        as_numpy_kv(t, SPEC, "float16", 4)


@pytest.mark.anyio
async def test_meta_tensors_through_the_api_are_typed_errors(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    async with await TierKV.open(config(tmp_path)) as kv:
        toks = list(range(BT))
        meta_tokens = torch.arange(BT, device="meta")
        with pytest.raises(TokensError, match="meta"):
            await kv.lookup(meta_tokens)
        with pytest.raises(TokensError, match="meta"):
            await kv.put(meta_tokens, kv_for(BT))
        with pytest.raises(KVLayoutError, match="meta"):
            await kv.put(toks, torch.empty(30, 2, BT, 3, 64, dtype=torch.float16, device="meta"))
        await kv.put(toks, kv_for(BT))
        with pytest.raises(KVLayoutError, match="meta"):
            await kv.get(toks, out=torch.empty(30, 2, BT, 3, 64, dtype=torch.float16, device="meta"))


# ------------------------------------------------------------------ NUL in paths and strings


def test_nul_in_a_path_option_is_a_config_error_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        Config.load(config(tmp_path, path=str(tmp_path / "a\x00b")), env={})
    assert info.value.field == "tiers[1].path"
    cfg = config(tmp_path)
    cfg["tiers"][1]["path"] = [str(tmp_path / "ok"), "bad\x00"]
    with pytest.raises(ConfigError) as info:
        Config.load(cfg, env={})
    assert info.value.field == "tiers[1].path[1]"
    cfg = config(tmp_path)
    cfg["model"]["name"] = "sm\x00ol"
    with pytest.raises(ConfigError) as info:
        Config.load(cfg, env={})
    assert info.value.field == "model.name"


@pytest.mark.anyio
async def test_nul_in_a_path_through_open_and_the_backend_readers(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="NUL"):
        await TierKV.open(config(tmp_path, path=str(tmp_path / "a\x00b")))
    # a backend opened on its own reads its options with the same readers
    with pytest.raises(ConfigError, match="NUL") as info:
        opt_str({"path": "a\x00b"}, "path", prefix="tiers[1]")
    assert info.value.field == "tiers[1].path"
    with pytest.raises(ConfigError, match="NUL"):
        opt_path({"path": "/x\x00"}, "path")
    assert opt_path({"path": tmp_path}, "path") == str(tmp_path)


# ------------------------------------------------------------------ capacity


@pytest.mark.parametrize("capacity", [0, "0", "0MiB", -1, "-1GiB", 0.5])
def test_capacity_must_hold_at_least_a_byte(tmp_path: Path, capacity: Any) -> None:
    cfg = config(tmp_path)
    cfg["tiers"][0]["capacity"] = capacity
    with pytest.raises(ConfigError) as info:
        Config.load(cfg, env={})
    assert info.value.field == "tiers[0].capacity"


@pytest.mark.anyio
async def test_capacity_zero_through_open(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        await TierKV.open(config(tmp_path, capacity=0))
    assert info.value.field == "tiers[1].capacity"
