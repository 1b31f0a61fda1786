"""RoPE-aware prefetch: which blocks a decode position will need, per layer class, and in what order.

Owns :class:`PrefetchPlanner` (the one planner the library's ``prefetch``/``hint(decode_position=)``
and the lab's evaluation :mod:`tierkv.lab.prefetch_eval` both use), its output :class:`PrefetchPlan`,
the layer classes :class:`LayerClass` (derived from a :class:`~tierkv.ModelSpec` by
:func:`layer_classes`), the per-class attention-span EMA :class:`PrefetchWindow` and
:func:`attention_span`.

Layer classes
-------------
A *sliding* (local) class is the model's ``"sliding_attention"`` layers: a query at position ``n``
attends to ``[n - window, n)`` with ``window = spec.sliding_window`` and to nothing before (a hard
structural limit). A *global* class is the ``"full_attention"`` layers (and MLA's): a query at ``n``
may attend anywhere in ``[0, n)``. Without a model spec (or one whose layers are all full
attention) there is one global class. Layers holding no KV (linear attention, Mamba) are no class.

What "needed" means
-------------------
The *reach* of a class at decode position ``n`` is every position its layers can attend to: sliding
``[n - window, n)``, global ``[0, n)``. A block (``block_tokens`` positions, block ``i`` holds
``[i * block_tokens, (i + 1) * block_tokens)``) before ``n`` that lies wholly outside the reach of
every class is **excluded**: no layer reads it at ``n`` nor at any later position (windows only move
forward), so promoting it is pure waste. Only a model whose layers are all sliding has excluded
blocks (those wholly before ``n - window``): a global class reaches every position.

Within its reach a class *needs* (the blocks that hold most of its attention mass, which the planner
promotes) under these assumptions about rotary position embeddings (RoPE):

* sliding class: attention decays with distance, and the observed span (the EMA of
  :func:`attention_span` reported for the class, at most ``window``; the whole window before any
  report) bounds where the mass is: positions ``[n - span, n)``, nearest first;
* global class: (1) the *attention sinks*, the first ``sink_blocks`` blocks, which every head of a
  RoPE model attends heavily whatever the distance (Xiao et al., StreamingLLM); (2) the recent span
  ``[n - span, n)`` (the observed EMA, ``default_span`` tokens before any report), nearest first; (3)
  the ``far_blocks`` blocks before that span which the per-block head importance ranks highest, when
  it is known (``importance``: a score per block index, higher = more attended, 0 = no evidence).

A dense engine still reads every block in a global class's reach; "needed" orders what it reads by
where the attention mass is, so that a bounded fast tier holds the blocks that matter most (a
sparse-attention engine reads only those).

Order and budget
----------------
``plan.order`` lists the needed blocks by urgency: first by the number of layers needing the block
(the sum of the layer counts of the classes that need it: a recent block a 5:1 local:global model
needs in all its layers comes before a sink only its global layers need), then by the block's best
rank within a needing class (sinks first, then nearest to ``n``, then by importance), then by index.
After them come the **lookahead** blocks: stored blocks wholly at or past ``n`` (a resumed prefix the
engine loads next as the decode moves on), in position order. The list holds only blocks in
``stored`` (all blocks when ``None``) and at most ``budget`` of them: the cut drops the least urgent.
With ``fill_reach`` the rest of the reach (stored blocks some class can attend to but none needs),
nearest to ``n`` first, comes between the needed blocks and the lookahead: a dense engine reads them at
``n``, sooner than the lookahead.

Pure computation; :class:`PrefetchWindow` and :class:`PrefetchPlanner` keep mutable EMAs (not
thread-safe: the library calls them from the event loop only).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..errors import ConfigError, InputError

if TYPE_CHECKING:
    from .._model import ModelSpec

__all__ = ["LayerClass", "PrefetchPlan", "PrefetchPlanner", "PrefetchWindow", "attention_span", "layer_classes"]

#: class names :func:`layer_classes` gives (``report_attention``'s ``layer_class`` of those layers)
LOCAL = "local"
GLOBAL = "global"


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
    """Adaptive attention span per layer class (``"local"``, ``"global"`` or any name): an EMA.

    :meth:`blocks` is the plain readahead ``[n, n + w]`` (``w`` the max over classes) that the library
    used before :class:`PrefetchPlanner`; the lab keeps it as the baseline it is measured against.
    """

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

    def observed(self, layer_class: str) -> int | None:
        """The class's span EMA in tokens (clamped), or None before any report of it."""
        return self.window(layer_class) if layer_class in self._span else None

    def window(self, layer_class: str | None = None) -> int:
        """Window in tokens for a class (or the max over classes), clamped."""
        if layer_class is None:
            w = max(self._span.values(), default=float(self.min_window))
        else:
            w = self._span.get(layer_class, float(self.min_window))
        return int(min(self.max_window, max(self.min_window, round(w))))

    def blocks(self, n: int, layer_class: str | None = None, total_blocks: int | None = None) -> list[int]:
        """Readahead: indices of the blocks covering positions ``[n, n + w]`` (clipped to ``total_blocks``)."""
        if n < 0:
            raise InputError(f"decode position must be >= 0, got {n}")
        lo = n // self.block_tokens
        hi = (n + self.window(layer_class)) // self.block_tokens
        if total_blocks is not None:
            hi = min(hi, total_blocks - 1)
        return list(range(lo, hi + 1))


@dataclass(frozen=True, slots=True)
class LayerClass:
    """Layers sharing an attention reach: ``layers`` of them, the first at KV layer ``first_layer``;
    ``window`` tokens for a sliding class, None for a global one."""

    name: str
    layers: int
    first_layer: int = 0
    window: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError("prefetch.layer_class.name", self.name, "a non-empty string")
        for f, lo in (("layers", 1), ("first_layer", 0)):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ConfigError(f"prefetch.layer_class.{f}", v, f"an int >= {lo}")
        w = self.window
        if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w < 1):
            raise ConfigError("prefetch.layer_class.window", w, "None (global) or an int >= 1 (sliding)")


def layer_classes(spec: ModelSpec | None) -> tuple[LayerClass, ...]:
    """The layer classes of ``spec`` (KV layers only, in model order): ``"local"`` for its
    ``"sliding_attention"`` layers (window ``spec.sliding_window``), ``"global"`` for the others; one
    global class of one layer without a spec."""
    if spec is None:
        return (LayerClass(GLOBAL, 1),)
    kinds = [t for t in spec.layer_types if t in ("full_attention", "sliding_attention")] or (
        ["full_attention"] * spec.kv_layers
    )
    out = []
    for kind, name in (("full_attention", GLOBAL), ("sliding_attention", LOCAL)):
        idx = [i for i, t in enumerate(kinds) if t == kind]
        if idx:
            out.append(LayerClass(name, len(idx), idx[0], spec.sliding_window if kind == "sliding_attention" else None))
    return tuple(sorted(out, key=lambda c: c.first_layer))


def class_of_layer(spec: ModelSpec | None, kv_layer: int) -> str:
    """The class name (``"local"``/``"global"``) of KV layer ``kv_layer`` of ``spec`` (global without one)."""
    if spec is None or not spec.layer_types:
        return GLOBAL
    kinds = [t for t in spec.layer_types if t in ("full_attention", "sliding_attention")]
    if not 0 <= kv_layer < len(kinds):
        raise InputError(f"layer {kv_layer!r} out of range [0, {len(kinds)})")
    return LOCAL if kinds[kv_layer] == "sliding_attention" else GLOBAL


@dataclass(frozen=True, slots=True)
class PrefetchPlan:
    """What :meth:`PrefetchPlanner.plan` decided at one decode position.

    ``order``: block indices to promote, most urgent first (at most the budget); ``layers``: per entry of
    ``order``, the number of layers needing it (0 for a lookahead block); ``excluded``: the stored blocks
    no layer class will read (never to be promoted); ``lookahead``: how many entries of ``order`` (its
    tail) are lookahead blocks."""

    order: tuple[int, ...]
    layers: tuple[int, ...]
    excluded: frozenset[int]
    lookahead: int


def _int_at_least(what: str, v: object, lo: int) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or int(v) < lo:
        raise InputError(f"{what}: expected an int >= {lo}, got {v!r}")
    return int(v)


class PrefetchPlanner:
    """Plans the promotions for a decode position (see the module docstring for the contract).

    ``classes``: the model's layer classes (:func:`layer_classes`); ``sink_blocks``: attention-sink
    blocks of a global class; ``default_span``: a global class's recent span in tokens before any
    report (default 4 blocks); ``far_blocks``: importance-ranked blocks a global class adds; ``weight``:
    the EMA weight of the observed spans (:attr:`spans`, fed by :meth:`observe_span`).
    Raises ConfigError for a bad parameter (naming it).
    """

    __slots__ = ("block_tokens", "classes", "default_span", "far_blocks", "sink_blocks", "spans")

    def __init__(
        self,
        block_tokens: int,
        classes: Sequence[LayerClass] | None = None,
        *,
        sink_blocks: int = 1,
        default_span: int | None = None,
        far_blocks: int = 8,
        weight: float = 0.2,
    ) -> None:
        for f, v, lo in (
            ("block_tokens", block_tokens, 1),
            ("sink_blocks", sink_blocks, 0),
            ("far_blocks", far_blocks, 0),
        ):
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ConfigError(f"scheduler.prefetch.{f}", v, f"an int >= {lo}")
        span = 4 * block_tokens if default_span is None else default_span
        if isinstance(span, bool) or not isinstance(span, int) or span < 0:
            raise ConfigError("scheduler.prefetch.default_span", span, "an int >= 0 (tokens)")
        cls = tuple(classes) if classes is not None else layer_classes(None)
        if not cls or not all(isinstance(c, LayerClass) for c in cls):
            raise ConfigError("scheduler.prefetch.classes", cls, "a non-empty sequence of LayerClass")
        if len({c.name for c in cls}) != len(cls):
            raise ConfigError("scheduler.prefetch.classes", [c.name for c in cls], "distinct class names")
        self.block_tokens = block_tokens
        self.classes = cls
        self.sink_blocks = sink_blocks
        self.default_span = span
        self.far_blocks = far_blocks
        self.spans = PrefetchWindow(block_tokens, weight=weight)

    def observe_span(self, layer_class: str, span_tokens: int) -> None:
        """Fold one observed attention span (tokens) of ``layer_class`` into its EMA."""
        self.spans.observe_span(layer_class, span_tokens)

    def span(self, c: LayerClass) -> int:
        """The recent span in tokens the class needs: the observed EMA (a sliding class: at most its
        window; before any report the whole window), or ``default_span`` for a global class."""
        seen = self.spans.observed(c.name)
        if c.window is not None:
            return c.window if seen is None else min(c.window, max(seen, 1))
        return self.default_span if seen is None else seen

    def excluded_before(self, n: int) -> int:
        """Blocks ``0 .. k - 1`` are outside every class's reach at decode position ``n``: returns ``k``."""
        if any(c.window is None for c in self.classes):
            return 0
        lo = n - max(c.window or 0 for c in self.classes)  # the earliest position any layer reaches
        return max(0, lo) // self.block_tokens

    def plan(
        self,
        n: int,
        total_blocks: int,
        *,
        stored: Collection[int] | None = None,
        importance: Sequence[float] | np.ndarray | None = None,
        budget: int | None = None,
        fill_reach: bool = False,
    ) -> PrefetchPlan:
        """The plan at decode position ``n`` for a sequence of ``total_blocks`` blocks, of which those in
        ``stored`` (indices; all when None) exist. ``importance``: a score per block index (length
        ``total_blocks``, finite, >= 0) or None; ``budget``: at most this many blocks in ``order``;
        ``fill_reach``: after the needed blocks (before the lookahead), the other stored blocks in
        some class's reach, nearest to ``n`` first (their ``layers`` entry is 0): for an engine whose
        global layers read every block (dense attention), not only those holding the mass.

        Raises InputError naming the argument for an ``n``, ``total_blocks`` or ``budget`` that is not
        an int >= 0, an ``importance`` of another length or with a negative or non-finite score."""
        n = _int_at_least("decode_position", n, 0)
        total = _int_at_least("total_blocks", total_blocks, 0)
        cap = None if budget is None else _int_at_least("budget", budget, 0)
        imp: np.ndarray | None = None
        if importance is not None:
            imp = np.asarray(importance, dtype=np.float64).reshape(-1)
            if imp.shape != (total,):
                raise InputError(f"importance: expected one score per block ({total}), got {imp.shape[0]}")
            if not np.all(np.isfinite(imp)) or np.any(imp < 0):
                raise InputError("importance: scores must be finite and >= 0")
        have = set(range(total)) if stored is None else {int(i) for i in stored if 0 <= int(i) < total}
        bt = self.block_tokens
        past = -(-n // bt)  # blocks wholly or partly before n: 0 .. past - 1
        before = min(past, total)
        cut = self.excluded_before(n)
        excluded = frozenset(i for i in range(min(cut, total)) if i in have)

        need_layers: dict[int, int] = {}
        best_rank: dict[int, int] = {}

        def need(i: int, c: LayerClass, rank: int) -> None:
            if i not in have or i >= before:
                return
            need_layers[i] = need_layers.get(i, 0) + c.layers
            best_rank[i] = min(best_rank.get(i, rank), rank)

        for c in self.classes:
            span = self.span(c)
            recent_lo = max(0, n - span) // bt
            rank = 0
            picked: set[int] = set()
            if c.window is None:
                for i in range(min(self.sink_blocks, before)):
                    need(i, c, rank)
                    picked.add(i)
                    rank += 1
            for i in range(before - 1, recent_lo - 1, -1):  # nearest first
                if i not in picked:
                    need(i, c, rank)
                    picked.add(i)
                    rank += 1
            if c.window is None and imp is not None and self.far_blocks:
                far = [i for i in range(recent_lo) if i not in picked and imp[i] > 0]
                far.sort(key=lambda i: (-imp[i], i))
                for i in far[: self.far_blocks]:
                    need(i, c, rank)
                    rank += 1
        needed = sorted(need_layers, key=lambda i: (-need_layers[i], best_rank[i], i))
        if fill_reach:  # the rest of the reach, nearest first: what a dense engine reads too
            reach_lo = 0 if any(c.window is None for c in self.classes) else cut
            needed += [i for i in range(before - 1, reach_lo - 1, -1) if i in have and i not in need_layers]
        ahead = [i for i in range(before, total) if i in have]
        order = needed + ahead
        if cap is not None:
            order = order[:cap]
        layers = tuple(need_layers.get(i, 0) for i in order)
        return PrefetchPlan(tuple(order), layers, excluded, sum(1 for i in order if i >= before))
