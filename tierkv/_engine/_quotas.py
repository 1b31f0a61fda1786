"""Tenant quotas: room within a tenant's quota by evicting only its own blocks.

Owns: the quota check made before a copy is written (``quota_room``), evicting a
tenant's own lowest-ranked blocks, and the per-tenant accounting views. The byte
counts themselves are kept by the index's residency (``Tier.tenant_bytes``).

May not touch: other tenants' blocks.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import anyio
import anyio.lowlevel

from ._results import TenantStats

if TYPE_CHECKING:
    from ._store import Store

log = logging.getLogger("tierkv")

__all__ = ["Quotas"]


class Quotas:
    """Per-tenant quotas (see the module docstring)."""

    def __init__(self, s: Store) -> None:
        self.s = s

    def tenant_usage(self, tenant: str | None = None) -> dict[str, int]:
        """Logical bytes ``tenant``'s blocks hold on each tier (each copy where it is
        stored), by tier name; no I/O."""
        _, tid = self.s.scope_digest(tenant)
        return {t.name: t.tenant_bytes.get(tid, 0) for t in self.s.tiers}

    def tenant_stats(self) -> dict[str, TenantStats]:
        """Per-tenant accounting of every tenant holding blocks (no I/O), by tenant name
        (``default`` for ``tenant=None``; a tenant known only from a persistent tier by its id)."""
        tids: set[bytes] = set()
        for t in self.s.tiers:
            tids.update(t.tenant_bytes)
        out: dict[str, TenantStats] = {}
        for tid in sorted(tids):
            usage = {t.name: t.tenant_bytes.get(tid, 0) for t in self.s.tiers}
            q = self.s.quota_for(tid)
            out[self.s.tenant_label(tid)] = TenantStats(
                tenant=self.s.tenant_label(tid),
                used_bytes=sum(usage.values()),
                used_bytes_by_tier=usage,
                quota_bytes=q.total if q is not None else None,
                quota_bytes_by_tier=dict(q.per_tier) if q is not None else {},
            )
        return out

    async def quota_room(self, tid: bytes, ti: int, nbytes: int) -> bool:
        """Make room within ``tid``'s quota for a new copy of ``nbytes`` on tier ``ti`` by
        evicting the tenant's *own* lowest-ranked blocks (never another tenant's): on ``ti``
        for a per-tier quota, anywhere for a total one. False when the tenant cannot get
        the room (the block alone exceeds its quota, or its other blocks are all pinned)."""
        q = self.s.quota_for(tid)
        if q is None:
            return True
        t = self.s.tiers[ti]
        limit = q.per_tier.get(t.name)
        if limit is not None:
            if nbytes > limit:
                return False
            while t.tenant_bytes.get(tid, 0) + nbytes > limit:
                need = t.tenant_bytes.get(tid, 0) + nbytes - limit
                if await self.s.mover.shed(ti, need, tenant=tid) <= 0:
                    return False
        if q.total is not None:
            if nbytes > q.total:
                return False
            while (used := sum(x.tenant_bytes.get(tid, 0) for x in self.s.tiers)) + nbytes > q.total:
                if await self.drop_own(tid, used + nbytes - q.total) <= 0:
                    return False
        return True

    async def drop_own(self, tid: bytes, need: int) -> int:
        """Drop ``tid``'s least recently used unpinned blocks (every copy) until ``need``
        bytes of its copies are freed; returns the bytes freed."""
        own = sorted(
            (e for e in self.s.index.entries.values() if e.tenant[:16] == tid and not e.pins and not e.moving),
            key=lambda e: e.t_last,
        )
        freed = 0
        with anyio.CancelScope(shield=True):
            for e in own:
                if freed >= need:
                    break
                if self.s.index.entries.get(e.key) is not e or e.pins or e.moving:
                    continue
                copies = len({e.tier, e.backing} - {-1})
                self.s.decided("evict", e, e.tier, -1, "tenant quota")
                self.s.mover.arc_lost(e)
                await self.s.mover.drop(e)
                freed += copies * e.nbytes
        return freed
