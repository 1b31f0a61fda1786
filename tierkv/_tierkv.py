"""The public entry point: :class:`TierKV`.

Blocks and prefixes
-------------------
``put(tokens, kv)`` cuts the token sequence into blocks of ``block_tokens``
tokens. Each *whole* block is stored under a chained key (see
:mod:`tierkv._keys`), so a key names the whole prefix up to the end of its
block. A trailing partial block is **not stored**: ``put`` reports how many
tokens it covered (a multiple of ``block_tokens``) and the caller keeps or
recomputes the tail. ``lookup``/``get`` return the longest stored prefix,
always a multiple of ``block_tokens``.

Concurrency and cancellation
----------------------------
All methods are coroutines safe to call from many tasks at once, under
asyncio or trio. Index updates happen under one lock, I/O outside it. A
cancelled ``put`` leaves every block either fully stored and indexed or absent;
a cancelled ``get`` changes nothing. Blocks being read are pinned so that
rebalancing never removes them mid-read.

Integrity
---------
Every block carries a CRC-32 of its bytes in its tag; ``get`` verifies it and
treats a mismatch as a miss (the block is removed from its tier), never
returning wrong bytes.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import re
import struct
import time
import zlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import numpy as np
from anyio.abc import TaskGroup, TaskStatus
from anyio.streams.memory import MemoryObjectSendStream

from ._backend import (
    Allocation,
    Backend,
    BackendStats,
    OpenContext,
    SupportsContentHash,
    SupportsScan,
    SupportsTagLookup,
    TierKind,
)
from ._config import Config, TenantQuota
from ._errors import (
    BackendError,
    BlockExistsError,
    BlockNotFoundError,
    CapacityError,
    ClosedError,
    ConfigError,
    DecodeError,
    InputError,
    IntegrityError,
    KVLayoutError,
    LoadFailedError,
    SchedulerError,
    TierKVError,
    TierUnavailableError,
)
from ._keys import Scope, block_keys, tenant_salt, to_token_array
from ._layout import STORAGE_DTYPES, as_numpy_kv, block_slice
from ._options import config_path
from ._placement import TierLoad, bytes_to_shed, lower_tier, select_victims
from ._registry import load_backend_class
from ._scheduling import SchedulerState
from ._telemetry import Telemetry
from .codecs import TierCodec
from .scheduler import CircuitBreaker, PrefetchWindow, placement_value

__all__ = ["CheckpointResult", "GetResult", "LookupResult", "PutResult", "TenantStats", "TierKV", "TierStats"]

# magic, version, flags, model scope, tenant, parent, pos, crc32, nbytes, root (unscoped digest of block 0's tokens)
_TAG = struct.Struct("<2sBB16s16s32sIIQ8s")
_TAG_MAGIC = b"TK"
_TAG_VERSION = 1
_ZERO16 = bytes(16)
_CKPT_TAG = b"TKCKPT1"
_CKPT_NAME = re.compile(r"^[0-9A-Za-z._-]{1,100}$")
_ZERO32 = bytes(32)
_log = logging.getLogger("tierkv")


@dataclass(frozen=True, slots=True)
class PutResult:
    """Outcome of :meth:`TierKV.put`.

    ``tokens`` is the prefix length covered by stored blocks after the call
    (new or already present); ``tail_tokens`` were not stored (partial block).
    """

    tokens: int
    new_blocks: int
    existing_blocks: int
    tail_tokens: int
    tiers: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class LookupResult:
    """The longest stored prefix: ``tokens`` (a multiple of ``block_tokens``),
    the tiers holding its blocks (fastest first) and each block's tier."""

    tokens: int
    blocks: int
    tiers: tuple[str, ...]
    block_tiers: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class GetResult:
    """KV of the longest stored prefix. ``kv`` is ``None`` when ``tokens`` is 0;
    otherwise the caller's ``out`` (filled) or a new numpy array in the layout
    of :mod:`tierkv._layout`. ``miss_reason`` (empty on a full hit) is one of
    ``never_stored``, ``evicted_local``, ``evicted_remote``, ``gated``,
    ``tier_unhealthy``, ``tier_error``, ``integrity``, ``different_scope``,
    ``overloaded`` (admission control);
    a gated miss carries both estimates (``fetch_s``, ``recompute_s``).
    ``exact`` is False when some block passed through a tier with a lossy
    codec (its KV is then the codec's reconstruction, not the original bits)."""

    tokens: int
    kv: Any
    tiers: tuple[str, ...]
    miss_reason: str = ""
    fetch_s: float | None = None
    recompute_s: float | None = None
    exact: bool = True


@dataclass(frozen=True, slots=True)
class CheckpointResult:
    """Outcome of :meth:`TierKV.checkpoint`.

    ``logical_bytes``: KV bytes the manifest references; ``copied_bytes``: what
    this checkpoint had to copy to the checkpoint tier (the delta);
    ``stored_bytes_delta``: how much that tier's usage grew (after its own
    content deduplication, for a tier that has one); ``distinct_contents``: distinct
    content hashes (from a tier that implements SupportsContentHash).
    """

    name: str
    tier: str
    blocks: int
    logical_bytes: int
    copied_bytes: int
    stored_bytes_delta: int
    distinct_contents: int


@dataclass(frozen=True, slots=True)
class TierStats:
    """Per-tier view of :meth:`TierKV.stats`."""

    name: str
    backend: str
    kind: str
    capacity_bytes: int
    used_bytes: int
    blocks: int
    hits: int
    misses: int
    bytes_in: int
    bytes_out: int
    promotions: int
    demotions: int
    io_path: str
    emulated: bool
    healthy: bool
    codec: str = "raw"
    codec_reasoning: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class TenantStats:
    """Per-tenant view of :meth:`TierKV.tenant_stats`: logical bytes its blocks hold
    (each copy where it is stored) and its quota (None: no limit)."""

    tenant: str
    used_bytes: int
    used_bytes_by_tier: Mapping[str, int]
    quota_bytes: int | None
    quota_bytes_by_tier: Mapping[str, int]


class _Entry:
    """Index record of one block. ``tier`` serves reads; ``backing`` is the
    persistent tier holding a durable copy (-1: none; equal to ``tier`` when
    the serving tier is itself persistent). ``bid``, ``cell``, ``count``,
    ``children`` (prefix fanout) and ``t_last`` feed the predictor."""

    __slots__ = (
        "backing",
        "bid",
        "cell",
        "children",
        "count",
        "crc",
        "exact",
        "key",
        "label",
        "model_scope",
        "moving",
        "nbytes",
        "p_pred",
        "parent",
        "pins",
        "pos",
        "t_last",
        "tag",
        "tenant",
        "tier",
    )

    def __init__(
        self,
        key: str,
        tier: int,
        nbytes: int,
        tag: bytes,
        model_scope: bytes,
        tenant: bytes,
        parent: bytes,
        pos: int,
        crc: int,
    ) -> None:
        self.key = key
        self.tier = tier
        self.nbytes = nbytes
        self.tag = tag
        self.model_scope = model_scope
        self.tenant = tenant
        self.parent = parent
        self.pos = pos
        self.crc = crc
        self.pins = 0
        self.backing = -1
        self.bid = 0
        self.cell = 0
        self.count = 0
        self.children = 0
        self.t_last = 0.0
        self.label: int | None = None
        self.p_pred = 0.0
        #: the raw bytes on exact tiers (checked against ``crc``) are the original bits; False once
        #: they were rebuilt from a lossy copy. Copies on lossy tiers are guarded by their codec's CRC.
        self.exact = True
        self.moving = False  # a relocation (move, promotion, demotion) holds it


class _Tier:
    __slots__ = (
        "_charged",
        "backed",
        "backend",
        "breaker",
        "bytes_in",
        "bytes_out",
        "codec",
        "config_name",
        "demotions",
        "high",
        "hits",
        "kind",
        "limiter",
        "low",
        "lru",
        "misses",
        "name",
        "promotions",
        "room_lock",
        "tenant_bytes",
    )

    def __init__(
        self,
        name: str,
        config_name: str,
        backend: Backend,
        high: float,
        low: float,
        breaker: CircuitBreaker,
        transfers: int,
    ) -> None:
        self.name = name
        self.config_name = config_name
        self.backend = backend
        self.kind = str(backend.capabilities.tier_kind.value)
        self.high = high
        self.low = low
        self.lru: OrderedDict[str, None] = OrderedDict()
        #: keys whose *durable copy* (not their serving copy) is on this tier
        self.backed: set[str] = set()
        self.hits = self.misses = self.bytes_in = self.bytes_out = 0
        self.promotions = self.demotions = 0
        self.breaker = breaker
        self.limiter = anyio.CapacityLimiter(transfers)
        self.codec: TierCodec | None = None
        #: writers that must make room on this tier queue here (see TierKV._allocate_with_room)
        self.room_lock = anyio.Lock()
        #: logical bytes each tenant's copies hold on this tier (serving and durable copies)
        self.tenant_bytes: dict[bytes, int] = {}
        self._charged: dict[tuple[str, bool], tuple[bytes, int]] = {}

    # Residency: the only mutators of ``lru`` (serving copies) and ``backed`` (durable-only
    # copies); they keep ``tenant_bytes`` exact for the quotas.
    def place(self, e: _Entry) -> None:
        """``e`` is served from this tier (most recently used)."""
        self.lru[e.key] = None
        self._charge(e, False)

    def unplace(self, key: str) -> None:
        if key in self.lru:
            del self.lru[key]
            self._refund(key, False)

    def back(self, e: _Entry) -> None:
        """This tier holds ``e``'s durable copy (served elsewhere)."""
        self.backed.add(e.key)
        self._charge(e, True)

    def unback(self, key: str) -> None:
        if key in self.backed:
            self.backed.discard(key)
            self._refund(key, True)

    def _charge(self, e: _Entry, backed: bool) -> None:
        k = (e.key, backed)
        if k not in self._charged:
            tid = e.tenant[:16]
            self._charged[k] = (tid, e.nbytes)
            self.tenant_bytes[tid] = self.tenant_bytes.get(tid, 0) + e.nbytes

    def _refund(self, key: str, backed: bool) -> None:
        got = self._charged.pop((key, backed), None)
        if got is not None:
            tid, n = got
            left = self.tenant_bytes.get(tid, 0) - n
            if left > 0:
                self.tenant_bytes[tid] = left
            else:
                self.tenant_bytes.pop(tid, None)

    @property
    def healthy(self) -> bool:
        """Closed circuit breaker: the tier takes part in placement and serves reads."""
        return self.breaker.healthy


#: tag flag: the block's raw bytes are a lossy codec's reconstruction, not the original bits
_FLAG_INEXACT = 0x01


def pack_tag(
    model_scope: bytes,
    tenant: bytes,
    parent: bytes,
    pos: int,
    crc: int,
    nbytes: int,
    root: bytes,
    *,
    exact: bool = True,
) -> bytes:
    flags = 0 if exact else _FLAG_INEXACT
    return _TAG.pack(_TAG_MAGIC, _TAG_VERSION, flags, model_scope[:16], tenant[:16], parent, pos, crc, nbytes, root[:8])


def retag(tag: bytes, crc: int, *, exact: bool) -> bytes:
    """``tag`` with another checksum of the raw bytes and exactness flag."""
    parsed = unpack_tag(tag)
    if parsed is None:
        return tag
    ms, tenant, parent, pos, _crc, nbytes, root = parsed
    return pack_tag(ms, tenant, parent, pos, crc, nbytes, root, exact=exact)


def tag_exact(tag: bytes) -> bool:
    """Whether a tag says its block's raw bytes are the original bits."""
    return len(tag) != _TAG.size or not tag[3] & _FLAG_INEXACT


def unpack_tag(tag: bytes) -> tuple[bytes, bytes, bytes, int, int, int, bytes] | None:
    """(model_scope, tenant, parent, pos, crc, nbytes, root), or None if ``tag`` is not ours."""
    if len(tag) != _TAG.size:
        return None
    magic, version, _flags, ms, tenant, parent, pos, crc, nbytes, root = _TAG.unpack(tag)
    if magic != _TAG_MAGIC or version != _TAG_VERSION:
        return None
    return ms, tenant, parent, pos, crc, nbytes, root


def tag_tenant(tag: bytes) -> bytes | None:
    """The tenant field of a block tag written by :class:`TierKV`, or None when ``tag`` is not
    one of ours. Backends that share content between blocks (the ``pfs`` tier's dedup) use it
    to keep each tenant's content apart without parsing the rest of the tag."""
    parsed = unpack_tag(tag)
    return None if parsed is None else parsed[1]


def _pbin(p: float) -> str:
    """Calibration bin of a predicted probability: "0.0" .. "0.9" (tenths)."""
    return f"{min(int(p * 10), 9) / 10:.1f}"


def _root_of(tokens: np.ndarray[Any, Any], block_tokens: int) -> bytes:
    """Scope-free fingerprint of the first block's tokens (to tell a
    ``different_scope`` miss from a ``never_stored`` one; never used as a key)."""
    raw = np.ascontiguousarray(tokens[:block_tokens], dtype="<i8").tobytes()
    return hashlib.sha256(b"tierkv.root\x00" + raw).digest()[:8]


class TierKV:
    """An async KV-cache store over an ordered hierarchy of tiers.

    Open with ``kv = await TierKV.open(config)`` and close with
    ``await kv.aclose()`` (or ``async with await TierKV.open(config) as kv``).
    ``__init__`` does no I/O; use :meth:`open`.
    """

    def __init__(
        self, config: Config, tiers: Sequence[tuple[str, Backend]], *, telemetry: Telemetry | None = None
    ) -> None:
        self.config = config
        self._spec = config.model
        self._block_tokens = config.effective_block_tokens
        self._dtype = STORAGE_DTYPES[config.kv_dtype]
        names = [name for name, _ in tiers]
        kinds = [str(b.capabilities.tier_kind.value) for _, b in tiers]
        self._sched = SchedulerState(config.scheduler, names, kinds)
        self._tel = telemetry if telemetry is not None else Telemetry(config.telemetry)
        self._tiers = [
            _Tier(name, tc.backend, b, tc.high_watermark, tc.low_watermark, br, self._sched.max_transfers)
            for (name, b), tc, br in zip(tiers, config.tiers, self._sched.breakers, strict=True)
        ]
        for t, tc in zip(self._tiers, config.tiers, strict=True):
            if tc.codec is not None:
                t.codec = self._make_codec(t, tc.codec)
        self._fetch_limiter = anyio.CapacityLimiter(self._sched.max_fetches)
        #: (tenant, root) -> blocks at position 0 with that root: tells a tenant's own
        #: ``different_scope`` miss from ``never_stored``; ``_roots_any`` is the operator's view
        self._roots: dict[tuple[bytes, bytes], int] = {}
        self._roots_any: dict[bytes, int] = {}
        self._service_tg: TaskGroup | None = None
        self._jobs: MemoryObjectSendStream[tuple[Any, ...]] | None = None
        self._pending_jobs: set[tuple[Any, ...]] = set()
        self._next_bid = 0
        self._tool_blocks: dict[str, list[str]] = {}
        self.prefetch_stats = {"issued": 0, "useful": 0, "wasted": 0}
        self._prefetched: set[str] = set()
        self._tel.register_tier_gauges(self._gauge_rows)
        self._index: dict[str, _Entry] = {}
        self._lock = anyio.Lock()
        self._rebalance_lock = anyio.Lock()
        self._closed = False
        base = config.scope()
        self._model_scope = base.with_tenant("").digest()
        self._scope_cache: dict[str, bytes] = {}
        self._block_shape = self._spec.kv_shape(self._block_tokens)
        self._block_nbytes = int(np.prod(self._block_shape)) * self._dtype.itemsize
        # the adaptive tau's shadow caches model the whole cache (backend stats are in-memory)
        self._sched.set_capacity_blocks(sum(b.stats().capacity_bytes for _, b in tiers) // max(1, self._block_nbytes))
        self.misses_by_reason: dict[str, int] = {}
        self._staged: dict[str, tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], str | None]] = {}
        #: blocks copied up from the checkpoint named by ``open(restore=...)``
        self.restored_blocks = 0
        #: per tier: keys of checkpoint copies kept beside an entry's durable copy elsewhere
        self._retained: dict[int, set[str]] = {}
        #: per tier: checkpoint manifests written there (key -> bytes)
        self._manifests: dict[int, dict[str, int]] = {}
        #: tenant id -> its name (as first given) and its quota (``[tenants]``)
        self._tenant_names: dict[bytes, str] = {}
        self._quotas: dict[bytes, TenantQuota] = {}
        self._default_quota = config.quota_of(None)
        #: background jobs that failed (the service logs, counts and traces them, and goes on)
        self.failed_jobs = 0

    # ----------------------------------------------------------------- lifecycle
    @classmethod
    async def open(
        cls,
        config: Config | Mapping[str, Any] | str | Path,
        *,
        restore: str | None = None,
        tracer_provider: Any = None,
        meter_provider: Any = None,
    ) -> TierKV:
        """Validate ``config``, open every tier, and rebuild the index from
        persistent tiers (warm start). With ``restore``, the blocks of that
        checkpoint are also copied up into the fast tiers, hottest first, up to
        their high watermark (``kv.restored_blocks`` says how many).

        Raises ConfigError, PluginError (backend missing, broken or unusable
        here) and BackendError (a tier failed to open). On failure every tier
        already opened is closed again.
        """
        if isinstance(config, (str, Path)):
            cfg = await anyio.to_thread.run_sync(Config.load, config)
        else:
            cfg = Config.load(config)
        opened: list[tuple[str, Backend]] = []
        try:
            raw_block = (
                int(np.prod(cfg.model.kv_shape(cfg.effective_block_tokens))) * STORAGE_DTYPES[cfg.kv_dtype].itemsize
            )
            for i, t in enumerate(cfg.tiers):
                backend_cls = load_backend_class(t.backend)
                # a codec's block adds its header and may not compress: bound it generously
                bound = raw_block if t.codec is None else raw_block + raw_block // 64 + 4096
                ctx = OpenContext(block_nbytes=bound)
                with config_path(f"tiers[{i}]"):  # a backend's option errors name tiers[i].field
                    opened.append((t.name, await backend_cls.open(t.options, name=t.name, context=ctx)))
            telemetry = Telemetry(cfg.telemetry, tracer_provider=tracer_provider, meter_provider=meter_provider)
            kv = cls(cfg, opened, telemetry=telemetry)
            await kv._recover()
            if restore is not None:
                kv.restored_blocks = await kv._restore(restore)
        except BaseException:
            with anyio.CancelScope(shield=True):
                for _, b in opened:
                    try:
                        await b.aclose()
                    except TierKVError:
                        pass
            raise
        return kv

    async def aclose(self) -> None:
        """Close every tier (persistent tiers keep their blocks); idempotent."""
        if self._closed:
            return
        self._closed = True
        self._tel.close()  # the meter's gauges must not keep this store alive
        with anyio.CancelScope(shield=True):
            errors: list[BaseException] = []
            for t in self._tiers:
                try:
                    await t.backend.aclose()
                except TierKVError as exc:
                    errors.append(exc)
            if errors:
                raise errors[0]

    async def __aenter__(self) -> TierKV:
        """Start the scheduler service in a task group owned by this block."""
        tg = anyio.create_task_group()
        await tg.__aenter__()
        try:
            await tg.start(self.run_scheduler)
        except BaseException:
            tg.cancel_scope.cancel()
            await tg.__aexit__(None, None, None)
            raise
        self._service_tg = tg
        return self

    async def __aexit__(self, *exc: object) -> None:
        tg, self._service_tg = self._service_tg, None
        try:
            if tg is not None:
                tg.cancel_scope.cancel()
                await tg.__aexit__(None, None, None)
        finally:
            await self.aclose()

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("TierKV is closed")

    @property
    def block_tokens(self) -> int:
        return self._block_tokens

    @property
    def tier_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self._tiers)

    # ------------------------------------------------------------------ keys
    def _scope_digest(self, tenant: str | None) -> tuple[bytes, bytes]:
        """(key scope digest, 16-byte tenant id) for ``tenant``."""
        if tenant is not None and (not isinstance(tenant, str) or len(tenant) > 256 or "\x00" in tenant):
            raise InputError(f"tenant: expected a string of at most 256 characters without NUL, got {tenant!r}")
        salt = tenant_salt(tenant)
        tid = bytes.fromhex(salt)[:16] if salt else _ZERO16
        d = self._scope_cache.get(salt)
        if d is None:
            d = self.config.scope(salt).digest()
            self._scope_cache[salt] = d
            self._tenant_names.setdefault(tid, tenant if tenant is not None else "")
            q = self.config.quota_of(tenant)
            if q is not None:
                self._quotas[tid] = q
        return d, tid

    def scope(self, tenant: str | None = None) -> Scope:
        """The key scope for ``tenant`` (for inspection and tests)."""
        return self.config.scope(tenant_salt(tenant))

    def _keys(self, tokens: object, tenant: str | None) -> tuple[np.ndarray[Any, Any], list[bytes], bytes]:
        arr = to_token_array(tokens)
        digest, tid = self._scope_digest(tenant)
        return arr, block_keys(digest, arr, self._block_tokens), tid

    # ------------------------------------------------------------------ loads
    def _loads(self) -> list[TierLoad]:
        out = []
        for t in self._tiers:
            s = t.backend.stats()
            out.append(TierLoad(s.capacity_bytes, s.used_bytes, t.high, t.low, t.healthy))
        return out

    # ------------------------------------------------------------------- put
    async def put(
        self,
        tokens: object,
        kv_data: object,
        *,
        block_type: str | None = None,
        tenant: str | None = None,
        durable: bool = False,
    ) -> PutResult:
        """Store the KV of ``tokens`` in whole blocks (see the module docstring).

        ``kv_data`` has the layout of :mod:`tierkv._layout` covering exactly
        ``len(tokens)`` tokens. Blocks already stored are not written again.

        ``durable=True``: when ``put`` returns, every whole block of the prefix
        is committed on a persistent tier (written through to the fastest
        healthy persistent tier when it was placed on a volatile one) and
        survives a crash of this process. This is what "acknowledged as
        durable" means; without it a block may live only in volatile memory.

        Cancellation: the block being written when the cancel arrives is
        finished and indexed (a bounded delay), then ``put`` stops; every block
        is either fully stored and indexed or absent.

        Raises:
            TokensError, KVLayoutError, InputError: bad arguments (nothing stored).
            CapacityError: no tier had room for a block (blocks stored before it stay).
            TierUnavailableError: ``durable=True`` and no healthy persistent tier.
            BackendError: a tier failed.
            ClosedError.
        """
        self._check_open()
        arr_tokens, keys, tid = self._keys(tokens, tenant)
        kv = as_numpy_kv(kv_data, self._spec, self.config.kv_dtype, len(arr_tokens))
        if block_type is not None and not isinstance(block_type, str):
            raise InputError(f"block_type: expected a string or None, got {type(block_type).__name__}")
        if durable and self._persistent_tier() is None:
            raise TierUnavailableError("put(durable=True) needs a healthy persistent tier (e.g. nvme or pfs)")
        bt = self._block_tokens
        tail = len(arr_tokens) - len(keys) * bt
        todo: list[int] = []
        existing = 0
        async with self._lock:
            for i, k in enumerate(keys):
                e = self._index.get(k.hex())
                if e is None or (durable and e.backing < 0):
                    todo.append(i)
                if e is not None:
                    existing += 1
                    self._touch(e)
        tiers_used: list[str] = []
        stored = 0

        def prepare() -> list[tuple[int, memoryview, int]]:
            out = []
            for i in todo:
                blk = np.ascontiguousarray(kv[block_slice(self._spec, i * bt, (i + 1) * bt)])
                data = blk.reshape(-1).view(np.uint8).data
                out.append((i, data, zlib.crc32(data)))
            return out

        label = self._sched.block_type_index(block_type)
        root = _root_of(arr_tokens, bt) if keys else b""
        span_cm = self._tel.timed("put")
        span = span_cm.__enter__()
        try:
            prepared = await anyio.to_thread.run_sync(prepare) if todo else []
            for i, data, crc in prepared:
                parent = keys[i - 1] if i else _ZERO32
                tag = pack_tag(self._model_scope, tid, parent, i, crc, data.nbytes, root)
                key = keys[i].hex()
                with anyio.CancelScope(shield=True):
                    placed = await self._store_block(key, data, tag, i, tid, parent, crc, durable, root, label)
                if placed is None:
                    # another task is storing this block right now: wait until it is indexed (and
                    # durable, if asked), so that on return every block of the prefix is stored
                    store = functools.partial(
                        self._store_block, key, data, tag, i, tid, parent, crc, durable, root, label
                    )
                    await self._await_concurrent_store(key, store, data, tag, durable)
                    continue
                if placed:
                    stored += 1
                    placed_e = self._index.get(key)
                    if placed_e is not None and self._tiers[placed_e.tier].name not in tiers_used:
                        tiers_used.append(self._tiers[placed_e.tier].name)
                await anyio.lowlevel.checkpoint_if_cancelled()
            async with self._lock:
                entries = [e for e in (self._index.get(k.hex()) for k in keys) if e is not None]
                self._record_access(entries, len(keys), existing)
            if block_type == "tool_context" and self._sched.tool is not None:
                self._tool_blocks[self._sched.tool] = [k.hex() for k in keys]
                self._sched.chain.observe_size(self._sched.tool, sum(e.nbytes for e in entries))
            self._sched.transition = None  # a hint applies to the next request only
            self._tel.tenant_tokens.add(len(keys) * bt, {"tenant": tid.hex(), "op": "put"})
            if span is not None and span.is_recording():
                span.set_attributes(
                    {
                        "tierkv.tokens": len(arr_tokens),
                        "tierkv.stored_tokens": len(keys) * bt,
                        "tierkv.new_blocks": stored,
                        "tierkv.bytes": sum(d.nbytes for _, d, _ in prepared),
                        "tierkv.tiers": tiers_used,
                        "tierkv.codec": sorted(
                            {self._codec_name(i) for i, t in enumerate(self._tiers) if t.name in tiers_used}
                        ),
                        "tierkv.tenant": tid.hex(),
                        "tierkv.durable": durable,
                    }
                )
        except BaseException as exc:
            span_cm.__exit__(type(exc), exc, exc.__traceback__)
            raise
        span_cm.__exit__(None, None, None)
        if self._jobs is not None:
            self._submit(("rebalance",))
        else:
            await self._rebalance()
        return PutResult(
            tokens=len(keys) * bt,
            new_blocks=stored,
            existing_blocks=existing,
            tail_tokens=tail,
            tiers=tuple(tiers_used),
        )

    def _persistent_tier(self, below: int = -1) -> int | None:
        for ti in range(below + 1, len(self._tiers)):
            t = self._tiers[ti]
            if t.healthy and t.backend.capabilities.persistent:
                return ti
        return None

    async def _store_block(
        self,
        key: str,
        data: memoryview,
        tag: bytes,
        pos: int,
        tid: bytes,
        parent: bytes,
        crc: int,
        durable: bool,
        root: bytes,
        label: int | None,
    ) -> bool | None:
        """Write one block and index it. Returns True if written, False if it was
        already stored (only its durable copy was added), None if another task
        holds a reservation for it."""
        e = self._index.get(key)
        if e is None:
            ti = await self._write_to_fastest(key, data, tag, 0, crc=crc)
            if ti is None:
                return None
            e = self._index.get(key)
            if e is None:
                e = _Entry(key, ti, data.nbytes, tag, self._model_scope, tid, parent, pos, crc)
                e.label = label
                e.t_last = self._sched.now()  # the most recent block, until the put records its access
                if self._tiers[ti].backend.capabilities.persistent:
                    e.backing = ti
                self._adopt(e, root)
                self._tiers[ti].place(e)
                written = True
            else:
                # another task indexed it meanwhile (same key, same bytes): our copy on ``ti``
                # is kept only if it is one of that entry's copies or can be its durable copy
                await self._attach_copy(e, ti)
                written = False
        else:
            written = False
        if durable and e.backing < 0:
            await self._make_durable(e, data, tag)
        return written

    async def _await_concurrent_store(
        self, key: str, store: Callable[[], Awaitable[bool | None]], data: memoryview, tag: bytes, durable: bool
    ) -> None:
        """Wait (at most 30 s, then TimeoutError) until the block ``key``, which another task
        holds a reservation for, is indexed; then make it durable if ``durable``. If the other
        task gives up, ``store()`` stores it here."""
        with anyio.fail_after(30):
            while True:
                await anyio.sleep(0.002)
                e = self._index.get(key)
                if e is None:
                    with anyio.CancelScope(shield=True):
                        placed = await store()
                    if placed is None:
                        continue  # still being written by the other task
                    return  # stored (and made durable) here
                if durable and e.backing < 0:
                    with anyio.CancelScope(shield=True):
                        await self._make_durable(e, data, tag)
                return

    async def _make_durable(self, e: _Entry, data: memoryview, tag: bytes) -> None:
        """Write the durable copy of ``e`` to the fastest persistent tier below its
        serving tier that has room. If another task is writing that copy right
        now, wait for it (bounded). Raises CapacityError when no persistent tier
        can take it."""
        key = e.key
        with anyio.fail_after(30):
            while e.backing < 0:
                busy = False
                for bi in range(e.tier + 1, len(self._tiers)):
                    t = self._tiers[bi]
                    if not (t.healthy and t.backend.capabilities.persistent):
                        continue
                    try:
                        placed = await self._write_to_fastest(key, data, tag, bi, only=True, crc=e.crc)
                    except CapacityError:
                        continue
                    if placed is None:
                        busy = True  # another put of the same block is writing it there
                        continue
                    await self._attach_copy(e, bi)
                    break
                if e.backing >= 0 and self._index.get(key) is e:
                    return
                if self._index.get(key) is not e:
                    # dropped meanwhile by capacity pressure: index it again, durably this time
                    ti = await self._write_to_fastest(key, data, tag, 0, crc=e.crc)
                    if ti is not None:
                        cur = self._index.get(key)
                        if cur is None:
                            e.tier, e.backing, e.pins, e.moving = ti, -1, 0, False
                            if self._tiers[ti].backend.capabilities.persistent:
                                e.backing = ti
                            self._adopt(e, b"")
                            self._tiers[ti].place(e)
                        else:
                            await self._attach_copy(cur, ti)
                        e = self._index.get(key, e)
                    continue
                if not busy:
                    raise CapacityError(f"put(durable=True): no persistent tier has room for block {key[:16]}")
                await anyio.sleep(0.005)

    async def _write_to_fastest(
        self, key: str, data: memoryview, tag: bytes, start: int, *, only: bool = False, crc: int | None = None
    ) -> int | None:
        """Write to the fastest healthy tier at or below ``start`` with room (only
        ``start`` with ``only``); None if a reservation for ``key`` exists elsewhere.

        New blocks are the most recently used, so when a tier is full (or too
        fragmented) its lowest-ranked blocks move down first; the space made is
        reserved for this write (:meth:`_allocate_with_room`). A copy the tier
        already holds under ``key`` is adopted only after it verifies against
        ``crc`` (the raw bytes' checksum); otherwise it is replaced.
        """
        last_exc: BaseException | None = None
        tid = tag_tenant(tag) or _ZERO16
        for ti in [start] if only else range(start, len(self._tiers)):
            t = self._tiers[ti]
            if not t.healthy:
                continue
            if not await self._quota_room(tid, ti, data.nbytes):
                last_exc = CapacityError(
                    f"tenant {self._tenant_label(tid)!r} is at its quota on tier {t.name!r} "
                    "and has no block of its own left to evict"
                )
                continue
            payload = await self._encode_for(ti, data)
            for _attempt in range(2):
                try:
                    alloc = await self._allocate_with_room(ti, key, payload.nbytes, tag)
                except BlockExistsError:
                    if not await t.backend.contains(key):
                        return None  # only reserved: another task is writing it right now
                    if await self._verify_copy(ti, key, data.nbytes, crc):
                        return ti  # committed earlier (e.g. a write-through copy): adopt it
                    if self._index.get(key) is not None:
                        return None  # indexed meanwhile by another task: theirs now
                    await self._drop_copy(ti, key)  # corrupt or truncated: replace it
                    continue
                except CapacityError as exc:
                    last_exc = exc
                    break
                except BackendError as exc:
                    self._tier_failed(ti, exc)
                    last_exc = exc
                    break
                try:
                    await t.backend.write(alloc, payload)
                except BlockNotFoundError:
                    return None  # the reservation was dropped by a concurrent evict of the key
                except BackendError as exc:
                    self._tier_failed(ti, exc)
                    last_exc = exc
                    break
                t.bytes_in += data.nbytes
                self._tel.bytes_written.add(data.nbytes, {"tier": t.name})
                return ti
        if last_exc is None:
            raise CapacityError(f"no tier has room for a block of {data.nbytes} bytes")
        if isinstance(last_exc, CapacityError):
            raise CapacityError(f"no tier has room for a block of {data.nbytes} bytes ({last_exc})") from last_exc
        raise last_exc

    # ---------------------------------------------------------------- quotas
    def _quota_for(self, tid: bytes) -> TenantQuota | None:
        q = self._quotas.get(tid)
        return q if q is not None else self._default_quota

    def _tenant_label(self, tid: bytes) -> str:
        name = self._tenant_names.get(tid)
        return name if name else ("default" if tid == _ZERO16 else tid.hex())

    def tenant_usage(self, tenant: str | None = None) -> dict[str, int]:
        """Logical bytes ``tenant``'s blocks hold on each tier (each copy where it is
        stored), by tier name; no I/O."""
        _, tid = self._scope_digest(tenant)
        return {t.name: t.tenant_bytes.get(tid, 0) for t in self._tiers}

    def tenant_stats(self) -> dict[str, TenantStats]:
        """Per-tenant accounting of every tenant holding blocks (no I/O), by tenant name
        (``default`` for ``tenant=None``; a tenant known only from a persistent tier by its id)."""
        tids: set[bytes] = set()
        for t in self._tiers:
            tids.update(t.tenant_bytes)
        out: dict[str, TenantStats] = {}
        for tid in sorted(tids):
            usage = {t.name: t.tenant_bytes.get(tid, 0) for t in self._tiers}
            q = self._quota_for(tid)
            out[self._tenant_label(tid)] = TenantStats(
                tenant=self._tenant_label(tid),
                used_bytes=sum(usage.values()),
                used_bytes_by_tier=usage,
                quota_bytes=q.total if q is not None else None,
                quota_bytes_by_tier=dict(q.per_tier) if q is not None else {},
            )
        return out

    async def _quota_room(self, tid: bytes, ti: int, nbytes: int) -> bool:
        """Make room within ``tid``'s quota for a new copy of ``nbytes`` on tier ``ti`` by
        evicting the tenant's *own* lowest-ranked blocks (never another tenant's): on ``ti``
        for a per-tier quota, anywhere for a total one. False when the tenant cannot get
        the room (the block alone exceeds its quota, or its other blocks are all pinned)."""
        q = self._quota_for(tid)
        if q is None:
            return True
        t = self._tiers[ti]
        limit = q.per_tier.get(t.name)
        if limit is not None:
            if nbytes > limit:
                return False
            while t.tenant_bytes.get(tid, 0) + nbytes > limit:
                need = t.tenant_bytes.get(tid, 0) + nbytes - limit
                if await self._shed(ti, need, tenant=tid) <= 0:
                    return False
        if q.total is not None:
            if nbytes > q.total:
                return False
            while (used := sum(x.tenant_bytes.get(tid, 0) for x in self._tiers)) + nbytes > q.total:
                if await self._drop_own(tid, used + nbytes - q.total) <= 0:
                    return False
        return True

    async def _drop_own(self, tid: bytes, need: int) -> int:
        """Drop ``tid``'s least recently used unpinned blocks (every copy) until ``need``
        bytes of its copies are freed; returns the bytes freed."""
        own = sorted(
            (e for e in self._index.values() if e.tenant[:16] == tid and not e.pins and not e.moving),
            key=lambda e: e.t_last,
        )
        freed = 0
        with anyio.CancelScope(shield=True):
            for e in own:
                if freed >= need:
                    break
                if self._index.get(e.key) is not e or e.pins or e.moving:
                    continue
                copies = len({e.tier, e.backing} - {-1})
                self._decided("evict", e, e.tier, -1, "tenant quota")
                await self._drop(e)
                freed += copies * e.nbytes
        return freed

    async def _allocate_with_room(self, ti: int, key: str, nbytes: int, tag: bytes) -> Allocation:
        """Allocate ``nbytes`` for ``key`` on tier ``ti``, shedding its lowest-ranked blocks
        when it is full. Writers that had to make room queue on the tier's room lock and
        each allocates right after its own shedding, so the space made for a write goes to
        that write; concurrent writers never fail for each other's freed space. Raises
        CapacityError only when the tier cannot hold the block: bigger than the tier, or
        nothing left to shed (everything pinned or being relocated)."""
        t = self._tiers[ti]
        try:
            return await t.backend.allocate(key, nbytes, tag=tag)
        except CapacityError:
            if t.backend.stats().capacity_bytes < nbytes:
                raise
        async with t.room_lock:
            while True:
                try:
                    return await t.backend.allocate(key, nbytes, tag=tag)
                except CapacityError:
                    if await self._shed(ti, nbytes) <= 0:
                        raise

    async def _verify_copy(self, ti: int, key: str, nbytes: int, crc: int | None) -> bool:
        """Whether tier ``ti``'s committed copy of ``key`` reads back whole and, for an exact
        copy, matches ``crc`` (a lossy tier's copy is checked by its codec's own checksum)."""
        if crc is None:
            return True
        try:
            raw = await self._read_raw(ti, key)
        except (BlockNotFoundError, IntegrityError):
            return False
        if len(raw) != nbytes:
            return False
        return not self._exact_tier(ti) or zlib.crc32(raw) == crc

    async def _drop_copy(self, ti: int, key: str) -> None:
        """Evict tier ``ti``'s copy of ``key`` (an unindexed or superseded copy), shielded."""
        with anyio.CancelScope(shield=True):
            try:
                await self._tiers[ti].backend.evict(key)
            except BackendError as exc:
                self._tier_failed(ti, exc)

    def _exact_tier(self, ti: int) -> bool:
        """Whether tier ``ti`` stores raw bytes exactly (no codec, or a lossless one)."""
        c = self._tiers[ti].codec
        return c is None or c.lossless

    async def _attach_copy(self, e: _Entry, ti: int) -> None:
        """Account for a copy of ``e`` just committed on tier ``ti``: every byte a tier holds is
        either indexed or freed. The copy is kept when it is one of ``e``'s copies already
        (serving or durable) or can become its missing durable copy (a healthy persistent
        tier below the serving one); otherwise (``e`` left the index meanwhile, or already
        has a durable copy elsewhere) it is evicted at once."""
        if self._index.get(e.key) is e:
            if ti in (e.tier, e.backing):
                return
            if e.backing < 0 and ti > e.tier and self._tiers[ti].backend.capabilities.persistent:
                self._set_backing(e, ti)
                return
        await self._drop_copy(ti, e.key)

    def _codec_name(self, ti: int) -> str:
        c = self._tiers[ti].codec
        return c.name if c is not None else "raw"

    def _make_codec(self, t: _Tier, spec: Mapping[str, Any]) -> TierCodec:
        """The tier's codec from its config; ``{codec = "auto"}`` chooses by the
        tier's estimated bandwidth (re-chosen as measurements come in)."""
        if self.config.kv_dtype not in ("float16", "float32") and spec.get("codec") not in ("raw", "lz4", "zstd"):
            raise ConfigError(
                f"tiers[{self._tiers.index(t)}].codec",
                dict(spec),
                "raw, lz4 or zstd for this kv_dtype (lossy codecs need float16/32)",
            )
        mla = self._spec.attention == "mla"
        if mla and spec.get("codec") == "auto":
            if spec.get("allow_lossy") is True:
                raise ConfigError(
                    f"tiers[{self._tiers.index(t)}].codec.allow_lossy",
                    True,
                    "false for an MLA model (lossy codecs need K/V heads)",
                )
            spec = {**spec, "allow_lossy": False}
        bw = self._sched.estimators[self._tiers.index(t)].bandwidth_Bps if t in self._tiers else None
        tc = TierCodec.from_config(spec, bandwidth_Bps=bw if spec.get("codec") == "auto" else None, tier=t.name)
        if mla and not tc.lossless:
            raise ConfigError(
                f"tiers[{self._tiers.index(t)}].codec",
                dict(spec),
                "a lossless codec (raw, lz4, zstd) for an MLA model: lossy codecs quantize per K/V head, "
                "and the MLA latent has none",
            )
        return tc

    def _adopt(self, e: _Entry, root: bytes) -> None:
        """Insert a new entry into the index (under the lock, or before serving)."""
        e.bid = self._next_bid
        self._next_bid += 1
        self._index[e.key] = e
        parent = self._index.get(e.parent.hex()) if e.pos else None
        if parent is not None:
            parent.children += 1
        if not root and e.pos == 0:
            parsed = unpack_tag(e.tag)
            root = parsed[6] if parsed is not None else b""
        if root and e.pos == 0:
            rk = (e.tenant[:16], root[:8])
            self._roots[rk] = self._roots.get(rk, 0) + 1
            self._roots_any[root[:8]] = self._roots_any.get(root[:8], 0) + 1

    async def _encode_for(self, ti: int, raw: memoryview) -> memoryview:
        """The bytes tier ``ti`` stores for a block (its codec's self-describing
        block, or the raw bytes when it has none)."""
        tc = self._tiers[ti].codec
        if tc is None:
            return raw
        arr = np.frombuffer(raw, dtype=self._dtype).reshape(self._block_shape)
        return memoryview(await tc.aencode(arr, dtype=self.config.kv_dtype))

    async def _decoded(self, ti: int, key: str, data: memoryview) -> memoryview:
        """Raw block bytes from what tier ``ti`` returned; a payload that does not
        decode is an integrity failure of that tier (never garbage)."""
        tc = self._tiers[ti].codec
        if tc is None:
            return data
        try:
            arr = await tc.adecode(data)
        except DecodeError as exc:
            raise IntegrityError(f"block {key[:16]}: {exc}", tier=self._tiers[ti].name) from exc
        out: memoryview = np.ascontiguousarray(arr).reshape(-1).view(np.uint8).data
        return out

    async def _read_raw(self, ti: int, key: str) -> memoryview:
        return await self._decoded(ti, key, await self._tiers[ti].backend.read(key))

    def _tier_failed(self, ti: int, exc: BaseException) -> None:
        """Feed the tier's circuit breaker with a device failure; an open breaker
        takes the tier out of placement and makes its blocks misses until probes
        succeed. Contract outcomes (missing block, existing key, no capacity,
        corrupt block) are not failures of the device."""
        if isinstance(exc, (BlockNotFoundError, BlockExistsError, CapacityError, IntegrityError)):
            return
        t = self._tiers[ti]
        was = t.healthy
        t.breaker.record_failure()
        if was and not t.healthy:
            self._tel.decision(
                "tier_unhealthy", {"tierkv.tier": t.name, "tierkv.reason": f"{type(exc).__name__}: {exc}"[:200]}
            )

    def _gauge_rows(self) -> list[tuple[str, str, int, int, int]]:
        rows = []
        for t in self._tiers:
            st = t.backend.stats()
            rows.append((t.name, t.kind, st.capacity_bytes, st.used_bytes, st.blocks))
        return rows

    def _touch(self, e: _Entry) -> None:
        lru = self._tiers[e.tier].lru
        if e.key in lru:
            lru.move_to_end(e.key)

    # ----------------------------------------------------------- rebalancing
    async def _rebalance(self) -> None:
        """Move LRU blocks down from every tier past its high watermark."""
        async with self._rebalance_lock:
            for ti in range(len(self._tiers)):
                need = bytes_to_shed(self._loads()[ti])
                if need > 0:
                    await self._shed(ti, need)

    async def _make_room(self, ti: int, nbytes: int) -> None:
        s = self._tiers[ti].backend.stats()
        need = nbytes - (s.capacity_bytes - s.used_bytes)
        if need > 0:
            await self._shed(ti, need)

    def _eviction_order(self, ti: int) -> list[str]:
        """Keys of tier ``ti`` in the order they should leave it (call under the lock).

        LRU policy: least recently used first. Predictive policy: lowest
        ``ln P(reuse) + t_last / tau`` first; at the bottom tier, protected
        high-fanout prefixes go last."""
        tier = self._tiers[ti]
        backed = sorted((k for k in tier.backed if k in self._index), key=lambda k: self._index[k].t_last)
        if self._sched.policy == "lru":
            return [*tier.lru, *backed]
        sched = self._sched
        bottom = lower_tier(self._loads(), ti) is None
        # head-granular importance reported by the engine lifts the blocks that
        # attention actually uses (weighted aggregate over heads, per position)
        imp = sched.importance.block_scores() if sched.importance is not None else None
        keyed = []
        for k in tier.lru:
            e = self._index.get(k)
            if e is None:
                continue
            prot = 1 if bottom and sched.protected(e.children) else 0
            score = sched.priority(e.cell, e.t_last)
            if imp is not None and e.pos < len(imp):
                score += float(imp[e.pos])
            keyed.append((prot, score, k))
        keyed.sort()
        return [k for _, _, k in keyed] + backed

    async def _shed(self, ti: int, need: int, *, tenant: bytes | None = None) -> int:
        """Move (or, at the bottom, drop) enough of tier ``ti``'s lowest-ranked blocks to free
        ``need`` bytes there (only ``tenant``'s blocks, when given: a quota); returns the
        bytes actually freed on ``ti``.

        Victims are entry objects chosen in one synchronous step: pinned blocks and blocks
        another task is relocating are skipped, and a victim that left the index or tier
        ``ti`` before its turn is passed over (a concurrent invalidate, evict or move).
        The relocations are shielded: a cancelled caller never leaves half a move behind."""
        tier = self._tiers[ti]
        index = self._index
        sizes: dict[str, int] = {}
        busy: list[str] = []
        for k in (*tier.lru, *tier.backed):
            e = index.get(k)
            if e is None or (tenant is not None and e.tenant[:16] != tenant):
                continue
            sizes[k] = e.nbytes
            if e.pins or e.moving:
                busy.append(k)
        chosen = select_victims(self._eviction_order(ti), sizes, need, busy)
        victims = [index[k] for k in chosen]
        freed = 0
        with self._pinned(victims), anyio.CancelScope(shield=True):
            dest = lower_tier(self._loads(), ti)
            for e in victims:
                if index.get(e.key) is not e:
                    continue  # left the index meanwhile
                if e.tier != ti:
                    if e.backing == ti and await self._shed_durable_copy(e, ti, dest):
                        freed += e.nbytes
                    continue
                self._prefetch_wasted(e)
                if e.backing > ti:  # a durable copy exists below: just drop this one
                    if await self._demote_to_backing(e):
                        self._decided("demote", e, ti, e.backing, "watermark: durable copy below")
                        freed += e.nbytes
                    continue
                if dest is not None:
                    if await self._move(e, ti, dest):
                        self._decided("demote", e, ti, dest, "watermark")
                        freed += e.nbytes
                    # else: no room below right now (or another task is writing it there):
                    # keep the block where it is rather than lose it
                    continue
                if e.moving:
                    continue
                self._decided("evict", e, ti, -1, "watermark at the bottom tier")
                await self._drop(e)
                freed += e.nbytes
        return freed

    @contextlib.contextmanager
    def _pinned(self, entries: Sequence[_Entry]) -> Iterator[None]:
        """Pin ``entries`` for the duration of the ``with`` block: the one pin helper.

        A pinned block is never chosen as a victim, invalidated or flushed. Pinning and
        unpinning never await, so neither can be cancelled or interleaved with another
        task; pins belong to the entry *objects* (a block re-put meanwhile under the same
        key is another entry and is not touched)."""
        pinned = list(entries)
        for e in pinned:
            e.pins += 1
        try:
            yield
        finally:
            for e in pinned:
                e.pins -= 1

    def _decided(self, kind: str, e: _Entry, src: int, dst: int, reason: str) -> None:
        """Count and trace one placement decision with the predictor's view of the block."""
        sched, tel = self._sched, self._tel
        s_name = self._tiers[src].name if src >= 0 else ""
        d_name = self._tiers[dst].name if dst >= 0 else ""
        if kind == "demote":
            self._tiers[src].demotions += 1
            tel.demotions.add(1, {"from": s_name, "to": d_name})
        elif kind == "promote":
            tel.promotions.add(1, {"from": s_name, "to": d_name})
        elif kind == "evict":
            tel.evictions.add(1, {"tier": s_name, "reason": reason})
        if not tel.enabled:
            return
        p = sched.p_reuse(e.cell)
        post = sched.predictor
        attrs: dict[str, Any] = {
            "tierkv.block": e.key[:16],
            "tierkv.score": sched.priority(e.cell, e.t_last),
            "tierkv.tau_s": sched.tau_s,
            "tierkv.posterior": p,
            "tierkv.confidence": min(1.0, post.resolved / (post.resolved + post.config.confidence_k)),
            "tierkv.from_tier": s_name,
            "tierkv.to_tier": d_name,
            "tierkv.reason": reason,
            "tierkv.fanout": e.children,
        }
        rate = sched.prefill_tokens_per_s or 10_000.0
        for ti, t in enumerate(self._tiers):
            est = sched.estimators[ti]
            kind_ = t.kind if t.kind in sched.placement.tier_usd_per_gb_hour else "pfs"
            attrs[f"tierkv.value.{t.name}"] = placement_value(
                p,
                self._block_tokens,
                e.nbytes,
                kind_,
                est.latency_s + e.nbytes / est.bandwidth_Bps,
                rate,
                sched.placement,
            )
        tel.decision(kind, attrs)

    async def _shed_durable_copy(self, e: _Entry, ti: int, dest: int | None) -> bool:
        """Move the durable copy of a block served elsewhere down to the next
        persistent tier; with none below (or no room), drop it (the block stays
        cached, no longer durable). True if tier ``ti`` no longer holds it."""
        if not await self._claim(e, e.tier):
            return False
        try:
            return await self._shed_durable_copy_claimed(e, ti, dest)
        finally:
            e.moving = False

    async def _shed_durable_copy_claimed(self, e: _Entry, ti: int, dest: int | None) -> bool:
        moved = False
        if e.backing != ti:
            return False
        if dest is not None and self._tiers[dest].backend.capabilities.persistent:
            try:
                data, tag = await self._copy_bytes(e, ti, dest)
                payload = await self._encode_for(dest, data)
                alloc = await self._allocate_with_room(dest, e.key, payload.nbytes, tag)
                await self._tiers[dest].backend.write(alloc, payload)
                self._commit_copy_bytes(e, tag)
                moved = True
            except (BlockNotFoundError, IntegrityError, CapacityError, BlockExistsError):
                moved = False
        async with self._lock:
            self._set_backing(e, dest if moved and dest is not None else -1)
        await self._tiers[ti].backend.evict(e.key)
        self._decided("demote" if moved else "evict", e, ti, dest if moved and dest is not None else -1, "durable copy")
        return True

    async def _demote_to_backing(self, e: _Entry) -> bool:
        old = e.tier
        if not await self._claim(e, old):
            return False
        try:
            await self._retarget(e, e.backing)
            await self._tiers[old].backend.evict(e.key)
        finally:
            e.moving = False
        return True

    async def _claim(self, e: _Entry, tier: int) -> bool:
        """Claim the right to relocate ``e`` (one relocation of a block at a time).
        False if another task is relocating it, or it is no longer indexed on ``tier``."""
        async with self._lock:
            if e.moving or self._index.get(e.key) is not e or e.tier != tier:
                return False
            e.moving = True
            return True

    async def _move(self, e: _Entry, src: int, dst: int) -> bool:
        """:meth:`_move_claimed` under a relocation claim; False if the block is busy."""
        if not await self._claim(e, src):
            return False
        try:
            return await self._move_claimed(e, src, dst)
        finally:
            e.moving = False

    async def _move_claimed(self, e: _Entry, src: int, dst: int) -> bool:
        """Copy a block from tier ``src`` to ``dst`` then evict it from ``src``.

        The durable copy follows the block: if ``src`` held it, ``dst`` holds it
        afterwards (when persistent). Returns False when the block could not be
        placed on ``dst`` (no room, or another task is writing it there)."""
        s, d = self._tiers[src], self._tiers[dst]
        try:
            data, tag = await self._copy_bytes(e, src, dst)
        except (BlockNotFoundError, IntegrityError):
            if e.tier != src or self._index.get(e.key) is not e:
                return True  # moved or removed by another task meanwhile
            # the serving copy vanished or is corrupt (quarantined by the backend)
            if e.backing >= 0 and e.backing != src:
                await self._retarget(e, e.backing)
            else:
                await self._forget(e, "vanished")
            return True
        s.bytes_out += len(data)
        self._tel.bytes_read.add(len(data), {"tier": s.name})
        try:
            payload = await self._encode_for(dst, data)
            alloc = await self._allocate_with_room(dst, e.key, payload.nbytes, tag)
        except BlockExistsError:
            if not await d.backend.contains(e.key):
                return False  # only reserved there by another task: not a copy yet
            if e.backing != dst and not await self._verify_copy(dst, e.key, e.nbytes, e.crc):
                return False
        except CapacityError:
            return False
        else:
            await d.backend.write(alloc, payload)
            d.bytes_in += e.nbytes
            self._tel.bytes_written.add(e.nbytes, {"tier": d.name})
        self._commit_copy_bytes(e, tag)
        if self._index.get(e.key) is not e:
            await self._drop_copy(dst, e.key)  # dropped meanwhile: nothing to move any more
            return True
        s.unplace(e.key)
        e.tier = dst
        if e.backing == src or (e.backing < 0 and d.backend.capabilities.persistent):
            self._set_backing(e, dst if d.backend.capabilities.persistent else -1)
        d.place(e)
        await s.backend.evict(e.key)
        return True

    async def _copy_bytes(self, e: _Entry, src: int, dst: int) -> tuple[memoryview, bytes]:
        """The raw bytes of ``e`` for a new copy on ``dst``, read from ``src`` (or from its
        exact durable copy when ``src`` stores a lossy encoding), and the tag that copy
        carries. Exact tiers of one entry always hold the same bytes, checked against
        ``e.crc``: when the only source is a lossy copy and ``dst`` stores raw bytes, its
        reconstruction becomes the entry's raw bytes (new checksum, ``exact=False``, the
        tag's inexact flag), applied by :meth:`_commit_copy_bytes` once written."""
        if not self._exact_tier(src):
            for alt in (e.tier, e.backing):
                if alt >= 0 and alt != src and self._exact_tier(alt):
                    src = alt
                    break
        data = await self._read_raw(src, e.key)
        if self._exact_tier(src) or not self._exact_tier(dst):
            return data, e.tag
        return data, retag(e.tag, zlib.crc32(data), exact=False)

    def _commit_copy_bytes(self, e: _Entry, tag: bytes) -> None:
        """Adopt the checksum and exactness ``tag`` states for ``e``'s raw copies."""
        if tag != e.tag:
            parsed = unpack_tag(tag)
            if parsed is not None:
                e.crc = parsed[4]
            e.exact = tag_exact(tag)
            e.tag = tag

    def _set_backing(self, e: _Entry, ti: int) -> None:
        """Point the durable copy of ``e`` at tier ``ti`` (-1: none), keeping each
        tier's set of backing-only copies exact (call under the lock)."""
        if e.backing >= 0 and e.backing != e.tier:
            self._tiers[e.backing].unback(e.key)
        e.backing = ti
        if ti >= 0 and ti != e.tier:
            self._tiers[ti].back(e)

    async def _retarget(self, e: _Entry, ti: int, *, claimed: bool = True) -> None:
        """Serve ``e`` from tier ``ti`` (which holds its durable copy) from now on.
        Callers hold the relocation claim; on a read path (``claimed=False``) a
        block being relocated by another task is left to that task."""
        async with self._lock:
            if self._index.get(e.key) is not e or e.tier == ti or (not claimed and e.moving):
                return
            self._tiers[e.tier].unplace(e.key)
            if ti >= 0:
                self._tiers[ti].unback(e.key)
            e.tier = ti
            self._tiers[ti].place(e)

    async def _drop(self, e: _Entry) -> None:
        """Remove a block from the index and from every tier holding a copy."""
        await self._forget(e, None)
        with anyio.CancelScope(shield=True):
            await self._tiers[e.tier].backend.evict(e.key)
            if e.backing >= 0 and e.backing != e.tier:
                await self._tiers[e.backing].backend.evict(e.key)
            for ti, keys in self._retained.items():
                if e.key in keys:
                    keys.discard(e.key)
                    await self._drop_copy(ti, e.key)

    def _prefetch_wasted(self, e: _Entry) -> None:
        """A prefetched block that leaves its tier before any hit was wasted."""
        if e.key in self._prefetched:
            self._prefetched.discard(e.key)
            self.prefetch_stats["wasted"] += 1
            self._tel.prefetch.add(1, {"outcome": "wasted"})

    async def _forget(self, e: _Entry, reason: str | None) -> None:
        """Remove ``e`` from the index (its copies are the caller's business)."""
        async with self._lock:
            if self._index.get(e.key) is e:
                del self._index[e.key]
                parent = self._index.get(e.parent.hex()) if e.pos else None
                if parent is not None and parent.children > 0:
                    parent.children -= 1
                if e.pos == 0:
                    self._unroot(e)
                self._tiers[e.tier].unplace(e.key)
                if e.backing >= 0:
                    self._tiers[e.backing].unback(e.key)
        self._prefetch_wasted(e)
        if e.count and self._tel.enabled and self._sched.now() - e.t_last <= self._sched.predictor.horizon:
            pass  # outcome still open: it may yet be reused elsewhere; not counted
        elif e.count and self._tel.enabled:
            self._tel.calibration.add(1, {"bin": _pbin(e.p_pred), "outcome": "not_reused"})
        if reason:
            self._tel.evictions.add(1, {"tier": self._tiers[e.tier].name, "reason": reason})

    # ---------------------------------------------------------------- lookup
    def _walk(self, keys: list[bytes], tid: bytes) -> tuple[list[_Entry], str]:
        """Index entries of the longest stored prefix and, if it ends early, why.

        Each entry's tag must belong to the chain being walked (parent key, position,
        model scope, tenant): an entry whose tag names another place (a record renamed or
        forged on a shared medium) ends the prefix as ``integrity`` and is never served."""
        out: list[_Entry] = []
        ms = self._model_scope[:16]
        parent = _ZERO32
        check_tenant = not self.config.share_across_tenants  # shared: one key space, any tenant's blocks
        for i, k in enumerate(keys):
            e = self._index.get(k.hex())
            if e is None:
                return out, "never_stored"
            if (
                e.pos != i
                or e.parent != parent
                or e.model_scope[:16] != ms
                or (check_tenant and e.tenant[:16] != tid[:16])
            ):
                return out, "integrity"
            if not self._tiers[e.tier].healthy and not (e.backing >= 0 and self._tiers[e.backing].healthy):
                return out, "tier_unhealthy"
            out.append(e)
            parent = k
        return out, ""

    async def _drop_forged(self, keys: list[bytes], found: int, reason: str) -> None:
        """After a walk that ended on an entry whose tag is not of its chain: remove it."""
        if reason == "integrity" and found < len(keys):
            e = self._index.get(keys[found].hex())
            if e is not None:
                self._tel.decision("forged_tag", {"tierkv.block": e.key[:16], "tierkv.tier": self._tiers[e.tier].name})
                await self._drop(e)

    async def _adopt_shared(self, keys: list[bytes], start: int, tid: bytes) -> int:
        """Adopt blocks ``keys[start:]`` that another process committed on a shared
        tier (``capabilities.shared`` and :class:`SupportsTagLookup`), in chain
        order, stopping at the first key no such tier holds. A tag is adopted
        only if it is ours and names this model scope, tenant, position and
        parent; its CRC is verified by ``get`` as for any block. A tier error
        feeds that tier's breaker and ends the walk. Returns how many blocks
        were adopted."""
        shared = [
            (ti, t)
            for ti, t in enumerate(self._tiers)
            if t.healthy and t.backend.capabilities.shared and isinstance(t.backend, SupportsTagLookup)
        ]
        adopted = 0
        for i in range(start, len(keys) if shared else start):
            key = keys[i].hex()
            if key in self._index:
                break
            hit: tuple[int, bytes] | None = None
            for ti, t in shared:
                backend = t.backend
                assert isinstance(backend, SupportsTagLookup)
                try:
                    tag = await backend.tag_of(key)
                except BackendError as exc:
                    self._tier_failed(ti, exc)
                    return adopted
                parsed = unpack_tag(tag) if tag is not None else None
                if tag is not None and parsed is not None:
                    ms, tenant, parent, pos, _crc, _nbytes, _root = parsed
                    if (ms, tenant, parent, pos) == (
                        self._model_scope[:16],
                        tid[:16],
                        keys[i - 1] if i else _ZERO32,
                        i,
                    ):
                        hit = (ti, tag)
                        break
            if hit is None:
                break
            ti, tag = hit
            ms, tenant, parent, pos, crc, nbytes, root = unpack_tag(tag) or (b"", b"", b"", 0, 0, 0, b"")
            async with self._lock:
                if key not in self._index:
                    adopted_e = _Entry(key, ti, nbytes, tag, ms, tenant, parent, pos, crc)
                    self._adopt(adopted_e, root)
                    self._tiers[ti].place(adopted_e)
            adopted += 1
        return adopted

    def _unroot(self, e: _Entry) -> None:
        parsed = unpack_tag(e.tag)
        if parsed is None or not parsed[6]:
            return
        root = parsed[6][:8]
        rk = (e.tenant[:16], root)
        if self._roots.get(rk, 0) > 1:
            self._roots[rk] -= 1
        else:
            self._roots.pop(rk, None)
        if self._roots_any.get(root, 0) > 1:
            self._roots_any[root] -= 1
        else:
            self._roots_any.pop(root, None)

    def _miss_reason(self, arr: np.ndarray[Any, Any], found: int, reason: str, tid: bytes) -> tuple[str, str]:
        """(the caller's reason, the operator's reason) for a prefix that ended after
        ``found`` blocks. The caller's view refines ``never_stored`` at the first block into
        ``different_scope`` only when *the same tenant* stored these tokens under another
        model scope: one tenant never learns what another cached. The operator's view (for
        operator-side telemetry only) says ``different_scope`` for any tenant's copy."""
        if reason == "never_stored" and found == 0 and len(arr) >= self._block_tokens:
            root = _root_of(arr, self._block_tokens)[:8]
            own = "different_scope" if (tid[:16], root) in self._roots else reason
            return own, "different_scope" if root in self._roots_any else reason
        return reason, reason

    async def lookup(self, tokens: object, *, tenant: str | None = None) -> LookupResult:
        """How many leading tokens are stored, and in which tiers (no data moved).

        Raises TokensError, InputError, ClosedError.
        """
        self._check_open()
        arr, keys, tid = self._keys(tokens, tenant)
        with self._tel.timed("lookup") as span:
            entries, reason = self._walk(keys, tid)
            if reason == "never_stored" and await self._adopt_shared(keys, len(entries), tid):
                entries, reason = self._walk(keys, tid)
            await self._drop_forged(keys, len(entries), reason)
            block_tiers = [self._serving_tier(e).name for e in entries]
            tiers = tuple(t.name for t in self._tiers if t.name in block_tiers)
            hit = len(entries) * self._block_tokens
            if span is not None and span.is_recording():
                span.set_attributes(
                    {
                        "tierkv.tokens": len(arr),
                        "tierkv.hit_tokens": hit,
                        "tierkv.tiers_hit": list(tiers),
                        "tierkv.tenant": tid.hex(),
                        "tierkv.miss_reason": self._miss_reason(arr, len(entries), reason, tid)[0]
                        if len(entries) < len(keys)
                        else "",
                    }
                )
        return LookupResult(hit, len(entries), tiers, tuple(block_tiers))

    def _serving_tier(self, e: _Entry) -> _Tier:
        t = self._tiers[e.tier]
        return t if t.healthy or e.backing < 0 else self._tiers[e.backing]

    # ------------------------------------------------------------------- get
    async def get(self, tokens: object, *, out: Any = None, tenant: str | None = None) -> GetResult:
        """Return the KV of the longest stored prefix of ``tokens``, bit-identical
        to what was put.

        With ``out`` (a numpy array or CPU torch tensor of the layout for at
        least the returned prefix, of the configured dtype) the prefix is
        written into ``out[..., :tokens, ...]`` and ``out`` is returned as
        ``kv``. A block that fails verification, vanished from its tier, or
        sits on an unhealthy tier ends the prefix there (a miss, never wrong
        bytes); ``miss_reason`` says why. With a prefill rate configured, the
        fetch-vs-recompute gate may answer a miss (``"gated"``) when reading
        would be slower than recomputing.

        Concurrent reads are bounded by ``scheduler.max_concurrent_fetches``
        (admission control); a hit in a slower tier may schedule a promotion
        in the background.

        Raises TokensError, KVLayoutError (bad ``out``), ClosedError, and
        LoadFailedError when a tier fails and ``load_failure = "fail"``.
        """
        self._check_open()
        arr, keys, tid = self._keys(tokens, tenant)
        with self._tel.timed("get") as span:
            found, reason = self._walk(keys, tid)
            if reason == "never_stored":
                await self._adopt_shared(keys, len(found), tid)
            entries, reason = self._walk(keys, tid)
            if reason == "integrity":
                await self._drop_forged(keys, len(entries), reason)
                found_before = len(entries)
                entries, reason = self._walk(keys, tid)
                if reason == "never_stored" and len(entries) == found_before:
                    reason = "integrity"  # the forged entry is gone; the caller learns why the prefix ended
            with self._pinned(entries):
                self._record_access(entries, len(keys), len(entries))
                result = await self._admitted_fetch(entries, len(keys), out, arr, reason, tid)
            operator_reason = result.miss_reason
            if operator_reason == "never_stored":
                operator_reason = self._miss_reason(arr, result.tokens // self._block_tokens, "never_stored", tid)[1]
            self._after_get(result, entries, tid, span, len(arr), operator_reason)
        return result

    async def _admitted_fetch(
        self, entries: list[_Entry], wanted: int, out: Any, arr: np.ndarray[Any, Any], reason: str, tid: bytes
    ) -> GetResult:
        """Admission control: at most ``max_concurrent_fetches`` reads at once; with
        ``fetch_wait_s`` a request that cannot start within that budget is
        answered at once as a miss (``overloaded``: the engine recomputes), so
        latency stays bounded during a miss storm."""
        wait = self._sched.fetch_wait_s
        if wait is None or not entries:
            async with self._fetch_limiter:
                return await self._fetch(entries, wanted, out, arr, reason, tid)
        acquired = False
        with anyio.move_on_after(wait):
            await self._fetch_limiter.acquire()
            acquired = True
        if not acquired:
            return GetResult(0, None, (), "overloaded")
        try:
            return await self._fetch(entries, wanted, out, arr, reason, tid)
        finally:
            self._fetch_limiter.release()

    def _after_get(
        self, r: GetResult, entries: list[_Entry], tid: bytes, span: Any, tokens: int, operator_reason: str
    ) -> None:
        """Account one get. ``misses_by_reason`` and the ``tierkv.misses`` metric are the
        operator's: they carry the operator's view of the reason (``operator_reason``, which
        may know of another tenant's blocks); the result and the span carry the caller's."""
        tel = self._tel
        tenant = tid.hex()
        if r.miss_reason:
            self.misses_by_reason[operator_reason] = self.misses_by_reason.get(operator_reason, 0) + 1
            tel.misses.add(1, {"reason": operator_reason, "tenant": tenant})
        if r.tokens:
            tel.tokens_saved += r.tokens
            tel.saved_tokens.add(r.tokens, {"tenant": tenant})
            tel.tenant_tokens.add(r.tokens, {"tenant": tenant, "op": "hit"})
        served = entries[: r.tokens // self._block_tokens]
        for e in served:
            if e.key in self._prefetched:
                self._prefetched.discard(e.key)
                self.prefetch_stats["useful"] += 1
                tel.prefetch.add(1, {"outcome": "useful"})
        if span is not None and span.is_recording():
            span.set_attributes(
                {
                    "tierkv.tokens": tokens,
                    "tierkv.hit_tokens": r.tokens,
                    "tierkv.tiers_hit": list(r.tiers),
                    "tierkv.bytes": sum(e.nbytes for e in served),
                    "tierkv.codec": sorted({self._codec_name(e.tier) for e in served}),
                    "tierkv.exact": r.exact,
                    "tierkv.tenant": tenant,
                    "tierkv.miss_reason": r.miss_reason,
                }
            )
        # promotions of blocks served from slower tiers (background, never blocking this call)
        if self._jobs is not None:
            healthy = [t.healthy for t in self._tiers]
            for e in served:
                if e.tier > 0:
                    dst = self._sched.promotion_target(e.cell, self._block_tokens, e.nbytes, e.tier, healthy, e.count)
                    if dst is not None:
                        self._submit(("promote", e.key, dst))

    def _record_access(self, entries: list[_Entry], prompt_blocks: int, leading_seen: int) -> None:
        """Feed the predictor with one request's blocks (call under the index lock).

        Blocks are touched leaf first with increasing timestamps so that a
        parent always ranks at least as high as its descendants."""
        sched = self._sched
        now = sched.now()
        pred = sched.predictor
        n = len(entries)
        tel = self._tel
        for i in range(n - 1, -1, -1):
            e = entries[i]
            if e.count and tel.enabled:  # resolve the previous prediction: reused within the horizon?
                reused = now - e.t_last <= pred.horizon
                tel.calibration.add(1, {"bin": _pbin(e.p_pred), "outcome": "reused" if reused else "not_reused"})
            e.count += 1
            e.t_last = now + (n - i) * 1e-6
            e.cell = sched.cell(
                label=e.label,
                position=e.pos,
                prompt_blocks=prompt_blocks,
                leading_seen=leading_seen,
                count=e.count - 1,
                fanout=e.children,
            )
            e.p_pred = sched.p_reuse(e.cell)
            pred.observe(now, e.bid, e.cell)
            sched.observe_ranked(e.bid, e.cell, now)
            self._touch(e)
        pred.advance(now)
        sched.end_request(now)

    async def _read_blocks(self, entries: list[_Entry], served: list[int]) -> list[memoryview | BaseException]:
        """Read every entry's bytes, batched per tier; a failure is returned in
        place. ``served[i]`` is set to the tier entry ``i`` was read from."""
        results: list[memoryview | BaseException] = [BlockNotFoundError("unread")] * len(entries)
        by_tier: dict[int, list[int]] = {}
        for i, e in enumerate(entries):
            ti = e.tier if self._tiers[e.tier].healthy or e.backing < 0 else e.backing
            served[i] = ti
            by_tier.setdefault(ti, []).append(i)
        for ti, idxs in by_tier.items():
            await self._read_tier(ti, idxs, entries, results)
        for i, r in enumerate(results):
            e = entries[i]
            if isinstance(r, BlockNotFoundError) and e.tier != served[i]:
                # moved by a concurrent promotion/demotion while we read: read where it is now
                try:
                    results[i] = await self._read_raw(e.tier, e.key)
                    served[i] = e.tier
                    continue
                except BackendError as exc:
                    results[i] = r = exc
            # serve from the durable copy when the fast copy failed
            if isinstance(r, BaseException) and e.backing >= 0 and e.backing != e.tier:
                try:
                    results[i] = await self._read_raw(e.backing, e.key)
                except BackendError:
                    continue
                served[i] = e.backing
                await self._retarget(e, e.backing, claimed=False)
        return results

    async def _read_tier(
        self, ti: int, idxs: list[int], entries: list[_Entry], results: list[memoryview | BaseException]
    ) -> None:
        """Batch-read the entries ``idxs`` from tier ``ti`` into ``results``;
        feeds the tier's bandwidth estimator and circuit breaker."""
        tier = self._tiers[ti]
        backend = tier.backend
        t0 = time.perf_counter()
        try:
            views = await backend.read_many([entries[i].key for i in idxs])
            if tier.codec is not None:
                views = [await self._decoded(ti, entries[i].key, v) for i, v in zip(idxs, views, strict=True)]
        except BackendError as batch_exc:
            pending: BackendError | None = batch_exc if isinstance(batch_exc, IntegrityError) else None
            for i in idxs:  # find which block failed
                try:
                    results[i] = await self._read_raw(ti, entries[i].key)
                    tier.breaker.record_success()
                except BlockNotFoundError as exc:
                    # blocks the batch found corrupt are quarantined, so they now read as missing:
                    # after a batch IntegrityError every such block counts as corrupt
                    results[i] = pending or exc
                except IntegrityError as exc:
                    results[i] = exc
                except BackendError as exc:
                    results[i] = exc
                    self._tier_failed(ti, exc)
            return
        tier.breaker.record_success()
        nbytes = 0
        for i, v in zip(idxs, views, strict=True):
            results[i] = v
            nbytes += len(v)
        self._sched.estimators[ti].observe(nbytes, time.perf_counter() - t0)

    async def _fetch(
        self, entries: list[_Entry], wanted: int, out: Any, arr: np.ndarray[Any, Any], reason: str, tid: bytes
    ) -> GetResult:
        bt = self._block_tokens
        n = len(entries)
        miss_reason = "" if n == wanted else self._miss_reason(arr, n, reason, tid)[0]
        if n == 0:
            if wanted:
                self._tiers[-1].misses += 1
            return GetResult(0, None, (), miss_reason)
        by_tier: dict[int, int] = {}
        for e in entries:
            by_tier[e.tier] = by_tier.get(e.tier, 0) + e.nbytes
        decision = self._sched.gate(n * bt, by_tier)
        if decision is not None:
            self._tel.gate.add(1, {"decision": "fetch" if decision.fetch else "recompute"})
            with self._tel.span(
                "tierkv.gate",
                {
                    "tierkv.fetch_s": decision.fetch_s,
                    "tierkv.recompute_s": decision.recompute_s,
                    "tierkv.decision": "fetch" if decision.fetch else "recompute",
                    "tierkv.reason": decision.reason,
                    "tierkv.tokens": n * bt,
                },
            ):
                pass
            if not decision.fetch:
                return GetResult(0, None, (), "gated", decision.fetch_s, decision.recompute_s)
        target = self._out_view(out, n * bt)
        served = [e.tier for e in entries]
        datas = await self._read_blocks(entries, served)

        def assemble() -> int:
            for i, (e, d) in enumerate(zip(entries, datas, strict=True)):
                if isinstance(d, BaseException):
                    return i
                if len(d) != e.nbytes or (self._exact_tier(served[i]) and zlib.crc32(d) != e.crc):
                    datas[i] = IntegrityError(f"block {e.key[:16]} failed its CRC check", tier=self._tiers[e.tier].name)
                    return i
                blk = np.frombuffer(d, dtype=self._dtype).reshape(self._block_shape)
                target[block_slice(self._spec, i * bt, (i + 1) * bt)] = blk
            return len(entries)

        good = await anyio.to_thread.run_sync(assemble)
        per_tier: dict[int, list[int]] = {}
        for i in range(good):
            e, tier = entries[i], self._tiers[served[i]]
            tier.hits += 1
            tier.bytes_out += e.nbytes
            acc = per_tier.setdefault(served[i], [0, 0])
            acc[0] += 1
            acc[1] += e.nbytes
        for ti, (blocks, nbytes) in per_tier.items():  # one observation per tier per request
            self._tel.hits.add(blocks, {"tier": self._tiers[ti].name})
            self._tel.bytes_read.add(nbytes, {"tier": self._tiers[ti].name})
        if good < n:
            e, err = entries[good], datas[good]
            tier = self._tiers[e.tier]
            tier.misses += 1
            if isinstance(err, BlockNotFoundError) and (e.tier != served[good] or self._index.get(e.key) is not e):
                miss_reason = "evicted_local"  # moved or dropped by another task during this read
            elif isinstance(err, (BlockNotFoundError, IntegrityError)):
                if isinstance(err, IntegrityError):
                    miss_reason = "integrity"
                else:
                    miss_reason = "evicted_remote" if tier.backend.capabilities.shared else "evicted_local"
                await self._discard_failed_copy(e)
            else:
                if self.config.load_failure == "fail":
                    raise LoadFailedError(f"reading block {good} from tier {tier.name!r} failed: {err}") from (
                        err if isinstance(err, BaseException) else None
                    )
                miss_reason = "tier_unhealthy" if not tier.healthy else "tier_error"
        # blocks after the first failure that the tier found corrupt (a batch read quarantines
        # every corrupt block it meets) leave the index too, else they would stay indexed on a
        # tier that no longer has them and a later put would skip them as existing. A missing
        # block there is left alone: it may be a transient race, settled when it is read first.
        for i in range(good + 1, n):
            e_i, err_i = entries[i], datas[i]
            if isinstance(err_i, IntegrityError) and e_i.tier == served[i] and self._index.get(e_i.key) is e_i:
                await self._discard_failed_copy(e_i)
        if good == 0:
            return GetResult(0, None, (), miss_reason)
        used = set(served[:good])
        tiers = tuple(t.name for i, t in enumerate(self._tiers) if i in used)
        exact = all(e.exact and self._exact_tier(ti) for e, ti in zip(entries[:good], served[:good], strict=True))
        if out is not None:
            return GetResult(good * bt, out, tiers, miss_reason, exact=exact)
        result = target if good == n else np.ascontiguousarray(target[block_slice(self._spec, 0, good * bt)])
        return GetResult(good * bt, result, tiers, miss_reason, exact=exact)

    async def _discard_failed_copy(self, e: _Entry) -> None:
        """A read found the serving copy of ``e`` missing or corrupt: evict it; the durable
        copy (if on another tier) serves the next request, else ``e`` leaves the index."""
        await self._drop_quietly(e)
        if e.backing >= 0 and e.backing != e.tier:
            await self._retarget(e, e.backing, claimed=False)
        else:
            await self._forget(e, None)

    async def _drop_quietly(self, e: _Entry) -> None:
        try:
            await self._tiers[e.tier].backend.evict(e.key)
        except BackendError:
            pass

    def _out_view(self, out: Any, tokens: int) -> np.ndarray[Any, Any]:
        if out is None:
            return np.empty(self._spec.kv_shape(tokens), dtype=self._dtype)
        if not isinstance(out, np.ndarray) and not type(out).__module__.startswith("torch"):
            raise KVLayoutError("out type", "a numpy array or a CPU torch tensor", type(out).__name__)
        shape = tuple(out.shape)
        expected = self._spec.kv_shape(tokens)
        ax = 1 if self._spec.attention == "mla" else 2
        if len(shape) != len(expected) or any(
            (s != x) if j != ax else (s < x) for j, (s, x) in enumerate(zip(shape, expected, strict=True))
        ):
            raise KVLayoutError("out shape", f"{expected} (or more tokens on axis {ax})", shape)
        probe = as_numpy_kv(out, self._spec, self.config.kv_dtype, shape[ax])
        if not probe.flags.writeable:
            raise KVLayoutError("out", "a writable buffer", "read-only")
        return probe

    # ------------------------------------------------------------ invalidate
    async def invalidate(
        self, *, tenant: str | None = None, all_tenants: bool = False, scope: Scope | None = None
    ) -> int:
        """Remove stored blocks: those of ``tenant`` (the default tenant when
        None), or every tenant's with ``all_tenants=True``; restricted to the
        model ``scope`` if given (its tenant field is ignored), else to this
        configuration's scope. Returns the number of blocks removed."""
        self._check_open()
        ms = scope.with_tenant("").digest()[:16] if scope is not None else self._model_scope[:16]
        _, tid = self._scope_digest(tenant)
        async with self._lock:
            victims = [
                e
                for e in self._index.values()
                if e.model_scope[:16] == ms and (all_tenants or e.tenant == tid) and e.pins == 0
            ]
        for e in victims:
            await self._drop(e)
        return len(victims)

    # ------------------------------------------------------- scheduler service
    async def run_scheduler(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """The background placement service: promotions, demotions, prefetches,
        capacity reservations and health probes of unhealthy tiers.

        Start it in your task group with ``await tg.start(kv.run_scheduler)``
        (``async with await TierKV.open(cfg) as kv`` starts it for you). While it
        runs, ``put`` and ``get`` only *queue* placement work, so they never wait
        for it; jobs beyond ``scheduler.queue`` are dropped and counted. Each
        tier runs at most ``scheduler.max_transfers_per_tier`` transfers at once.
        Cancel the enclosing scope (or close the TierKV) to stop it; jobs in
        flight finish their current block (writes are shielded), queued ones are
        dropped. Only one service may run per TierKV.
        """
        self._check_open()
        if self._jobs is not None:
            raise SchedulerError("the scheduler service is already running for this TierKV")
        send, recv = anyio.create_memory_object_stream[tuple[Any, ...]](self._sched.queue_size)
        try:
            async with anyio.create_task_group() as tg, recv:
                self._jobs = send
                tg.start_soon(self._probe_loop)
                task_status.started()
                async for job in recv:
                    tg.start_soon(self._run_job, job)
                tg.cancel_scope.cancel()
        finally:
            self._jobs = None
            self._pending_jobs.clear()
            send.close()

    def _submit(self, job: tuple[Any, ...]) -> None:
        """Queue a background job (deduplicated); drop it if the queue is full."""
        if self._jobs is None or job in self._pending_jobs:
            return
        try:
            self._jobs.send_nowait(job)
        except (anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._sched.dropped_jobs += 1
            return
        self._pending_jobs.add(job)

    async def _run_job(self, job: tuple[Any, ...]) -> None:
        try:
            kind = job[0]
            if kind == "rebalance":
                await self._rebalance()
            elif kind in ("promote", "prefetch"):
                key, dst = job[1], job[2]
                e = self._index.get(key)
                if e is None or e.tier <= dst or not self._tiers[dst].healthy:
                    return
                async with self._tiers[e.tier].limiter, self._tiers[dst].limiter:
                    await self._promote_if_room(e, dst, "prefetch" if kind == "prefetch" else "value")
            elif kind == "reserve":
                await self._make_room(0, int(job[1]))
        except Exception as exc:  # a failed background job never kills the service
            self.failed_jobs += 1
            _log.warning("tierkv: background job %s failed: %s: %s", job[0], type(exc).__name__, exc, exc_info=exc)
            self._tel.decision(
                "job_failed", {"tierkv.job": str(job[0]), "tierkv.reason": f"{type(exc).__name__}: {exc}"[:200]}
            )
        finally:
            self._pending_jobs.discard(job)

    async def _promote_if_room(self, e: _Entry, dst: int, reason: str) -> bool:
        if self._index.get(e.key) is not e or e.tier <= dst:
            return False
        with self._pinned([e]):
            src = e.tier
            await self._make_room(dst, e.nbytes)
            ok = await self._promote(e, dst)
            if ok:
                self._decided("promote", e, src, dst, reason)
                if reason == "prefetch":
                    self._prefetched.add(e.key)
                    self.prefetch_stats["issued"] += 1
            return ok

    async def _probe_loop(self) -> None:
        """Probe unhealthy tiers once their breaker's cooldown has passed."""
        while True:
            await anyio.sleep(max(0.05, min(1.0, min((t.breaker.cooldown_s for t in self._tiers), default=1.0) / 2)))
            for ti, t in enumerate(self._tiers):
                if t.healthy or not t.breaker.allow():
                    continue
                try:
                    with anyio.fail_after(5):
                        await t.backend.contains("tierkv-probe")
                except (TierKVError, TimeoutError) as exc:
                    self._tier_failed(ti, exc)
                else:
                    t.breaker.record_success()
                    if t.healthy:
                        self._tel.decision("tier_healthy", {"tierkv.tier": t.name, "tierkv.reason": "probe succeeded"})

    # ------------------------------------------------------------------ hints
    def hint(
        self,
        *,
        transition: str | None = None,
        tool: str | None = None,
        decode_position: int | None = None,
        tokens: object = None,
        tenant: str | None = None,
        response_tokens: int | None = None,
    ) -> None:
        """Tell the scheduler what the engine knows (never blocks, no I/O).

        * ``transition`` (``same_tool_repeat``, ``tool_switch``,
          ``reasoning_step``, ``agent_handoff``) labels the next request's
          blocks for the reuse predictor;
        * ``tool`` names the tool the agent calls now: the Markov chain counts
          the transition from the previous tool, and when it predicts the next
          tool with probability >= 0.5 the service reserves room in the fastest
          tier for that tool's KV profile and prefetches its context blocks
          (those put with ``block_type="tool_context"`` while it was the current
          tool), and the head-importance multipliers are reset for the switch;
        * ``decode_position`` with ``tokens``: prefetch the blocks covering
          ``[n, n + w]`` (RoPE-aware window, see :meth:`prefetch`);
        * ``response_tokens``: the engine has *finished* answering the most
          recent request (``put``/``get``) with this many tokens. Call it at
          completion, not before: the eviction ranking re-weights that request's
          blocks by the learned reuse rate of its answer-length class and counts
          their recency from now (``SchedulerState.respond``; the replay lab's
          ``tierkv`` policy does the same). Repeated calls for one request are
          ignored.

        Raises ConfigError for an unknown transition label; InputError (nothing changed)
        for a ``transition`` or ``tool`` that is not a non-empty string, a
        ``decode_position`` or ``response_tokens`` that is not an int >= 0, a
        ``decode_position`` without ``tokens`` (or ``tokens`` without it), a bad tenant.
        """
        sched = self._sched
        for field, value in (("transition", transition), ("tool", tool)):
            if value is not None and (not isinstance(value, str) or not value or len(value) > 256):
                raise InputError(f"hint {field}: expected a non-empty string of at most 256 characters, got {value!r}")
        if decode_position is not None:
            if isinstance(decode_position, bool) or not isinstance(decode_position, int) or decode_position < 0:
                raise InputError(f"hint decode_position: expected an int >= 0, got {decode_position!r}")
            if tokens is None:
                raise InputError("hint decode_position: needs the request's tokens (tokens=...)")
        if tokens is not None and decode_position is None:
            raise InputError("hint tokens: only meaningful with decode_position")
        if tenant is not None:
            self._scope_digest(tenant)  # validates it
        if response_tokens is not None:
            if isinstance(response_tokens, bool) or not isinstance(response_tokens, int) or response_tokens < 0:
                raise InputError(f"response_tokens: expected an int >= 0, got {response_tokens!r}")
            sched.respond(response_tokens)
        if transition is not None:
            sched.transition = sched.transition_index(transition)
        if tool is not None:
            prev = sched.tool
            if prev is not None:
                sched.chain.observe_transition(prev, tool)
            sched.tool = tool
            pred = sched.chain.predict(tool)
            if pred is not None and pred[1] >= 0.5:
                nxt, p = pred
                reserve = sched.chain.reservation(tool)
                if reserve:
                    self._submit(("reserve", reserve))
                for key in self._tool_blocks.get(nxt, []):
                    self._submit(("prefetch", key, 0))
                if sched.importance is not None:
                    sched.importance.set_multipliers(None)
                self._tel.decision(
                    "predicted_switch", {"tierkv.tool": tool, "tierkv.next_tool": nxt, "tierkv.probability": p}
                )
        if decode_position is not None and tokens is not None:
            self._prefetch_keys(tokens, decode_position, tenant)

    def _prefetch_keys(self, tokens: object, decode_position: int, tenant: str | None) -> list[str]:
        if isinstance(decode_position, bool) or not isinstance(decode_position, int) or decode_position < 0:
            raise InputError(f"decode_position: expected an int >= 0, got {decode_position!r}")
        _, keys, _ = self._keys(tokens, tenant)
        sched = self._sched
        if sched.prefetch_window is None:
            sched.prefetch_window = PrefetchWindow(self._block_tokens, min_window=self._block_tokens)
        wanted = [keys[i].hex() for i in sched.prefetch_window.blocks(decode_position, total_blocks=len(keys))]
        out = []
        for k in wanted:
            e = self._index.get(k)
            if e is not None and e.tier > 0:
                self._submit(("prefetch", k, 0))
                out.append(k)
        return out

    async def prefetch(self, tokens: object, *, decode_position: int = 0, tenant: str | None = None) -> int:
        """Promote the blocks covering ``[decode_position, decode_position + w]``
        of ``tokens`` into the fastest tier ahead of need; ``w`` adapts per layer
        class from the attention spans reported with :meth:`report_attention`.

        With the scheduler service running this only queues the promotions and
        returns at once; without it the promotions run now. Returns the number
        of blocks scheduled (or promoted). Raises TokensError, InputError.
        """
        self._check_open()
        with self._tel.timed("prefetch") as span:
            keys = self._prefetch_keys(tokens, decode_position, tenant)
            done = len(keys)
            if self._jobs is None:
                done = 0
                for k in keys:
                    e = self._index.get(k)
                    if e is not None and await self._promote_if_room(e, 0, "prefetch"):
                        done += 1
            if span is not None and span.is_recording():
                _, tid = self._scope_digest(tenant)
                span.set_attributes(
                    {
                        "tierkv.decode_position": decode_position,
                        "tierkv.blocks": done,
                        "tierkv.tokens": len(to_token_array(tokens)),
                        "tierkv.tenant": tid.hex(),
                    }
                )
        return done

    def report_attention(
        self,
        layer: int,
        head_scores: Any,
        positions: Any,
        query_pos: int,
        *,
        layer_class: str = "global",
    ) -> None:
        """Report one layer's attention statistics (``head_scores``: query heads x
        attended positions) at decode position ``query_pos``: updates the
        head-granular EMA importance and the prefetch window of ``layer_class``
        (``"local"`` for sliding-window layers, ``"global"`` otherwise)."""
        from .scheduler import HeadImportance, attention_span

        sched = self._sched
        spec = self._spec
        if sched.importance is None:
            sched.importance = HeadImportance(
                spec.kv_layers,
                spec.num_attention_heads,
                spec.num_kv_heads,
                block_tokens=self._block_tokens,
                mla=spec.attention == "mla",
            )
        sched.importance.report_attention(layer, head_scores, positions, query_pos)
        if sched.prefetch_window is None:
            sched.prefetch_window = PrefetchWindow(self._block_tokens, min_window=self._block_tokens)
        scores = np.asarray(head_scores).max(axis=0)
        sched.prefetch_window.observe_span(layer_class, attention_span(scores, np.asarray(positions), query_pos))

    # ----------------------------------------------------------------- flush
    async def flush(self, scope: Scope | None = None, *, batch: int = 64) -> int:
        """Reclaim the space of every block of a model scope on every tier,
        persistent ones included; returns the number of blocks removed.

        ``scope`` (its tenant field is ignored) defaults to *every scope except
        this configuration's*: after a rollout (new weights fingerprint, model
        or tokenizer revision, KV dtype) the old keys are already unreachable,
        and ``await kv.flush()`` frees them. Work proceeds in batches of
        ``batch`` blocks with the index lock released in between, so traffic
        continues; run it in the background with
        ``tg.start_soon(kv.flush, old_scope)``. Pinned blocks (being read) are
        skipped and picked up by a later flush.
        """
        self._check_open()
        if scope is not None:
            target = scope.with_tenant("").digest()[:16]

            def match(e: _Entry) -> bool:
                return e.model_scope[:16] == target
        else:
            current = self._model_scope[:16]

            def match(e: _Entry) -> bool:
                return e.model_scope[:16] != current

        removed = 0
        while True:
            async with self._lock:
                victims = [e for e in self._index.values() if e.pins == 0 and match(e)][:batch]
            if not victims:
                return removed
            for e in victims:
                await self._drop(e)
            removed += len(victims)
            await anyio.lowlevel.checkpoint()

    # ------------------------------------------------------------ checkpoints
    def _checkpoint_tier(self) -> int:
        for ti in range(len(self._tiers) - 1, -1, -1):
            t = self._tiers[ti]
            if t.healthy and t.backend.capabilities.persistent:
                return ti
        raise TierUnavailableError("checkpoints need a healthy persistent tier (e.g. pfs)")

    async def checkpoint(self, name: str) -> CheckpointResult:
        """Write a manifest of the cache state to the bottom persistent tier (PFS).

        Every indexed block gets a copy on that tier if it has none (a *delta*:
        blocks already there — from an earlier checkpoint, a demotion or a
        durable put — are not copied again, and a content-addressed tier stores
        identical content once). The manifest lists the blocks hottest first
        with their content hash, size and tag; it is stored on the same tier
        under ``ckpt.<name>`` and replaces an older checkpoint of that name.
        After it returns, every listed block is durable.

        Raises InputError (bad name), TierUnavailableError, BackendError.
        """
        self._check_open()
        if not isinstance(name, str) or not _CKPT_NAME.match(name):
            raise InputError(f"checkpoint name {name!r}: expected 1-100 characters from [0-9A-Za-z._-]")
        ci = self._checkpoint_tier()
        ct = self._tiers[ci]
        before = ct.backend.stats().used_bytes
        order: list[_Entry] = []
        for t in self._tiers:  # hottest first: fastest tier, most recent first
            order.extend(self._index[k] for k in reversed(t.lru) if k in self._index)
        copied = 0
        rows: list[dict[str, Any]] = []
        with self._pinned(order):
            for e in order:
                if e.tier != ci and e.backing != ci:
                    try:
                        data = await self._read_raw(e.tier, e.key)
                    except (BlockNotFoundError, IntegrityError):
                        continue
                    if await self._write_to_fastest(e.key, data, e.tag, ci, only=True, crc=e.crc) is None:
                        continue
                    copied += e.nbytes
                    if self._index.get(e.key) is e and e.backing < 0:
                        self._set_backing(e, ci)
                    elif ci not in (e.tier, e.backing):
                        # durable elsewhere already: this copy is the manifest's (kept, accounted)
                        self._retained.setdefault(ci, set()).add(e.key)
                sha = ""
                if isinstance(ct.backend, SupportsContentHash):
                    sha = await ct.backend.content_hash(e.key) or ""
                rows.append({"key": e.key, "sha256": sha, "nbytes": e.nbytes, "tag": e.tag.hex()})
        manifest = json.dumps(
            {
                "format": "tierkv.checkpoint",
                "version": 1,
                "name": name,
                "created_unix": time.time(),
                "model_scope": self._model_scope.hex(),
                "block_tokens": self._block_tokens,
                "blocks": rows,
            },
            separators=(",", ":"),
        ).encode()
        key = f"ckpt.{name}"
        with anyio.CancelScope(shield=True):
            await ct.backend.evict(key)
            self._manifests.setdefault(ci, {}).pop(key, None)
            alloc = await ct.backend.allocate(key, len(manifest), tag=_CKPT_TAG)
            await ct.backend.write(alloc, manifest)
            self._manifests[ci][key] = len(manifest)
        logical = sum(int(r["nbytes"]) for r in rows)
        return CheckpointResult(
            name=name,
            tier=ct.name,
            blocks=len(rows),
            logical_bytes=logical,
            copied_bytes=copied,
            stored_bytes_delta=ct.backend.stats().used_bytes - before,
            distinct_contents=len({r["sha256"] for r in rows if r["sha256"]}),
        )

    async def _restore(self, name: str) -> int:
        """Warm the fast tiers from checkpoint ``name``: copy its blocks up,
        hottest first, until the fast tiers reach their high watermark."""
        ci = self._checkpoint_tier()
        backend = self._tiers[ci].backend
        try:
            raw = await backend.read(f"ckpt.{name}")
        except BlockNotFoundError as exc:
            raise InputError(f"restore: no checkpoint named {name!r} on tier {self._tiers[ci].name!r}") from exc
        try:
            manifest = json.loads(bytes(raw))
            rows = manifest["blocks"]
            if manifest.get("format") != "tierkv.checkpoint" or not isinstance(rows, list):
                raise ValueError("not a tierkv checkpoint manifest")
        except (ValueError, KeyError, TypeError) as exc:
            raise IntegrityError(
                f"checkpoint {name!r}: unreadable manifest ({exc})", tier=self._tiers[ci].name
            ) from exc
        warmed = 0
        for row in rows:
            e = self._index.get(str(row.get("key", "")))
            if e is None or e.tier == 0:
                continue
            dst = self._warm_target(e.nbytes, e.tier)
            if dst is None:
                break
            if await self._promote(e, dst):
                warmed += 1
        return warmed

    def _warm_target(self, nbytes: int, below: int) -> int | None:
        loads = self._loads()
        for ti in range(below):
            t = loads[ti]
            if t.healthy and t.used + nbytes <= t.high_watermark * t.capacity:
                return ti
        return None

    async def _promote(self, e: _Entry, dst: int) -> bool:
        """:meth:`_promote_claimed` under a relocation claim; False if the block is busy."""
        src = e.tier
        if not await self._claim(e, src):
            return False
        try:
            return await self._promote_claimed(e, dst)
        finally:
            e.moving = False

    async def _promote_claimed(self, e: _Entry, dst: int) -> bool:
        """Copy a block up to tier ``dst``; a persistent source stays as the
        durable copy, a volatile one is evicted. False if it did not fit."""
        src = e.tier
        dst_backend = self._tiers[dst].backend
        with anyio.CancelScope(shield=True):
            try:
                data, tag = await self._copy_bytes(e, src, dst)
                payload = await self._encode_for(dst, data)
                alloc = await self._allocate_with_room(dst, e.key, payload.nbytes, tag)
            except (BlockNotFoundError, CapacityError, BlockExistsError, IntegrityError):
                return False
            await dst_backend.write(alloc, payload)
            self._tiers[dst].bytes_in += e.nbytes
            self._tiers[src].bytes_out += e.nbytes
            self._tel.bytes_written.add(e.nbytes, {"tier": self._tiers[dst].name})
            self._tel.bytes_read.add(e.nbytes, {"tier": self._tiers[src].name})
            if self._index.get(e.key) is not e or e.tier != src:
                await self._drop_copy(dst, e.key)
                return False
            self._commit_copy_bytes(e, tag)
            self._tiers[src].unplace(e.key)
            e.tier = dst
            self._tiers[dst].place(e)
            self._tiers[dst].promotions += 1
            if e.backing == src:
                self._tiers[src].back(e)  # stays as the durable copy
            else:
                await self._tiers[src].backend.evict(e.key)
        return True

    # ----------------------------------------------------- speculative decoding
    async def stage(self, request: str, tokens: object, kv_data: object, *, tenant: str | None = None) -> int:
        """Hold the KV of a request's sequence *including unverified draft
        tokens* in process memory, invisible to every reader (``lookup``/``get``
        in this process or any other sharing a tier). Replaces what was staged
        for ``request``; returns the staged token count.

        Only :meth:`commit` makes tokens visible, and only accepted ones.
        Raises the input errors of :meth:`put`.
        """
        self._check_open()
        if not isinstance(request, str) or not request:
            raise InputError(f"request: expected a non-empty string, got {request!r}")
        arr = to_token_array(tokens)
        kv = as_numpy_kv(kv_data, self._spec, self.config.kv_dtype, len(arr))
        self._scope_digest(tenant)  # validate the tenant now
        copy = await anyio.to_thread.run_sync(np.array, kv)
        self._staged[request] = (arr.copy(), copy, tenant)
        return len(arr)

    async def commit(self, request: str, accepted_tokens: int, *, durable: bool = False) -> PutResult:
        """Store the first ``accepted_tokens`` staged tokens of ``request`` (whole
        blocks, as :meth:`put`) and drop the rejected draft beyond them.

        Raises InputError (unknown request, ``accepted_tokens`` out of range).
        """
        self._check_open()
        staged = self._staged.get(request)
        if staged is None:
            raise InputError(f"commit: nothing staged for request {request!r}")
        arr, kv, tenant = staged
        if isinstance(accepted_tokens, bool) or not isinstance(accepted_tokens, int):
            raise InputError(f"accepted_tokens: expected an int, got {type(accepted_tokens).__name__}")
        if not 0 <= accepted_tokens <= len(arr):
            raise InputError(f"accepted_tokens: {accepted_tokens} outside [0, {len(arr)}] staged tokens")
        self.rollback(request, accepted_tokens)
        view = kv[block_slice(self._spec, 0, accepted_tokens)]
        return await self.put(arr[:accepted_tokens], np.ascontiguousarray(view), tenant=tenant, durable=durable)

    def rollback(self, request: str, to_tokens: int | None = None) -> None:
        """Discard staged draft tokens of ``request`` beyond ``to_tokens`` (all of
        them, and the request, when None). Idempotent; never touches stored blocks."""
        staged = self._staged.get(request)
        if staged is None:
            return
        if to_tokens is None or to_tokens <= 0:
            del self._staged[request]
            return
        arr, kv, tenant = staged
        if to_tokens < len(arr):
            self._staged[request] = (arr[:to_tokens], kv[block_slice(self._spec, 0, to_tokens)], tenant)

    # ----------------------------------------------------------------- stats
    def stats(self) -> dict[str, TierStats]:
        """Per-tier accounting (no I/O)."""
        out: dict[str, TierStats] = {}
        for t in self._tiers:
            s: BackendStats = t.backend.stats()
            kind = s.kind.value if isinstance(s.kind, TierKind) else str(s.kind)
            out[t.name] = TierStats(
                name=t.name,
                backend=t.config_name,
                kind=kind,
                capacity_bytes=s.capacity_bytes,
                used_bytes=s.used_bytes,
                blocks=s.blocks,
                hits=t.hits,
                misses=t.misses,
                bytes_in=t.bytes_in,
                bytes_out=t.bytes_out,
                promotions=t.promotions,
                demotions=t.demotions,
                io_path=s.io_path,
                emulated=s.emulated,
                healthy=t.healthy,
                codec=t.codec.name if t.codec is not None else "raw",
                codec_reasoning=t.codec.reasoning if t.codec is not None else None,
            )
        return out

    def invariant_violations(self, *, quiescent: bool = True) -> list[str]:
        """Check the index against the tiers (no I/O); returns what is wrong, empty when sound.

        Always: no entry has a negative pin count; each tier's serving and durable copies
        are indexed only once. With ``quiescent`` (no operation in flight, e.g. after a
        concurrency run has joined its tasks): every pin is released, no relocation claim
        is held, each tier holds exactly the blocks the index places on it (serving copies,
        durable copies, checkpoint copies and manifests) and no reservation, and for a tier
        without a codec its ``details["logical_bytes"]`` equals the indexed bytes."""
        out: list[str] = []
        expect_blocks = [0] * len(self._tiers)
        expect_bytes = [0] * len(self._tiers)
        for k, e in self._index.items():
            if e.key != k:
                out.append(f"entry {k[:16]} indexed under another key {e.key[:16]}")
            if e.pins < 0 or (quiescent and e.pins):
                out.append(f"block {k[:16]} has pins == {e.pins}")
            if quiescent and e.moving:
                out.append(f"block {k[:16]} still claimed for a relocation")
            for ti in {e.tier, e.backing} - {-1}:
                expect_blocks[ti] += 1
                expect_bytes[ti] += e.nbytes
            if k not in self._tiers[e.tier].lru:
                out.append(f"block {k[:16]} missing from tier {self._tiers[e.tier].name}'s order")
            if e.backing >= 0 and e.backing != e.tier and k not in self._tiers[e.backing].backed:
                out.append(f"block {k[:16]}'s durable copy missing from tier {self._tiers[e.backing].name}'s set")
        for ti, keys in self._retained.items():
            for k in keys:
                r = self._index.get(k)
                if r is None or ti not in (r.tier, r.backing):
                    expect_blocks[ti] += 1
        for ti, names in self._manifests.items():
            expect_blocks[ti] += len(names)
            expect_bytes[ti] += sum(names.values())
        for ti, t in enumerate(self._tiers):
            stray = [k for k in t.lru if (s_ := self._index.get(k)) is None or s_.tier != ti]
            stray += [k for k in t.backed if (b_ := self._index.get(k)) is None or b_.backing != ti]
            if stray:
                out.append(f"tier {t.name}: {len(stray)} keys in its bookkeeping are not indexed there")
            if not quiescent:
                continue
            st = t.backend.stats()
            if st.blocks != expect_blocks[ti]:
                out.append(f"tier {t.name}: holds {st.blocks} blocks, the index places {expect_blocks[ti]} there")
            if st.reserved_bytes:
                out.append(f"tier {t.name}: {st.reserved_bytes} bytes still reserved")
            logical = st.details.get("logical_bytes")
            if t.codec is None and isinstance(logical, int) and logical != expect_bytes[ti]:
                out.append(f"tier {t.name}: holds {logical} logical bytes, the index places {expect_bytes[ti]} there")
        return out

    # --------------------------------------------------------------- recovery
    async def _recover(self) -> None:
        """Rebuild the index from persistent tiers: the fastest copy serves, the
        next persistent copy is the durable backing; further copies are removed."""
        for ti, t in enumerate(self._tiers):
            if not isinstance(t.backend, SupportsScan):
                continue
            for info in await t.backend.scan():
                parsed = unpack_tag(info.tag)
                if parsed is None:
                    # not a tierkv block (a checkpoint manifest, another user's object): kept, accounted
                    self._manifests.setdefault(ti, {})[info.key] = info.nbytes
                    continue
                ms, tenant, parent, pos, crc, nbytes, root = parsed
                if nbytes != info.nbytes and t.codec is None:
                    await self._drop_copy(ti, info.key)  # truncated or foreign: never served, freed
                    continue
                e = self._index.get(info.key)
                if e is None:
                    e = _Entry(info.key, ti, nbytes, info.tag, ms, tenant, parent, pos, crc)
                    e.exact = tag_exact(info.tag)
                    e.backing = ti
                    self._adopt(e, root)
                    t.place(e)
                elif e.backing == e.tier:
                    self._set_backing(e, ti)
                else:
                    await t.backend.evict(info.key)

    def __repr__(self) -> str:
        return f"<TierKV tiers={self.tier_names} blocks={len(self._index)}{' closed' if self._closed else ''}>"
