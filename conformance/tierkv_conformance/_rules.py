"""The pass rule of ``tierkv certify``: one per tier kind, owned by the suite.

A backend says what it is (``Capabilities.tier_kind``, and ``stats().emulated``
when it runs on a stand-in); the bar its envelope must clear comes from this
table, the same for every backend of a kind, built in or third party. A row of
the envelope passes when its ratio to the raw reference measured in the same run
is at least ``min_ratio``; where the rule has a small-block bound, rows of blocks
smaller than ``small_block_bytes`` are graded by their batched time per block
instead (at most ``small_block_us``): at those sizes the fixed per-block work of
any store (an index entry, a header, a checksum) dominates a bare copy loop.

The raw reference (see :mod:`tierkv_conformance._envelope`): the backend's own
``raw_reference`` where it implements :class:`~tierkv.backend.SupportsRawReference`
(network tiers must), else memcpy for memory tiers and O_DIRECT ``pwritev``/``preadv``
for storage tiers.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from dataclasses import dataclass

from tierkv.backend import TierKind

__all__ = ["PASS_RULES", "PassRule", "pass_rule"]

KiB = 1024


@dataclass(frozen=True, slots=True)
class PassRule:
    """How the envelope of one tier kind is graded (see the module docstring)."""

    min_ratio: float
    small_block_bytes: int = 0
    small_block_us: float = 0.0

    def describe(self) -> str:
        text = f"every envelope ratio >= {self.min_ratio}"
        if self.small_block_bytes:
            text += (
                f" for blocks >= {self.small_block_bytes // KiB} KiB, "
                f"and <= {self.small_block_us:g} us per block (batched) below"
            )
        return text


#: The rule for each tier kind. Memory tiers move bytes with a copy the reference also
#: makes; storage tiers add a crash-safe header and sync per batch to the reference's
#: bare O_DIRECT writes (nvme: the fastest medium, the highest bar); network tiers are
#: graded against their own plain client moving the same batches.
PASS_RULES: Mapping[TierKind, PassRule] = types.MappingProxyType(
    {
        TierKind.HBM: PassRule(0.8),
        TierKind.DRAM: PassRule(0.8, small_block_bytes=64 * KiB, small_block_us=20.0),
        TierKind.CXL: PassRule(0.8, small_block_bytes=64 * KiB, small_block_us=20.0),
        TierKind.NVME: PassRule(0.9, small_block_bytes=64 * KiB, small_block_us=100.0),
        TierKind.PFS: PassRule(0.8),
        TierKind.RDMA: PassRule(0.9),
        TierKind.REMOTE: PassRule(0.8),
        TierKind.OTHER: PassRule(0.8),
    }
)


def pass_rule(kind: TierKind | str) -> PassRule:
    """The rule for ``kind`` (a :class:`~tierkv.backend.TierKind` or its value)."""
    return PASS_RULES[TierKind(kind)]
