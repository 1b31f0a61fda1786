"""The conformance suite run against the reference backends of ``conformance_ref``."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import pytest
from conformance_ref import RefFileBackend, RefMemoryBackend
from tierkv_conformance import BackendConformance, FaultConfig, FaultInjectingBackend

from tierkv.backend import Backend


class _RefSuite(BackendConformance):
    """The suite over a reference backend opened with ``options`` (a file backend's ``path``
    is a folder in the test's own directory)."""

    options: ClassVar[dict[str, Any]]

    @pytest.fixture
    def backend_options(self, tmp_path: Path) -> dict[str, Any]:
        if issubclass(self.backend_cls, RefFileBackend):
            return {**self.options, "path": str(tmp_path / "blocks")}
        return dict(self.options)


class TestRefMemory(_RefSuite):
    backend_cls = RefMemoryBackend
    options: ClassVar[dict[str, Any]] = {"capacity": "48MiB", "max_block_bytes": "16MiB"}


class TestRefMemoryAligned(_RefSuite):
    backend_cls = RefMemoryBackend
    cancel_iterations = 20
    stateful_examples = 5
    options: ClassVar[dict[str, Any]] = {"capacity": 1_000_000, "alignment": 4096, "max_block_bytes": 300_000}


class TestRefFile(_RefSuite):
    backend_cls = RefFileBackend
    cancel_iterations = 30
    stateful_examples = 8
    options: ClassVar[dict[str, Any]] = {"capacity": "32MiB", "alignment": 512, "max_block_bytes": "8MiB"}


class TestFaultWrapperAtZeroRates(_RefSuite):
    """With every rate at zero the fault wrapper is itself a conformant backend."""

    backend_cls = RefFileBackend
    cancel_iterations = 20
    stateful_examples = 5
    options: ClassVar[dict[str, Any]] = {"capacity": "16MiB", "max_block_bytes": "4MiB"}

    async def open_backend(self, options: Mapping[str, Any]) -> Backend:
        inner = await RefFileBackend.open(dict(options))
        return FaultInjectingBackend(inner, FaultConfig(seed=1))
