"""The index: one :class:`Entry` per stored block, per-tier residency, the one pin helper.

Owns: the entries (key -> :class:`Entry`), each tier's residency sets (``Tier.lru`` for
serving copies, ``Tier.backed`` for durable-only copies, with per-tenant byte counts
kept exact by :meth:`Tier.place` / :meth:`Tier.back` and their inverses), the prefix
walk, the first-block roots behind miss reasons, :meth:`Index.pinned`, and the
invariant check. Everything here is synchronous: an index mutation never awaits, so it
is atomic on the event loop and cannot be cancelled half-way.

May not touch: backends (no I/O), the scheduler's state, telemetry.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import anyio
import numpy as np

from ..backend import Backend
from ..codecs import TierCodec
from ..scheduler import CircuitBreaker
from ..scheduler._buckets import RankQueue
from ._tags import ZERO32, root_of, unpack_tag

if TYPE_CHECKING:
    from ._store import Store

__all__ = ["Entry", "Index", "Tier", "pbin"]


def pbin(p: float) -> str:
    """Calibration bin of a predicted probability: "0.0" .. "0.9" (tenths)."""
    return f"{min(int(p * 10), 9) / 10:.1f}"


class Entry:
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
        "rank",
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
        #: quantised eviction key (the mover's ``rank_of``), kept in its tier's ``queue``
        self.rank = 0
        self.label: int | None = None
        self.p_pred = 0.0
        #: the raw bytes on exact tiers (checked against ``crc``) are the original bits; False once
        #: they were rebuilt from a lossy copy. Copies on lossy tiers are guarded by their codec's CRC.
        self.exact = True
        self.moving = False  # a relocation (move, promotion, demotion) holds it


class Tier:
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
        "queue",
        "ranked",
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
        #: serving copies ranked by their entries' eviction keys (the predictive order; kept
        #: only when ``ranked``: under the LRU policy ``lru`` is the order)
        self.queue: RankQueue[str] = RankQueue()
        self.ranked = True
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
    def place(self, e: Entry) -> None:
        """``e`` is served from this tier (most recently used, ranked by ``e.rank``)."""
        self.lru[e.key] = None
        if self.ranked:
            self.queue.set(e.key, e.rank)
        self._charge(e, False)

    def unplace(self, key: str) -> None:
        if key in self.lru:
            del self.lru[key]
            self.queue.discard(key)
            self._refund(key, False)

    def back(self, e: Entry) -> None:
        """This tier holds ``e``'s durable copy (served elsewhere)."""
        self.backed.add(e.key)
        self._charge(e, True)

    def unback(self, key: str) -> None:
        if key in self.backed:
            self.backed.discard(key)
            self._refund(key, True)

    def _charge(self, e: Entry, backed: bool) -> None:
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


class Index:
    """The entries of one store and the walk over them (see the module docstring)."""

    def __init__(self, s: Store) -> None:
        self.s = s
        self.entries: dict[str, Entry] = {}
        self.next_bid = 0
        #: (tenant, root) -> blocks at position 0 with that root: tells a tenant's own
        #: ``different_scope`` miss from ``never_stored``; ``roots_any`` is the operator's view
        self.roots: dict[tuple[bytes, bytes], int] = {}
        self.roots_any: dict[bytes, int] = {}

    def remove(self, e: Entry) -> bool:
        """Take ``e`` out of the index and its tiers' residency; False if it was not there."""
        if self.entries.get(e.key) is not e:
            return False
        del self.entries[e.key]
        parent = self.entries.get(e.parent.hex()) if e.pos else None
        if parent is not None and parent.children > 0:
            parent.children -= 1
        if e.pos == 0:
            self.unroot(e)
        self.s.tiers[e.tier].unplace(e.key)
        if e.backing >= 0:
            self.s.tiers[e.backing].unback(e.key)
        return True

    def adopt(self, e: Entry, root: bytes) -> None:
        """Insert a new entry into the index (under the lock, or before serving)."""
        e.bid = self.next_bid
        self.next_bid += 1
        self.entries[e.key] = e
        parent = self.entries.get(e.parent.hex()) if e.pos else None
        if parent is not None:
            parent.children += 1
        if not root and e.pos == 0:
            parsed = unpack_tag(e.tag)
            root = parsed[6] if parsed is not None else b""
        if root and e.pos == 0:
            rk = (e.tenant[:16], root[:8])
            self.roots[rk] = self.roots.get(rk, 0) + 1
            self.roots_any[root[:8]] = self.roots_any.get(root[:8], 0) + 1

    def touch(self, e: Entry) -> None:
        """``e`` was accessed: most recently used on its serving tier, ranked by ``e.rank``."""
        t = self.s.tiers[e.tier]
        if e.key in t.lru:
            t.lru.move_to_end(e.key)
            if t.ranked:
                t.queue.set(e.key, e.rank)

    @contextlib.contextmanager
    def pinned(self, entries: Sequence[Entry]) -> Iterator[None]:
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

    def set_backing(self, e: Entry, ti: int) -> None:
        """Point the durable copy of ``e`` at tier ``ti`` (-1: none), keeping each
        tier's set of backing-only copies exact (call under the lock)."""
        if e.backing >= 0 and e.backing != e.tier:
            self.s.tiers[e.backing].unback(e.key)
        e.backing = ti
        if ti >= 0 and ti != e.tier:
            self.s.tiers[ti].back(e)

    def walk(self, keys: list[bytes], tid: bytes) -> tuple[list[Entry], str]:
        """Index entries of the longest stored prefix and, if it ends early, why.

        Each entry's tag must belong to the chain being walked (parent key, position,
        model scope, tenant): an entry whose tag names another place (a record renamed or
        forged on a shared medium) ends the prefix as ``integrity`` and is never served."""
        out: list[Entry] = []
        ms = self.s.model_scope[:16]
        parent = ZERO32
        check_tenant = not self.s.config.share_across_tenants  # shared: one key space, any tenant's blocks
        for i, k in enumerate(keys):
            e = self.entries.get(k.hex())
            if e is None:
                return out, "never_stored"
            if (
                e.pos != i
                or e.parent != parent
                or e.model_scope[:16] != ms
                or (check_tenant and e.tenant[:16] != tid[:16])
            ):
                return out, "integrity"
            if not self.s.tiers[e.tier].healthy and not (e.backing >= 0 and self.s.tiers[e.backing].healthy):
                return out, "tier_unhealthy"
            out.append(e)
            parent = k
        return out, ""

    def unroot(self, e: Entry) -> None:
        parsed = unpack_tag(e.tag)
        if parsed is None or not parsed[6]:
            return
        root = parsed[6][:8]
        rk = (e.tenant[:16], root)
        if self.roots.get(rk, 0) > 1:
            self.roots[rk] -= 1
        else:
            self.roots.pop(rk, None)
        if self.roots_any.get(root, 0) > 1:
            self.roots_any[root] -= 1
        else:
            self.roots_any.pop(root, None)

    def miss_reason(self, arr: np.ndarray[Any, Any], found: int, reason: str, tid: bytes) -> tuple[str, str]:
        """(the caller's reason, the operator's reason) for a prefix that ended after
        ``found`` blocks. The caller's view refines ``never_stored`` at the first block into
        ``different_scope`` only when *the same tenant* stored these tokens under another
        model scope: one tenant never learns what another cached. The operator's view (for
        operator-side telemetry only) says ``different_scope`` for any tenant's copy."""
        if reason == "never_stored" and found == 0 and len(arr) >= self.s.block_tokens:
            root = root_of(arr, self.s.block_tokens)[:8]
            own = "different_scope" if (tid[:16], root) in self.roots else reason
            return own, "different_scope" if root in self.roots_any else reason
        return reason, reason

    def invariant_violations(self, *, quiescent: bool = True) -> list[str]:
        """Check the index against the tiers (no I/O); returns what is wrong, empty when sound.

        Always: no entry has a negative pin count; each tier's serving and durable copies
        are indexed only once. With ``quiescent`` (no operation in flight, e.g. after a
        concurrency run has joined its tasks): every pin is released, no relocation claim
        is held, each tier holds exactly the blocks the index places on it (serving copies,
        durable copies, checkpoint copies and manifests) and no reservation, and for a tier
        without a codec its ``details["logical_bytes"]`` equals the indexed bytes."""
        out: list[str] = []
        expect_blocks = [0] * len(self.s.tiers)
        expect_bytes = [0] * len(self.s.tiers)
        for k, e in self.entries.items():
            if e.key != k:
                out.append(f"entry {k[:16]} indexed under another key {e.key[:16]}")
            if e.pins < 0 or (quiescent and e.pins):
                out.append(f"block {k[:16]} has pins == {e.pins}")
            if quiescent and e.moving:
                out.append(f"block {k[:16]} still claimed for a relocation")
            for ti in {e.tier, e.backing} - {-1}:
                expect_blocks[ti] += 1
                expect_bytes[ti] += e.nbytes
            if k not in self.s.tiers[e.tier].lru:
                out.append(f"block {k[:16]} missing from tier {self.s.tiers[e.tier].name}'s order")
            if e.backing >= 0 and e.backing != e.tier and k not in self.s.tiers[e.backing].backed:
                out.append(f"block {k[:16]}'s durable copy missing from tier {self.s.tiers[e.backing].name}'s set")
        for ti, keys in self.s.retained.items():
            for k in keys:
                r = self.entries.get(k)
                if r is None or ti not in (r.tier, r.backing):
                    expect_blocks[ti] += 1
        for ti, names in self.s.manifests.items():
            expect_blocks[ti] += len(names)
            expect_bytes[ti] += sum(names.values())
        for ti, t in enumerate(self.s.tiers):
            stray = [k for k in t.lru if (s_ := self.entries.get(k)) is None or s_.tier != ti]
            stray += [k for k in t.backed if (b_ := self.entries.get(k)) is None or b_.backing != ti]
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
