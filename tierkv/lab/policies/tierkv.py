"""``tierkv``: the replay lab's model of tierkv's eviction ranking (:class:`TierKVPolicy`) and its ablations.

Driven by the library's :class:`~tierkv.scheduler.ReusePredictor`, :class:`~tierkv.scheduler.TauAdapter` and
:class:`~tierkv.scheduler.ResponseModel`; adds what exists only here: :class:`OptGen` labels, the quick-step
transition and bypass (see :class:`TierKVOptions`).

Owns: :class:`TierKVOptions`, :class:`OptGen`, :class:`TierKVPolicy`. Imports only ``tierkv.scheduler`` and
``tierkv.errors`` from the library.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import repeat

import numpy as np

from tierkv.errors import ConfigError
from tierkv.scheduler._buckets import bucketize, lowest, push
from tierkv.scheduler._predictor import N_CELLS, PredictorConfig, ReusePredictor
from tierkv.scheduler._response import ResponseModel, response_class
from tierkv.scheduler._tau import TauAdapter

__all__ = ["OptGen", "TierKVOptions", "TierKVPolicy"]

_LN4 = math.log(4.0)
_LN_HALF = math.log(0.5)
_QUANTA = 64.0  # tierkv keys are quantised to 1/64 of a natural-log unit


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
        "probe",
        "reqs",
        "seq",
        "tau",
        "tl",
        "track_idle",
        "turn_time",
    )

    def __init__(self, capacity: int, options: TierKVOptions | None = None, name: str = "lab-tierkv") -> None:
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
        #: calibration probe (``tierkv replay --calibration``): when a pair of lists, every access appends the
        #: predictor's reuse probability of its cell (before the tail/fanout/prefix adjustments of the key)
        #: to the first and its OPTgen credit (True without OPTgen) to the second
        self.probe: tuple[list[float], list[bool]] | None = None
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
        credit = self.optgen.label(ids) if self.optgen is not None else None
        probe = self.probe
        if probe is not None:
            table = pred.table
            probe[0].extend([table[c] for c in cells])
            probe[1].extend(credit if credit is not None else repeat(True, n))
        pred.observe_many(now, ids, cells, credit)
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
