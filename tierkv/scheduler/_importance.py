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
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from ..errors import ConfigError, InputError

__all__ = ["BlockImportance", "HeadImportance"]


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

    def mass(self, head_scores: np.ndarray, positions: np.ndarray, query_pos: int, n_blocks: int) -> np.ndarray:
        """The attention mass of one report per (KV head or latent, block) for blocks ``0 .. n_blocks - 1``
        (shape ``(heads, n_blocks)``): normalised per query head, damped by distance, grouped over
        architecture (GQA: max over a group's query heads; MLA: max over all). Positions past the last
        block are left out. ``InputError`` on bad shapes/values (pure: changes nothing)."""
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
        keep = blocks < n_blocks
        out = np.zeros((self.kv_heads, n_blocks))
        for h in range(self.kv_heads):
            out[h] = np.bincount(blocks[keep], weights=g[h, keep], minlength=n_blocks)[:n_blocks]
        return out

    def check_layer(self, layer: int) -> None:
        if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or not 0 <= layer < self.layers:
            raise InputError(f"layer {layer!r} out of range [0, {self.layers})")

    def report_attention(
        self, layer: int, head_scores: np.ndarray, positions: np.ndarray, query_pos: int, recency: float = 1.0
    ) -> None:
        """Fold one report into the EMA (see the module docstring). ``InputError`` on bad shapes/values."""
        self.check_layer(layer)
        mass = self.mass(head_scores, positions, query_pos, self._imp.shape[2])
        w = self.weight
        self._imp[layer] = (1.0 - w) * self._imp[layer] * recency + w * mass

    @property
    def multipliers(self) -> np.ndarray:
        """The per-(layer, head) multipliers (a view; see :meth:`set_multipliers`)."""
        return self._mult

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


class BlockImportance:
    """Head importance per stored block, keyed by the block's key (never by position across sequences).

    Each key holds an EMA per (layer, KV head or latent), ``imp = (1 - w) * imp + w * mass``, where ``mass``
    is that block's share of one layer's report aggregated by architecture (:meth:`HeadImportance.mass`:
    GQA max over a group's query heads, MLA one entry per layer). A report names the key chain of the
    sequence it is about (:meth:`report`); only that chain's blocks change, every other block keeps its
    value. A block's *own* score is ``sum over (layer, head) of multiplier x imp``; its ranking
    :meth:`score` is the max of the own scores of the block and of every block below it in the reported
    chains, so ``score(parent) >= score(child)``: added to a ranking that keeps parents at least as high
    as their descendants, it keeps that order (a prefix is useless without its ancestors).

    Bounded: at most ``max_keys`` keys; the least recently reported are forgotten first (forgetting a
    block only ever leaves its ancestors' scores higher). ``version`` changes with every change of a score.
    Pure bookkeeping; not thread-safe.
    """

    __slots__ = ("_all", "_depth", "_dirty", "_eff", "_kids", "_own", "_parent", "heads", "max_keys", "version")

    def __init__(self, heads: HeadImportance, *, max_keys: int = 65_536) -> None:
        if max_keys < 1:
            raise ConfigError("scheduler.importance.max_keys", max_keys, "an int >= 1")
        self.heads = heads
        self.max_keys = max_keys
        self.version = 0
        self._dirty: set[str] = set()  # keys whose score changed since the last take_changed()
        self._all = False  # every score may have changed (new multipliers)
        self._own: OrderedDict[str, np.ndarray] = OrderedDict()
        self._eff: dict[str, float] = {}
        self._parent: dict[str, str | None] = {}
        self._depth: dict[str, int] = {}
        self._kids: dict[str, set[str]] = {}

    def __len__(self) -> int:
        return len(self._own)

    def __contains__(self, key: object) -> bool:
        return key in self._own

    def score(self, key: str) -> float:
        """The ranking score of block ``key`` (0 for a block never reported)."""
        return self._eff.get(key, 0.0)

    def scores(self) -> dict[str, float]:
        """Every reported block's ranking score by key (a read-only view: do not modify)."""
        return self._eff

    def own(self, key: str) -> np.ndarray | None:
        """The block's EMA per (layer, head) (a copy), or None."""
        a = self._own.get(key)
        return None if a is None else a.copy()

    def report(self, layer: int, mass: np.ndarray, chain: Sequence[str]) -> None:
        """Fold one layer's ``mass`` (``(heads, len(chain))``, from :meth:`HeadImportance.mass`) into the
        blocks of ``chain`` (the sequence's block keys, root first). ``InputError`` (nothing changed) on
        a bad layer, a mismatched shape or an empty chain."""
        h = self.heads
        h.check_layer(layer)
        m = np.asarray(mass, dtype=np.float64)
        if not chain or m.shape != (h.kv_heads, len(chain)):
            raise InputError(f"importance mass must be ({h.kv_heads}, {len(chain)}) for a chain of that many blocks")
        w = h.weight
        for i, k in enumerate(chain):
            a = self._own.get(k)
            if a is None:
                a = self._own[k] = np.zeros((h.layers, h.kv_heads), dtype=np.float64)
            else:
                self._own.move_to_end(k)
            a[layer] = (1.0 - w) * a[layer] + w * m[:, i]
            self._link(k, chain[i - 1] if i else None, i)
        for k in reversed(chain):  # leaf first: a parent's score takes its children's
            new = self._score_of(k)
            if self._eff.get(k) != new:
                self._eff[k] = new
                self._dirty.add(k)
        while len(self._own) > self.max_keys:
            self._forget(next(iter(self._own)))
        self.version += 1

    def take_changed(self) -> set[str] | None:
        """The keys whose :meth:`score` changed since the last call (and forget them), or None when
        any score may have changed (:meth:`set_multipliers`): what a ranking keyed by these scores
        must re-key."""
        if self._all:
            self._all = False
            self._dirty = set()
            return None
        out, self._dirty = self._dirty, set()
        return out

    def set_multipliers(self, multipliers: np.ndarray | None) -> None:
        """:meth:`HeadImportance.set_multipliers`, then every score is recomputed."""
        self.heads.set_multipliers(multipliers)
        for k in sorted(self._own, key=lambda x: -self._depth[x]):
            self._eff[k] = self._score_of(k)
        self._all = True
        self.version += 1

    def _score_of(self, k: str) -> float:
        own = float(np.sum(self.heads.multipliers * self._own[k]))
        kids = self._kids.get(k)
        if kids:
            own = max(own, max(self._eff.get(c, 0.0) for c in kids))
        return own

    def _link(self, k: str, parent: str | None, depth: int) -> None:
        old = self._parent.get(k, "")
        if old != parent:
            if old:
                self._kids.get(old, set()).discard(k)
            if parent is not None:
                self._kids.setdefault(parent, set()).add(k)
        self._parent[k] = parent
        self._depth[k] = depth

    def _forget(self, k: str) -> None:
        del self._own[k]
        if self._eff.pop(k, 0.0):
            self._dirty.add(k)
        self._depth.pop(k, None)
        p = self._parent.pop(k, None)
        if p is not None:
            kids = self._kids.get(p)
            if kids is not None:
                kids.discard(k)
                if not kids:
                    del self._kids[p]
        for c in self._kids.pop(k, set()):
            self._parent[c] = None
