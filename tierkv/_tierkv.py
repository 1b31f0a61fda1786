"""Compatibility re-exports while imports move to :mod:`tierkv._engine` (to be removed)."""

from ._engine import CheckpointResult, GetResult, LookupResult, PutResult, TenantStats, TierKV, TierStats
from ._engine._tags import pack_tag, tag_tenant, unpack_tag

__all__ = [
    "CheckpointResult",
    "GetResult",
    "LookupResult",
    "PutResult",
    "TenantStats",
    "TierKV",
    "TierStats",
    "pack_tag",
    "tag_tenant",
    "unpack_tag",
]
