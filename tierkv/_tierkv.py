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

import struct
import zlib
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import numpy as np

from ._backend import Backend, BackendStats, SupportsScan, TierKind
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
)
from ._keys import Scope, block_keys, tenant_salt, to_token_array
from ._layout import STORAGE_DTYPES, as_numpy_kv, block_slice
from ._placement import TierLoad, bytes_to_shed, lower_tier, select_victims
from ._registry import load_backend_class

__all__ = ["GetResult", "LookupResult", "PutResult", "TierKV", "TierStats"]

_TAG = struct.Struct("<2sBB16s16s32sIIQ")  # magic, version, flags, model scope, tenant, parent, pos, crc32, nbytes
_TAG_MAGIC = b"TK"
_TAG_VERSION = 1
_ZERO16 = bytes(16)
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
    __slots__ = ("crc", "key", "model_scope", "nbytes", "parent", "pins", "pos", "tag", "tenant", "tier")

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

    # ----------------------------------------------------------------- lifecycle
    @classmethod
    async def open(cls, config: Config | Mapping[str, Any] | str | Path) -> TierKV:
        """Validate ``config``, open every tier, and rebuild the index from
        persistent tiers (warm start).

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
    ) -> PutResult:
        """Store the KV of ``tokens`` in whole blocks (see the module docstring).

        ``kv_data`` has the layout of :mod:`tierkv._layout` covering exactly
        ``len(tokens)`` tokens. Blocks already stored are not written again.

        Raises:
            TokensError, KVLayoutError, InputError: bad arguments (nothing stored).
            CapacityError: no tier had room for a block (blocks stored before it stay).
            BackendError: a tier failed.
            ClosedError.
        """
        self._check_open()
        arr_tokens, keys, tid = self._keys(tokens, tenant)
        kv = as_numpy_kv(kv_data, self._spec, self.config.kv_dtype, len(arr_tokens))
        if block_type is not None and not isinstance(block_type, str):
            raise InputError(f"block_type: expected a string or None, got {type(block_type).__name__}")
        bt = self._block_tokens
        tail = len(arr_tokens) - len(keys) * bt
        new: list[int] = []
        existing = 0
        async with self._lock:
            for i, k in enumerate(keys):
                e = self._index.get(k.hex())
                if e is None:
                    new.append(i)
                else:
                    existing += 1
                    self._touch(e)
        tiers_used: list[str] = []
        stored = 0

        def prepare() -> list[tuple[int, memoryview, int]]:
            out = []
            for i in new:
                blk = np.ascontiguousarray(kv[block_slice(self._spec, i * bt, (i + 1) * bt)])
                data = blk.reshape(-1).view(np.uint8).data
                out.append((i, data, zlib.crc32(data)))
            return out

        prepared = await anyio.to_thread.run_sync(prepare) if new else []
        for i, data, crc in prepared:
            parent = keys[i - 1] if i else _ZERO32
            tag = pack_tag(self._model_scope, tid, parent, i, crc, data.nbytes)
            key = keys[i].hex()
            tier = await self._store_block(key, data, tag)
            if tier is None:
                continue  # stored concurrently by another task
            stored += 1
            name = self._tiers[tier].name
            if name not in tiers_used:
                tiers_used.append(name)
            async with self._lock:
                self._index[key] = _Entry(key, tier, data.nbytes, tag, self._model_scope, tid, parent, i, crc)
                self._tiers[tier].lru[key] = None
        await self._rebalance()
        return PutResult(
            tokens=len(keys) * bt,
            new_blocks=stored,
            existing_blocks=existing,
            tail_tokens=tail,
            tiers=tuple(tiers_used),
        )

    async def _store_block(self, key: str, data: memoryview, tag: bytes) -> int | None:
        """Write one block to the fastest tier with room; None if it already exists.

        New blocks are the most recently used, so when the fastest tier is
        full (or too fragmented) its least recently used blocks move down first.
        """
        last_exc: BaseException | None = None
        for ti in range(len(self._tiers)):
            t = self._tiers[ti]
            if not t.healthy:
                continue
            for attempt in range(2):
                try:
                    alloc = await t.backend.allocate(key, data.nbytes, tag=tag)
                except BlockExistsError:
                    return None
                except CapacityError as exc:
                    last_exc = exc
                    if attempt == 0 and t.backend.stats().capacity_bytes >= data.nbytes:
                        await self._shed(ti, data.nbytes)
                        continue
                    break
                await t.backend.write(alloc, data)
                t.bytes_in += data.nbytes
                return ti
        raise CapacityError(f"no tier has room for a block of {data.nbytes} bytes") from last_exc

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
            dest = lower_tier(self._loads(), ti)
            for k in victims:
                e = self._index[k]
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

    async def _move(self, e: _Entry, src: int, dst: int) -> bool:
        """Copy a block from tier ``src`` to ``dst`` then evict it from ``src``."""
        s, d = self._tiers[src], self._tiers[dst]
        try:
            data = await s.backend.read(e.key)
        except BlockNotFoundError:
            await self._forget(e, "evicted")
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
            d.lru[e.key] = None
        await s.backend.evict(e.key)
        return True

    async def _drop(self, e: _Entry) -> None:
        await self._tiers[e.tier].backend.evict(e.key)
        await self._forget(e, None)

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
        return results

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
            if isinstance(err, BlockNotFoundError):
                await self._forget(e, "evicted")
                miss_reason = "evicted"
            elif isinstance(err, IntegrityError):
                await self._drop_quietly(e)
                await self._forget(e, "integrity")
                miss_reason = "integrity"
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
        """Rebuild the index from persistent tiers (fastest copy wins)."""
        for ti, t in enumerate(self._tiers):
            if not isinstance(t.backend, SupportsScan):
                continue
            for info in await t.backend.scan():
                parsed = unpack_tag(info.tag)
                if parsed is None or info.key in self._index:
                    continue
                ms, tenant, parent, pos, crc, nbytes = parsed
                if nbytes != info.nbytes:
                    continue
                self._index[info.key] = _Entry(info.key, ti, info.nbytes, info.tag, ms, tenant, parent, pos, crc)
                t.lru[info.key] = None

    def __repr__(self) -> str:
        return f"<TierKV tiers={self.tier_names} blocks={len(self._index)}{' closed' if self._closed else ''}>"
