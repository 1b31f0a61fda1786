"""The reference backends of the conformance suite (they live in ``tierkv_conformance.reference_backends``)."""

from tierkv_conformance.reference_backends import (
    LeakyCancelBackend,
    RefFileBackend,
    RefMemoryBackend,
    StaleAfterEvictBackend,
)

__all__ = ["LeakyCancelBackend", "RefFileBackend", "RefMemoryBackend", "StaleAfterEvictBackend"]
