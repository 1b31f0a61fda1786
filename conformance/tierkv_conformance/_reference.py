"""Optional protocol: a backend that can measure the raw reference of its own medium.

``tierkv certify`` compares the backend's throughput with a raw reference
measured in the same run: memcpy for memory tiers, O_DIRECT ``preadv``/``pwritev``
for storage tiers. For a network tier only the backend knows what "the plain
client" is, so it implements :class:`SupportsRawReference`; without it a
network tier gets no ratio, and therefore cannot be CERTIFIED.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = ["RawMeasurement", "SupportsRawReference"]


@dataclass(frozen=True, slots=True)
class RawMeasurement:
    """Throughput of the raw reference: ``nbytes`` moved in ``seconds`` by ``method``."""

    nbytes: int
    seconds: float
    method: str

    @property
    def gbps(self) -> float:
        return self.nbytes / self.seconds / 1e9 if self.seconds > 0 else 0.0


@runtime_checkable
class SupportsRawReference(Protocol):
    """Implemented by an open backend instance (usually a network tier)."""

    async def raw_reference(self, op: str, block_bytes: int, count: int, concurrency: int) -> RawMeasurement:
        """Move ``count`` blocks of ``block_bytes`` with the medium's plain client
        (``op`` is ``"write"`` or ``"read"``), at most ``concurrency`` in flight,
        without going through the backend's own bookkeeping, and return what was
        measured. Clean up whatever it stored. Raises BackendIOError on failure.
        """
        ...
