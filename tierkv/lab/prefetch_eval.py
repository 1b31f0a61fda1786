"""Replay of decode-resume requests that carry positions: what RoPE-aware prefetch buys in a fast tier.

Owns the positioned trace (:class:`PositionedRequest`, :func:`synth_positions`), the simulation of a
fast tier of limited capacity (LRU, demand fill) over an unbounded slow tier (:func:`simulate`) and the
policies it compares: no prefetch (``none``), the old readahead ``[n, n + w]`` of
:meth:`tierkv.scheduler.PrefetchWindow.blocks` (``readahead``), and :class:`tierkv.scheduler.PrefetchPlanner`
(``rope``; ``rope-noimp`` without the head importance), the planner object the library's ``prefetch`` uses,
``rope-fill`` the planner with ``fill_reach`` (the rest of the reach after the needed blocks, for a
dense engine), and, as the ablation of its layer classes, ``tail``: the same budget of blocks nearest before ``n``
(nearest first), then the stored blocks past ``n``.

The workload
------------
Sessions hold a stored prefix of ``L`` blocks. A request resumes a session at a decode position ``n``:
either at the end of its prefix (``n = L * block_tokens``, a new turn) or, with probability
``resume_frac``, inside it (a rewind: the engine re-decodes the stored continuation ``[n, L)``, e.g.
verifying it, and reads those blocks as the decode passes them). The decode runs from ``n`` through the
stored continuation and then ``decode_tokens`` positions more.

Ground truth of what the layers read (the *needed block-layer loads*), per request and block, counted
once per layer that reads the block during the decode:

* sliding layers: the blocks of ``[p - window, p)`` for every decode position ``p`` (``p`` from ``n`` to
  the last decode position);
* global layers, ``global_reads = "dense"``: every stored block before ``p`` (full attention reads all
  of them); ``"sparse"`` (an engine with block-sparse attention, Quest-like): the attention sink (block
  0), the blocks of ``[p - global_span, p)`` and the session's ``important`` far blocks (fixed per
  session, drawn once: what head importance learns).

The planner is told what the engine would report: after a session's first request the importance of its
important blocks (a score per block), and per class the span (``window`` for sliding layers,
``global_span`` for global ones); the readahead gets the same spans (its ``w`` is their max).

Timing: the prefetch of request ``r`` is issued ``lead`` requests before it (between the two, the
other requests' demand fills and prefetches go through the fast tier). A prefetch inserts the blocks of
its plan that are not in the fast tier, in the plan's order (the library submits promotions in that
order), each at the most-recent end; a need reads its blocks in position order, a hit refreshes the block,
a miss loads it from the slow tier into the fast tier.

Metrics (per policy): ``hit`` = needed block-layer loads found in the fast tier at need time / all
needed block-layer loads; ``wasted`` = prefetched blocks that were no hit of the request they were
prefetched for (evicted before, or not read) / prefetched blocks; ``promoted_gib`` = bytes the prefetch
promoted; ``demand_gib`` = bytes the misses loaded.

Pure computation, deterministic for a seed.
"""

from __future__ import annotations

import statistics
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .._model import ModelSpec
from ..errors import InputError
from ..scheduler import LayerClass, PrefetchPlanner, PrefetchWindow, layer_classes

__all__ = [
    "POLICIES",
    "EvalResult",
    "PositionedRequest",
    "Workload",
    "all_global_spec",
    "gemma_like_spec",
    "simulate",
    "synth_positions",
]

POLICIES = ("none", "readahead", "tail", "rope-noimp", "rope", "rope-fill")


def gemma_like_spec(window: int = 1024) -> ModelSpec:
    """24 layers, five sliding (``window`` tokens) to one global, GQA 8/4 x 128."""
    return ModelSpec(
        name="gemma-like-5to1",
        num_layers=24,
        num_attention_heads=8,
        num_kv_heads=4,
        head_dim=128,
        attention="gqa",
        layer_types=(("sliding_attention",) * 5 + ("full_attention",)) * 4,
        sliding_window=window,
    )


def all_global_spec() -> ModelSpec:
    """The same geometry with every layer global."""
    return ModelSpec(
        name="all-global", num_layers=24, num_attention_heads=8, num_kv_heads=4, head_dim=128, attention="gqa"
    )


@dataclass(frozen=True, slots=True)
class PositionedRequest:
    """One request: ``session``, its stored prefix of ``stored_blocks`` blocks, decode position ``n``."""

    session: int
    stored_blocks: int
    n: int


@dataclass(frozen=True, slots=True)
class Workload:
    """Trace parameters (see the module docstring)."""

    sessions: int = 48
    requests: int = 1500
    block_tokens: int = 256
    min_blocks: int = 8
    max_blocks: int = 64
    resume_frac: float = 0.4
    decode_tokens: int = 256
    zipf: float = 1.0
    important: int = 4
    global_span: int = 2048
    lead: int = 4


def synth_positions(w: Workload, seed: int) -> tuple[list[PositionedRequest], list[list[int]]]:
    """The requests and, per session, its important far blocks. InputError for bad parameters."""
    if w.sessions < 1 or w.requests < 1 or not 1 <= w.min_blocks <= w.max_blocks or not 0 <= w.resume_frac <= 1:
        raise InputError(f"workload: bad parameters {w!r}")
    rng = np.random.default_rng(seed)
    lengths = rng.integers(w.min_blocks, w.max_blocks + 1, size=w.sessions)
    weights = 1.0 / np.arange(1, w.sessions + 1) ** w.zipf
    weights /= weights.sum()
    important = []
    for L in lengths:
        far_end = max(2, int(L) - w.global_span // w.block_tokens)
        k = min(w.important, far_end - 1)
        important.append(sorted(int(b) for b in rng.choice(np.arange(1, far_end), size=k, replace=False)))
    out = []
    for s in rng.choice(w.sessions, size=w.requests, p=weights):
        L = int(lengths[s])
        if rng.random() < w.resume_frac:
            n = int(rng.integers(L * w.block_tokens // 4, L * w.block_tokens))
        else:
            n = L * w.block_tokens
        out.append(PositionedRequest(int(s), L, n))
    return out, important


def needed_loads(
    r: PositionedRequest, classes: Sequence[LayerClass], w: Workload, important: Sequence[int], reads: str
) -> dict[int, int]:
    """Block -> layers that read it during the request's decode (the ground truth)."""
    bt = w.block_tokens
    # the decode passes the stored continuation, then runs decode_tokens more positions
    end = max(r.n, r.stored_blocks * bt) + w.decode_tokens
    out: dict[int, int] = {}

    def add(lo: int, hi: int, layers: int) -> None:  # positions [lo, hi)
        for b in range(max(0, lo) // bt, min(r.stored_blocks, -(-hi // bt))):
            out[b] = out.get(b, 0) + layers

    for c in classes:
        if c.window is not None:
            add(r.n - c.window, end - 1, c.layers)
        elif reads == "dense":
            add(0, end - 1, c.layers)
        else:
            blocks = {0, *important}
            blocks.update(range(max(0, r.n - w.global_span) // bt, min(r.stored_blocks, -(-(end - 1) // bt))))
            for b in blocks:
                if b < r.stored_blocks:
                    out[b] = out.get(b, 0) + c.layers
    return out


@dataclass(frozen=True, slots=True)
class EvalResult:
    policy: str
    hit: float
    wasted: float
    promoted_gib: float
    demand_gib: float


def simulate(
    spec: ModelSpec,
    w: Workload,
    capacity_blocks: int,
    policy: str,
    seed: int,
    *,
    reads: str = "sparse",
    budget: int = 32,
) -> EvalResult:
    """One replay (see the module docstring). InputError for an unknown policy or reads mode."""
    if policy not in POLICIES:
        raise InputError(f"policy: expected one of {POLICIES}, got {policy!r}")
    if reads not in ("dense", "sparse"):
        raise InputError(f"reads: expected 'dense' or 'sparse', got {reads!r}")
    if capacity_blocks < 1:
        raise InputError(f"capacity_blocks: expected an int >= 1, got {capacity_blocks!r}")
    reqs, important = synth_positions(w, seed)
    bt = w.block_tokens
    classes = layer_classes(spec)
    block_bytes = spec.kv_layers * 2 * bt * spec.num_kv_heads * spec.head_dim * 2
    planner = PrefetchPlanner(bt, classes)
    window = PrefetchWindow(bt, min_window=bt)
    for c in classes:  # the spans the engine would report
        span = c.window if c.window is not None else w.global_span
        planner.observe_span(c.name, span)
        window.observe_span(c.name, span)
    fast: OrderedDict[tuple[int, int], None] = OrderedDict()
    seen: set[int] = set()  # sessions whose importance has been reported
    batches: dict[int, set[tuple[int, int]]] = {}
    hit_loads = all_loads = promoted = wasted = demand = 0

    def insert(key: tuple[int, int]) -> None:
        fast[key] = None
        fast.move_to_end(key)
        while len(fast) > capacity_blocks:
            fast.popitem(last=False)

    def prefetch(i: int) -> None:
        nonlocal promoted
        r = reqs[i]
        if policy == "none":
            return
        if policy == "readahead":
            order: Sequence[int] = window.blocks(r.n, total_blocks=r.stored_blocks)
        elif policy == "tail":
            before = min(-(-r.n // bt), r.stored_blocks)
            order = [*range(before - 1, -1, -1), *range(before, r.stored_blocks)][:budget]
        else:
            imp = None
            if policy != "rope-noimp" and r.session in seen:
                imp = np.zeros(r.stored_blocks)
                for rank, b in enumerate(important[r.session]):
                    imp[b] = 1.0 / (1 + rank)
            fill = policy == "rope-fill"
            order = planner.plan(r.n, r.stored_blocks, importance=imp, budget=budget, fill_reach=fill).order
        batch = set()
        for b in order:
            key = (r.session, b)
            if key not in fast:
                insert(key)
                batch.add(key)
                promoted += 1
        batches[i] = batch

    for i in range(min(w.lead, len(reqs))):
        prefetch(i)
    for i, r in enumerate(reqs):
        if i + w.lead < len(reqs):
            prefetch(i + w.lead)
        need = needed_loads(r, classes, w, important[r.session], reads)
        hits: set[tuple[int, int]] = set()
        for b in sorted(need):
            key = (r.session, b)
            all_loads += need[b]
            if key in fast:
                hit_loads += need[b]
                fast.move_to_end(key)
                hits.add(key)
            else:
                demand += 1
                insert(key)
        batch = batches.pop(i, set())
        wasted += len(batch - hits)
        seen.add(r.session)
    gib = block_bytes / 2**30
    return EvalResult(policy, hit_loads / max(1, all_loads), wasted / max(1, promoted), promoted * gib, demand * gib)


def mean_sd(values: Sequence[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0
