"""Use tierkv with Hugging Face ``transformers``: KV <-> cache conversion, prefill from stored KV, greedy decoding.

Public helpers for any ``transformers`` causal LM (the demo uses them on SmolLM2-135M-Instruct)::

    from tierkv.integrations.transformers import cache_to_kv, generate_greedy, kv_to_cache, prefill

    logits, kv = prefill(model, [ids])              # ids: list[int]; kv: (layers, 2, tokens, kv_heads, head_dim)
    await store.put(ids, kv)                        # store = await tierkv.TierKV.open(config)
    got = await store.get(followup)                 # the longest stored prefix of a later prompt
    tokens, ttft = generate_greedy(model, [followup], past_kv=got.kv, max_new_tokens=32)  # prefills the rest

KV layout
    tierkv stores the KV of a sequence as ONE tensor shaped
    ``(layers, 2, tokens, kv_heads, head_dim)`` (index 0 on the second axis is K, 1 is V).
    :func:`cache_to_kv` and :func:`kv_to_cache` convert between that and the ``transformers``
    cache object (``DynamicCache``; per-layer tensors shaped ``(batch=1, kv_heads, tokens, head_dim)``),
    for the 4.x and 5.x cache layouts.

Models
    Every function taking ``model`` accepts a bare ``transformers`` model or a :class:`LoadedModel` (a model
    with its tokenizer and the identity tierkv scopes its KV by: ``hf_config`` is what
    ``ModelSpec.from_hf_config`` reads).

Threads
    torch keeps its default intra-op thread count (one per core). Timings are therefore comparable only on
    the same machine.

Heavy imports (torch, transformers) happen inside the functions, never at import time of this module.
Errors: :class:`~tierkv.errors.InputError` for a KV or ``input_ids`` of the wrong shape.

Concurrency: the functions are blocking and CPU-bound; async callers run them through
``anyio.to_thread.run_sync``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tierkv.errors import InputError

__all__ = [
    "LoadedModel",
    "cache_to_kv",
    "chat_prompt_ids",
    "generate_greedy",
    "kv_to_cache",
    "prefill",
]


@dataclass(frozen=True, slots=True)
class LoadedModel:
    """A loaded model and what tierkv needs to scope its KV.

    ``model`` is a ``transformers`` causal LM in eval mode on the CPU, ``tokenizer`` its
    tokenizer, ``hf_config`` the model's config as a plain JSON-able dict (what
    ``ModelSpec.from_hf_config`` reads), ``weights_fingerprint`` an identity of the weights (the
    demo's loader: the sha256 of its GGUF file), ``name``/``revision`` the model identity for the key scope, ``dtype`` the compute dtype
    (which is also the dtype of the KV that :func:`prefill` returns).
    """

    model: Any
    tokenizer: Any
    hf_config: dict[str, Any]
    weights_fingerprint: str
    name: str
    revision: str
    dtype: str = "float32"


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


def _start(model: Any, input_ids: Any, past_kv: Any, timings: dict[str, float] | None = None) -> tuple[Any, Any]:
    ids = _as_ids(input_ids)
    cache = None
    t0 = time.perf_counter()
    if past_kv is not None:
        prefix = int(past_kv.shape[2])
        if prefix >= ids.shape[1]:
            raise InputError(
                f"past_kv covers {prefix} tokens but input_ids has {ids.shape[1]}: at least one token must be prefilled"
            )
        cache = kv_to_cache(past_kv)
        ids = ids[:, prefix:]
    t1 = time.perf_counter()
    out = _forward(_model_of(model), ids, cache)
    if timings is not None:
        timings["cache_s"] = t1 - t0
        timings["prefill_s"] = time.perf_counter() - t1
        timings["prefill_tokens"] = float(ids.shape[1])
    return out


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


def generate_greedy(
    model: Any, input_ids: Any, *, past_kv: Any = None, max_new_tokens: int, timings: dict[str, float] | None = None
) -> tuple[list[int], float]:
    """Greedy (argmax) generation; returns ``(new token ids, time to first token in seconds)``.

    ``input_ids`` is the whole prompt ``(1, T)``; with ``past_kv`` covering its first P tokens
    only tokens ``P..`` are prefilled. TTFT runs from the call until the first new token's argmax
    is known: it includes building the cache from ``past_kv`` and the prefill of the suffix, but
    not the fetch of ``past_kv`` (callers add that). Generation stops after ``max_new_tokens`` or
    at the EOS token. Deterministic for a given machine and thread count. ``timings``, when
    given, receives where the TTFT went: ``cache_s`` (building the cache from ``past_kv``),
    ``prefill_s`` and ``prefill_tokens`` (the suffix run through the model).

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
        logits, cache = _start(model, input_ids, past_kv, timings)
        token = int(torch.argmax(logits).item())
        ttft = time.perf_counter() - start
        tokens = [token]
        while len(tokens) < max_new_tokens and token not in eos_ids:
            logits, cache = _forward(bare, torch.tensor([[token]], dtype=torch.long), cache)
            token = int(torch.argmax(logits).item())
            tokens.append(token)
    return tokens, ttft


# ----------------------------------------------------------------------------- prompts


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
