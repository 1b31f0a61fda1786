"""The accelerator path of put / get(out=) (tierkv._device), run with CPU torch tensors taken as
accelerator tensors (``tierkv._device.ACCELERATORS`` gets ``"cpu"``): the same code a CUDA tensor
takes, but for the side stream and pinned memory, which only ``benchmarks/gpu_check.py`` exercises
on a GPU. Three routes: a DRAM tier (array IO: one copy each way between the tensor and the arena),
a device-resident tier (``SupportsDeviceIO``: the block stays on the device) and a pfs tier (host
staging in a worker thread). Under asyncio, trio and the sync facade."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kvtest import BT, config, dram_tier, kv_for, pfs_tier, smol_config

from tierkv import KVLayoutError, TierKV, _device, _registry
from tierkv._engine import _durable, _reader
from tierkv_backends import dram

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.anyio

N = 3 * BT + 5


def toks(n: int = N) -> list[int]:
    return list(range(70_000, 70_000 + n))


@pytest.fixture
def cpu_is_a_device(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """CPU tensors take the accelerator path; counts the calls of each route's copy."""
    monkeypatch.setattr(_device, "ACCELERATORS", {"cuda", "cpu"})
    calls = {"arena": 0, "staged": 0, "to_device": 0}

    def counting(where: str, real: Any) -> Any:
        def f(*a: Any) -> Any:
            calls[where] += 1
            return real(*a)

        return f

    monkeypatch.setattr(dram, "device_copy", counting("arena", dram.device_copy))
    monkeypatch.setattr(_durable, "to_host", counting("staged", _durable.to_host))
    monkeypatch.setattr(_reader, "device_copy", counting("to_device", _reader.device_copy))
    return calls


@pytest.fixture(scope="module")
def device_tier(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Register ``cpu-device`` (tests/device_tier.py) as a third-party backend would."""
    site = tmp_path_factory.mktemp("site")
    info = site / "tierkv_test_device_tier-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tierkv-test-device-tier\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[tierkv.backends]\ncpu-device = device_tier:CpuDeviceTier\n")
    sys.path.insert(0, str(site))
    _registry.refresh()
    try:
        yield "cpu-device"
    finally:
        sys.path.remove(str(site))
        _registry.refresh()


def strided_source(seed: int) -> tuple[np.ndarray[Any, Any], Any]:
    """KV for N tokens and the same KV as a non-contiguous torch view (a slice of a larger cache)."""
    kv = kv_for(N, seed=seed)
    big = torch.zeros((kv.shape[0], 2, N + 20, *kv.shape[3:]), dtype=torch.float16)
    view = big[:, :, 7 : 7 + N]
    view.copy_(torch.from_numpy(kv))
    assert not view.is_contiguous()
    return kv, view


async def test_dram_tier_copies_between_the_tensor_and_its_arena(
    tmp_path: Path, cpu_is_a_device: dict[str, int]
) -> None:
    kv, src = strided_source(1)
    async with await TierKV.open(config(tmp_path, pfs=None)) as store:
        r = await store.put(toks(), src)
        assert r.new_blocks == N // BT
        assert cpu_is_a_device["arena"] == N // BT and cpu_is_a_device["staged"] == 0
        out = torch.full((kv.shape[0], 2, N + 3, *kv.shape[3:]), 9.0, dtype=torch.float16)
        g = await store.get(toks(), out=out)
        hit = (N // BT) * BT
        assert g.tokens == hit and g.kv is out
        assert out[:, :, :hit].numpy().tobytes() == np.ascontiguousarray(kv[:, :, :hit]).tobytes()
        assert (out[:, :, hit:] == 9.0).all()  # nothing past the prefix is written
        assert cpu_is_a_device["arena"] == 2 * (N // BT) and cpu_is_a_device["staged"] == 0
        got = await store.get(toks())  # without out: a host array, as always
        assert got.kv.tobytes() == np.ascontiguousarray(kv[:, :, :hit]).tobytes()


async def test_device_resident_tier_keeps_the_block_on_the_device(
    tmp_path: Path, cpu_is_a_device: dict[str, int], device_tier: str
) -> None:
    kv, src = strided_source(2)
    cfg = smol_config([{"name": "dev", "backend": device_tier, "capacity": "64MiB"}])
    async with await TierKV.open(cfg) as store:
        tier = store._s.tiers[0].backend
        await store.put(toks(), src)
        assert tier.device_writes == N // BT and cpu_is_a_device["staged"] == 0
        out = torch.zeros((kv.shape[0], 2, N, *kv.shape[3:]), dtype=torch.float16)
        g = await store.get(toks(), out=out)
        hit = (N // BT) * BT
        assert g.tokens == hit and tier.device_reads == N // BT
        assert out[:, :, :hit].numpy().tobytes() == np.ascontiguousarray(kv[:, :, :hit]).tobytes()


async def test_storage_tier_stages_through_host_memory(tmp_path: Path, cpu_is_a_device: dict[str, int]) -> None:
    kv, src = strided_source(3)
    async with await TierKV.open(smol_config([pfs_tier(tmp_path)])) as store:
        await store.put(toks(), src, durable=True)
        assert cpu_is_a_device["staged"] == N // BT and cpu_is_a_device["arena"] == 0
        out = torch.zeros((kv.shape[0], 2, N, *kv.shape[3:]), dtype=torch.float16)
        g = await store.get(toks(), out=out)
        hit = (N // BT) * BT
        assert g.tokens == hit and cpu_is_a_device["to_device"] == N // BT  # verified on the host, then copied
        assert out[:, :, :hit].numpy().tobytes() == np.ascontiguousarray(kv[:, :, :hit]).tobytes()


async def test_bad_device_tensors_are_typed_errors_and_store_nothing(
    tmp_path: Path, cpu_is_a_device: dict[str, int]
) -> None:
    _, src = strided_source(4)
    async with await TierKV.open(config(tmp_path, pfs=None)) as store:
        with pytest.raises(KVLayoutError, match="dtype"):
            await store.put(toks(), src.float())
        with pytest.raises(KVLayoutError, match="shape"):
            await store.put(toks(N - 1), src)
        assert all(s.blocks == 0 for s in store.stats().values())
        await store.put(toks(), src)
        with pytest.raises(KVLayoutError, match="out shape"):
            await store.get(toks(), out=torch.zeros((2, 2), dtype=torch.float16))
        with pytest.raises(KVLayoutError, match="dtype"):
            await store.get(toks(), out=torch.zeros(tuple(src.shape), dtype=torch.float32))


def test_device_path_through_the_sync_facade(tmp_path: Path, cpu_is_a_device: dict[str, int]) -> None:
    kv, src = strided_source(5)
    with TierKV.open_sync(smol_config([dram_tier(), pfs_tier(tmp_path)])) as store:
        store.put(toks(), src)
        out = torch.zeros(tuple(src.shape), dtype=torch.float16)
        hit = (N // BT) * BT
        assert store.get(toks(), out=out).tokens == hit
        assert out[:, :, :hit].numpy().tobytes() == np.ascontiguousarray(kv[:, :, :hit]).tobytes()
        assert cpu_is_a_device["arena"] >= 2 * (N // BT)
