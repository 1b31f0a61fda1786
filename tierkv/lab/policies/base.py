"""The interface every replayed cache policy implements, and the hit count they share.

A policy is a block-granular prefix cache of a fixed capacity. ``request(ids, now, tail_partial)`` looks up
the request's chained prefix-block ids *before* changing anything (so a request never hits on blocks it
inserts itself), then touches/inserts them, and returns ``(leading_hits, block_hits)``: the length of the
leading run of resident blocks (what a prefix cache can reuse) and the number of resident blocks.

Owns: :class:`Policy` and :func:`hits`. Imports nothing from the library.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol

__all__ = ["Policy", "hits"]


class Policy(Protocol):
    """A replayable cache policy of a fixed capacity in blocks."""

    name: str

    def request(self, ids: Sequence[int], now: float, tail_partial: bool) -> tuple[int, int]:
        """Serve one request; return ``(leading_hits, block_hits)``."""
        ...


def hits(cache: dict[int, object] | OrderedDict[int, object], ids: Sequence[int]) -> tuple[int, int, list[bool]]:
    flags = [b in cache for b in ids]
    lead = 0
    for f in flags:
        if not f:
            break
        lead += 1
    return lead, sum(flags), flags
