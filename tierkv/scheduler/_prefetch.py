"""RoPE-aware prefetch window.

With rotary position embeddings attention is dominated by nearby positions for *local* layers (sliding
window or learned locality) while *global* layers reach far back. Given the decode position ``n``, the
blocks covering ``[n, n + w]`` are promoted from lower tiers ahead of need. ``w`` per layer class is the
EMA of the observed attention span (distance from the query back to the farthest position holding a
``coverage`` share of the attention mass), clamped to ``[min_window, max_window]``; the prefetch window is
the maximum over classes (one layer of each class must be served).

Pure bookkeeping; not thread-safe.
"""

from __future__ import annotations

import numpy as np

from ..errors import ConfigError, InputError

__all__ = ["PrefetchWindow", "attention_span"]


def attention_span(scores: np.ndarray, positions: np.ndarray, query_pos: int, coverage: float = 0.9) -> int:
    """Smallest distance ``d`` such that positions within ``d`` of ``query_pos`` hold ``coverage`` of the mass."""
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    pos = np.asarray(positions, dtype=np.int64).reshape(-1)
    if s.shape != pos.shape or s.size == 0:
        raise InputError("scores and positions must be non-empty and of the same length")
    tot = s.sum()
    if tot <= 0:
        return 0
    dist = np.abs(query_pos - pos)
    order = np.argsort(dist, kind="stable")
    cum = np.cumsum(s[order]) / tot
    k = int(np.searchsorted(cum, coverage - 1e-12))
    return int(dist[order][min(k, len(order) - 1)])


class PrefetchWindow:
    """Adaptive window per layer class (``"local"``, ``"global"`` or any name)."""

    __slots__ = ("_span", "block_tokens", "max_window", "min_window", "weight")

    def __init__(
        self, block_tokens: int, *, min_window: int = 0, max_window: int = 1 << 20, weight: float = 0.2
    ) -> None:
        if block_tokens < 1 or min_window < 0 or max_window < min_window:
            raise ConfigError(
                "scheduler.prefetch", (block_tokens, min_window, max_window), "block_tokens >= 1, 0 <= min <= max"
            )
        if not 0.0 < weight <= 1.0:
            raise ConfigError("scheduler.prefetch.weight", weight, "a number in (0, 1]")
        self.block_tokens = block_tokens
        self.min_window = min_window
        self.max_window = max_window
        self.weight = weight
        self._span: dict[str, float] = {}

    def observe_span(self, layer_class: str, span_tokens: int) -> None:
        old = self._span.get(layer_class)
        self._span[layer_class] = (
            float(span_tokens) if old is None else (1 - self.weight) * old + self.weight * span_tokens
        )

    def window(self, layer_class: str | None = None) -> int:
        """Window in tokens for a class (or the max over classes), clamped."""
        if layer_class is None:
            w = max(self._span.values(), default=float(self.min_window))
        else:
            w = self._span.get(layer_class, float(self.min_window))
        return int(min(self.max_window, max(self.min_window, round(w))))

    def blocks(self, n: int, layer_class: str | None = None, total_blocks: int | None = None) -> list[int]:
        """Indices of the blocks covering positions ``[n, n + w]`` (clipped to ``total_blocks``)."""
        if n < 0:
            raise InputError(f"decode position must be >= 0, got {n}")
        lo = n // self.block_tokens
        hi = (n + self.window(layer_class)) // self.block_tokens
        if total_blocks is not None:
            hi = min(hi, total_blocks - 1)
        return list(range(lo, hi + 1))
