"""Cache policies for the trace-replay lab (block-granular prefix caches of a fixed capacity).

Every policy implements :class:`Policy`: ``request(ids, now, tail_partial)`` looks up the request's
chained prefix-block ids *before* changing anything (so a request never hits on blocks it inserts itself),
then touches/inserts them, and returns ``(leading_hits, block_hits)``: the length of the leading run of
resident blocks (what a prefix cache can reuse) and the number of resident blocks.

Classical baselines touch blocks in request order, as a serving engine does:

* ``lru`` -- least recently used.
* ``lfu`` -- least frequently used (frequency while resident), ties broken by recency.
* ``arc`` -- Adaptive Replacement Cache (Megiddo & Modha, FAST'03): T1/T2 plus ghost lists B1/B2.
* ``s3fifo`` -- S3-FIFO (Yang et al., SOSP'23): small FIFO (10%), main FIFO with 2-bit frequency, ghost FIFO.
* ``tinylfu`` -- W-TinyLFU (Einziger et al., 2017): 1% window LRU, segmented-LRU main (20% probation),
  admission by frequency. The frequency "sketch" is an exact counter dict halved every ``10 x capacity``
  accesses (the reset/ageing of TinyLFU without the count-min approximation).
* ``belady`` -- Belady's MIN with bypass (offline, needs the next-use index of every access): evicts the
  block used furthest in the future and does not admit a block whose next use is further than every
  resident block's. An upper bound for block hits; prefix-consistent because a parent's next use always
  precedes its child's.

``tierkv`` is :class:`TierKVPolicy`, driven by the library's :class:`~tierkv.scheduler.ReusePredictor`.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Protocol

import numpy as np

from .._errors import ConfigError
from ._buckets import bucketize, lowest, push
from ._predictor import N_CELLS, PredictorConfig, ReusePredictor
from ._response import ResponseModel, response_class
from ._tau import TauAdapter

__all__ = [
    "ArcPolicy",
    "BeladyPolicy",
    "LfuPolicy",
    "LruPolicy",
    "OptGen",
    "Policy",
    "S3FifoPolicy",
    "SessionOptions",
    "SessionPolicy",
    "TierKVOptions",
    "TierKVPolicy",
    "TinyLfuPolicy",
    "next_use_index",
    "session_class",
]

_INF = 1 << 62
_LN4 = math.log(4.0)
_LN_HALF = math.log(0.5)
_QUANTA = 64.0  # tierkv keys are quantised to 1/64 of a natural-log unit


class Policy(Protocol):
    """A replayable cache policy of a fixed capacity in blocks."""

    name: str

    def request(self, ids: Sequence[int], now: float, tail_partial: bool) -> tuple[int, int]:
        """Serve one request; return ``(leading_hits, block_hits)``."""
        ...


def _hits(cache: dict[int, object] | OrderedDict[int, object], ids: Sequence[int]) -> tuple[int, int, list[bool]]:
    flags = [b in cache for b in ids]
    lead = 0
    for f in flags:
        if not f:
            break
        lead += 1
    return lead, sum(flags), flags


class LruPolicy:
    """Least recently used."""

    __slots__ = ("cache", "capacity", "name")

    def __init__(self, capacity: int) -> None:
        self.name = "lru"
        self.capacity = capacity
        self.cache: OrderedDict[int, None] = OrderedDict()

    def request(self, ids: Sequence[int], now: float, tail_partial: bool) -> tuple[int, int]:
        cache = self.cache
        lead, hits, _flags = _hits(cache, ids)  # type: ignore[arg-type]
        cap = self.capacity
        move = cache.move_to_end
        for b in ids:
            if b in cache:
                move(b)
            else:
                if len(cache) >= cap:
                    cache.popitem(last=False)
                cache[b] = None
        return lead, hits


class LfuPolicy:
    """Least frequently used (in-cache frequency), ties by least recent; lazy heap."""

    __slots__ = ("cache", "capacity", "clock", "heap", "name")

    def __init__(self, capacity: int) -> None:
        self.name = "lfu"
        self.capacity = capacity
        self.cache: dict[int, tuple[int, int]] = {}
        self.heap: list[tuple[int, int, int]] = []
        self.clock = 0

    def request(self, ids: Sequence[int], now: float, tail_partial: bool) -> tuple[int, int]:
        cache, heap = self.cache, self.heap
        lead, hits, _flags = _hits(cache, ids)  # type: ignore[arg-type]
        for b in ids:
            self.clock += 1
            if b in cache:
                freq = cache[b][0] + 1
            else:
                freq = 1
                while len(cache) >= self.capacity:
                    fr, ck, v = heapq.heappop(heap)
                    if cache.get(v) == (fr, ck):
                        del cache[v]
            cache[b] = (freq, self.clock)
            heapq.heappush(heap, (freq, self.clock, b))
        if len(heap) > 4 * len(cache) + 1024:
            self.heap = [(fr, ck, v) for v, (fr, ck) in cache.items()]
            heapq.heapify(self.heap)
        return lead, hits


class ArcPolicy:
    """Adaptive Replacement Cache."""

    __slots__ = ("b1", "b2", "c", "name", "p", "t1", "t2")

    def __init__(self, capacity: int) -> None:
        self.name = "arc"
        self.c = capacity
        self.p = 0.0
        self.t1: OrderedDict[int, None] = OrderedDict()
        self.t2: OrderedDict[int, None] = OrderedDict()
        self.b1: OrderedDict[int, None] = OrderedDict()
        self.b2: OrderedDict[int, None] = OrderedDict()

    def _replace(self, in_b2: bool) -> None:
        t1, t2 = self.t1, self.t2
        if t1 and (len(t1) > self.p or (in_b2 and len(t1) == self.p)):
            k, _ = t1.popitem(last=False)
            self.b1[k] = None
        elif t2:
            k, _ = t2.popitem(last=False)
            self.b2[k] = None
        else:
            k, _ = t1.popitem(last=False)
            self.b1[k] = None

    def request(self, ids: Sequence[int], now: float, tail_partial: bool) -> tuple[int, int]:
        t1, t2, b1, b2, c = self.t1, self.t2, self.b1, self.b2, self.c
        flags = [(b in t1 or b in t2) for b in ids]
        lead = 0
        for f in flags:
            if not f:
                break
            lead += 1
        for b in ids:
            if b in t1 or b in t2:
                if b in t1:
                    del t1[b]
                else:
                    del t2[b]
                t2[b] = None
                continue
            if b in b1:
                self.p = min(float(c), self.p + max(len(b2) / len(b1), 1.0))
                self._replace(False)
                del b1[b]
                t2[b] = None
            elif b in b2:
                self.p = max(0.0, self.p - max(len(b1) / len(b2), 1.0))
                self._replace(True)
                del b2[b]
                t2[b] = None
            else:
                l1 = len(t1) + len(b1)
                if l1 == c:
                    if len(t1) < c:
                        b1.popitem(last=False)
                        self._replace(False)
                    else:
                        t1.popitem(last=False)
                elif l1 < c and l1 + len(t2) + len(b2) >= c:
                    if l1 + len(t2) + len(b2) >= 2 * c:
                        b2.popitem(last=False)
                    if len(t1) + len(t2) >= c:
                        self._replace(False)
                t1[b] = None
        return lead, sum(flags)


class S3FifoPolicy:
    """S3-FIFO: small FIFO (10%), main FIFO with frequency bits (max 3), ghost FIFO of main's size."""

    __slots__ = ("freq", "ghost", "main", "main_cap", "name", "small", "small_cap")

    def __init__(self, capacity: int) -> None:
        self.name = "s3fifo"
        self.small_cap = max(1, capacity // 10)
        self.main_cap = capacity - self.small_cap  # 0 only when capacity == 1
        self.small: OrderedDict[int, None] = OrderedDict()
        self.main: OrderedDict[int, None] = OrderedDict()
        self.ghost: OrderedDict[int, None] = OrderedDict()
        self.freq: dict[int, int] = {}

    def _evict_main(self) -> None:
        main, freq = self.main, self.freq
        while main:
            k, _ = main.popitem(last=False)
            f = freq[k]
            if f > 0:
                freq[k] = f - 1
                main[k] = None
            else:
                del freq[k]
                return

    def _evict_small(self) -> None:
        small, freq = self.small, self.freq
        while small:
            k, _ = small.popitem(last=False)
            if freq[k] > 0 and self.main_cap > 0:
                freq[k] = 0
                if len(self.main) >= self.main_cap:
                    self._evict_main()
                self.main[k] = None
            else:
                del freq[k]
                ghost = self.ghost
                ghost[k] = None
                if len(ghost) > max(1, self.main_cap):
                    ghost.popitem(last=False)
                return

    def request(self, ids: Sequence[int], now: float, tail_partial: bool) -> tuple[int, int]:
        freq = self.freq
        lead, hits, _flags = _hits(freq, ids)  # type: ignore[arg-type]
        for b in ids:
            if b in freq:
                v = freq[b]
                if v < 3:
                    freq[b] = v + 1
                continue
            if b in self.ghost and self.main_cap > 0:
                del self.ghost[b]
                while len(self.main) >= self.main_cap:
                    self._evict_main()
                self.main[b] = None
            else:
                while len(self.small) >= self.small_cap:
                    self._evict_small()
                self.small[b] = None
            freq[b] = 0
        return lead, hits


class TinyLfuPolicy:
    """W-TinyLFU: window LRU (1%) -> TinyLFU admission -> SLRU main (probation 20% / protected 80%)."""

    __slots__ = ("counts", "name", "prob", "prob_cap", "prot", "prot_cap", "reset_at", "seen", "win", "win_cap")

    def __init__(self, capacity: int) -> None:
        self.name = "tinylfu"
        self.win_cap = max(1, capacity // 100)
        main = capacity - self.win_cap
        self.prot_cap = int(main * 0.8)
        self.prob_cap = main - self.prot_cap
        self.win: OrderedDict[int, None] = OrderedDict()
        self.prob: OrderedDict[int, None] = OrderedDict()
        self.prot: OrderedDict[int, None] = OrderedDict()
        self.counts: dict[int, int] = {}
        self.seen = 0
        self.reset_at = 10 * capacity

    def _count(self, b: int) -> None:
        c = self.counts
        c[b] = c.get(b, 0) + 1
        self.seen += 1
        if self.seen >= self.reset_at:
            self.seen //= 2
            self.counts = {k: v // 2 for k, v in c.items() if v > 1}

    def _to_main(self, cand: int) -> None:
        prob, prot = self.prob, self.prot
        if self.prob_cap + self.prot_cap == 0:
            return
        if len(prob) + len(prot) < self.prob_cap + self.prot_cap:
            prob[cand] = None
            return
        victim = next(iter(prob)) if prob else next(iter(prot))
        c = self.counts
        if c.get(cand, 0) > c.get(victim, 0):
            if victim in prob:
                del prob[victim]
            else:
                del prot[victim]
            prob[cand] = None

    def request(self, ids: Sequence[int], now: float, tail_partial: bool) -> tuple[int, int]:
        win, prob, prot = self.win, self.prob, self.prot
        flags = [(b in win or b in prob or b in prot) for b in ids]
        lead = 0
        for f in flags:
            if not f:
                break
            lead += 1
        for b in ids:
            self._count(b)
            if b in win or b in prob or b in prot:
                if b in win:
                    win.move_to_end(b)
                elif b in prob:
                    del prob[b]
                    prot[b] = None
                    if len(prot) > self.prot_cap:
                        k, _ = prot.popitem(last=False)
                        prob[k] = None
                else:
                    prot.move_to_end(b)
                continue
            win[b] = None
            if len(win) > self.win_cap:
                k, _ = win.popitem(last=False)
                self._to_main(k)
        return lead, sum(flags)


def next_use_index(requests: Sequence[Sequence[int]]) -> list[list[int]]:
    """For every access (request i, position j): the global access index of the block's next use, or a huge int."""
    out: list[list[int]] = [[] for _ in requests]
    nxt: dict[int, int] = {}
    pos = sum(len(r) for r in requests)
    for i in range(len(requests) - 1, -1, -1):
        ids = requests[i]
        pos -= len(ids)
        row = [0] * len(ids)
        for j in range(len(ids) - 1, -1, -1):
            b = ids[j]
            row[j] = nxt.get(b, _INF)
            nxt[b] = pos + j
        out[i] = row
    return out


class BeladyPolicy:
    """Belady's MIN with bypass; ``next_uses[i]`` is :func:`next_use_index` for request ``i`` (served in order)."""

    __slots__ = ("cache", "capacity", "heap", "i", "name", "next_uses")

    def __init__(self, capacity: int, next_uses: list[list[int]]) -> None:
        self.name = "belady"
        self.capacity = capacity
        self.next_uses = next_uses
        self.cache: dict[int, int] = {}
        self.heap: list[tuple[int, int]] = []  # (-next_use, block)
        self.i = 0

    def request(self, ids: Sequence[int], now: float, tail_partial: bool) -> tuple[int, int]:
        cache, heap, cap = self.cache, self.heap, self.capacity
        lead, hits, _flags = _hits(cache, ids)  # type: ignore[arg-type]
        nu_row = self.next_uses[self.i]
        self.i += 1
        push, pop = heapq.heappush, heapq.heappop
        for b, nu in zip(ids, nu_row, strict=True):
            if b in cache:
                if nu >= _INF:
                    del cache[b]
                else:
                    cache[b] = nu
                    push(heap, (-nu, b))
                continue
            if nu >= _INF:
                continue
            if len(cache) >= cap:
                while True:
                    neg, v = heap[0]
                    if cache.get(v) == -neg:
                        break
                    pop(heap)
                if -neg <= nu:
                    continue  # bypass: everything resident is needed sooner
                pop(heap)
                del cache[v]
            cache[b] = nu
            push(heap, (-nu, b))
        if len(heap) > 4 * len(cache) + 1024:
            self.heap = [(-nu, v) for v, nu in cache.items()]
            heapq.heapify(self.heap)
        return lead, hits


@dataclass(frozen=True, slots=True)
class TierKVOptions:
    """Components of the tierkv policy; each flag off is one ablation.

    * ``predictor`` -- a block's value is its predicted reuse probability (off: every block worth 1, so
      the ranking degenerates to recency: LRU with the other components).
    * ``prefix_tree`` -- a parent ranks at least as high as any of its children in the request (a child
      is useless without its parent) and blocks are touched leaf-first.
    * ``fanout`` -- blocks shared by ``fanout_protect`` or more continuations are protected (value x4).
    * ``bypass`` -- do not admit a block that would rank below the current victim.
    * ``size`` -- a partial trailing block is worth half (its id changes as soon as tokens are appended).
    * ``optgen`` -- train the predictor on what an optimal cache of this size would have kept
      (:class:`OptGen` over the past) instead of on "reused within the horizon".
    * ``quick_step`` -- seconds: a continuation this soon after its previous turn is labelled
      ``reasoning_step`` (0 disables the rule; ablation ``tierkv-no-quick-step``).
    * ``shape`` -- prompt length and block position as predictor evidence (off: one shape bucket).
    * ``decay`` -- exponential recency decay with time constant ``tau_s`` (off: no recency at all).
    * ``response`` -- at a request's completion (:meth:`TierKVPolicy.respond`), re-weight its blocks by the
      learned calibration of its answer-length class (:class:`~tierkv.scheduler._response.ResponseModel`).
    * ``completion`` -- at a request's completion, its blocks' recency counts from the completion time
      instead of the arrival (needs ``decay``).
    * ``shadow_taus`` -- adapt ``tau`` online (needs ``decay``; empty: fixed ``tau_s``): each candidate
      replays the same keys (value + ``t / tau``) on a spatially sampled mini-cache (about
      ``shadow_blocks`` blocks, the sample rate scaled with the capacity); every ``adapt_every``
      requests the candidate with the most (decayed by ``adapt_decay``) sampled hits becomes ``tau`` if it
      beats the current one by ``shadow_margin``, and the resident blocks are re-keyed (O(resident)).
    """

    predictor: bool = True
    prefix_tree: bool = True
    fanout: bool = True
    bypass: bool = True
    size: bool = True
    decay: bool = True
    optgen: bool = True
    fanout_protect: int = 4
    tau_s: float = 300.0
    quick_step: float = 30.0
    shape: bool = True
    response: bool = True
    completion: bool = True
    shadow_taus: tuple[float, ...] = (30.0, 60.0, 120.0, 300.0)
    shadow_blocks: int = 1024
    shadow_margin: float = 0.02
    adapt_every: int = 32
    adapt_decay: float = 0.98
    predictor_config: PredictorConfig = field(default_factory=PredictorConfig)

    def __post_init__(self) -> None:
        if isinstance(self.fanout_protect, bool) or not isinstance(self.fanout_protect, int) or self.fanout_protect < 2:
            raise ConfigError("tierkv.fanout_protect", self.fanout_protect, "an integer >= 2")
        if not (isinstance(self.tau_s, (int, float)) and math.isfinite(self.tau_s) and self.tau_s > 0):
            raise ConfigError("tierkv.tau_s", self.tau_s, "a finite number > 0")
        if not (isinstance(self.quick_step, (int, float)) and math.isfinite(self.quick_step) and self.quick_step >= 0):
            raise ConfigError("tierkv.quick_step", self.quick_step, "a finite number >= 0")
        if not all(isinstance(t, (int, float)) and math.isfinite(t) and t > 0 for t in self.shadow_taus):
            raise ConfigError("tierkv.shadow_taus", self.shadow_taus, "finite numbers > 0")
        for name in ("shadow_blocks", "adapt_every"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"tierkv.{name}", v, "an integer >= 1")
        if not (isinstance(self.shadow_margin, (int, float)) and 0 <= self.shadow_margin < math.inf):
            raise ConfigError("tierkv.shadow_margin", self.shadow_margin, "a finite number >= 0")
        if not (isinstance(self.adapt_decay, (int, float)) and 0 < self.adapt_decay <= 1):
            raise ConfigError("tierkv.adapt_decay", self.adapt_decay, "a number in (0, 1]")


class OptGen:
    """Causal reconstruction of Belady's decisions on the past (OPTgen, Jain & Lin, ISCA'16).

    Time advances one quantum per request. When a block is accessed again, the interval since its previous
    access was an optimal-cache hit iff the cache occupancy (blocks an optimal cache of ``capacity`` holds
    live) stayed below ``capacity`` over the whole interval; a hit then occupies the interval. Intervals
    longer than ``window`` quanta count as misses. ``label`` needs only the past: no future information.
    """

    __slots__ = ("capacity", "i", "lastq", "occ", "window")

    def __init__(self, capacity: int, window: int = 4096) -> None:
        self.capacity = capacity
        self.window = window
        self.occ = np.zeros(window, dtype=np.int64)
        self.lastq: dict[int, int] = {}
        self.i = -1

    def label(self, ids: Sequence[int]) -> list[bool]:
        """Start the next quantum with this request; return per block whether its reuse was an OPT hit."""
        self.i += 1
        i, w, occ, lastq, cap = self.i, self.window, self.occ, self.lastq, self.capacity
        e = i % w
        occ[e] = 0
        out = [False] * len(ids)
        groups: dict[int, list[int]] = {}
        for j, b in enumerate(ids):
            q = lastq.get(b)
            if q is not None and i - q < w and q < i:
                g = groups.get(q)
                if g is None:
                    groups[q] = [j]
                else:
                    g.append(j)
            lastq[b] = i
        for q, js in groups.items():
            a = q % w
            if a < e:
                m = int(occ[a:e].max())
            else:
                m = int(occ[a:].max())
                if e:
                    m = max(m, int(occ[:e].max()))
            room = cap - m
            if room <= 0:
                continue
            take = js[:room]  # positions in order: parents first
            k = len(take)
            if a < e:
                occ[a:e] += k
            else:
                occ[a:] += k
                if e:
                    occ[:e] += k
            for j in take:
                out[j] = True
        return out


class TierKVPolicy:
    """tierkv's replay policy: predicted reuse probability with exponential recency decay.

    A resident block's chance of being reused soon is modelled as ``p * exp(-(now - t_last) / tau)``:
    ``p`` is the predictor's reuse probability (labels derived causally, see
    :mod:`tierkv.scheduler._predictor`), halved for a partial tail block, x4 for a high-fanout prefix, and
    never below a descendant's in the same request; ``t_last`` the last access;
    ``tau`` a time constant of the order of the gap between turns of a conversation (300 s; chosen on the
    first 40% of the Mooncake conversation trace, whose turn gaps have p50 117 s and p75 240 s) to start
    from, then adapted online: keys computed with different ``tau`` are not comparable, so a change of
    ``tau`` re-keys every resident block (``value + t / tau``, the time term kept per block); the candidate
    ``tau`` values (``TierKVOptions.shadow_taus``) are scored by the hits of sampled mini-caches that rank
    the same values with their own ``tau`` (:class:`~tierkv.scheduler._tau.TauAdapter`). Reuse outcomes are labelled by
    :class:`OptGen` (would an optimal cache of this size have kept the block?) within the predictor's
    300 s horizon. Ordering by that quantity at any ``now``
    is ordering by the static key ``ln p + t_last / tau``. Keys are quantised to 1/64 (1.6% in ``p`` or
    ``tau / 64`` in time) and kept in FIFO buckets under a min-heap of bucket keys, so an access costs
    O(1) dict/deque operations instead of a heap push of a tuple; the victim is the oldest block of the
    lowest bucket. Without OptGen the predictor's horizon follows the measured residency time of the cache
    (EWMA of victims' idle time). Either way one configuration adapts to every capacity.

    Answer length (:meth:`respond`, delivered by the replay at the request's modelled completion): the
    request's blocks that no later request touched get ``(t_done - t_arrival) / tau`` (recency from the
    completion) plus the learned log calibration of its answer-length class added to their key
    (:mod:`tierkv.scheduler._response`); shared prefixes (``fanout_protect`` successors) are never lowered.
    """

    __slots__ = (
        "adapter",
        "bheap",
        "buckets",
        "cache",
        "capacity",
        "count",
        "entries",
        "fanout",
        "idle_ewma",
        "last",
        "model",
        "name",
        "optgen",
        "opts",
        "owner",
        "pred",
        "reqs",
        "seq",
        "tau",
        "tl",
        "track_idle",
        "turn_time",
    )

    def __init__(self, capacity: int, options: TierKVOptions | None = None, name: str = "tierkv") -> None:
        self.name = name
        self.capacity = capacity
        self.opts = options or TierKVOptions()
        self.pred = ReusePredictor(self.opts.predictor_config)
        self.cache: dict[int, int] = {}  # block -> quantised key
        self.buckets: dict[int, deque[int]] = {}  # quantised key -> blocks (FIFO; stale entries skipped)
        self.bheap: list[int] = []  # quantised keys that have a bucket
        self.entries = 0
        self.count: dict[int, int] = {}
        self.last: dict[int, float] = {}
        self.fanout: dict[int, int] = {}
        self.idle_ewma = -1.0
        self.tau = self.opts.tau_s
        self.optgen = OptGen(capacity) if self.opts.optgen else None
        self.track_idle = self.optgen is None
        self.turn_time: dict[int, float] = {}  # last two blocks of each request -> its time
        self.seq = 0  # index of the next request
        self.owner: dict[int, int] = {}  # block -> index of the request that touched it last
        self.reqs: dict[int, tuple[Sequence[int], float, int, int]] = {}  # uncompleted request -> (ids, t, key, cell)
        self.model = ResponseModel()
        # adaptive tau (shared with the library: tierkv.scheduler._tau): the time term of each resident
        # block's key, kept to re-key the cache when tau changes
        st = self.opts.shadow_taus if self.opts.decay else ()
        self.tl: dict[int, float] = {}
        self.adapter: TauAdapter | None = None
        if st:
            self.adapter = TauAdapter(
                st,
                self.tau,
                max(1, capacity),
                sample_blocks=self.opts.shadow_blocks,
                margin=self.opts.shadow_margin,
                every=self.opts.adapt_every,
                decay=self.opts.adapt_decay,
            )

    @property
    def tau_trace(self) -> list[tuple[float, float]]:
        """(time, new tau) of every switch of the adaptive tau."""
        return [] if self.adapter is None else self.adapter.trace

    def _retau(self, t: float, now: float) -> None:
        """Re-key every resident block for the new ``tau`` (keys are ``value + t_time / tau``)."""
        f = (1.0 / t - 1.0 / self.tau) * _QUANTA
        cache, tget = self.cache, self.tl.get
        for b, q in cache.items():
            cache[b] = q + round(tget(b, now) * f)
        self.tau = t
        self._compact()

    def _compact(self) -> None:
        self.buckets, self.bheap = bucketize(self.cache)
        self.entries = len(self.cache)
        tl = self.tl
        if len(tl) > len(self.cache):
            self.tl = {b: tl[b] for b in self.cache if b in tl}

    def request(self, ids: Sequence[int], now: float, tail_partial: bool) -> tuple[int, int]:
        cache, count, fanout, pred, opts = self.cache, self.count, self.fanout, self.pred, self.opts
        last = self.last
        n = len(ids)
        flags = [b in cache for b in ids]
        lead = 0
        for f in flags:
            if not f:
                break
            lead += 1
        hits = sum(flags)
        # causal labels: leading run of blocks seen before (not necessarily resident)
        seen = 0
        for b in ids:
            if b not in count:
                break
            seen += 1
        turn_time = self.turn_time
        if seen > 1:
            pb = ids[seen - 1]
            turn = count[pb]
            pt = turn_time.get(pb)
            tt = 2 if (opts.quick_step > 0 and pt is not None and now - pt < opts.quick_step) else 0
        else:
            tt = 3
            turn = 0
        turn_time[ids[n - 1]] = now
        if n > 1:
            turn_time[ids[n - 2]] = now
        shape = opts.shape
        sb0 = 7 * (0 if n <= 2 else min(6, (n - 1).bit_length() - 1)) if shape else 0
        pred.advance(now)
        ltable = pred.log_table if opts.predictor else [0.0] * N_CELLS
        base = now / self.tau if opts.decay else 0.0
        keys = [0.0] * n
        cells = [0] * n
        protect = opts.fanout_protect if opts.fanout else 1 << 60
        boost = _LN4
        cget, fget = count.get, fanout.get
        tail_j = n - 1 if tail_partial else -1
        tail_adj = _LN_HALF if opts.size else 0.0
        for j in range(n):
            b = ids[j]
            c = cget(b, 0)
            if c:
                fo = fget(b, 0)
                d = c if c > turn else turn
            else:
                fo = 0
                d = turn
                if j:
                    p = ids[j - 1]
                    fanout[p] = fget(p, 0) + 1
            bt = 0 if (j == 0 or fo >= 2) else (3 if j == tail_j else 2)
            cell = (
                (
                    ((bt * 4 + tt) * 6 + (d if d < 5 else 5)) * 4
                    + (0 if fo == 0 else 1 if fo == 1 else 2 if fo < 4 else 3)
                )
                * 49
                + sb0
                + ((j.bit_length() if j < 32 else 6) if shape else 0)
            )
            cells[j] = cell
            count[b] = c + 1
            k = ltable[cell] + base
            if fo >= protect:
                k += boost
            keys[j] = k
        if tail_j >= 0:
            keys[tail_j] += tail_adj
        if self.track_idle:
            last.update(zip(ids, [now] * n, strict=True))
        ad = self.adapter
        if ad is not None:
            self.tl.update(zip(ids, repeat(now, n), strict=False))
        seq = self.seq
        self.seq = seq + 1
        if n:
            self.owner.update(zip(ids, repeat(seq, n), strict=False))
            kj = n - 2 if (tail_partial and n > 1) else n - 1
            self.reqs[seq] = (ids, now, ids[kj], cells[kj])
        pred.observe_many(now, ids, cells, self.optgen.label(ids) if self.optgen is not None else None)
        order: Sequence[int] = range(n)
        if opts.prefix_tree:
            m = -math.inf
            for j in range(n - 1, -1, -1):
                if keys[j] < m:
                    keys[j] = m
                else:
                    m = keys[j]
            order = range(n - 1, -1, -1)
        if ad is not None:
            sampled = ad.sampled
            js = [j for j in range(n) if sampled(ids[j])]
            if js:
                js.reverse()  # leaf first, as the real cache
                for j in js:
                    ad.add(ids[j], keys[j] - base, now)
        cap = self.capacity
        bypass = opts.bypass
        idle = self.idle_ewma
        buckets, bheap = self.buckets, self.bheap
        bget = buckets.get
        for j in order:
            b = ids[j]
            q = int((keys[j] + 64.0) * _QUANTA)
            if b not in cache:
                if len(cache) >= cap:
                    qv, dq = lowest(cache, buckets, bheap)  # the victim heads dq
                    if bypass and q <= qv:
                        continue
                    v = dq.popleft()
                    del cache[v]
                    if ad is not None:
                        self.tl.pop(v, None)
                    if self.track_idle:
                        age = now - last[v]
                        idle = age if idle < 0 else 0.999 * idle + 0.001 * age
            elif cache[b] == q:
                continue
            cache[b] = q
            slot = bget(q)  # _buckets.push, inlined: once per access on the replay's hot path
            if slot is None:
                buckets[q] = deque((b,))
                heapq.heappush(bheap, q)
            else:
                slot.append(b)
        self.idle_ewma = idle
        if self.optgen is None and idle > 0:
            pred.horizon = idle if idle > 1.0 else 1.0
        self.entries += n
        if self.entries > 4 * cap + 4096:
            self._compact()
        if ad is not None:
            t = ad.request(now)
            if t is not None:
                self._retau(t, now)
        return lead, hits

    def respond(self, index: int, t_done: float, output_tokens: int) -> None:
        """Request ``index`` (0-based, in :meth:`request` order) completed at ``t_done`` with an answer of
        ``output_tokens`` tokens: learn from it and re-key its blocks that no later request touched.

        The caller must deliver it no earlier than the completion (the replay does, at the modelled
        completion time, before the first request that arrives after it); ``t_done`` is the clock of the
        keys (non-decreasing across calls). Unknown or repeated indices are ignored.
        """
        rec = self.reqs.pop(index, None)
        if rec is None:
            return
        ids, t_arr, key_block, key_cell = rec
        opts, pred, model = self.opts, self.pred, self.model
        cls = response_class(output_tokens)
        model.advance(t_done, pred.last_reuse, pred.horizon)
        model.observe(t_done, key_block, cls, pred.table[key_cell])
        delta = model.adjustment(cls) if opts.response else 0.0
        if opts.completion and opts.decay and t_done > t_arr:
            delta += (t_done - t_arr) / self.tau
        dq = round(delta * _QUANTA)
        if dq == 0:
            return
        cache, owner, fget = self.cache, self.owner, self.fanout.get
        buckets, bheap = self.buckets, self.bheap
        # a shared prefix's value is not this session's: never lowered (raising it keeps parent >= child)
        shared = opts.fanout_protect if dq < 0 else 0
        moved = 0
        tl = self.tl if (self.adapter is not None and opts.completion and opts.decay and t_done > t_arr) else None
        for b in ids:
            if owner.get(b) != index:
                continue  # touched since by another request
            q = cache.get(b)
            if q is None or (shared and fget(b, 0) >= shared):
                continue  # evicted, or a shared prefix
            q += dq
            cache[b] = q
            if tl is not None:
                tl[b] = t_done
            push(buckets, bheap, b, q)
            moved += 1
        self.entries += moved
        if self.entries > 4 * self.capacity + 4096:
            self._compact()


# --- session (renewal-process) policy --------------------------------------------------------------------

_N_TURN_BUCKETS = 4
_N_LEN_BUCKETS = 4
_CLS_TAIL = _N_TURN_BUCKETS * _N_LEN_BUCKETS
_CLS_LEFTOVER = _CLS_TAIL + 1
_SESSION_GROUPS: tuple[int, ...] = (*([0] * _CLS_TAIL), 1, 2)


def session_class(turn: int, prompt_blocks: int, previous_gap_s: float | None = None) -> int:
    """Class in ``[0, 16)`` of a session's period, known when its turn arrives.

    A first turn (``turn <= 1`` or no previous gap): its prompt length in blocks, <= 4, <= 16, <= 64, more
    -> 0..3. A later turn: ``4 + 4 * turn_bucket + gap_bucket`` with turn buckets 2, 3-4, 5+ and buckets of
    the gap that preceded this turn, < 30 s, < 2 min, < 8 min, more (a session's pace persists: users and
    agents have their own rhythm). Classes 16 (a partial tail block) and 17 (blocks a continuation did not
    re-use) are separate.
    """
    if turn <= 1 or previous_gap_s is None:
        return 0 if prompt_blocks <= 4 else 1 if prompt_blocks <= 16 else 2 if prompt_blocks <= 64 else 3
    tb = 0 if turn == 2 else 1 if turn <= 4 else 2
    g = previous_gap_s
    gb = 0 if g < 30.0 else 1 if g < 120.0 else 2 if g < 480.0 else 3
    return 4 + 4 * tb + gb


@dataclass(frozen=True, slots=True)
class SessionOptions:
    """Components of the session (renewal-process) tierkv policy; each flag off is one ablation.

    * ``hazard`` -- rank sessions by the learned hit density (off: by recency of the session's last turn).
    * ``classes`` -- one survival curve per (turn x prompt length) class (off: one for all sessions).
    * ``density`` -- hit density per unit time (off: probability of a turn within the horizon).
    * ``bypass`` -- do not admit blocks of a session that ranks at or below the current victim.
    * ``prefix_tree`` -- evict only leaves of the resident prefix tree (a parent outlives its children),
      deepest block of the victim session first, and never admit a block whose parent is not resident.
    * ``tail`` -- a partial trailing block is its own session (class ``tail``): the next turn extends
      it under a new id, so it is rarely re-used.
    * ``fanout_protect`` -- a block followed by this many distinct blocks is a shared prefix: re-using
      it does not make a request a continuation of whoever touched it last.
    * ``horizon_s`` -- the horizon until the first evictions; then the EWMA of the age of evicted sessions.
    * ``bins_per_octave``, ``prior_strength`` -- survival estimation (:class:`RenewalHazard`).
    * ``refresh_periods`` -- re-estimate the survival curves every this many new periods.
    * ``rescore_fraction`` -- re-rank resident sessions every ``max(1 s, horizon x fraction)``.
    """

    hazard: bool = True
    classes: bool = True
    density: bool = True
    bypass: bool = True
    prefix_tree: bool = True
    tail: bool = True
    fanout_protect: int = 4
    horizon_s: float = 60.0
    bins_per_octave: int = 4
    prior_strength: float = 20.0
    refresh_periods: int = 256
    rescore_fraction: float = 1.0 / 32.0

    def __post_init__(self) -> None:
        for name in ("fanout_protect", "bins_per_octave", "refresh_periods"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < (2 if name == "fanout_protect" else 1):
                raise ConfigError(f"tierkv.{name}", v, "an integer >= 2" if name == "fanout_protect" else ">= 1")
        for name in ("horizon_s", "prior_strength", "rescore_fraction"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ConfigError(f"tierkv.{name}", v, "a finite number > 0")


class SessionPolicy:
    """tierkv's policy: conversations as renewal processes, ranked by learned hit density.

    A request is a *turn* of a session. It continues the session that last touched the deepest block of its
    leading run of already-seen blocks, unless that block is a shared prefix (``fanout_protect`` distinct
    successors); then it starts a new session (turn 1). Each session's period (time since its last turn)
    is tracked by :class:`~tierkv.scheduler._survival.RenewalHazard` in a class known at the turn (turn number
    x prompt length; a partial tail block and the blocks a continuation left behind have their own classes).
    The score of a session of age ``a`` is the hit density ``D(a)`` over the cache's horizon ``H`` (the EWMA
    age of evicted sessions): the next turn re-uses the whole chain, so every resident block of a session
    earns the same expected hits per block-second. A block belongs to the session that touched it last
    (ancestors therefore belong to sessions at least as recent as their descendants).

    Eviction: the session with the lowest score gives up its deepest resident block that has no resident
    child (leaf of the prefix tree); shared prefixes stay while anything below them is resident. A new block
    is admitted only if its session outranks the victim (bypass). Scores of resident sessions are recomputed
    every ``max(1 s, H x rescore_fraction)`` into a heap; the survival curves every ``refresh_periods``
    periods. Outcomes are only the turns that actually arrived: no future information.
    """

    __slots__ = (
        "cache",
        "capacity",
        "deferred",
        "fanout",
        "heap",
        "horizon",
        "hz",
        "lists",
        "name",
        "next_rescore",
        "next_sid",
        "opts",
        "parent",
        "rc",
        "s_cls",
        "s_pid",
        "s_start",
        "s_turn",
        "s_ver",
        "since_refresh",
        "toucher",
    )

    def __init__(self, capacity: int, options: SessionOptions | None = None, name: str = "tierkv") -> None:
        # deferred import: _survival imports nothing from here, but keep module import order simple
        from ._survival import RenewalHazard

        self.name = name
        self.capacity = capacity
        self.opts = o = options or SessionOptions()
        self.hz = RenewalHazard(_SESSION_GROUPS, o.bins_per_octave, 64, 1.0, o.prior_strength)
        self.cache: dict[int, int] = {}  # resident block -> owner session
        self.parent: dict[int, int] = {}  # resident block -> parent block (-1: root)
        self.rc: dict[int, int] = {}  # resident block -> resident children
        self.deferred: set[int] = set()  # resident blocks skipped because they had resident children
        self.toucher: dict[int, int] = {}  # every seen block -> session that touched it last
        self.fanout: dict[int, int] = {}  # seen block -> distinct successors
        self.lists: dict[int, list[int]] = {}  # live session -> its blocks, deepest last (stale entries skipped)
        self.heap: list[tuple[float, float, int, int]] = []  # (score, start, session, version)
        self.s_pid: dict[int, int] = {}
        self.s_cls: dict[int, int] = {}
        self.s_start: dict[int, float] = {}
        self.s_turn: dict[int, int] = {}
        self.s_ver: dict[int, int] = {}
        self.next_sid = 0
        self.horizon = o.horizon_s
        self.next_rescore = -math.inf
        self.since_refresh = 0

    def _score(self, sid: int, now: float) -> float:
        if not self.opts.hazard:
            return 0.0
        hz = self.hz
        return hz.table[self.s_cls[sid]][hz.bin(now - self.s_start[sid])]

    def _push(self, sid: int, now: float) -> None:
        v = self.s_ver.get(sid, 0) + 1
        self.s_ver[sid] = v
        heapq.heappush(self.heap, (self._score(sid, now), self.s_start[sid], sid, v))

    def _new_session(self, now: float, cls: int, turn: int) -> int:
        sid = self.next_sid
        self.next_sid += 1
        self.s_pid[sid] = self.hz.start(now, cls)
        self.s_cls[sid] = cls
        self.s_start[sid] = now
        self.s_turn[sid] = turn
        self.since_refresh += 1
        return sid

    def _own(self, b: int, sid: int, now: float) -> None:
        lst = self.lists.get(sid)
        if lst is None:
            self.lists[sid] = [b]
            self._push(sid, now)
        else:
            lst.append(b)

    def _rescore(self, now: float) -> None:
        s_start, s_ver, score = self.s_start, self.s_ver, self._score
        heap = []
        for sid in self.lists:
            v = s_ver[sid] + 1
            s_ver[sid] = v
            heap.append((score(sid, now), s_start[sid], sid, v))
        heapq.heapify(heap)
        self.heap = heap
        self.next_rescore = now + max(1.0, self.horizon * self.opts.rescore_fraction)

    def _victim(self) -> tuple[float, float, int, int] | None:
        """The top live session entry whose list ends with an evictable block, or None."""
        heap, lists, cache, rc, s_ver = self.heap, self.lists, self.cache, self.rc, self.s_ver
        tree = self.opts.prefix_tree
        while heap:
            top = heap[0]
            sid = top[2]
            if s_ver.get(sid) != top[3]:
                heapq.heappop(heap)
                continue
            lst = lists[sid]
            while lst:
                b = lst[-1]
                if cache.get(b) != sid:
                    lst.pop()
                    continue
                if tree and rc.get(b, 0) > 0:
                    lst.pop()
                    self.deferred.add(b)
                    continue
                return top
            heapq.heappop(heap)
            del lists[sid]
            s_ver[sid] += 1
        return None

    def _evict(self, sid: int, now: float) -> None:
        b = self.lists[sid].pop()
        del self.cache[b]
        self.rc.pop(b, None)
        p = self.parent.pop(b)
        age = now - self.s_start[sid]
        self.horizon = 0.999 * self.horizon + 0.001 * (age if age > 1.0 else 1.0)
        if p >= 0 and self.opts.prefix_tree and p in self.cache:
            c = self.rc[p] - 1
            self.rc[p] = c
            if c == 0 and p in self.deferred:
                self.deferred.discard(p)
                self._own(p, self.cache[p], now)

    def request(self, ids: Sequence[int], now: float, tail_partial: bool) -> tuple[int, int]:
        cache, toucher, fanout, opts, hz = self.cache, self.toucher, self.fanout, self.opts, self.hz
        n = len(ids)
        flags = [b in cache for b in ids]
        lead = 0
        for f in flags:
            if not f:
                break
            lead += 1
        hits = sum(flags)
        if n == 0:
            return 0, 0
        seen = 0
        for b in ids:
            if b not in toucher:
                break
            seen += 1
        turn = 1
        gap: float | None = None
        if seen:
            kb = ids[seen - 1]
            if fanout.get(kb, 0) < opts.fanout_protect:
                psid = toucher[kb]
                turn = self.s_turn[psid] + 1
                gap = now - self.s_start[psid]
                if hz.event(self.s_pid[psid], now):
                    # what the continuation did not re-use stays with the parent, now a leftover
                    self.s_pid[psid] = hz.start(now, _CLS_LEFTOVER)
                    self.s_cls[psid] = _CLS_LEFTOVER
                    self.s_start[psid] = now
                    self.since_refresh += 1
                    if psid in self.lists:
                        self._push(psid, now)
            if seen < n:
                fanout[kb] = fanout.get(kb, 0) + 1
        if self.since_refresh >= opts.refresh_periods:
            self.since_refresh = 0
            hz.refresh(now, self.horizon, opts.density)
            self.next_rescore = -math.inf
        if now >= self.next_rescore:
            self._rescore(now)
        cls = session_class(turn, n, gap) if opts.classes else 0
        sid = self._new_session(now, cls, turn)
        tail_sid = self._new_session(now, _CLS_TAIL, turn) if (opts.tail and tail_partial and n > 1) else -1
        my = (self._score(sid, now), now)
        my_tail = (self._score(tail_sid, now), now) if tail_sid >= 0 else my
        cap, tree, bypass = self.capacity, opts.prefix_tree, opts.bypass
        parent, rc = self.parent, self.rc
        admit = True
        for j in range(n):
            b = ids[j]
            owner = tail_sid if (j == n - 1 and tail_sid >= 0) else sid
            toucher[b] = owner
            if b in cache:
                cache[b] = owner
                self._own(b, owner, now)
                continue
            if not admit:
                continue
            p = ids[j - 1] if j else -1
            if tree and j and p not in cache:
                admit = False
                continue
            mine = my_tail if owner == tail_sid else my
            while len(cache) >= cap:
                top = self._victim()
                if top is None or (bypass and mine <= (top[0], top[1])):
                    admit = False
                    break
                self._evict(top[2], now)
            if not admit:
                continue
            cache[b] = owner
            parent[b] = p
            if tree and p >= 0 and p != b:
                rc[p] = rc.get(p, 0) + 1
            self._own(b, owner, now)
        return lead, hits
