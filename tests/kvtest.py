"""Shared helpers of the test suite: the SmolLM2-135M-shaped model, its KV, tier tables, configs.

One place for what many test modules need (the model's hf_config, a block's size, random KV of
the model's layout, DRAM/PFS tier tables, a whole config), so a test states only what it varies.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import numpy as np

if TYPE_CHECKING:
    import pytest

__all__ = [
    "BLOCK",
    "BT",
    "HF",
    "Held",
    "config",
    "dram_tier",
    "hold_in_thread",
    "kv_for",
    "kv_shape",
    "nvme_tier",
    "pfs_tier",
    "smol_config",
    "smooth_kv",
]

HF: dict[str, Any] = json.loads(
    (Path(__file__).parent / "data" / "hf_configs" / "smollm2-135m-instruct.json").read_text()
)
#: tokens per block in the tests (small, so blocks are small)
BT = 16
#: bytes of one fp16 block of SmolLM2-135M: 30 layers x K/V x 16 tokens x 3 KV heads x 64
BLOCK = 30 * 2 * BT * 3 * 64 * 2


def kv_shape(n: int) -> tuple[int, ...]:
    """The model's KV layout for ``n`` tokens: (layers, K/V, tokens, KV heads, head dim)."""
    return (30, 2, n, 3, 64)


def kv_for(n: int, seed: int = 0, dtype: Any = np.float16) -> np.ndarray[Any, Any]:
    """Random KV of ``n`` tokens in the model's layout ``(30, 2, n, 3, 64)``."""
    return np.random.default_rng(seed).standard_normal(kv_shape(n)).astype(dtype)


def smooth_kv(shape: int | tuple[int, ...], seed: int = 0) -> np.ndarray[Any, Any]:
    """KV-like fp16 values (what lossy codecs are built for): smooth along the tokens, each
    channel at its own scale. ``shape`` is a token count (the model's layout) or a whole
    shape, whose token axis is axis 1 of an MLA ``(layers, tokens, latent)`` shape, else axis 2."""
    full = kv_shape(shape) if isinstance(shape, int) else shape
    rng = np.random.default_rng(seed)
    base_shape = list(full)
    base_shape[1 if len(full) == 3 else 2] = 1
    base = rng.standard_normal(base_shape) * np.linspace(0.5, 4.0, full[-1])
    return (base + 0.1 * rng.standard_normal(full)).astype(np.float16)


def dram_tier(capacity: int | str = "64MiB", name: str = "dram") -> dict[str, Any]:
    return {"name": name, "backend": "dram", "capacity": capacity}


def pfs_tier(tmp_path: Path, capacity: int | str = "256MiB", name: str = "pfs") -> dict[str, Any]:
    return {"name": name, "backend": "pfs", "path": str(tmp_path / name), "capacity": capacity}


def nvme_tier(
    tmp_path: Path, capacity: int | str, slot_bytes: int | str | None = None, name: str = "nvme"
) -> dict[str, Any]:
    """An nvme tier under ``tmp_path / name``; without ``slot_bytes`` the core sizes its slots."""
    tier: dict[str, Any] = {"name": name, "backend": "nvme", "path": str(tmp_path / name), "capacity": capacity}
    if slot_bytes is not None:
        tier["slot_bytes"] = slot_bytes
    return tier


def smol_config(
    tiers: list[dict[str, Any]], *, revision: str = "test", block_tokens: int | None = BT, **extra: Any
) -> dict[str, Any]:
    """A config of the SmolLM2-shaped model over ``tiers`` (fp16, ``BT``-token blocks;
    ``block_tokens=None`` leaves the key out, for the model's default)."""
    cfg: dict[str, Any] = {"model": {"name": "smol", "revision": revision, "hf_config": HF}, "kv_dtype": "float16"}
    if block_tokens is not None:
        cfg["block_tokens"] = block_tokens
    cfg["tiers"] = tiers
    cfg.update(extra)
    return cfg


def config(
    tmp_path: Path, *, dram: int | str | None = "64MiB", pfs: int | str | None = "256MiB", **extra: Any
) -> dict[str, Any]:
    """DRAM over PFS (either left out with None), the tiers most tests use."""
    tiers = [dram_tier(dram)] if dram is not None else []
    if pfs is not None:
        tiers.append(pfs_tier(tmp_path, pfs))
    return smol_config(tiers, **extra)


@dataclass
class Held:
    """A method held in its worker thread: ``started`` is set once a call is inside, the call
    goes on when ``release`` is set (or after 5 s); ``real`` is the method before the patch."""

    real: Any
    started: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)

    async def entered(self) -> None:
        """Wait (polling: it is set by a worker thread) until a call is held."""
        while not self.started.is_set():  # noqa: ASYNC110 - set by a worker thread
            await anyio.sleep(0.001)


def hold_in_thread(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str, *, after_call: bool = False) -> Held:
    """Patch ``owner.name`` (a method a backend runs in a worker thread) to hold every call,
    before the real method runs or, with ``after_call``, after it has run."""
    held = Held(getattr(owner, name))

    def holding(*args: Any, **kwargs: Any) -> Any:
        out = held.real(*args, **kwargs) if after_call else None
        held.started.set()
        held.release.wait(5)
        return out if after_call else held.real(*args, **kwargs)

    monkeypatch.setattr(owner, name, holding)
    return held
