"""The shipped library as a replay policy: a real :class:`~tierkv.TierKV`, driven request by request.

The replay's ``tierkv`` rows are this policy, so the lab measures the code users run, not a model
of it: one DRAM tier holding exactly ``capacity`` blocks (watermarks 1.0, one granule per block),
the scheduler's clock set to the trace's timestamps, and per request ``lookup(prompt)`` then
``put(prompt)`` -- what an engine does. A trace block id ``h`` (a chained prefix hash) becomes the
tokens ``h * B .. h * B + B - 1`` of a block of ``B`` tokens, so equal id chains are equal token
prefixes and get equal keys. A request whose last block is partial (the trace's ``tail_partial``)
ends in the first ``B // 2`` tokens of its last id instead, and the store keeps partial last blocks
(``partial_blocks = true``): what an engine's put of the whole prompt gives the store, a *tail* under
its own key (equal for equal ids), which the next turn extends under another one. The KV is a tiny
model's (4 KiB per block) filled with zeros: only placement is measured.

The store runs on a :class:`~tierkv.SyncTierKV`'s event-loop thread; :meth:`close` stops it.
Owns: the mapping from replay requests to library calls. May not be imported by the core.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ... import SyncTierKV, TierKV
from ..._keys import tail_key

__all__ = ["BLOCK_TOKENS", "LibraryPolicy", "library_config"]

#: tokens per block of the replayed library (any value works: placement is per block)
BLOCK_TOKENS = 16
# one layer, one KV head of 64: 16 tokens x 2 (K, V) x 64 x 2 bytes = one 4 KiB granule per block
_HF = {
    "num_hidden_layers": 1,
    "num_attention_heads": 1,
    "num_key_value_heads": 1,
    "hidden_size": 64,
    "head_dim": 64,
}
_BLOCK_NBYTES = BLOCK_TOKENS * 2 * 64 * 2


def library_config(capacity: int, policy: str | None = None) -> dict[str, Any]:
    """The configuration of the replayed store: one DRAM tier of exactly ``capacity`` blocks."""
    cfg: dict[str, Any] = {
        "model": {"name": "replay", "revision": "1", "hf_config": _HF},
        "kv_dtype": "float16",
        "block_tokens": BLOCK_TOKENS,
        "tiers": [
            {
                "name": "dram",
                "backend": "dram",
                "capacity": max(1, capacity) * _BLOCK_NBYTES,
                "granule": _BLOCK_NBYTES,
                "high_watermark": 1.0,
                "low_watermark": 1.0,
            }
        ],
        "partial_blocks": True,
        "telemetry": {"enabled": False},
    }
    if policy is not None:
        cfg["scheduler"] = {"policy": policy}
    return cfg


#: tokens of a partial last block in the replayed store (any value in 1 .. BLOCK_TOKENS - 1 works)
TAIL_TOKENS = BLOCK_TOKENS // 2


def tokens_of(ids: Sequence[int], tail_partial: bool = False) -> np.ndarray[Any, Any]:
    """The token ids of a request whose blocks have the trace ids ``ids``; ``tail_partial``: the
    last block is partial (its first :data:`TAIL_TOKENS` tokens)."""
    base = np.asarray(ids, dtype=np.int64) * BLOCK_TOKENS
    toks = (base[:, None] + np.arange(BLOCK_TOKENS, dtype=np.int64)[None, :]).reshape(-1)
    if tail_partial and len(ids):
        return toks[: len(toks) - BLOCK_TOKENS + TAIL_TOKENS]
    return toks


class LibraryPolicy:
    """A real TierKV as a replayable policy of ``capacity`` blocks (see the module docstring).

    ``policy``: the library's ``scheduler.policy`` (None: its default, what users get)."""

    def __init__(self, capacity: int, *, policy: str | None = None, name: str = "tierkv") -> None:
        self.name = name
        self.capacity = capacity
        self._clock = [0.0]
        # no scheduler service: the replay calls the store one request at a time
        self._sync = SyncTierKV.open(library_config(capacity, policy), scheduler=False)
        self.kv: TierKV = self._sync.aio
        sched = self.kv._sched
        sched.now = lambda: self._clock[0]  # type: ignore[method-assign]  # the trace's clock
        sched.set_capacity_blocks(capacity)
        self._zeros = np.zeros((1, 2, 0, 1, 64), dtype=np.float16)

    async def _request(self, ids: Sequence[int], tail_partial: bool) -> tuple[int, int]:
        kv = self.kv
        toks = tokens_of(ids, tail_partial)
        found = await kv.lookup(toks)
        lead = found.blocks + (1 if found.tail_tokens else 0)
        _, keys, _ = kv._s.keys(toks, None)
        index = kv._index
        hits = sum(1 for k in keys if k.hex() in index)
        if tail_partial:  # the tail, under its own key (its parent's and its tokens')
            parent = keys[-1] if keys else kv._s.scope_digest(None)[0]
            hits += tail_key(parent, toks[len(keys) * BLOCK_TOKENS :]).hex() in index
        if found.tail_tokens and found.blocks < len(keys):
            hits += 1  # a stored tail begins the block the walk stopped at (its id's first tokens)
        if len(self._zeros[0, 0]) != len(toks):
            self._zeros = np.zeros((1, 2, len(toks), 1, 64), dtype=np.float16)
        await kv.put(toks, self._zeros)
        return lead, hits

    def request(self, ids: Sequence[int], now: float, tail_partial: bool) -> tuple[int, int]:
        """lookup then put of the request's prompt at trace time ``now``."""
        if not ids:
            return 0, 0
        self._clock[0] = now
        return self._sync.call(self._request, ids, tail_partial)

    def close(self) -> None:
        """Close the store and stop its event-loop thread; idempotent."""
        self._sync.close()
