"""The built-in backends run the full conformance suite (skipped while a backend is not installed here)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
from tierkv_conformance import BackendConformance

_HAVE_DRAM = importlib.util.find_spec("tierkv_backends.dram") is not None
_HAVE_PFS = importlib.util.find_spec("tierkv_backends.pfs") is not None


@pytest.mark.skipif(not _HAVE_DRAM, reason="tierkv_backends.dram is not there yet")
class TestDram(BackendConformance):
    backend_name = "dram"

    @pytest.fixture
    def backend_options(self, tmp_path: Path) -> dict[str, Any]:
        return {"capacity": "96MiB"}


@pytest.mark.skipif(not _HAVE_PFS, reason="tierkv_backends.pfs is not there yet")
class TestPfs(BackendConformance):
    backend_name = "pfs"
    cancel_iterations = 40

    @pytest.fixture
    def backend_options(self, tmp_path: Path) -> dict[str, Any]:
        return {**self.resolve_backend_class().default_options(tmp_path), "capacity": "96MiB"}
