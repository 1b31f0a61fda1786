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

import json
import re
import struct
import time
import zlib
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import numpy as np

from ._backend import Backend, BackendStats, SupportsContentHash, SupportsScan, TierKind
from ._config import Config
from ._errors import (
    BackendError,
    BlockExistsError,
    BlockNotFoundError,
    CapacityError,
    ClosedError,
    InputError,
    IntegrityError,
    KVLayoutError,
    LoadFailedError,
    TierKVError,
    TierUnavailableError,
)
from ._keys import Scope, block_keys, tenant_salt, to_token_array
from ._layout import STORAGE_DTYPES, as_numpy_kv, block_slice
from ._placement import TierLoad, bytes_to_shed, lower_tier, select_victims
from ._registry import load_backend_class

__all__ = ["CheckpointResult", "GetResult", "LookupResult", "PutResult", "TierKV", "TierStats"]

_TAG = struct.Struct("<2sBB16s16s32sIIQ")  # magic, version, flags, model scope, tenant, parent, pos, crc32, nbytes
_TAG_MAGIC = b"TK"
_TAG_VERSION = 1
_ZERO16 = bytes(16)
_CKPT_TAG = b"TKCKPT1"
_CKPT_NAME = re.compile(r"^[0-9A-Za-z._-]{1,100}$")
_ZERO32 = bytes(32)


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
    of :mod:`tierkv._layout`."""

    tokens: int
    kv: Any
    tiers: tuple[str, ...]
    miss_reason: str = ""


@dataclass(frozen=True, slots=True)
class CheckpointResult:
    """Outcome of :meth:`TierKV.checkpoint`.

    ``logical_bytes``: KV bytes the manifest references; ``copied_bytes``: what
    this checkpoint had to copy to the checkpoint tier (the delta);
    ``stored_bytes_delta``: how much that tier's usage grew (after its own
    content deduplication); ``distinct_contents``: distinct content hashes.
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


class _Entry:
    """Index record of one block. ``tier`` serves reads; ``backing`` is the
    persistent tier holding a durable copy (-1: none; equal to ``tier`` when
    the serving tier is itself persistent)."""

    __slots__ = ("backing", "crc", "key", "model_scope", "nbytes", "parent", "pins", "pos", "tag", "tenant", "tier")

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


class _Tier:
    __slots__ = (
        "backend",
        "bytes_in",
        "bytes_out",
        "config_name",
        "demotions",
        "healthy",
        "high",
        "hits",
        "lock",
        "low",
        "lru",
        "misses",
        "name",
        "promotions",
    )

    def __init__(self, name: str, config_name: str, backend: Backend, high: float, low: float) -> None:
        self.name = name
        self.config_name = config_name
        self.backend = backend
        self.high = high
        self.low = low
        self.lru: OrderedDict[str, None] = OrderedDict()
        self.hits = self.misses = self.bytes_in = self.bytes_out = 0
        self.promotions = self.demotions = 0
        self.healthy = True
        self.lock = anyio.Lock()


def pack_tag(model_scope: bytes, tenant: bytes, parent: bytes, pos: int, crc: int, nbytes: int) -> bytes:
    return _TAG.pack(_TAG_MAGIC, _TAG_VERSION, 0, model_scope[:16], tenant[:16], parent, pos, crc, nbytes)


def unpack_tag(tag: bytes) -> tuple[bytes, bytes, bytes, int, int, int] | None:
    """(model_scope, tenant, parent, pos, crc, nbytes), or None if ``tag`` is not ours."""
    if len(tag) != _TAG.size:
        return None
    magic, version, _flags, ms, tenant, parent, pos, crc, nbytes = _TAG.unpack(tag)
    if magic != _TAG_MAGIC or version != _TAG_VERSION:
        return None
    return ms, tenant, parent, pos, crc, nbytes


class TierKV:
    """An async KV-cache store over an ordered hierarchy of tiers.

    Open with ``kv = await TierKV.open(config)`` and close with
    ``await kv.aclose()`` (or ``async with await TierKV.open(config) as kv``).
    ``__init__`` does no I/O; use :meth:`open`.
    """

    def __init__(self, config: Config, tiers: Sequence[tuple[str, Backend]]) -> None:
        self.config = config
        self._spec = config.model
        self._block_tokens = config.effective_block_tokens
        self._dtype = STORAGE_DTYPES[config.kv_dtype]
        self._tiers = [
            _Tier(name, tc.backend, b, tc.high_watermark, tc.low_watermark)
            for (name, b), tc in zip(tiers, config.tiers, strict=True)
        ]
        self._index: dict[str, _Entry] = {}
        self._lock = anyio.Lock()
        self._rebalance_lock = anyio.Lock()
        self._closed = False
        base = config.scope()
        self._model_scope = base.with_tenant("").digest()
        self._scope_cache: dict[str, bytes] = {}
        self._block_shape = self._spec.kv_shape(self._block_tokens)
        self._block_nbytes = int(np.prod(self._block_shape)) * self._dtype.itemsize
        self.misses_by_reason: dict[str, int] = {}
        self._staged: dict[str, tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], str | None]] = {}
        #: blocks copied up from the checkpoint named by ``open(restore=...)``
        self.restored_blocks = 0

    # ----------------------------------------------------------------- lifecycle
    @classmethod
    async def open(cls, config: Config | Mapping[str, Any] | str | Path, *, restore: str | None = None) -> TierKV:
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
            for t in cfg.tiers:
                backend_cls = load_backend_class(t.backend)
                opened.append((t.name, await backend_cls.open(t.options, name=t.name)))
            kv = cls(cfg, opened)
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
        return self

    async def __aexit__(self, *exc: object) -> None:
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

        prepared = await anyio.to_thread.run_sync(prepare) if todo else []
        for i, data, crc in prepared:
            parent = keys[i - 1] if i else _ZERO32
            tag = pack_tag(self._model_scope, tid, parent, i, crc, data.nbytes)
            key = keys[i].hex()
            with anyio.CancelScope(shield=True):
                placed = await self._store_block(key, data, tag, i, tid, parent, crc, durable)
            if placed is None:
                continue  # being stored concurrently by another task
            if placed:
                stored += 1
                name = self._tiers[self._index[key].tier].name
                if name not in tiers_used:
                    tiers_used.append(name)
            await anyio.lowlevel.checkpoint_if_cancelled()
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
        self, key: str, data: memoryview, tag: bytes, pos: int, tid: bytes, parent: bytes, crc: int, durable: bool
    ) -> bool | None:
        """Write one block and index it. Returns True if written, False if it was
        already stored (only its durable copy was added), None if another task
        holds a reservation for it."""
        e = self._index.get(key)
        if e is None:
            ti = await self._write_to_fastest(key, data, tag, 0)
            if ti is None:
                return None
            e = _Entry(key, ti, data.nbytes, tag, self._model_scope, tid, parent, pos, crc)
            if self._tiers[ti].backend.capabilities.persistent:
                e.backing = ti
            async with self._lock:
                self._index[key] = e
                self._tiers[ti].lru[key] = None
            written = True
        else:
            written = False
        if durable and e.backing < 0:
            bi = self._persistent_tier(e.tier)
            if bi is None:
                raise TierUnavailableError("put(durable=True) needs a healthy persistent tier below the block's tier")
            if await self._write_to_fastest(key, data, tag, bi, only=True) is not None:
                e.backing = bi
        return written

    async def _write_to_fastest(
        self, key: str, data: memoryview, tag: bytes, start: int, *, only: bool = False
    ) -> int | None:
        """Write to the fastest healthy tier at or below ``start`` with room (only
        ``start`` with ``only``); None if a reservation for ``key`` exists elsewhere.

        New blocks are the most recently used, so when a tier is full (or too
        fragmented) its least recently used blocks move down first.
        """
        last_exc: BaseException | None = None
        for ti in [start] if only else range(start, len(self._tiers)):
            t = self._tiers[ti]
            if not t.healthy:
                continue
            for attempt in range(2):
                try:
                    alloc = await t.backend.allocate(key, data.nbytes, tag=tag)
                except BlockExistsError:
                    if await t.backend.contains(key):
                        return ti  # committed earlier (e.g. a write-through copy): adopt it
                    return None
                except CapacityError as exc:
                    last_exc = exc
                    if attempt == 0 and t.backend.stats().capacity_bytes >= data.nbytes:
                        await self._shed(ti, data.nbytes)
                        continue
                    break
                except BackendError as exc:
                    self._tier_failed(ti, exc)
                    last_exc = exc
                    break
                try:
                    await t.backend.write(alloc, data)
                except BackendError as exc:
                    self._tier_failed(ti, exc)
                    last_exc = exc
                    break
                t.bytes_in += data.nbytes
                return ti
        if isinstance(last_exc, CapacityError) or last_exc is None:
            raise CapacityError(f"no tier has room for a block of {data.nbytes} bytes") from last_exc
        raise last_exc

    def _tier_failed(self, ti: int, exc: BaseException) -> None:
        """Hook for the circuit breaker (see the scheduler); counts the failure."""
        self.misses_by_reason.setdefault("tier_error", 0)

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

    async def _shed(self, ti: int, need: int) -> None:
        tier = self._tiers[ti]
        async with self._lock:
            sizes = {k: self._index[k].nbytes for k in tier.lru if k in self._index}
            pinned = [k for k in sizes if self._index[k].pins]
            victims = select_victims(list(tier.lru), sizes, need, pinned)
            for k in victims:
                self._index[k].pins += 1
        try:
            with anyio.CancelScope(shield=True):
                dest = lower_tier(self._loads(), ti)
                for k in victims:
                    e = self._index[k]
                    if e.tier != ti:
                        continue
                    if e.backing > ti:  # a durable copy exists below: just drop this one
                        await self._demote_to_backing(e)
                        tier.demotions += 1
                        continue
                    if dest is not None and await self._move(e, ti, dest):
                        tier.demotions += 1
                        continue
                    await self._drop(e)
        finally:
            async with self._lock:
                for k in victims:
                    e2 = self._index.get(k)
                    if e2 is not None:
                        e2.pins -= 1

    async def _demote_to_backing(self, e: _Entry) -> None:
        src = self._tiers[e.tier]
        async with self._lock:
            src.lru.pop(e.key, None)
            old, e.tier = e.tier, e.backing
            self._tiers[e.tier].lru[e.key] = None
        await self._tiers[old].backend.evict(e.key)

    async def _move(self, e: _Entry, src: int, dst: int) -> bool:
        """Copy a block from tier ``src`` to ``dst`` then evict it from ``src``."""
        s, d = self._tiers[src], self._tiers[dst]
        try:
            data = await s.backend.read(e.key)
        except BlockNotFoundError:
            await self._forget(e, "evicted_local")
            return True
        s.bytes_out += len(data)
        try:
            await self._make_room(dst, e.nbytes)
            alloc = await d.backend.allocate(e.key, e.nbytes, tag=e.tag)
        except BlockExistsError:
            pass
        except CapacityError:
            return False
        else:
            await d.backend.write(alloc, data)
            d.bytes_in += e.nbytes
        async with self._lock:
            s.lru.pop(e.key, None)
            e.tier = dst
            if d.backend.capabilities.persistent and e.backing < 0:
                e.backing = dst
            d.lru[e.key] = None
        await s.backend.evict(e.key)
        return True

    async def _drop(self, e: _Entry) -> None:
        """Remove a block from the index and from every tier holding a copy."""
        await self._forget(e, None)
        with anyio.CancelScope(shield=True):
            await self._tiers[e.tier].backend.evict(e.key)
            if e.backing >= 0 and e.backing != e.tier:
                await self._tiers[e.backing].backend.evict(e.key)

    async def _forget(self, e: _Entry, reason: str | None) -> None:
        async with self._lock:
            if self._index.get(e.key) is e:
                del self._index[e.key]
            self._tiers[e.tier].lru.pop(e.key, None)
        if reason:
            self.misses_by_reason[reason] = self.misses_by_reason.get(reason, 0) + 1

    # ---------------------------------------------------------------- lookup
    async def lookup(self, tokens: object, *, tenant: str | None = None) -> LookupResult:
        """How many leading tokens are stored, and in which tiers (no data moved).

        Raises TokensError, InputError, ClosedError.
        """
        self._check_open()
        _, keys, _ = self._keys(tokens, tenant)
        block_tiers: list[str] = []
        for k in keys:
            e = self._index.get(k.hex())
            if e is None or not self._tiers[e.tier].healthy:
                break
            block_tiers.append(self._tiers[e.tier].name)
        tiers = tuple(t.name for t in self._tiers if t.name in block_tiers)
        return LookupResult(len(block_tiers) * self._block_tokens, len(block_tiers), tiers, tuple(block_tiers))

    # ------------------------------------------------------------------- get
    async def get(self, tokens: object, *, out: Any = None, tenant: str | None = None) -> GetResult:
        """Return the KV of the longest stored prefix of ``tokens``, bit-identical
        to what was put.

        With ``out`` (a numpy array or CPU torch tensor of the layout for at
        least the returned prefix, of the configured dtype) the prefix is
        written into ``out[..., :tokens, ...]`` and ``out`` is returned as
        ``kv``. A block that fails verification or vanished from its tier ends
        the prefix there (a miss, never wrong bytes).

        Raises TokensError, KVLayoutError (bad ``out``), ClosedError, and
        LoadFailedError when a tier fails and ``load_failure = "fail"``.
        """
        self._check_open()
        _, keys, _ = self._keys(tokens, tenant)
        entries: list[_Entry] = []
        async with self._lock:
            for k in keys:
                e = self._index.get(k.hex())
                if e is None or not self._tiers[e.tier].healthy:
                    break
                e.pins += 1
                entries.append(e)
                self._touch(e)
        try:
            return await self._fetch(entries, len(keys), out)
        finally:
            async with self._lock:
                for e in entries:
                    e.pins -= 1

    async def _read_blocks(self, entries: list[_Entry]) -> list[memoryview | BaseException]:
        """Read every entry's bytes, batched per tier; a failure is returned in place."""
        results: list[memoryview | BaseException] = [BlockNotFoundError("unread")] * len(entries)
        by_tier: dict[int, list[int]] = {}
        for i, e in enumerate(entries):
            by_tier.setdefault(e.tier, []).append(i)
        for ti, idxs in by_tier.items():
            await self._read_tier(ti, idxs, entries, results)
        for i, r in enumerate(results):  # serve from the durable copy when the fast copy failed
            e = entries[i]
            if isinstance(r, BaseException) and e.backing >= 0 and e.backing != e.tier:
                try:
                    results[i] = await self._tiers[e.backing].backend.read(e.key)
                except BackendError:
                    continue
                async with self._lock:
                    self._tiers[e.tier].lru.pop(e.key, None)
                    e.tier = e.backing
                    self._tiers[e.tier].lru[e.key] = None
        return results

    async def _read_tier(
        self, ti: int, idxs: list[int], entries: list[_Entry], results: list[memoryview | BaseException]
    ) -> None:
        """Batch-read the entries ``idxs`` from tier ``ti`` into ``results``."""
        backend = self._tiers[ti].backend
        try:
            views = await backend.read_many([entries[i].key for i in idxs])
            for i, v in zip(idxs, views, strict=True):
                results[i] = v
        except BackendError as batch_exc:
            pending: BackendError | None = batch_exc if isinstance(batch_exc, IntegrityError) else None
            for i in idxs:  # find which block failed
                try:
                    results[i] = await backend.read(entries[i].key)
                except BlockNotFoundError as exc:
                    # a block the batch found corrupt is quarantined, so it now reads as missing
                    results[i] = pending or exc
                    pending = None
                except BackendError as exc:
                    results[i] = exc

    async def _fetch(self, entries: list[_Entry], wanted: int, out: Any) -> GetResult:
        bt = self._block_tokens
        n = len(entries)
        miss_reason = "" if n == wanted else "never_stored"
        if n < wanted:
            self._tiers[-1].misses += 1
        if n == 0:
            return GetResult(0, None, (), miss_reason)
        target = self._out_view(out, n * bt)
        datas = await self._read_blocks(entries)

        def assemble() -> int:
            for i, (e, d) in enumerate(zip(entries, datas, strict=True)):
                if isinstance(d, BaseException):
                    return i
                if len(d) != e.nbytes or zlib.crc32(d) != e.crc:
                    datas[i] = IntegrityError(f"block {e.key[:16]} failed its CRC check", tier=self._tiers[e.tier].name)
                    return i
                blk = np.frombuffer(d, dtype=self._dtype).reshape(self._block_shape)
                target[block_slice(self._spec, i * bt, (i + 1) * bt)] = blk
            return len(entries)

        good = await anyio.to_thread.run_sync(assemble)
        for e in entries[:good]:
            tier = self._tiers[e.tier]
            tier.hits += 1
            tier.bytes_out += e.nbytes
        if good < n:
            e, err = entries[good], datas[good]
            tier = self._tiers[e.tier]
            tier.misses += 1
            if isinstance(err, (BlockNotFoundError, IntegrityError)):
                if isinstance(err, IntegrityError):
                    miss_reason = "integrity"
                else:
                    miss_reason = "evicted_remote" if tier.backend.capabilities.shared else "evicted_local"
                await self._drop_quietly(e)
                if e.backing >= 0 and e.backing != e.tier:
                    async with self._lock:  # the durable copy below serves the next request
                        tier.lru.pop(e.key, None)
                        e.tier = e.backing
                        self._tiers[e.tier].lru[e.key] = None
                    self.misses_by_reason[miss_reason] = self.misses_by_reason.get(miss_reason, 0) + 1
                else:
                    await self._forget(e, miss_reason)
            else:
                if self.config.load_failure == "fail":
                    raise LoadFailedError(f"reading block {good} from tier {tier.name!r} failed: {err}") from (
                        err if isinstance(err, BaseException) else None
                    )
                miss_reason = "tier_error"
                self.misses_by_reason["tier_error"] = self.misses_by_reason.get("tier_error", 0) + 1
        if good == 0:
            return GetResult(0, None, (), miss_reason)
        used = {e.tier for e in entries[:good]}
        tiers = tuple(t.name for i, t in enumerate(self._tiers) if i in used)
        if out is not None:
            return GetResult(good * bt, out, tiers, miss_reason)
        result = target if good == n else np.ascontiguousarray(target[block_slice(self._spec, 0, good * bt)])
        return GetResult(good * bt, result, tiers, miss_reason)

    async def _drop_quietly(self, e: _Entry) -> None:
        try:
            await self._tiers[e.tier].backend.evict(e.key)
        except BackendError:
            pass

    def _out_view(self, out: Any, tokens: int) -> np.ndarray[Any, Any]:
        if out is None:
            return np.empty(self._spec.kv_shape(tokens), dtype=self._dtype)
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
        async with self._lock:
            order: list[_Entry] = []
            for t in self._tiers:  # hottest first: fastest tier, most recent first
                order.extend(self._index[k] for k in reversed(t.lru) if k in self._index)
            for e in order:
                e.pins += 1
        copied = 0
        rows: list[dict[str, Any]] = []
        try:
            for e in order:
                if e.tier != ci and e.backing != ci:
                    try:
                        data = await self._tiers[e.tier].backend.read(e.key)
                    except BlockNotFoundError:
                        continue
                    if await self._write_to_fastest(e.key, data, e.tag, ci, only=True) is None:
                        continue
                    copied += e.nbytes
                    if e.backing < 0:
                        e.backing = ci
                sha = ""
                if isinstance(ct.backend, SupportsContentHash):
                    sha = await ct.backend.content_hash(e.key) or ""
                rows.append({"key": e.key, "sha256": sha, "nbytes": e.nbytes, "tag": e.tag.hex()})
        finally:
            async with self._lock:
                for e in order:
                    e.pins -= 1
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
            alloc = await ct.backend.allocate(key, len(manifest), tag=_CKPT_TAG)
            await ct.backend.write(alloc, manifest)
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
        """Copy a block up to tier ``dst``; a persistent source stays as the
        durable copy, a volatile one is evicted. False if it did not fit."""
        src = e.tier
        try:
            data = await self._tiers[src].backend.read(e.key)
            alloc = await self._tiers[dst].backend.allocate(e.key, e.nbytes, tag=e.tag)
        except (BlockNotFoundError, CapacityError, BlockExistsError):
            return False
        with anyio.CancelScope(shield=True):
            await self._tiers[dst].backend.write(alloc, data)
            self._tiers[dst].bytes_in += e.nbytes
            self._tiers[src].bytes_out += e.nbytes
            async with self._lock:
                self._tiers[src].lru.pop(e.key, None)
                e.tier = dst
                self._tiers[dst].lru[e.key] = None
                self._tiers[dst].promotions += 1
            if e.backing != src:
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
            )
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
                    continue  # not a tierkv block (a checkpoint manifest, another user's object)
                ms, tenant, parent, pos, crc, nbytes = parsed
                if nbytes != info.nbytes:
                    continue
                e = self._index.get(info.key)
                if e is None:
                    e = _Entry(info.key, ti, info.nbytes, info.tag, ms, tenant, parent, pos, crc)
                    e.backing = ti
                    self._index[info.key] = e
                    t.lru[info.key] = None
                elif e.backing == e.tier:
                    e.backing = ti
                else:
                    await t.backend.evict(info.key)

    def __repr__(self) -> str:
        return f"<TierKV tiers={self.tier_names} blocks={len(self._index)}{' closed' if self._closed else ''}>"
