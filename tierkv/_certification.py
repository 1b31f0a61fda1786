"""What a backend tells ``tierkv certify`` about itself: descriptive only, never the pass rule.

Import these from :mod:`tierkv.backend`, which re-exports them. ``tierkv certify``
(the conformance suite) measures a backend's throughput next to a raw reference
and grades it by a rule it owns, one per tier kind
(``tierkv_conformance.PASS_RULES``). A backend declares what it is
(``Capabilities.tier_kind``; ``BackendStats.emulated`` when it runs on a stand-in)
and, through the hooks here, how a deployment configures it and what its plain
medium does; nothing here moves the bar it is graded against.

Owns :class:`CertificationProfile`, :class:`RawMeasurement`, :class:`SupportsRawReference`
and the envelope's batch size (:func:`certify_batch`); no I/O, no other tierkv module.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

__all__ = ["CERTIFY_BATCH_BYTES", "CertificationProfile", "RawMeasurement", "SupportsRawReference", "certify_batch"]

#: Bytes per batch call when ``tierkv certify`` measures throughput (an engine moves a
#: request's blocks in one batch call); a raw reference moves the same batches.
CERTIFY_BATCH_BYTES = 8 * 1024 * 1024


def certify_batch(block_bytes: int, count: int) -> int:
    """Blocks per batch call of the envelope for ``count`` blocks of ``block_bytes``."""
    return max(1, min(count, CERTIFY_BATCH_BYTES // max(1, block_bytes)))


@dataclass(frozen=True, slots=True)
class CertificationProfile:
    """How ``tierkv certify`` sets a backend up for its envelope (the ``certification``
    class attribute of :class:`~tierkv.backend.Backend`).

    Attributes:
        options_for_block: ``f(options, block_bytes)`` giving the options of an instance
            for blocks of ``block_bytes``, or None to measure that size on the
            configured instance. For a backend whose deployments size a storage unit to
            the model's block (the ``nvme`` tier's slots): each such size is measured on
            an instance of its own, and the row's ``note`` shows its options.
    """

    options_for_block: Callable[[Mapping[str, Any], int], dict[str, Any] | None] | None = None


@dataclass(frozen=True, slots=True)
class RawMeasurement:
    """Throughput of a raw reference: ``nbytes`` moved in ``seconds`` by ``method``."""

    nbytes: int
    seconds: float
    method: str

    @property
    def gbps(self) -> float:
        return self.nbytes / self.seconds / 1e9 if self.seconds > 0 else 0.0


@runtime_checkable
class SupportsRawReference(Protocol):
    """An open backend that measures the raw reference of its own medium.

    ``tierkv certify`` compares a backend with a raw reference measured in the same run:
    memcpy for memory tiers, O_DIRECT ``pwritev``/``preadv`` for storage tiers. For a
    network tier only the backend knows what "the plain client" is, so it implements
    this protocol; without it a network tier gets no ratio, and cannot be CERTIFIED. A
    tier whose medium is not plain memory or a file (HBM's CUDA copies, a
    file-per-block store) may implement it too; it is then used instead.
    """

    async def raw_reference(self, op: str, block_bytes: int, count: int, concurrency: int) -> RawMeasurement:
        """Move ``count`` blocks of ``block_bytes`` with the medium's plain client (``op``
        is ``"write"`` or ``"read"``), at most ``concurrency`` in flight and in the
        envelope's batches (:func:`certify_batch`) where the client has batch calls,
        without the backend's own bookkeeping, and return what was measured. Clean up
        whatever it stored. Raises BackendIOError on failure.
        """
        ...
