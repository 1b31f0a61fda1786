"""Use tierkv with Hugging Face ``transformers``: a ``DynamicCache`` bridge, KV <-> cache conversion, greedy decoding.

The Cache bridge (docs/transformers.md)::

    from tierkv.integrations.transformers import load_cache, model_config, prefill_cache, store_cache

    store = await tierkv.TierKV.open({"model": model_config(model), ...})   # the model's key scope
    _, cache = prefill_cache(model, ids)                 # or generate()'s cache
    await store_cache(store, model, ids, cache)          # only the whole blocks not stored yet
    hit = await load_cache(store, model, followup_ids)   # a DynamicCache of the longest stored prefix
    model.generate(input_ids=followup_ids, **hit.generate_kwargs)   # continues exactly as without it

(``store_cache_sync``/``load_cache_sync`` for ``TierKV.open_sync``; left-padded batches with
``attention_mask``.) The lower-level helpers:

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
    "STAGING_BYTES",
    "CacheHit",
    "CacheStoreResult",
    "LoadedModel",
    "cache_to_kv",
    "chat_prompt_ids",
    "generate_greedy",
    "kv_to_cache",
    "load_cache",
    "load_cache_sync",
    "model_config",
    "prefill",
    "prefill_cache",
    "store_cache",
    "store_cache_sync",
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
    return _cache_of_views(pairs)


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


def _cache_keyword(model: Any) -> str:
    """The keyword ``model`` takes a cache by: ``cache`` (transformers 5.x) or ``past_key_values``."""
    import inspect

    forward = getattr(model, "forward", None)
    if forward is None:
        return "past_key_values"
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


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


def _start(
    model: Any, input_ids: Any, past_kv: Any, timings: dict[str, float] | None = None, cache: Any = None
) -> tuple[Any, Any]:
    ids = _as_ids(input_ids)
    t0 = time.perf_counter()
    if cache is not None:
        if past_kv is not None:
            raise InputError("give past_kv or cache, not both")
        prefix = int(cache.get_seq_length())
        if prefix >= ids.shape[1]:
            raise InputError(
                f"cache covers {prefix} tokens but input_ids has {ids.shape[1]}: at least one token must be prefilled"
            )
        ids = ids[:, prefix:]
    elif past_kv is not None:
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
    model: Any,
    input_ids: Any,
    *,
    past_kv: Any = None,
    cache: Any = None,
    max_new_tokens: int,
    timings: dict[str, float] | None = None,
) -> tuple[list[int], float]:
    """Greedy (argmax) generation; returns ``(new token ids, time to first token in seconds)``.

    ``input_ids`` is the whole prompt ``(1, T)``; with ``past_kv`` covering its first P tokens
    only tokens ``P..`` are prefilled. TTFT runs from the call until the first new token's argmax
    is known: it includes building the cache from ``past_kv`` and the prefill of the suffix, but
    not the fetch of ``past_kv`` (callers add that). Generation stops after ``max_new_tokens`` or
    at the EOS token. Deterministic for a given machine and thread count. ``timings``, when
    given, receives where the TTFT went: ``cache_s`` (building the cache from ``past_kv``),
    ``prefill_s`` and ``prefill_tokens`` (the suffix run through the model).

    ``cache`` instead of ``past_kv``: a ``transformers`` cache covering the first P tokens
    (:attr:`CacheHit.cache` from :func:`load_cache`); it is extended in place (consumed).

    Raises:
        InputError: as :func:`prefill`, both ``past_kv`` and ``cache`` given, or ``max_new_tokens < 1``.
    """
    import torch

    if max_new_tokens < 1:
        raise InputError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    bare = _model_of(model)
    eos = getattr(bare.config, "eos_token_id", None)
    eos_ids = set(eos) if isinstance(eos, list) else ({eos} if eos is not None else set())
    with torch.inference_mode():
        start = time.perf_counter()
        logits, cache = _start(model, input_ids, past_kv, timings, cache)
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


# ----------------------------------------------------------------------------- the Cache bridge


def model_config(
    model: Any, *, name: str | None = None, revision: str = "", weights_fingerprint: str = ""
) -> dict[str, Any]:
    """The ``[model]`` table of a tierkv config for ``model``: the key scope the bridge checks.

    ``model`` is a :class:`LoadedModel` (its own name, revision, fingerprint and ``hf_config``
    are used; the keyword arguments override them when given) or a bare ``transformers`` model
    (``hf_config`` is ``model.config.to_dict()`` made plain JSON; ``name`` defaults to the
    config's ``_name_or_path``). Give ``weights_fingerprint`` (e.g. a hash of the weights file)
    so that two fine-tunes of one architecture never share keys: the HF config alone cannot
    tell them apart.
    """
    hf_config = _hf_config(model)
    if isinstance(model, LoadedModel):
        name = model.name if name is None else name
        revision = revision or model.revision
        weights_fingerprint = weights_fingerprint or model.weights_fingerprint
    if name is None:
        name = str(hf_config.get("_name_or_path") or hf_config.get("model_type") or "model")
    return {"name": name, "revision": revision, "weights_fingerprint": weights_fingerprint, "hf_config": hf_config}


@dataclass(frozen=True, slots=True)
class CacheStoreResult:
    """What :func:`store_cache` did, one entry per row of the batch.

    ``tokens``: the row's stored prefix after the call (real tokens, a multiple of
    ``block_tokens``, or the whole row when the store has ``partial_blocks`` on: its trailing
    partial block is stored too); ``new_blocks``: blocks this call copied out of the cache and wrote;
    ``existing_blocks``: blocks that were already stored (found by ``lookup``; never copied);
    ``tail_tokens``: the row's trailing tokens not stored (a partial block); ``puts``: the
    ``put(start=...)`` calls made in all.
    """

    tokens: tuple[int, ...]
    new_blocks: tuple[int, ...]
    existing_blocks: tuple[int, ...]
    tail_tokens: tuple[int, ...]
    puts: int


@dataclass(frozen=True, slots=True)
class CacheHit:
    """What :func:`load_cache` found: a cache for ``generate`` and how much of the prompt it covers.

    ``cache``: a ``DynamicCache`` holding the KV of columns ``[0, tokens)`` of every row of the
    (left-padded) ``input_ids`` -- pass it with the WHOLE ``input_ids`` and ``attention_mask`` to
    ``model.generate(input_ids=..., attention_mask=..., past_key_values=hit.cache)``, which then
    prefills columns ``tokens..`` only. ``None`` when ``tokens`` is 0 (nothing usable was stored):
    call ``generate`` without ``past_key_values``. The cache is consumed by the call that uses it
    (``generate`` extends it in place); load again for another call.

    ``cache_keyword``: the ``generate`` keyword this model takes the cache by (see
    :attr:`generate_kwargs`).

    ``tokens``: columns covered, the same for every row (a ``DynamicCache`` is rectangular): the
    minimum over rows of ``pad + stored prefix``, at most ``T - 1`` so that at least one column is
    prefilled. ``row_tokens``: per row, the real tokens taken from tierkv (``tokens - pad``, at
    least 0). ``stored_tokens``: per row, the stored prefix ``lookup`` reported (can exceed what was
    used). ``tiers``: tiers the used blocks came from, fastest first. ``lookup_s``, ``get_s``,
    ``build_s``: where the call's time went (lookups, fetches into the cache's memory, the rest).
    """

    cache: Any
    tokens: int
    row_tokens: tuple[int, ...]
    stored_tokens: tuple[int, ...]
    tiers: tuple[str, ...]
    lookup_s: float = 0.0
    get_s: float = 0.0
    build_s: float = 0.0
    cache_keyword: str = "past_key_values"

    @property
    def generate_kwargs(self) -> dict[str, Any]:
        """``{keyword: cache}`` for ``model.generate(**hit.generate_kwargs)``, ``{}`` without a cache.

        The keyword is ``cache`` where the model's ``forward`` takes it (transformers 5.x, which
        deprecates ``past_key_values``), else ``past_key_values``.
        """
        return {} if self.cache is None else {self.cache_keyword: self.cache}


#: staging budget of one ``put``: new blocks are copied out of the cache in chunks of at most this many bytes
STAGING_BYTES = 32 << 20


def _hf_config(model: Any) -> dict[str, Any]:
    import json

    if isinstance(model, LoadedModel):
        return model.hf_config
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "to_dict"):
        raise InputError(f"model: expected a transformers model or a LoadedModel, got {type(model).__name__}")
    plain: dict[str, Any] = json.loads(json.dumps(config.to_dict(), default=str))
    return plain


@dataclass(frozen=True, slots=True)
class _Geometry:
    layers: int
    kv_heads: int
    head_dim: int
    kv_dtype: str
    block_tokens: int


def _geometry(store: Any, model: Any) -> _Geometry:
    """The model's KV geometry, after checking that the store is scoped to this model."""
    from tierkv import ModelSpec
    from tierkv.errors import ConfigError

    try:
        spec = ModelSpec.from_hf_config(_hf_config(model))
    except ConfigError as exc:
        raise InputError(f"model: its config does not describe a KV cache tierkv can store ({exc})") from exc
    scope = store.scope()
    if spec.kv_digest() != scope.model_digest:
        raise InputError(
            f"model scope: the store is configured for model {scope.model_name!r} with a different geometry or"
            f" forward config than this model ({spec.num_layers} layers, {spec.num_kv_heads} KV heads of"
            f" {spec.head_dim}); open the store with model_config(model) as its [model] table so that two models"
            " never share keys"
        )
    if spec.attention == "mla" or spec.layer_types:
        raise InputError(
            "model: the transformers bridge supports models whose every layer is full attention"
            f" (this one: attention {spec.attention!r}, layer types {sorted(set(spec.layer_types))})"
        )
    return _Geometry(spec.num_layers, spec.num_kv_heads, spec.head_dim, scope.kv_dtype, int(store.block_tokens))


@dataclass(frozen=True, slots=True)
class _Rows:
    """A batch of prompts: ``ids`` (B, T) torch long, ``pads`` leading pad columns per row."""

    ids: Any
    pads: tuple[int, ...]

    @property
    def width(self) -> int:
        return int(self.ids.shape[1])

    def tokens(self, row: int) -> list[int]:
        return [int(t) for t in self.ids[row, self.pads[row] :].tolist()]


def _rows(input_ids: Any, attention_mask: Any) -> _Rows:
    import torch

    try:
        ids = torch.as_tensor(input_ids)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise InputError(f"input_ids: expected token ids shaped (T,) or (batch, T), got {exc}") from exc
    if ids.dim() == 1:
        ids = ids.unsqueeze(0)
    if ids.dim() != 2 or ids.shape[0] == 0 or ids.shape[1] == 0:
        raise InputError(f"input_ids: expected a shape (T,) or (batch, T) with T >= 1, got {tuple(ids.shape)}")
    if ids.dtype.is_floating_point or ids.dtype == torch.bool or ids.dtype.is_complex:
        raise InputError(f"input_ids: expected integer token ids, got dtype {ids.dtype}")
    ids = ids.to(torch.long)
    if attention_mask is None:
        return _Rows(ids, (0,) * int(ids.shape[0]))
    mask = torch.as_tensor(attention_mask)
    if mask.dim() == 1:
        mask = mask.unsqueeze(0)
    if tuple(mask.shape) != tuple(ids.shape):
        raise InputError(f"attention_mask: shape {tuple(mask.shape)} differs from input_ids' {tuple(ids.shape)}")
    pads: list[int] = []
    for row in range(int(mask.shape[0])):
        m = [int(v) for v in mask[row].tolist()]
        if any(v not in (0, 1) for v in m):
            raise InputError(f"attention_mask: row {row} holds values other than 0 and 1")
        pad = m.index(1) if 1 in m else len(m)
        if pad == len(m):
            raise InputError(f"attention_mask: row {row} is all padding")
        if 0 in m[pad:]:
            raise InputError(
                f"attention_mask: row {row} has padding after its first token; the bridge takes left padding"
                " (tokenizer.padding_side = 'left'), as generate() expects for decoder-only models"
            )
        pads.append(pad)
    return _Rows(ids, tuple(pads))


def _layers(cache: Any, rows: _Rows, geo: _Geometry) -> tuple[list[Any], list[Any]]:
    """The cache's per-layer K and V tensors, checked against the model and the batch."""
    from tierkv.errors import KVLayoutError

    if hasattr(cache, "layers"):
        keys = [getattr(layer, "keys", None) for layer in cache.layers]
        values = [getattr(layer, "values", None) for layer in cache.layers]
    elif hasattr(cache, "key_cache"):
        keys, values = list(cache.key_cache), list(cache.value_cache)
    else:
        raise InputError(f"cache: expected a transformers DynamicCache, got {type(cache).__name__}")
    batch, width = int(rows.ids.shape[0]), rows.width
    want = f"{geo.layers} layers of K and V shaped (batch={batch}, {geo.kv_heads}, >= {width} tokens, {geo.head_dim})"
    if len(keys) != geo.layers:
        raise KVLayoutError("cache layers", want, f"{len(keys)} layers")
    for i, (k, v) in enumerate(zip(keys, values, strict=True)):
        if k is None or v is None or getattr(k, "dim", lambda: 0)() != 4:
            raise KVLayoutError(f"cache layer {i}", want, "an empty layer" if k is None else type(k).__name__)
        for name, t in (("K", k), ("V", v)):
            shape = tuple(int(s) for s in t.shape)
            if shape[0] != batch or shape[1] != geo.kv_heads or shape[3] != geo.head_dim:
                raise KVLayoutError(f"cache layer {i} {name} shape", want, shape)
            if shape[2] < width:
                raise InputError(
                    f"input_ids: {width} tokens but the cache holds {shape[2]} (layer {i}); pass the tokens the"
                    " cache was computed from"
                )
            dtype = str(t.dtype).removeprefix("torch.")
            if dtype != geo.kv_dtype:
                raise KVLayoutError(f"cache layer {i} {name} dtype", geo.kv_dtype, dtype)
            if t.device.type != "cpu":
                raise KVLayoutError(f"cache layer {i} {name} device", "cpu", str(t.device))
    return keys, values


def _aio(store: Any, fn: str) -> Any:
    from tierkv import SyncTierKV, TierKV

    if isinstance(store, TierKV):
        return store
    if isinstance(store, SyncTierKV):
        raise InputError(f"store: a SyncTierKV is driven with {fn}_sync(), not awaited")
    raise InputError(f"store: expected a tierkv.TierKV, got {type(store).__name__}")


async def store_cache(
    store: Any,
    model: Any,
    input_ids: Any,
    cache: Any,
    *,
    attention_mask: Any = None,
    tenant: str | None = None,
    durable: bool = False,
) -> CacheStoreResult:
    """Store the KV a ``transformers`` cache holds for ``input_ids`` in ``store`` (a :class:`tierkv.TierKV`).

    ``cache`` is a ``DynamicCache`` (e.g. ``model(input_ids, use_cache=True).past_key_values``,
    :func:`prefill_cache`'s, or ``generate``'s) whose first ``T`` columns are the KV of
    ``input_ids`` (``(T,)`` or ``(batch, T)``); it may hold more columns (generated tokens), which
    are not stored. With ``attention_mask`` the batch is left-padded: row ``b``'s real tokens are
    the columns after its leading zeros and only they are stored, under the row's own tokens (so a
    later prompt finds them whatever its padding). The cache of a padded batch must come from a
    forward pass whose positions count real tokens from 0 (what ``generate`` and
    :func:`prefill_cache` do; a bare ``model(...)`` call on a left-padded batch without
    ``position_ids`` does not, and its KV would be stored under the wrong positions).

    Per row, ``lookup`` finds the stored prefix ``n``; only the whole blocks after it (and, with
    the store's ``partial_blocks`` on, the trailing partial block) are copied out of the cache's
    per-layer tensors, in chunks of at most :data:`STAGING_BYTES` (never the
    whole prefix at once), each stored with ``put(row_tokens[:end], chunk, start=...)``. Rows are
    stored one after the other, so rows sharing a prefix write it once.

    Model scope: ``model`` (a ``transformers`` model or :class:`LoadedModel`) must be the model the
    store is configured for (its ``[model]`` table from :func:`model_config`); the check compares
    ``ModelSpec.from_hf_config(model's config).kv_digest()`` with the store's scope, so a store
    never receives another model's KV under its keys.

    Raises:
        InputError: the store's scope is another model, the model is not full attention,
            ``input_ids``/``attention_mask`` are malformed or right-padded, or the cache holds fewer
            tokens than ``input_ids``; :class:`~tierkv.errors.KVLayoutError` (an InputError): the
            cache's layers, shapes, dtype (the store's ``kv_dtype``) or device do not match. Nothing
            is stored on any of these (all checks run before the first ``put``).
        What :meth:`tierkv.TierKV.put` raises (CapacityError, BackendError, ...): blocks stored
            before the failure stay.

    Cancellation: as ``put``'s -- each block is stored and indexed or absent. Concurrency: safe
    with other calls on the store; the cache must not be modified while the call runs.
    """
    kv = _aio(store, "store_cache")
    return await _store(kv, model, input_ids, cache, attention_mask, tenant, durable)


async def _store(
    kv: Any, model: Any, input_ids: Any, cache: Any, attention_mask: Any, tenant: str | None, durable: bool
) -> CacheStoreResult:
    import anyio.to_thread
    import torch

    geo = _geometry(kv, model)
    rows = _rows(input_ids, attention_mask)
    keys, values = _layers(cache, rows, geo)
    bt = geo.block_tokens
    per_block = geo.layers * 2 * bt * geo.kv_heads * geo.head_dim * keys[0].element_size()
    chunk_blocks = max(1, STAGING_BYTES // per_block)
    out_tokens: list[int] = []
    new: list[int] = []
    existing: list[int] = []
    tails: list[int] = []
    puts = 0
    stage: Any = None
    partial = bool(getattr(kv.config, "partial_blocks", False))
    for row in range(int(rows.ids.shape[0])):
        tokens, pad = rows.tokens(row), rows.pads[row]
        # with partial_blocks the store keeps the trailing partial block too: the last put covers it
        whole = len(tokens) if partial else (len(tokens) // bt) * bt
        have = (await kv.lookup(tokens, tenant=tenant)).tokens if whole else 0
        if have == len(tokens) and not durable:
            out_tokens.append(have)
            new.append(0)
            existing.append(-(-have // bt))
            tails.append(0)
            continue
        # durable: a stored block may live only in a volatile tier; put sees every block and writes those through;
        # a put starts at a block boundary (a stored tail's block is stored whole once the row covers it)
        first = 0 if durable else (have // bt) * bt
        stored, written, found = have, 0, first // bt
        for s in range(first, whole, chunk_blocks * bt):
            e = min(whole, s + chunk_blocks * bt)
            if stage is None or stage.shape[2] != e - s:
                stage = torch.empty((geo.layers, 2, e - s, geo.kv_heads, geo.head_dim), dtype=keys[0].dtype)

            def fill(buf: Any = stage, row: int = row, c0: int = pad + s, c1: int = pad + e) -> None:
                for layer in range(geo.layers):
                    buf[layer, 0].copy_(keys[layer][row, :, c0:c1].transpose(0, 1))
                    buf[layer, 1].copy_(values[layer][row, :, c0:c1].transpose(0, 1))

            await anyio.to_thread.run_sync(fill)
            res = await kv.put(tokens[:e], stage, start=s, tenant=tenant, durable=durable)
            puts += 1
            written += res.new_blocks
            found += res.existing_blocks
            stored = res.tokens
        out_tokens.append(stored)
        new.append(written)
        existing.append(found)
        tails.append(len(tokens) - stored if partial else len(tokens) - whole)
    return CacheStoreResult(tuple(out_tokens), tuple(new), tuple(existing), tuple(tails), puts)


async def load_cache(
    store: Any, model: Any, input_ids: Any, *, attention_mask: Any = None, tenant: str | None = None
) -> CacheHit:
    """Build a ``DynamicCache`` for ``model.generate`` from the KV ``store`` holds for ``input_ids``.

    ``input_ids`` is the WHOLE prompt, ``(T,)`` or ``(batch, T)``; with ``attention_mask`` the batch
    is left-padded (``tokenizer.padding_side = "left"``, as ``generate`` expects for decoder-only
    models; right padding is rejected). Per row, ``lookup`` finds the stored prefix of the row's
    real tokens; the cache covers the same number of columns ``P`` in every row (see
    :class:`CacheHit`): ``P = min(T - 1, min over rows of pad + stored prefix)``. Each row's blocks
    are fetched with ``get(out=...)`` straight into the cache's memory (one buffer shaped like the
    cache, ``(layers, 2, batch, kv_heads, columns, head_dim)``; the cache's tensors are views of it,
    so no copy follows the fetch); a row's pad columns hold zeros, which the attention mask hides.

    Then::

        out = model.generate(input_ids=ids, attention_mask=mask, past_key_values=hit.cache, ...)

    continues exactly as without the cache (greedy tokens equal; the stored KV is bit-identical to
    what was put). ``hit.cache`` is ``None`` when ``hit.tokens`` is 0.

    Model scope: as :func:`store_cache` (``model`` must be the store's model).

    Raises:
        InputError: scope or input as :func:`store_cache`.
        What :meth:`tierkv.TierKV.get` raises (``LoadFailedError`` with ``load_failure = "fail"``);
            a block that fails to load otherwise ends that row's prefix (a shorter ``tokens``, never
            wrong KV).

    Cancellation: nothing is left behind (the buffer is dropped). Concurrency: safe with other
    calls on the store.
    """
    kv = _aio(store, "load_cache")
    return await _load(kv, model, input_ids, attention_mask, tenant)


async def _load(kv: Any, model: Any, input_ids: Any, attention_mask: Any, tenant: str | None) -> CacheHit:
    import anyio.to_thread
    import torch

    t0 = time.perf_counter()
    geo = _geometry(kv, model)
    rows = _rows(input_ids, attention_mask)
    kw = _cache_keyword(_model_of(model))
    batch, width, bt = int(rows.ids.shape[0]), rows.width, geo.block_tokens
    tokens = [rows.tokens(b) for b in range(batch)]
    stored = [(await kv.lookup(t, tenant=tenant)).tokens for t in tokens]
    t1 = time.perf_counter()
    cover = min(width - 1, *(pad + n for pad, n in zip(rows.pads, stored, strict=True)))
    if cover <= 0:
        return CacheHit(None, 0, (0,) * batch, tuple(stored), (), t1 - t0, 0.0, time.perf_counter() - t1, kw)
    need = [max(0, cover - pad) for pad in rows.pads]  # real tokens each row must supply
    fetch = [-(-n // bt) * bt for n in need]  # whole blocks covering them (<= the stored prefix)
    columns = max(pad + f for pad, f in zip(rows.pads, fetch, strict=True))
    dtype = getattr(torch, geo.kv_dtype)
    shape = (geo.layers, 2, batch, geo.kv_heads, max(columns, cover), geo.head_dim)

    def alloc() -> Any:
        buf = torch.empty(shape, dtype=dtype)
        for b, pad in enumerate(rows.pads):
            if pad:
                buf[:, :, b, :, : min(pad, cover)].zero_()
        return buf

    # without pad columns to zero the buffer is only reserved (no page is touched until get writes it)
    buf = await anyio.to_thread.run_sync(alloc) if any(rows.pads) else alloc()
    t2 = time.perf_counter()
    tiers: list[str] = []
    for b, pad in enumerate(rows.pads):
        if not fetch[b]:
            continue
        out = buf[:, :, b, :, pad : pad + fetch[b]].permute(0, 1, 3, 2, 4)  # (L, 2, tokens, H, D), a view
        got = await kv.get(tokens[b][: fetch[b]], out=out, tenant=tenant)
        tiers += [t for t in got.tiers if t not in tiers]
        cover = min(cover, pad + got.tokens)  # a block that failed to load ends the row's prefix there
    t3 = time.perf_counter()
    if cover <= 0:
        return CacheHit(
            None, 0, (0,) * batch, tuple(stored), (), t1 - t0, t3 - t2, t2 - t1 + time.perf_counter() - t3, kw
        )
    order = [t for t in kv.tier_names if t in tiers]
    cache = _cache_of_views([(buf[layer, 0, :, :, :cover], buf[layer, 1, :, :, :cover]) for layer in range(geo.layers)])
    rows_used = tuple(max(0, cover - pad) for pad in rows.pads)
    return CacheHit(
        cache, cover, rows_used, tuple(stored), tuple(order), t1 - t0, t3 - t2, t2 - t1 + time.perf_counter() - t3, kw
    )


def _cache_of_views(pairs: Sequence[tuple[Any, Any]]) -> Any:
    """A ``DynamicCache`` whose layers hold the given tensors themselves (no copy).

    ``DynamicCache(pairs)`` would copy every layer once (its first ``update`` concatenates onto an
    empty tensor), and the first forward pass copies it again; so the layers are created empty
    and then handed the tensors. transformers 4.x (no ``layers``) gets the copying constructor.
    """
    from transformers import DynamicCache

    if hasattr(DynamicCache, "from_legacy_cache"):  # transformers 4.x
        return DynamicCache.from_legacy_cache(tuple((k.contiguous(), v.contiguous()) for k, v in pairs))
    cache: Any = DynamicCache([(k[..., :0, :], v[..., :0, :]) for k, v in pairs])
    for layer, (k, v) in zip(cache.layers, pairs, strict=True):
        layer.keys, layer.values = k, v
    return cache


def store_cache_sync(
    store: Any,
    model: Any,
    input_ids: Any,
    cache: Any,
    *,
    attention_mask: Any = None,
    tenant: str | None = None,
    durable: bool = False,
) -> CacheStoreResult:
    """:func:`store_cache` for a :class:`tierkv.SyncTierKV` (``TierKV.open_sync``), from a synchronous thread.

    Runs on the facade's loop thread in one hop (``SyncTierKV.call``); blocks the calling thread
    until done. Same contract and errors as :func:`store_cache`.
    """
    from tierkv import SyncTierKV

    if not isinstance(store, SyncTierKV):
        raise InputError(f"store: store_cache_sync takes a tierkv.SyncTierKV, got {type(store).__name__}")
    aio = store.aio
    result: CacheStoreResult = store.call(_store, aio, model, input_ids, cache, attention_mask, tenant, durable)
    return result


def load_cache_sync(
    store: Any, model: Any, input_ids: Any, *, attention_mask: Any = None, tenant: str | None = None
) -> CacheHit:
    """:func:`load_cache` for a :class:`tierkv.SyncTierKV` (``TierKV.open_sync``), from a synchronous thread.

    Same contract and errors as :func:`load_cache`.
    """
    from tierkv import SyncTierKV

    if not isinstance(store, SyncTierKV):
        raise InputError(f"store: load_cache_sync takes a tierkv.SyncTierKV, got {type(store).__name__}")
    aio = store.aio
    result: CacheHit = store.call(_load, aio, model, input_ids, attention_mask, tenant)
    return result


def prefill_cache(model: Any, input_ids: Any, *, attention_mask: Any = None) -> tuple[Any, Any]:
    """Run a prompt (or a left-padded batch) through ``model``; return ``(last logits, DynamicCache)``.

    ``input_ids`` ``(T,)`` or ``(batch, T)``; ``attention_mask`` as for :func:`store_cache`. The
    positions of each row's real tokens count from 0 (``position_ids`` from the mask, as
    ``generate`` computes them), so the cache is what :func:`store_cache` expects. Logits are the
    last column's, shaped ``(batch, vocab)``. Blocking and CPU-bound.

    Raises:
        InputError: malformed or right-padded input.
    """
    import inspect

    import torch

    rows = _rows(input_ids, attention_mask)
    bare = _model_of(model)
    mask = torch.ones_like(rows.ids)
    for b, pad in enumerate(rows.pads):
        mask[b, :pad] = 0
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    params = inspect.signature(bare.forward).parameters
    kwargs: dict[str, Any] = {"use_cache": True, "attention_mask": mask, "position_ids": position_ids}
    if "logits_to_keep" in params:
        kwargs["logits_to_keep"] = 1
    with torch.inference_mode():
        out = bare(input_ids=rows.ids, **kwargs)
    cache = getattr(out, "cache", None)
    if cache is None:
        cache = out.past_key_values
    return out.logits[:, -1], cache
