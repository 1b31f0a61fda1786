"""Use tierkv as SGLang's HiCache storage (L3) backend: :class:`TierKVHiCacheStorage`.

SGLang (tested with 0.5.23) loads it through its storage backend factory::

    python -m sglang.launch_server --model-path M --page-size 64 --enable-hierarchical-cache \\
        --hicache-storage-backend dynamic \\
        --hicache-storage-backend-extra-config '{"backend_name": "tierkv",
            "module_path": "tierkv.integrations.sglang", "class_name": "TierKVHiCacheStorage",
            "interface_v1": 1, "tierkv_config": "/etc/tierkv.toml"}'

The factory calls ``TierKVHiCacheStorage(storage_config, kwargs)``; SGLang then calls
:meth:`register_mem_pool_host` with its host memory pool, and the store opens there.

Extra config (``storage_config.extra_config``; unknown keys are a ConfigError)
    ``tierkv_config`` (required): a path to a tierkv TOML file or an inline table. It holds the
    tiers (and scheduler, telemetry, tenants...) but no ``[model]`` table: the adapter derives the
    model, ``kv_dtype``, ``block_tokens``, ``world_size``, ``kv_rank`` and ``object_group`` from
    the engine (a value set there that disagrees with the engine is a ConfigError).
    ``tenant``: the tierkv tenant every page is stored under (default: the default tenant).
    ``model_revision``, ``weights_fingerprint``: identity strings added to the key scope.
    ``durable``: ``put`` pages with ``durable=True`` (committed on a persistent tier when stored).
    ``scheduler``: run tierkv's placement service on the facade's loop (default true).
    ``backend_name``, ``module_path``, ``class_name``, ``interface_v1``: SGLang's own keys.

Keys
    SGLang names a page by its own chained hash string (the hash covers every token of the
    prefix up to the end of the page). tierkv keys blocks by token ids, so each page is stored as
    a one-block sequence of ``page_size`` synthetic token ids derived from that string
    (:func:`page_tokens`: SHA-256 of the key, 63 bits per token id, so ``63 * page_size`` bits
    of the key; with ``page_size`` 1 that is 63 bits). tierkv's block size is the engine's
    page size. The key scope holds the model name, the TP rank and size (``world_size``/``kv_rank``),
    the pipeline stage and the attention context-parallel rank (``object_group``), the per-rank
    geometry read from the host pool, the KV dtype and the tenant: two models, two ranks or two
    tenants never share a page. The object group (``sglang-page...``) keeps these synthetic
    sequences apart from blocks that other integrations store by real token ids.

Bytes
    A page is stored in tierkv's canonical layout (``(layers, 2, page_size, heads, head_dim)``;
    MLA ``(layers, page_size, latent)``), read from and written into the host pool through strided
    views (:func:`page_view`), without an intermediate copy on the adapter's side. The stored
    bytes therefore do not depend on the host pool layout: a page written from a ``layer_first``
    pool loads into a ``page_first`` one. Supported layouts: MHA ``layer_first``, ``page_first``,
    ``page_first_direct``, ``page_head``; MLA ``layer_first``, ``page_first``,
    ``page_first_direct``.

Errors
    Construction: :class:`~tierkv.errors.ConfigError` (bad extra config or tierkv config, an
    unsupported parallel setting). :meth:`register_mem_pool_host`: :class:`~tierkv.errors.KVLayoutError`
    (a pool this adapter cannot address) and what :meth:`tierkv.TierKV.open` raises. The batch
    methods: :class:`~tierkv.errors.InputError` for bad arguments (keys that are not strings,
    host indices that do not name whole aligned pages of the pool), nothing touched; a tier that
    fails is not an exception: the pages it could not serve or store are reported ``False``
    (a get never leaves wrong bytes reported as loaded). Before the pool is registered, and after
    :meth:`close`, every method raises :class:`~tierkv.errors.ClosedError`.

Concurrency: SGLang calls from its prefetch and backup threads at once; every method is
thread-safe (the store is a :class:`~tierkv.SyncTierKV`, each batch is one hop to its loop,
the pages of a batch are read or written concurrently there). A call blocks its thread until done.

This module imports sglang and torch when it is imported (it subclasses SGLang's ABC); nothing
else in tierkv imports it.
"""

from __future__ import annotations

import hashlib
import threading
import tomllib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheStorage

from tierkv import SyncTierKV, TierKV
from tierkv.errors import (
    BackendError,
    ClosedError,
    ConfigError,
    InputError,
    KVLayoutError,
    LoadFailedError,
    TierKVError,
)

__all__ = ["MHA_LAYOUTS", "MLA_LAYOUTS", "TierKVHiCacheStorage", "page_tokens", "page_view"]

#: host pool layouts of an MHA/GQA pool this adapter addresses
MHA_LAYOUTS = ("layer_first", "page_first", "page_first_direct", "page_head")
#: host pool layouts of an MLA pool this adapter addresses
MLA_LAYOUTS = ("layer_first", "page_first", "page_first_direct")

_SGLANG_KEYS = frozenset({"backend_name", "module_path", "class_name", "interface_v1"})
_OWN_KEYS = frozenset({"tierkv_config", "tenant", "model_revision", "weights_fingerprint", "durable", "scheduler"})
_ENGINE_FIELDS = ("kv_dtype", "block_tokens", "world_size", "kv_rank", "object_group")
_DTYPES = {
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float32: "float32",
    torch.float8_e4m3fn: "float8_e4m3fn",
    torch.float8_e5m2: "float8_e5m2",
}
_TOKEN_MASK = np.uint64(2**63 - 1)


def page_tokens(key: str, page_size: int) -> np.ndarray[Any, np.dtype[np.int64]]:
    """The ``page_size`` synthetic token ids a page named ``key`` is stored under: SHA-256
    digests of ``key`` (with a counter), 63 bits per id. Pure; raises InputError for a key that
    is not a non-empty string."""
    if not isinstance(key, str) or not key:
        raise InputError(f"key: expected a non-empty str (an SGLang page hash), got {type(key).__name__} {key!r}")
    raw = key.encode("utf-8")
    n = -(-page_size // 4)
    digest = b"".join(hashlib.sha256(b"tierkv.sglang.page\x00%d\x00" % i + raw).digest() for i in range(n))
    ids = np.frombuffer(digest, dtype="<u8")[:page_size] & _TOKEN_MASK
    return ids.astype(np.int64)


def _is_mla(pool: Any) -> bool:
    return hasattr(pool, "kv_lora_rank") and hasattr(pool, "kv_cache_dim")


def _raw_shape(pool: Any) -> tuple[int, ...]:
    """The shape of one page of ``pool`` as SGLang's ``get_data_page(index, flat=False)`` cuts it
    (singleton page axes dropped), in the pool's own axis order."""
    L, P = int(pool.layer_num), int(pool.page_size)
    if _is_mla(pool):
        d = int(pool.kv_cache_dim)
        return (P, L, 1, d) if pool.layout == "page_first" else (L, P, 1, d)
    H, D = int(pool.head_num), int(pool.head_dim)
    return {
        "layer_first": (2, L, P, H, D),
        "page_first": (2, P, L, H, D),
        "page_first_direct": (2, L, P, H, D),
        "page_head": (2, H, P, L, D),
    }[pool.layout]


def _canonical(pool: Any, raw: Any) -> Any:
    """A page in the pool's axis order (:func:`_raw_shape`) as a view in tierkv's layout."""
    if _is_mla(pool):
        v = raw[:, :, 0, :]
        return v.permute(1, 0, 2) if pool.layout == "page_first" else v
    if pool.layout == "page_first":
        return raw.permute(2, 0, 1, 3, 4)
    if pool.layout == "page_head":
        return raw.permute(3, 0, 2, 1, 4)
    return raw.transpose(0, 1)


def page_view(pool: Any, index: int) -> Any:
    """The page of ``pool`` whose first token slot is ``index`` as a strided torch view in
    tierkv's layout (writes through it land in the pool). ``pool`` is an SGLang host KV pool
    (``MHATokenToKVPoolHost`` or ``MLATokenToKVPoolHost``: ``kv_buffer``, ``layout``,
    ``page_size``, ``layer_num`` and the head geometry), ``index`` a multiple of its page size."""
    P = int(pool.page_size)
    kv = pool.kv_buffer
    mla = _is_mla(pool)
    if pool.layout == "layer_first":
        raw = kv[:, index : index + P] if mla else kv[:, :, index : index + P]
    elif pool.layout == "page_first":
        raw = kv[index : index + P] if mla else kv[:, index : index + P]
    else:  # page_first_direct, page_head: one row per page
        raw = kv[index // P] if mla else kv[:, index // P]
    return _canonical(pool, raw)


def _slots(pool: Any) -> int:
    """How many token slots ``pool.kv_buffer`` holds."""
    shape, P = [int(n) for n in pool.kv_buffer.shape], int(pool.page_size)
    if _is_mla(pool):
        return {"layer_first": shape[1], "page_first": shape[0]}.get(pool.layout, shape[0] * P)
    return {"layer_first": shape[2], "page_first": shape[1]}.get(pool.layout, shape[1] * P)


def _flat_view(pool: Any, flat: Any) -> Any:
    """A flat page (SGLang's ``get_data_page(index, flat=True)`` order) as a view in tierkv's layout."""
    if not isinstance(flat, torch.Tensor):
        raise InputError(f"value: expected a torch.Tensor (a flat page), got {type(flat).__name__}")
    shape = _raw_shape(pool)
    if flat.dtype != pool.dtype:
        raise KVLayoutError("page dtype", str(pool.dtype), str(flat.dtype))
    if flat.numel() != int(np.prod(shape)) or flat.device.type != "cpu":
        raise KVLayoutError(
            "flat page", f"{int(np.prod(shape))} elements on the cpu", f"{flat.numel()} on {flat.device}"
        )
    return _canonical(pool, flat.reshape(shape) if flat.is_contiguous() else flat.contiguous().reshape(shape))


def _read_config(source: object) -> dict[str, Any]:
    if isinstance(source, Mapping):
        return dict(source)
    if isinstance(source, (str, Path)):
        try:
            with open(source, "rb") as f:
                return tomllib.load(f)
        except OSError as exc:
            raise ConfigError("tierkv_config", str(source), f"a readable TOML file ({exc})") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError("tierkv_config", str(source), f"valid TOML ({exc})") from exc
    raise ConfigError("tierkv_config", source, "a path to a tierkv TOML file or an inline table (required)")


class TierKVHiCacheStorage(HiCacheStorage):  # type: ignore[misc]
    """SGLang ``HiCacheStorage`` over a tierkv store (see the module docstring).

    ``storage_config`` is SGLang's ``HiCacheStorageConfig``; ``kwargs`` is what the factory
    passes (unused). The store opens in :meth:`register_mem_pool_host`. The v1 zero-copy
    interface (``batch_get_v1``/``batch_set_v1``, selected by ``"interface_v1": 1``) and the
    generic one (``get``/``set``/``batch_get``/``batch_set`` on flat pages) both work."""

    def __init__(self, storage_config: Any, kwargs: Mapping[str, Any] | None = None) -> None:
        extra = dict(getattr(storage_config, "extra_config", None) or {})
        unknown = sorted(set(extra) - _SGLANG_KEYS - _OWN_KEYS)
        if unknown:
            raise ConfigError(
                f"extra_config.{unknown[0]}", extra[unknown[0]], f"one of {sorted(_OWN_KEYS | _SGLANG_KEYS)}"
            )
        if getattr(storage_config, "dcp_size", 1) != 1:
            raise ConfigError("dcp_size", storage_config.dcp_size, "1 (decode context parallel is not supported)")
        if getattr(storage_config, "should_split_heads", False):
            raise ConfigError("tp_lcm_size", storage_config.tp_lcm_size, "unset (heterogeneous TP is not supported)")
        self._user = _read_config(extra.get("tierkv_config"))
        if "model" in self._user:
            raise ConfigError(
                "tierkv_config.model",
                "<a [model] table>",
                "absent: the SGLang adapter derives the model from the engine's host pool "
                "(set model_revision / weights_fingerprint in the extra config)",
            )
        for name in ("tenant", "model_revision", "weights_fingerprint"):
            if name in extra and not isinstance(extra[name], str):
                raise ConfigError(f"extra_config.{name}", extra[name], "a string")
        for name in ("durable", "scheduler"):
            if name in extra and not isinstance(extra[name], bool):
                raise ConfigError(f"extra_config.{name}", extra[name], "true or false")
        model_name = getattr(storage_config, "model_name", None) or ""
        if not isinstance(model_name, str) or not model_name:
            raise ConfigError("model_name", model_name, "the engine's model name (SGLang sets it)")
        self.storage_config = storage_config
        self.model_name = model_name
        self.tenant: str | None = extra.get("tenant") or None
        self._revision = str(extra.get("model_revision", ""))
        self._fingerprint = str(extra.get("weights_fingerprint", ""))
        self._durable = bool(extra.get("durable", False))
        self._scheduler = bool(extra.get("scheduler", True))
        self._kv: SyncTierKV | None = None
        self._pool: Any = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ lifecycle
    def engine_config(self, pool: Any) -> dict[str, Any]:
        """The tierkv config this adapter opens for ``pool``: the user's ``tierkv_config`` plus
        the model, dtype, block size and scope fields read from the engine. Raises
        KVLayoutError (a pool it cannot address), ConfigError (a field that disagrees)."""
        layout = getattr(pool, "layout", None)
        mla = _is_mla(pool)
        allowed = MLA_LAYOUTS if mla else MHA_LAYOUTS
        if layout not in allowed:
            raise KVLayoutError("host pool layout", f"one of {allowed}", layout)
        dtype = _DTYPES.get(getattr(pool, "dtype", None))  # type: ignore[arg-type]
        if dtype is None:
            raise KVLayoutError("host pool dtype", f"one of {sorted(_DTYPES.values())}", getattr(pool, "dtype", None))
        kv = getattr(pool, "kv_buffer", None)
        if not isinstance(kv, torch.Tensor) or kv.device.type != "cpu":
            raise KVLayoutError("host pool kv_buffer", "a cpu torch.Tensor", type(kv).__name__)
        L, P = int(pool.layer_num), int(pool.page_size)
        if mla:
            spec: dict[str, Any] = {
                "name": self.model_name,
                "num_layers": L,
                "num_attention_heads": 1,
                "head_dim": int(pool.qk_rope_head_dim) or 1,
                "attention": "mla",
                "kv_lora_rank": int(pool.kv_lora_rank),
                "qk_rope_head_dim": int(pool.qk_rope_head_dim),
            }
            if int(pool.kv_cache_dim) != spec["kv_lora_rank"] + spec["qk_rope_head_dim"]:
                raise KVLayoutError("MLA kv_cache_dim", "kv_lora_rank + qk_rope_head_dim", pool.kv_cache_dim)
        else:
            H, D = int(pool.head_num), int(pool.head_dim)
            if int(getattr(pool, "v_head_dim", D)) != D:
                raise KVLayoutError("host pool v_head_dim", D, pool.v_head_dim)
            spec = {
                "name": self.model_name,
                "num_layers": L,
                "num_attention_heads": H,
                "head_dim": D,
                "attention": "mha",
            }
        want = len(_raw_shape(pool)) + (1 if layout in ("page_first_direct", "page_head") else 0)
        if kv.dim() != want:
            raise KVLayoutError("host pool kv_buffer dims", want, kv.dim())
        sc = self.storage_config
        group = "sglang-page"
        if int(getattr(sc, "pp_size", 1)) > 1:
            group += f":pp{sc.pp_rank}of{sc.pp_size}"
        if int(getattr(sc, "attn_cp_size", 1)) > 1:
            group += f":cp{sc.attn_cp_rank}of{sc.attn_cp_size}"
        engine = {
            "kv_dtype": dtype,
            "block_tokens": P,
            "world_size": int(sc.tp_size),
            "kv_rank": int(sc.tp_rank),
            "object_group": group,
        }
        cfg = dict(self._user)
        for field in _ENGINE_FIELDS:
            if field in cfg and cfg[field] != engine[field]:
                raise ConfigError(
                    f"tierkv_config.{field}", cfg[field], f"{engine[field]!r} (set by the engine) or absent"
                )
        cfg.update(engine)
        cfg["model"] = {
            "name": self.model_name,
            "revision": self._revision,
            "weights_fingerprint": self._fingerprint,
            "spec": spec,
        }
        return cfg

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """Take SGLang's host KV pool and open the store for it (once; a second pool is an
        InputError). Raises what :meth:`engine_config` and :meth:`tierkv.TierKV.open` raise."""
        with self._lock:
            if self._kv is not None:
                if mem_pool_host is self._pool:
                    return
                raise InputError("register_mem_pool_host: a different host pool is already registered")
            cfg = self.engine_config(mem_pool_host)
            self._kv = TierKV.open_sync(cfg, scheduler=self._scheduler)
            self._pool = mem_pool_host
            self.mem_pool_host = mem_pool_host

    @property
    def store(self) -> SyncTierKV:
        """The tierkv store (for stats and inspection); ClosedError before the pool is registered."""
        kv = self._kv
        if kv is None:
            raise ClosedError(
                "TierKVHiCacheStorage: no host pool registered yet (register_mem_pool_host opens the store)"
            )
        return kv

    def close(self) -> None:
        """Close the store (SGLang calls it when it detaches the backend); idempotent."""
        with self._lock:
            kv, self._kv = self._kv, None
        if kv is not None:
            kv.close()

    # ----------------------------------------------------------------- helpers
    def _hop(self, fn: Callable[[TierKV], Awaitable[Any]]) -> Any:
        kv = self.store
        return kv.call(fn, kv.aio)

    def _tokens(self, keys: object) -> list[np.ndarray[Any, np.dtype[np.int64]]]:
        self.store  # noqa: B018 (ClosedError before the pool is registered and after close)
        if isinstance(keys, (str, bytes)) or not isinstance(keys, Sequence):
            raise InputError(f"keys: expected a list of str, got {type(keys).__name__}")
        P = int(self._pool.page_size)
        return [page_tokens(k, P) for k in keys]

    def _page_starts(self, n: int, host_indices: object) -> list[int]:
        """The first slot of each of ``n`` pages named by ``host_indices`` (every page must be a
        whole, aligned run of the pool's slots)."""
        if not isinstance(host_indices, torch.Tensor) or host_indices.dim() != 1 or host_indices.is_floating_point():
            raise InputError("host_indices: expected a 1-D integer torch.Tensor of host pool slots")
        P = int(self._pool.page_size)
        if host_indices.numel() != n * P:
            raise InputError(f"host_indices: {n} keys need {n * P} slots (page size {P}), got {host_indices.numel()}")
        if n == 0:
            return []
        idx = host_indices.detach().cpu().to(torch.int64).reshape(n, P)
        starts = idx[:, 0]
        if bool((starts % P != 0).any()) or bool((idx != starts[:, None] + torch.arange(P)).any()):
            raise InputError(f"host_indices: each page must be {P} consecutive slots starting at a multiple of {P}")
        limit = _slots(self._pool)
        if int(starts.min()) < 0 or int(starts.max()) + P > limit:
            raise InputError(f"host_indices: a slot is outside the host pool (size {limit})")
        return [int(s) for s in starts.tolist()]

    def _get_into(self, tokens: list[np.ndarray[Any, Any]], views: list[Any]) -> list[bool]:
        tenant = self.tenant
        # a tier that failed: this page is not loaded
        return self._per_page(
            len(tokens),
            lambda kv, i: kv.get(tokens[i], out=views[i], tenant=tenant),
            (BackendError, LoadFailedError),
        )

    def _put_from(self, tokens: list[np.ndarray[Any, Any]], views: list[Any]) -> list[bool]:
        tenant, durable = self.tenant, self._durable
        # no room, or the tier failed: this page is not stored
        return self._per_page(
            len(tokens), lambda kv, i: kv.put(tokens[i], views[i], tenant=tenant, durable=durable), (BackendError,)
        )

    def _per_page(
        self,
        n: int,
        call: Callable[[TierKV, int], Awaitable[Any]],
        failed: tuple[type[BaseException], ...],
    ) -> list[bool]:
        """``call(kv, i)`` for pages ``0..n-1`` concurrently in one hop to the store's loop: page
        ``i`` is True when it moved a whole page, False when ``call`` raised one of ``failed``;
        any other tierkv error is raised (the first one) after every page ran."""
        P = int(self._pool.page_size)
        ok = [False] * n
        errors: list[BaseException] = []

        async def run(kv: TierKV) -> None:
            async def one(i: int) -> None:
                try:
                    ok[i] = (await call(kv, i)).tokens == P
                except failed:
                    ok[i] = False
                except TierKVError as exc:
                    errors.append(exc)

            async with anyio.create_task_group() as tg:
                for i in range(n):
                    tg.start_soon(one, i)

        self._hop(run)
        if errors:
            raise errors[0]
        return ok

    # ---------------------------------------------------------- v1 (zero copy)
    def batch_get_v1(self, keys: list[str], host_indices: Any, extra_info: Any = None) -> list[bool]:
        """Load each page ``keys[i]`` into the host slots ``host_indices[i*P:(i+1)*P]``; True for
        each page loaded whole and bit-identical to what was stored, False for a miss or a page a
        tier failed to serve (its slots may hold partial bytes: SGLang does not use them)."""
        tokens = self._tokens(keys)
        starts = self._page_starts(len(tokens), host_indices)
        return self._get_into(tokens, [page_view(self._pool, s) for s in starts])

    def batch_set_v1(self, keys: list[str], host_indices: Any, extra_info: Any = None) -> list[bool]:
        """Store each page ``keys[i]`` from the host slots ``host_indices[i*P:(i+1)*P]``; True for
        each page stored (or already stored), False for a page no tier took."""
        tokens = self._tokens(keys)
        starts = self._page_starts(len(tokens), host_indices)
        return self._put_from(tokens, [page_view(self._pool, s) for s in starts])

    def batch_exists(self, keys: list[str], extra_info: Any = None) -> int:
        """How many leading ``keys`` are stored (the first missing page ends the run)."""
        tokens, P, tenant = self._tokens(keys), int(self._pool.page_size), self.tenant

        async def run(kv: TierKV) -> int:
            for i, t in enumerate(tokens):
                if (await kv.lookup(t, tenant=tenant)).tokens < P:
                    return i
            return len(tokens)

        n: int = self._hop(run)
        return n

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    # ------------------------------------------------------- generic (flat pages)
    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> Any:
        """The flat page ``key`` (SGLang's ``get_data_page(flat=True)`` order) written into
        ``target_location`` (a new tensor when None), or None when it is not loaded."""
        return self.batch_get([key], None if target_location is None else [target_location])[0]

    def batch_get(self, keys: list[str], target_locations: Any = None, target_sizes: Any = None) -> list[Any]:
        tokens = self._tokens(keys)
        if target_locations is None:
            numel = int(np.prod(_raw_shape(self._pool)))
            target_locations = [torch.empty(numel, dtype=self._pool.dtype) for _ in tokens]
        if len(target_locations) != len(tokens):
            raise InputError(
                f"target_locations: {len(tokens)} keys need {len(tokens)} pages, got {len(target_locations)}"
            )
        ok = self._get_into(tokens, [_flat_view(self._pool, t) for t in target_locations])
        return [t if good else None for t, good in zip(target_locations, ok, strict=True)]

    def set(self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None) -> bool:
        """Store the flat page ``value`` under ``key``; False when no tier took it."""
        return self.batch_set([key], [value])

    def batch_set(
        self, keys: list[str], values: Any = None, target_locations: Any = None, target_sizes: Any = None
    ) -> bool:
        tokens = self._tokens(keys)
        if values is None or len(values) != len(tokens):
            raise InputError(f"values: {len(tokens)} keys need {len(tokens)} flat pages")
        return all(self._put_from(tokens, [_flat_view(self._pool, v) for v in values]))

    def clear(self) -> None:
        """Remove every page of this scope (model, rank, tenant) from every tier."""
        tenant = self.tenant

        async def run(kv: TierKV) -> int:
            return await kv.invalidate(tenant=tenant)

        self._hop(run)

    def get_stats(self) -> None:
        """SGLang's storage metrics are not collected; tierkv's are in ``self.store.stats()``."""
        return None
