"""Result values of the public API: frozen, slotted dataclasses, no behaviour.

Owns the shapes :class:`~tierkv.TierKV` returns (put, lookup, get, checkpoint,
per-tier and per-tenant stats); may not import the engine.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["CheckpointResult", "GetResult", "LookupResult", "PutResult", "TenantStats", "TierStats"]


@dataclass(frozen=True, slots=True)
class PutResult:
    """Outcome of :meth:`TierKV.put`.

    ``tokens`` is the prefix length covered by stored blocks after the call
    (new or already present); ``tail_tokens`` were not stored (partial block). With
    ``partial_blocks`` on, the partial block is stored too (a *tail*): ``tokens`` then
    covers it and ``tail_tokens`` is 0; the tail counts as one of ``new_blocks`` or
    ``existing_blocks``.
    """

    tokens: int
    new_blocks: int
    existing_blocks: int
    tail_tokens: int
    tiers: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class LookupResult:
    """The longest stored prefix: ``tokens`` (a multiple of ``block_tokens`` plus
    ``tail_tokens``), its whole ``blocks``, the tiers holding them (fastest first) and
    each block's tier (a stored tail's last). ``tail_tokens``: the tokens a stored
    partial last block covers past the whole blocks (0: none; see ``partial_blocks``)."""

    tokens: int
    blocks: int
    tiers: tuple[str, ...]
    block_tiers: tuple[str, ...]
    tail_tokens: int = 0


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
