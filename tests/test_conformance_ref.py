"""The conformance suite run against the reference backends of ``conformance_ref``."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from conformance_ref import RefFileBackend, RefMemoryBackend
from tierkv_conformance import BackendConformance, FaultConfig, FaultInjectingBackend

from tierkv.backend import Backend


class TestRefMemory(BackendConformance):
    backend_cls = RefMemoryBackend

    @pytest.fixture
    def backend_options(self, tmp_path: Path) -> dict[str, Any]:
        return {"capacity": "48MiB", "max_block_bytes": "16MiB"}


class TestRefMemoryAligned(BackendConformance):
    backend_cls = RefMemoryBackend
    cancel_iterations = 20
    stateful_examples = 5

    @pytest.fixture
    def backend_options(self, tmp_path: Path) -> dict[str, Any]:
        return {"capacity": 1_000_000, "alignment": 4096, "max_block_bytes": 300_000}


class TestRefFile(BackendConformance):
    backend_cls = RefFileBackend
    cancel_iterations = 30
    stateful_examples = 8

    @pytest.fixture
    def backend_options(self, tmp_path: Path) -> dict[str, Any]:
        return {"capacity": "32MiB", "path": str(tmp_path / "blocks"), "alignment": 512, "max_block_bytes": "8MiB"}


class TestFaultWrapperAtZeroRates(BackendConformance):
    """With every rate at zero the fault wrapper is itself a conformant backend."""

    backend_cls = RefFileBackend
    cancel_iterations = 20
    stateful_examples = 5

    @pytest.fixture
    def backend_options(self, tmp_path: Path) -> dict[str, Any]:
        return {"capacity": "16MiB", "path": str(tmp_path / "blocks"), "max_block_bytes": "4MiB"}

    async def open_backend(self, options: Mapping[str, Any]) -> Backend:
        inner = await RefFileBackend.open(dict(options))
        return FaultInjectingBackend(inner, FaultConfig(seed=1))
