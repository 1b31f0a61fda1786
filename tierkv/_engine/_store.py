"""The shared state of one store and the primitives every collaborator uses.

Owns: the configuration-derived constants (block shape and size, model scope), the
tiers (:class:`~._index.Tier`: backend, breaker, codec, residency), the scheduler
state, telemetry, tenant names and quotas, and the few primitives that translate a
block between its raw bytes and what a tier stores (codec encode/decode, ``read_raw``,
``drop_copy``), feed a tier's circuit breaker (``tier_failed``), and trace a
placement decision (``decided``). The collaborators hang off it: ``index``,
``mover``, ``quotas``, ``durable``, ``writer``, ``reader``, ``service``, ``ckpt``, ``staging``, ``hints``;
each is constructed here and reaches the others through it.

May not touch: the public API (``tierkv.TierKV`` is the front over this).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import anyio
import numpy as np

from .._config import Config, TenantQuota
from .._keys import KeyChains, layout_digest, tenant_salt, to_token_array
from .._layout import STORAGE_DTYPES
from .._placement import TierLoad
from .._scheduling import SchedulerState
from .._telemetry import Telemetry
from ..backend import Backend, TierKind
from ..codecs import TierCodec
from ..errors import (
    BackendError,
    BlockExistsError,
    BlockNotFoundError,
    CapacityError,
    ClosedError,
    ConfigError,
    DecodeError,
    InputError,
    IntegrityError,
)
from ..scheduler import placement_value
from ._checkpoint import Checkpoints
from ._durable import Durable
from ._hints import Hints
from ._index import Entry, Index, Tier
from ._mover import Mover
from ._quotas import Quotas
from ._reader import Reader
from ._service import Service
from ._staging import Staging
from ._tags import ZERO16
from ._writer import Writer

__all__ = ["Store"]

log = logging.getLogger("tierkv")

#: tiers whose reads are not verified unless configured (``TierConfig.verify``)
_MEMORY_KINDS = frozenset({TierKind.DRAM, TierKind.CXL, TierKind.HBM})


class Store:
    """State and primitives shared by the collaborators of one :class:`~tierkv.TierKV`."""

    def __init__(self, config: Config, tiers: Sequence[tuple[str, Backend]], telemetry: Telemetry) -> None:
        self.config = config
        self.spec = config.model
        self.block_tokens = config.effective_block_tokens
        self.dtype = STORAGE_DTYPES[config.kv_dtype]
        names = [name for name, _ in tiers]
        kinds = [str(b.capabilities.tier_kind.value) for _, b in tiers]
        self.sched = SchedulerState(config.scheduler, names, kinds)
        self.tel = telemetry
        self.tiers = [
            Tier(name, tc.backend, b, tc.high_watermark, tc.low_watermark, br, self.sched.max_transfers)
            for (name, b), tc, br in zip(tiers, config.tiers, self.sched.breakers, strict=True)
        ]
        for t in self.tiers:
            t.ranked = self.sched.policy != "lru"
        #: per tier: whether reads are verified against the block's checksum (see TierConfig.verify)
        self.verify_reads = [
            tc.verify if tc.verify is not None else b.capabilities.tier_kind not in _MEMORY_KINDS
            for (_, b), tc in zip(tiers, config.tiers, strict=True)
        ]
        for ti, (t, tc) in enumerate(zip(self.tiers, config.tiers, strict=True)):
            if tc.codec is not None:
                t.codec = self.make_codec(t, tc.codec)
                if t.codec.name != "raw" and t.codec.decode_Bps > 0:  # the gate models stored bytes and decode time
                    self.sched.set_codec(ti, t.codec.ratio_estimate, t.codec.decode_Bps)
        self.fetch_limiter = anyio.CapacityLimiter(self.sched.max_fetches)
        self.tool_blocks: dict[str, list[str]] = {}
        self.prefetch_stats = {"issued": 0, "useful": 0, "wasted": 0}
        self.prefetched: set[str] = set()
        self.rebalance_lock = anyio.Lock()
        self.closed = False
        self.model_scope = config.scope().with_tenant("").digest()
        self.scope_cache: dict[str, bytes] = {}
        self.block_shape = self.spec.kv_shape(self.block_tokens)
        self.block_nbytes = int(np.prod(self.block_shape)) * self.dtype.itemsize
        # the adaptive tau's shadow caches model the whole cache (backend stats are in-memory)
        caps = [b.stats().capacity_bytes for _, b in tiers]
        self.sched.set_capacity_blocks(
            sum(caps) // max(1, self.block_nbytes),
            # the session shadow holds what the store can: the tiers up to their high watermarks
            held_blocks=int(sum(t.high * c for t, c in zip(self.tiers, caps, strict=True)))
            // max(1, self.block_nbytes),
        )
        #: misses by the operator's view of their reason
        self.misses_by_reason: dict[str, int] = {}
        #: blocks copied up from the checkpoint named by ``open(restore=...)``
        self.restored_blocks = 0
        #: per tier: keys of checkpoint copies kept beside an entry's durable copy elsewhere
        self.retained: dict[int, set[str]] = {}
        #: per tier: checkpoint manifests and foreign objects found there (key -> bytes)
        self.manifests: dict[int, dict[str, int]] = {}
        #: tenant id -> its name (as first given) and its quota (``[tenants]``)
        self.tenant_names: dict[bytes, str] = {}
        self.tenant_quotas: dict[bytes, TenantQuota] = {}
        self.default_quota = config.quota_of(None)
        #: background jobs that failed (the service logs, counts and traces them, and goes on)
        self.failed_jobs = 0
        self.index = Index(self)
        self.chains = KeyChains()  # recent key chains (an engine asks for the same prompt's keys again)
        self.mover = Mover(self)
        self.quotas = Quotas(self)
        self.durable = Durable(self)
        self.writer = Writer(self)
        self.reader = Reader(self)
        self.service = Service(self)
        self.ckpt = Checkpoints(self)
        self.staging = Staging(self)
        self.hints = Hints(self)
        self.tel.register_tier_gauges(self.gauge_rows)

    def check_open(self) -> None:
        if self.closed:
            raise ClosedError("TierKV is closed")

    def scope_digest(self, tenant: str | None) -> tuple[bytes, bytes]:
        """(key scope digest, 16-byte tenant id) for ``tenant``."""
        if tenant is not None and (not isinstance(tenant, str) or len(tenant) > 256 or "\x00" in tenant):
            raise InputError(f"tenant: expected a string of at most 256 characters without NUL, got {tenant!r}")
        salt = tenant_salt(tenant)
        tid = bytes.fromhex(salt)[:16] if salt else ZERO16
        d = self.scope_cache.get(salt)
        if d is None:
            d = self.config.scope(salt).digest()
            self.scope_cache[salt] = d
            self.tenant_names.setdefault(tid, tenant if tenant is not None else "")
            q = self.config.quota_of(tenant)
            if q is not None:
                self.tenant_quotas[tid] = q
        return d, tid

    def keys(
        self, tokens: object, tenant: str | None, layout: bytes | None = None
    ) -> tuple[np.ndarray[Any, Any], list[bytes], bytes]:
        """(token ids, block keys, tenant id); ``layout``: the key id of an engine-native
        layout (its blocks' keys are seeded apart)."""
        arr = to_token_array(tokens)
        digest, tid = self.scope_digest(tenant)
        if layout is not None:
            digest = layout_digest(digest, layout)
        return arr, self.chains.keys(digest, arr, self.block_tokens), tid

    def loads(self) -> list[TierLoad]:
        out = []
        for t in self.tiers:
            s = t.backend.stats()
            out.append(TierLoad(s.capacity_bytes, s.used_bytes, t.high, t.low, t.healthy))
        return out

    def persistent_tier(self, below: int = -1) -> int | None:
        for ti in range(below + 1, len(self.tiers)):
            t = self.tiers[ti]
            if t.healthy and t.backend.capabilities.persistent:
                return ti
        return None

    def quota_for(self, tid: bytes) -> TenantQuota | None:
        q = self.tenant_quotas.get(tid)
        return q if q is not None else self.default_quota

    def tenant_label(self, tid: bytes) -> str:
        name = self.tenant_names.get(tid)
        return name if name else ("default" if tid == ZERO16 else tid.hex())

    async def drop_copy(self, ti: int, key: str) -> None:
        """Evict tier ``ti``'s copy of ``key`` (an unindexed or superseded copy), shielded."""
        with anyio.CancelScope(shield=True):
            try:
                await self.tiers[ti].backend.evict(key)
            except BackendError as exc:
                self.tier_failed(ti, exc)

    def verifies(self, ti: int) -> bool:
        """Whether blocks read from tier ``ti`` are checked against their checksum, so that
        a copy written there must carry one."""
        return self.verify_reads[ti]

    def needs_checksum(self, ti: int) -> bool:
        """Whether a copy written to tier ``ti`` must carry a checksum: the tier verifies its
        reads, or it persists (a copy found there after a restart is verified before use)."""
        return self.verify_reads[ti] or self.tiers[ti].backend.capabilities.persistent

    def exact_tier(self, ti: int) -> bool:
        """Whether tier ``ti`` stores raw bytes exactly (no codec, or a lossless one)."""
        c = self.tiers[ti].codec
        return c is None or c.lossless

    def codec_name(self, ti: int) -> str:
        c = self.tiers[ti].codec
        return c.name if c is not None else "raw"

    def make_codec(self, t: Tier, spec: Mapping[str, Any]) -> TierCodec:
        """The tier's codec from its config; ``{codec = "auto"}`` chooses by the
        tier's estimated bandwidth (re-chosen as measurements come in)."""
        if self.config.kv_dtype not in ("float16", "float32") and spec.get("codec") not in ("raw", "lz4", "zstd"):
            raise ConfigError(
                f"tiers[{self.tiers.index(t)}].codec",
                dict(spec),
                "raw, lz4 or zstd for this kv_dtype (lossy codecs need float16/32)",
            )
        mla = self.spec.attention == "mla"
        if mla and spec.get("codec") == "auto":
            if spec.get("allow_lossy") is True:
                raise ConfigError(
                    f"tiers[{self.tiers.index(t)}].codec.allow_lossy",
                    True,
                    "false for an MLA model (lossy codecs need K/V heads)",
                )
            spec = {**spec, "allow_lossy": False}
        bw = self.sched.estimators[self.tiers.index(t)].bandwidth_Bps if t in self.tiers else None
        tc = TierCodec.from_config(spec, bandwidth_Bps=bw if spec.get("codec") == "auto" else None, tier=t.name)
        if mla and not tc.lossless:
            raise ConfigError(
                f"tiers[{self.tiers.index(t)}].codec",
                dict(spec),
                "a lossless codec (raw, lz4, zstd) for an MLA model: lossy codecs quantize per K/V head, "
                "and the MLA latent has none",
            )
        return tc

    async def encode_for(self, ti: int, raw: memoryview) -> memoryview:
        """The bytes tier ``ti`` stores for a block (its codec's self-describing
        block, or the raw bytes when it has none)."""
        tc = self.tiers[ti].codec
        if tc is None:
            return raw
        shape = self.block_shape
        if raw.nbytes != self.block_nbytes:  # a partial last block (a tail): fewer tokens
            shape = self.spec.kv_shape(raw.nbytes // self.index.token_nbytes)
        arr = np.frombuffer(raw, dtype=self.dtype).reshape(shape)
        return memoryview(await tc.aencode(arr, dtype=self.config.kv_dtype))

    async def decoded(self, ti: int, key: str, data: memoryview) -> memoryview:
        """Raw block bytes from what tier ``ti`` returned; a payload that does not
        decode is an integrity failure of that tier (never garbage)."""
        tc = self.tiers[ti].codec
        if tc is None:
            return data
        try:
            arr = await tc.adecode(data)
        except DecodeError as exc:
            raise IntegrityError(f"block {key[:16]}: {exc}", tier=self.tiers[ti].name) from exc
        out: memoryview = np.ascontiguousarray(arr).reshape(-1).view(np.uint8).data
        return out

    async def read_raw(self, ti: int, key: str) -> memoryview:
        return await self.decoded(ti, key, await self.tiers[ti].backend.read(key))

    def tier_failed(self, ti: int, exc: BaseException) -> None:
        """Feed the tier's circuit breaker with a device failure; an open breaker
        takes the tier out of placement and makes its blocks misses until probes
        succeed. Contract outcomes (missing block, existing key, no capacity,
        corrupt block) are not failures of the device."""
        if isinstance(exc, (BlockNotFoundError, BlockExistsError, CapacityError, IntegrityError)):
            return
        t = self.tiers[ti]
        was = t.healthy
        t.breaker.record_failure()
        if was and not t.healthy:
            self.tel.decision(
                "tier_unhealthy", {"tierkv.tier": t.name, "tierkv.reason": f"{type(exc).__name__}: {exc}"[:200]}
            )

    def gauge_rows(self) -> list[tuple[str, str, int, int, int]]:
        rows = []
        for t in self.tiers:
            st = t.backend.stats()
            rows.append((t.name, t.kind, st.capacity_bytes, st.used_bytes, st.blocks))
        return rows

    def decided(self, kind: str, e: Entry, src: int, dst: int, reason: str) -> None:
        """Count and trace one placement decision with the predictor's view of the block."""
        sched, tel = self.sched, self.tel
        s_name = self.tiers[src].name if src >= 0 else ""
        d_name = self.tiers[dst].name if dst >= 0 else ""
        if kind == "demote":
            self.tiers[src].demotions += 1
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
        for ti, t in enumerate(self.tiers):
            est = sched.estimators[ti]
            kind_ = t.kind if t.kind in sched.placement.tier_usd_per_gb_hour else "pfs"
            attrs[f"tierkv.value.{t.name}"] = placement_value(
                p,
                self.block_tokens,
                e.nbytes,
                kind_,
                est.latency_s + e.nbytes / est.bandwidth_Bps,
                rate,
                sched.placement,
            )
        tel.decision(kind, attrs)

    def serving_tier_names(self, rows: list[int]) -> tuple[str, ...]:
        """The name of :meth:`serving_tier` of each indexed row (as arrays over the columns)."""
        if not rows:
            return ()
        c = self.index.cols
        tier = np.frombuffer(c.tier, dtype=np.int8)[rows]
        if not all(t.healthy for t in self.tiers):
            back = np.frombuffer(c.backing, dtype=np.int8)[rows]
            healthy = np.array([t.healthy for t in self.tiers], dtype=bool)
            tier = np.where(healthy[tier] | (back < 0), tier, back)
        names = [t.name for t in self.tiers]
        return tuple([names[i] for i in tier.tolist()])

    def serving_tier(self, e: Entry) -> Tier:
        t = self.tiers[e.tier]
        return t if t.healthy or e.backing < 0 else self.tiers[e.backing]
