"""Head-granular EMA importance of KV blocks.

The engine reports attention statistics with :meth:`HeadImportance.report_attention`: for one layer, an
array ``head_scores`` of shape ``(query_heads, n_positions)`` holding the attention mass each query head put
on each key position (any non-negative scale: it is normalised per head), and ``positions`` (the key
positions, shape ``(n_positions,)``) plus the current decode position ``query_pos``.

Per (layer, KV head) and block, an EMA: ``imp = (1 - w) * imp * recency + w * mass``, where ``mass`` is the
block's normalised attention mass damped by positional distance, ``exp(-(query_pos - pos) / distance_scale)``
(``distance_scale = inf`` disables it), and ``recency`` decays entries not refreshed in this report.

Architecture: GQA groups of ``query_heads // kv_heads`` query heads take the **max** over their query heads
(one KV head serves them all: evicting it hurts the most demanding one); MLA (``mla=True``) collapses to one
entry per layer (the latent is shared by all heads). A block's eviction score is the weighted sum over
(layer, head) entries; ``head_weights`` defaults to uniform. During a predicted task switch
:meth:`set_multipliers` biases heads (e.g. up-weight heads that attend to tool context).

Pure numpy bookkeeping; not thread-safe.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import ConfigError, InputError

__all__ = ["HeadImportance"]


class HeadImportance:
    """EMA importance per (layer, KV head or latent) per block of ``block_tokens`` positions."""

    __slots__ = (
        "_imp",
        "_mult",
        "block_tokens",
        "distance_scale",
        "kv_heads",
        "layers",
        "mla",
        "query_heads",
        "weight",
    )

    def __init__(
        self,
        layers: int,
        query_heads: int,
        kv_heads: int,
        *,
        block_tokens: int = 16,
        max_blocks: int = 4096,
        weight: float = 0.3,
        distance_scale: float = math.inf,
        mla: bool = False,
    ) -> None:
        if layers < 1 or query_heads < 1 or kv_heads < 1 or query_heads % kv_heads:
            raise ConfigError(
                "model.heads", (layers, query_heads, kv_heads), "layers >= 1, query_heads a multiple of kv_heads"
            )
        if not 0.0 < weight <= 1.0:
            raise ConfigError("scheduler.importance.weight", weight, "a number in (0, 1]")
        if block_tokens < 1 or max_blocks < 1:
            raise ConfigError("scheduler.importance.block_tokens", block_tokens, "block_tokens, max_blocks >= 1")
        self.layers = layers
        self.query_heads = query_heads
        self.kv_heads = 1 if mla else kv_heads
        self.mla = mla
        self.block_tokens = block_tokens
        self.weight = weight
        self.distance_scale = distance_scale
        self._imp = np.zeros((layers, self.kv_heads, max_blocks), dtype=np.float64)
        self._mult = np.ones((layers, self.kv_heads), dtype=np.float64)

    def report_attention(
        self, layer: int, head_scores: np.ndarray, positions: np.ndarray, query_pos: int, recency: float = 1.0
    ) -> None:
        """Fold one report into the EMA (see the module docstring). ``InputError`` on bad shapes/values."""
        if not 0 <= layer < self.layers:
            raise InputError(f"layer {layer} out of range [0, {self.layers})")
        s = np.asarray(head_scores, dtype=np.float64)
        pos = np.asarray(positions, dtype=np.int64)
        if s.ndim != 2 or s.shape[0] != self.query_heads or pos.shape != (s.shape[1],):
            raise InputError(
                f"head_scores must be ({self.query_heads}, n) and positions (n,); got {s.shape}, {pos.shape}"
            )
        if not np.all(np.isfinite(s)) or np.any(s < 0) or np.any(pos < 0):
            raise InputError("head_scores must be finite and >= 0, positions >= 0")
        tot = s.sum(axis=1, keepdims=True)
        s = np.divide(s, tot, out=np.zeros_like(s), where=tot > 0)
        if math.isfinite(self.distance_scale):
            s = s * np.exp(-np.maximum(query_pos - pos, 0) / self.distance_scale)[None, :]
        # group query heads -> KV heads (GQA: max), MLA: max over all
        g = s.reshape(self.kv_heads, -1, s.shape[1]).max(axis=1)
        blocks = pos // self.block_tokens
        nb = self._imp.shape[2]
        keep = blocks < nb
        mass = np.zeros((self.kv_heads, nb))
        for h in range(self.kv_heads):
            mass[h] = np.bincount(blocks[keep], weights=g[h, keep], minlength=nb)[:nb]
        w = self.weight
        self._imp[layer] = (1.0 - w) * self._imp[layer] * recency + w * mass

    def importance(self, layer: int, head: int, block: int) -> float:
        return float(self._imp[layer, head, block])

    def set_multipliers(self, multipliers: np.ndarray | None) -> None:
        """Per-(layer, head) multipliers for a predicted task switch; None resets to 1."""
        if multipliers is None:
            self._mult[:] = 1.0
            return
        m = np.asarray(multipliers, dtype=np.float64)
        if m.shape != self._mult.shape or np.any(m < 0):
            raise InputError(f"multipliers must be non-negative of shape {self._mult.shape}")
        self._mult[:] = m

    def block_scores(self, head_weights: np.ndarray | None = None) -> np.ndarray:
        """Eviction score per block: sum over (layer, head) of weight x multiplier x importance (higher = keep)."""
        w = self._mult if head_weights is None else self._mult * np.asarray(head_weights, dtype=np.float64)
        return np.asarray(np.einsum("lh,lhb->b", w, self._imp))
