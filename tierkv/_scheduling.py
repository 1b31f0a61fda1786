"""The scheduler's state inside a :class:`~tierkv.TierKV`: pure decisions, no I/O.

This module glues the pure models of :mod:`tierkv.scheduler` (reuse
predictor, gate, circuit breakers, placement value, prefetch window, tool
chain, head importance) to the core's index. TierKV does the I/O; everything
here is synchronous bookkeeping called from the event loop.

Configuration: the ``[scheduler]`` table.

=========================  ===========  ==================================================
field                      default      meaning
=========================  ===========  ==================================================
``policy``                 adaptive     ``adaptive`` (recency -- plain LRU, LRU with a
                                        frequency admission filter, or ARC -- or the
                                        predictor, whichever scores more hits on sampled
                                        shadow caches: see below), ``lru`` (recency ranks
                                        evictions; a block hit twice in a slower tier is
                                        promoted to the fastest) or ``predictive`` (the
                                        predictor ranks evictions and values promotions).
                                        The default is the policy that measures best, in
                                        the replay lab (``tierkv replay``: every trace
                                        shape, the Mooncake trace, ShareGPT conversations)
                                        and in ``benchmarks/bench_library_replay.py``
``prefill_tokens_per_s``   none         the engine's prefill rate; enables the
                                        fetch-vs-recompute gate
``gate_probe_interval_s``  10           a tier the gate turns down is still fetched from
                                        once per this many seconds (re-measuring it)
``tau_s``                  300          recency time constant of the eviction ranking (the
                                        start value when ``tau_candidates_s`` is not empty)
``tau_candidates_s``       [30, 60,     candidates of the adaptive ``tau``, chosen online by
                           120, 300]    sampled shadow caches (:class:`~tierkv.scheduler.TauAdapter`);
                                        ``[]`` keeps ``tau_s`` fixed
``promote``                true         promote hits from lower tiers when their value wins
``max_transfers_per_tier`` 4            concurrent promotions/demotions/prefetches per tier
``max_concurrent_fetches`` 64           admission control: concurrent ``get`` reads
``fetch_wait_s``           none         longest wait for an admission slot; past it ``get``
                                        answers a miss (``overloaded``) at once
``queue``                  1024         pending background jobs (excess jobs are dropped, counted)
``prefetch_max_blocks``    256          the most blocks one ``prefetch`` (or ``hint(decode_position=)``)
                                        promotes, most urgent first (:class:`~tierkv.scheduler.PrefetchPlanner`)
``session_shadow``         true         (adaptive policy) run the session shadow and let the cache
                                        follow it when it scores best (see below; about 1.2-1.8 KB
                                        of memory per block of capacity); false: five recency modes
``predictor``              {}           :class:`~tierkv.scheduler.PredictorConfig` fields
``breaker``                {}           failure_threshold, cooldown_s, probe_successes
``placement``              {}           :class:`~tierkv.scheduler.PlacementConfig` fields
=========================  ===========  ==================================================

Eviction ranking (predictive policy): ``priority = ln P(reuse | cell) +
t_last / tau``, i.e. ``P(reuse) x exp(-age / tau)`` in log space (``tau``
adapted online, the same :class:`~tierkv.scheduler.TauAdapter` as the replay
lab's ``tierkv`` policy: its shadow caches are sized to the tiers' total
capacity in blocks, :meth:`SchedulerState.set_capacity_blocks`); a request
touches its blocks leaf first so that a parent always ranks at least as high as
its descendants (a prefix is useless without its ancestors); blocks with a
prefix fanout of ``placement.protect_fanout`` children or more are protected
from eviction at the bottom tier while anything else can go.

Adaptive policy (``policy = "adaptive"``): the :class:`~tierkv.scheduler.TauAdapter`
keeps, besides one sampled shadow cache per ``tau`` candidate ranked like the real
cache (new blocks placed with the key of a fresh entry, then the request re-keyed leaf
first; no bypass), a sampled LRU shadow of the same accesses (ids: :func:`shadow_id`).
Recency takes the cache when the LRU shadow's sampled hits exceed the real cache's own
hits on the same sampled blocks (``hit`` of :meth:`SchedulerState.observe_ranked`); the predictor
gets it back when its shadow leads by the margin, or for a trial after a wait that
doubles with every failed trial (the predictor's features are read from the real
cache, so its shadow is only faithful while the cache follows it:
:meth:`~tierkv.scheduler.TauAdapter._choose_mode`). In recency mode
(:attr:`SchedulerState.recency`) the tiers evict in their recency order and promote as
the ``lru`` policy does; the predictive ranking is kept up to date all along, so a
switch costs nothing. On a workload whose features carry no reuse signal the shadows
score alike and the cache follows recency or an equivalent ranking. The session shadow
(:attr:`SchedulerState.session`, ``session_shadow``) is a whole renewal-process cache
(:class:`~tierkv.scheduler.SessionPolicy`) fed every request's keys before its put stores (and what a get found);
counted with the recency shadows, it hands the cache its own decisions when it leads
(:attr:`SchedulerState.session_mode`; ``docs/scheduler.md``).

Response length (``TierKV.hint(response_tokens=N)``, :meth:`SchedulerState.respond`):
when the engine reports the length of the answer to a request (``tokens=``: that
request's latest ``put``/``get``; without: the most recent request), that
request's blocks (those whose ``t_last`` is still the request's) get ``delta =
(t_done - t_request) / tau + ResponseModel.adjustment(class)`` added to their
priority (with the ``tau`` of the moment the priority is computed) -- the same re-keying as the replay lab's ``tierkv`` policy
(:mod:`tierkv.scheduler._response`). The adjustment is learned from whether the
request's deepest block was accessed again within the predictor's horizon after
the answer.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._options import opt_bool, opt_choice, opt_float, opt_int, reject_unknown
from .errors import ConfigError, InputError
from .scheduler import (
    BLOCK_TYPES,
    TRANSITIONS,
    CircuitBreaker,
    GateDecision,
    HeadImportance,
    PlacementConfig,
    PredictorConfig,
    PrefetchPlanner,
    ProbeSchedule,
    RateEstimator,
    ReusePredictor,
    TauAdapter,
    TierEstimator,
    ToolChain,
    cell_index,
    count_bucket,
    derive_block_type,
    derive_transition,
    fanout_bucket,
    gate,
    placement_value,
    size_bucket,
)
from .scheduler._admission import FrequencySketch
from .scheduler._arc import ArcTarget
from .scheduler._importance import BlockImportance
from .scheduler._predictor import BLOCK_TYPES as _BT
from .scheduler._response import ResponseModel, response_class
from .scheduler._session import SessionPolicy

__all__ = ["DEFAULT_TIER_PERFORMANCE", "RequestRecord", "SchedulerState", "TierPerf", "raw_shadow_id", "shadow_id"]


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """The latest access of one request (its ``put``/``get``), as the per-request signals need it.

    ``t_req``: the access time (its blocks carry ``t_last`` in ``[t_req, t_req + (blocks + 1) * 1e-6]``
    until another access touches them); ``leaf``: the key of the deepest block accessed, ``blocks`` how
    many blocks were accessed (the chain itself is not kept: :meth:`Index.chain_to
    <tierkv._engine._index.Index.chain_to>` finds it from the leaf by parent links, so a remembered
    request costs the same whatever its length); ``key_block``, ``key_cell``: the deepest block's
    predictor id and cell; ``answered``: a response length was attributed to this access."""

    t_req: float
    leaf: str
    blocks: int
    key_block: int
    key_cell: int
    answered: bool = False


def shadow_id(key: str) -> int:
    """The id of a block in the shadow caches: its key's first 64 bits (stable across evictions and
    re-puts, unlike the index's per-adoption ``bid``: a shadow must recognise a block the real cache
    dropped and stored again, or its hits depend on what the real cache did)."""
    return int(key[:16], 16)


def raw_shadow_id(key: bytes) -> int:
    """:func:`shadow_id` of a raw key (its first 8 bytes, big-endian), without hexing it."""
    return int.from_bytes(key[:8], "big")


_LN4 = math.log(4.0)  # the key boost of a protected shared prefix (as the mover's)

_KNOWN = frozenset(
    {
        "policy",
        "prefill_tokens_per_s",
        "gate_probe_interval_s",
        "tau_s",
        "tau_candidates_s",
        "promote",
        "max_transfers_per_tier",
        "max_concurrent_fetches",
        "fetch_wait_s",
        "queue",
        "prefetch_max_blocks",
        "session_shadow",
        "predictor",
        "breaker",
        "placement",
    }
)


@dataclass(frozen=True, slots=True)
class TierPerf:
    """Seed estimates of a tier kind: round-trip latency (s) and bandwidth (bytes/s)."""

    latency_s: float
    bandwidth_Bps: float


#: Seeds for the per-tier EWMA estimators, replaced by measurements as reads happen.
DEFAULT_TIER_PERFORMANCE: Mapping[str, TierPerf] = {
    "hbm": TierPerf(5e-6, 1.0e12),
    "dram": TierPerf(5e-6, 2.0e10),
    "cxl": TierPerf(1e-5, 1.0e10),
    "rdma": TierPerf(2e-5, 1.0e10),
    "nvme": TierPerf(1e-4, 3.0e9),
    "pfs": TierPerf(1e-3, 1.0e9),
    "remote": TierPerf(5e-4, 1.0e9),
    "other": TierPerf(1e-3, 1.0e9),
}


def _table(options: Mapping[str, Any], key: str) -> dict[str, Any]:
    v = options.get(key, {})
    if not isinstance(v, Mapping):
        raise ConfigError(f"scheduler.{key}", v, "a table")
    return dict(v)


class SchedulerState:
    """Per-TierKV scheduler state (single event loop; not thread-safe).

    ``clock`` (default: monotonic seconds since this state was made) is the predictor's and the gate's
    clock, :meth:`now`; a replay passes the trace's timestamps."""

    def __init__(
        self,
        options: Mapping[str, Any],
        tier_names: Sequence[str],
        tier_kinds: Sequence[str],
        *,
        clock: Callable[[], float] | None = None,
    ) -> None:
        reject_unknown(options, _KNOWN, prefix="scheduler")
        self._clock = clock
        self.policy = opt_choice(options, "policy", ("predictive", "lru", "adaptive"), "adaptive", prefix="scheduler")
        #: evictions follow recency now: always under ``lru``, while the shadows say so under ``adaptive``
        self.recency = self.policy == "lru"
        rate = options.get("prefill_tokens_per_s")
        self.prefill_tokens_per_s: float | None = (
            None if rate is None else opt_float(options, "prefill_tokens_per_s", prefix="scheduler", minimum=1e-9)
        )
        self.tau_s = opt_float(options, "tau_s", 300.0, prefix="scheduler", minimum=1e-3)
        cands = options.get("tau_candidates_s", [30.0, 60.0, 120.0, 300.0])
        if not isinstance(cands, (list, tuple)) or not all(
            isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and t > 0 for t in cands
        ):
            raise ConfigError(
                "scheduler.tau_candidates_s", cands, "a list of finite numbers > 0 (or [] for a fixed tau_s)"
            )
        self.tau_candidates = tuple(float(t) for t in cands)
        self.tau_adapter: TauAdapter | None = None  # made by set_capacity_blocks
        #: (adaptive policy) every block access's count, for the admission filter (Writer)
        self.sketch: FrequencySketch | None = None
        #: (adaptive policy) the same counts aged as TinyLFU's reference implementation ages them
        #: (``FrequencySketch(fresh=True)``), for the segmented mode by fresh counts (``TauAdapter.fresh_mode``)
        self.fresh_sketch: FrequencySketch | None = None
        #: (adaptive policy) ARC's target and ghosts for the real cache (its lists are ``Tier.arc``)
        self.arc_target: ArcTarget | None = None
        #: (adaptive policy) the session shadow: the renewal-process cache simulated at the real capacity
        #: over every request (:meth:`session_get`, :meth:`session_put`), followed in the session mode (:attr:`session_mode`)
        self.session: SessionPolicy | None = None
        self._session_gets: OrderedDict[bytes, int] = OrderedDict()  # request id -> blocks its get fed
        self.promote = opt_bool(options, "promote", True, prefix="scheduler")
        self.max_transfers = opt_int(options, "max_transfers_per_tier", 4, prefix="scheduler", minimum=1)
        self.max_fetches = opt_int(options, "max_concurrent_fetches", 64, prefix="scheduler", minimum=1)
        self.queue_size = opt_int(options, "queue", 1024, prefix="scheduler", minimum=1)
        #: the most blocks one ``prefetch`` plans (:class:`~tierkv.scheduler.PrefetchPlanner` budget)
        self.prefetch_max_blocks = opt_int(options, "prefetch_max_blocks", 256, prefix="scheduler", minimum=0)
        #: (adaptive policy) whether the session shadow runs (:attr:`session`)
        self.session_shadow = opt_bool(options, "session_shadow", True, prefix="scheduler")
        wait = options.get("fetch_wait_s")
        self.fetch_wait_s: float | None = (
            None if wait is None else opt_float(options, "fetch_wait_s", prefix="scheduler", minimum=0.0)
        )
        pred = _table(options, "predictor")
        try:
            self.predictor = ReusePredictor(PredictorConfig(**pred))
        except TypeError as exc:
            raise ConfigError("scheduler.predictor", pred, f"fields of PredictorConfig ({exc})") from exc
        br = _table(options, "breaker")
        reject_unknown(
            br, frozenset({"failure_threshold", "cooldown_s", "probe_successes"}), prefix="scheduler.breaker"
        )
        self.breakers = [
            CircuitBreaker(
                name,
                failure_threshold=br.get("failure_threshold", 3),
                cooldown_s=br.get("cooldown_s", 2.0),
                probe_successes=br.get("probe_successes", 1),
            )
            for name in tier_names
        ]
        pl = _table(options, "placement")
        try:
            self.placement = PlacementConfig(**pl)
        except TypeError as exc:
            raise ConfigError("scheduler.placement", pl, f"fields of PlacementConfig ({exc})") from exc
        self.kinds = list(tier_kinds)
        self.estimators = [
            TierEstimator(
                DEFAULT_TIER_PERFORMANCE.get(k, DEFAULT_TIER_PERFORMANCE["other"]).latency_s,
                DEFAULT_TIER_PERFORMANCE.get(k, DEFAULT_TIER_PERFORMANCE["other"]).bandwidth_Bps,
            )
            for k in tier_kinds
        ]
        # codec of each tier: (compression ratio estimate, decode-rate EWMA); None: stores raw bytes
        self.codecs: list[tuple[float, RateEstimator] | None] = [None] * len(self.kinds)
        self._t0 = time.monotonic()
        self.probe_interval_s = opt_float(options, "gate_probe_interval_s", 10.0, prefix="scheduler", minimum=1e-3)
        t_start = self.now()
        self.probes = [ProbeSchedule(self.probe_interval_s, t_start) for _ in self.kinds]
        self.chain = ToolChain()
        #: the RoPE-aware prefetch planner (made with the model's layer classes by the first use)
        self.prefetch_planner: PrefetchPlanner | None = None
        self.importance: HeadImportance | None = None
        #: head importance per stored block (made with :attr:`importance` by the first attention report)
        self.block_importance: BlockImportance | None = None
        self.transition: int | None = None
        #: transition labels tied to a request (its id: see :meth:`note_request`), for its next access
        self.transitions_for: OrderedDict[str, int] = OrderedDict()
        #: the latest access of each request by id, and the id of the most recent request
        self.requests: OrderedDict[str, RequestRecord] = OrderedDict()
        self.last_request: str | None = None
        self.tool: str | None = None
        self.gate_decisions = {"fetch": 0, "recompute": 0, "probe": 0}
        self.dropped_jobs = 0
        self.response = ResponseModel()
        # completed requests with a response-length adjustment: t_last windows [start, end] ->
        # (class adjustment, seconds from the request to its completion)
        self._resp_start: list[float] = []
        self._resp_end: list[float] = []
        self._resp_adj: list[float] = []
        self._resp_dt: list[float] = []
        self._resp_done_t = -math.inf  # request time of the latest respond() (one answer per request)

    # ------------------------------------------------------------------ time
    def now(self) -> float:
        """The predictor's and the gate's clock: ``clock()`` when one was given, else seconds since this
        scheduler started."""
        if self._clock is not None:
            return self._clock()
        return time.monotonic() - self._t0

    # ---------------------------------------------------------------- labels
    @staticmethod
    def block_type_index(block_type: str | None) -> int | None:
        if block_type is None:
            return None
        try:
            return _BT.index(block_type)
        except ValueError:
            raise InputError(f"block_type: got {block_type!r}; allowed: " + ", ".join(BLOCK_TYPES)) from None

    @staticmethod
    def transition_index(transition: str | None) -> int | None:
        if transition is None:
            return None
        try:
            return TRANSITIONS.index(transition)
        except ValueError:
            raise InputError(f"transition: got {transition!r}; allowed: " + ", ".join(TRANSITIONS)) from None

    def cell(
        self,
        *,
        label: int | None,
        position: int,
        prompt_blocks: int,
        leading_seen: int,
        count: int,
        fanout: int,
        transition: int | None = None,
    ) -> int:
        """The predictor cell of one block access (caller labels win over derived ones; ``transition``,
        a request's own label, wins over the untied :attr:`transition`)."""
        bt = label if label is not None else derive_block_type(position, position == prompt_blocks - 1, fanout)
        tr = transition if transition is not None else self.transition
        if tr is None:
            tr = derive_transition(leading_seen)
        ctx = bt * len(TRANSITIONS) + tr
        return cell_index(ctx, count_bucket(count), fanout_bucket(fanout), size_bucket(prompt_blocks, position))

    # --------------------------------------------------------------- ranking
    def priority(self, cell: int, t_last: float) -> float:
        """Eviction priority: higher stays. LRU policy: recency only."""
        if self.policy == "lru":
            return t_last
        return self.predictor.log_table[cell] + t_last / self.tau_s + self._response_delta(t_last)

    def _response_delta(self, t_last: float) -> float:
        i = bisect.bisect_right(self._resp_start, t_last) - 1
        if i >= 0 and t_last <= self._resp_end[i]:
            return self._resp_adj[i] + self._resp_dt[i] / self.tau_s
        return 0.0

    def response_deltas(self, t_last: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """:meth:`_response_delta` of every access time in ``t_last`` (float64; 0.0 outside every
        answered request's window), the same float operations."""
        out = np.zeros(len(t_last), dtype=np.float64)
        if not self._resp_start:
            return out
        i = np.searchsorted(np.asarray(self._resp_start, dtype=np.float64), t_last, side="right") - 1
        ok = i >= 0
        j = i[ok]
        ok[ok] = t_last[ok] <= np.asarray(self._resp_end, dtype=np.float64)[j]
        j = i[ok]
        out[ok] = (
            np.asarray(self._resp_adj, dtype=np.float64)[j]
            + np.asarray(self._resp_dt, dtype=np.float64)[j] / self.tau_s
        )
        return out

    # ------------------------------------------------------------ adaptive tau
    def set_capacity_blocks(self, blocks: int, *, held_blocks: int | None = None) -> None:
        """The cache's capacity in blocks (all tiers): sizes the adaptive ``tau``'s shadow caches
        (made on the first call; no-op with the LRU policy or a fixed ``tau``). ``held_blocks``: what
        the tiers hold below their high watermarks (the session shadow's size; default ``blocks``)."""
        adaptive = self.policy == "adaptive"
        if self.policy == "lru" or not (self.tau_candidates or adaptive):
            return
        blocks = max(1, int(blocks))
        if self.tau_adapter is None:
            # adaptive with a fixed tau: one candidate, tau_s, against recency
            taus = self.tau_candidates or (self.tau_s,)
            self.tau_adapter = TauAdapter(taus, self.tau_s, blocks, recency=adaptive, bypass=not adaptive)
        else:
            self.tau_adapter.resize(blocks)
        if adaptive:
            if self.sketch is None or self.fresh_sketch is None:
                self.sketch = FrequencySketch(blocks)
                self.fresh_sketch = FrequencySketch(blocks, fresh=True)
            else:
                self.sketch.resize(blocks)
                self.fresh_sketch.resize(blocks)
            if self.arc_target is None:
                self.arc_target = ArcTarget(blocks)
            else:
                self.arc_target.resize(blocks)
            held = max(1, int(held_blocks if held_blocks is not None else blocks))
            if self.session is not None:  # (a smaller capacity evicts at its next request)
                self.session.capacity = held
            elif self.session_shadow:
                self.session = SessionPolicy(held, name="session", track=True)

    def count_access(self, sid: int) -> None:
        """Count one access of the block whose shadow id is ``sid`` in the admission sketches."""
        if self.sketch is not None:
            self.sketch.add(sid)
        if self.fresh_sketch is not None:
            self.fresh_sketch.add(sid)

    @property
    def admission_sketch(self) -> FrequencySketch | None:
        """The counts the admission filter compares (:attr:`admit`): :attr:`fresh_sketch` in the segmented
        mode by fresh counts (``TauAdapter.fresh_mode``), else :attr:`sketch`."""
        ad = self.tau_adapter
        if ad is not None and ad.slru_mode and ad.fresh_mode and self.fresh_sketch is not None:
            return self.fresh_sketch
        return self.sketch

    @property
    def admit(self) -> bool:
        """Whether a put into a full cache admits only blocks more frequent than the next victim
        (the adaptive policy while it follows recency and one of its admission shadows beats the
        other recency shadows: they model LRU or a segmented LRU with the filter, not the
        predictor's ranking with it)."""
        ad = self.tau_adapter
        return ad is not None and (ad.admit_mode or ad.slru_mode) and ad.recency_mode and self.sketch is not None

    @property
    def slru(self) -> bool:
        """Whether victims come from a segmented LRU (the adaptive policy while it follows recency and
        its segmented admission shadow beats the other recency shadows; :attr:`admit` is on too): the
        tiers' ARC lists serve as probation (recent) and protected (frequent) segments, the protected
        one of a full tier trimmed to ``TauAdapter.PROTECTED`` of it once a request's access is
        recorded (``Reader._trim_protected``)."""
        ad = self.tau_adapter
        return ad is not None and ad.slru_mode and ad.recency_mode and self.arc_target is not None

    @property
    def arc(self) -> bool:
        """Whether victims are chosen by ARC (the adaptive policy while it follows recency and its ARC
        shadow beats plain LRU and LRU with admission): from the tiers' recent lists while they hold
        more than ARC's target, else from their frequent lists (``Mover.pick_victims``)."""
        ad = self.tau_adapter
        return ad is not None and ad.arc_mode and ad.recency_mode and self.arc_target is not None

    @property
    def session_mode(self) -> bool:
        """Whether the cache follows the session shadow (the adaptive policy while it follows recency and
        its session shadow beats the other recency shadows): a put stores only the blocks the shadow
        holds (``Writer.put_blocks``), victims are the blocks it dropped, oldest first, then the least
        recently used (``Mover.pick_victims``)."""
        ad = self.tau_adapter
        return ad is not None and ad.session_mode and ad.recency_mode and self.session is not None

    _SESSION_GETS = 4096  # gets remembered until their request's put (session_put)

    def session_get(self, keys: Sequence[bytes], found: int, now: float, tail: bytes | None = None) -> None:
        """A ``get`` of the blocks ``keys`` (raw keys, root first) that found the first ``found`` stored:
        those are one request for the session shadow (the blocks it misses are not its to admit: a get
        stores nothing, and a tenant's gets of prompts nobody stored must not push others' blocks out
        of the shadow), remembered by the request's id (its last key) so that the put that completes
        the request continues it (:meth:`session_put`). ``tail``: the raw key of the stored partial
        last block (``partial_blocks``) the get found after all of ``keys``; it is the request's last
        block, of the shadow's tail class. Synchronous; no-op without the shadow."""
        if self.session is None or not keys or found <= 0:
            return
        if tail is not None and found >= len(keys):
            self._observe_session([*keys, tail], now, continuation=False, count_from=0, tail=True)
            found = len(keys) + 1
        else:
            self._observe_session(keys[:found], now, continuation=False, count_from=0)
        gets = self._session_gets
        gets[keys[-1]] = found
        gets.move_to_end(keys[-1])
        if len(gets) > self._SESSION_GETS:
            gets.popitem(last=False)

    def session_put(self, keys: Sequence[bytes], first: int, now: float, tail: bytes | None = None) -> None:
        """A ``put`` of the blocks ``keys`` from ``first`` on, before it stores anything: the request's
        blocks for the session shadow. It continues the request (no new turn, and the blocks counted
        already are not counted again) when a ``get`` of the same request came before it, or when it
        starts past its first block (``start``: a chunk of a request whose earlier blocks were read or
        stored already). ``tail``: the raw key of the put's trailing partial block (``partial_blocks``),
        the request's last block, of the shadow's tail class (the next turn extends it under another
        key). Synchronous; no-op without the shadow."""
        if self.session is None or not (keys or tail):
            return
        fed = self._session_gets.pop(keys[-1], None) if keys else None
        cont = fed is not None or first > 0
        ids = [*keys, tail] if tail is not None else keys
        self._observe_session(ids, now, continuation=cont, count_from=max(first, fed or 0), tail=tail is not None)

    def _observe_session(
        self, keys: Sequence[bytes], now: float, *, continuation: bool, count_from: int, tail: bool = False
    ) -> None:
        """Feed the shadow one request (or its continuation) and the adaptive policy its sampled
        leading hits over ``keys[count_from:]`` (:meth:`TauAdapter.add_session`); ``tail``: the last
        key is a partial block."""
        ses, ad = self.session, self.tau_adapter
        if ses is None or ad is None:
            return
        lead = 0
        for k in keys[count_from:]:
            if ad.sampled(raw_shadow_id(k)):
                if not ses.holds(k):
                    break
                lead += 1
        ad.add_session(lead)
        ses.request(keys, now, tail, continuation=continuation)

    def observe_ranked(self, block: int, cell: int, now: float, fanout: int = 0, hit: bool = False) -> None:
        """One block access, in the order the cache admits a request's blocks (leaf first): feeds
        the adaptive ``tau``'s shadow caches when ``block`` is sampled, with the block's ranking value
        (the predictor's log probability, plus ln 4 for a protected shared prefix of ``fanout``
        children, as the real cache's key); ``hit``: the cache held the block when the request came."""
        ad = self.tau_adapter
        if ad is not None and ad.sampled(block):
            v = self.predictor.log_table[cell]
            if self.protected(fanout):
                v += _LN4
            ad.add(block, v, now, hit)

    def end_request(self, now: float) -> float | None:
        """A request's blocks were all observed: the adaptive ``tau`` may switch (then it is
        returned and used by every later :meth:`priority`), and under the ``adaptive`` policy
        the mode (:attr:`recency`; then ``math.inf`` is returned for a switch to recency, the
        current ``tau`` for a switch to the predictor)."""
        ad = self.tau_adapter
        if ad is None:
            return None
        t = ad.request(now)
        if t is not None:
            self.tau_s = ad.tau
            if ad.recency:
                self.recency = ad.recency_mode
        return t

    _RESPONSE_MEMORY = 65_536  # completed requests whose adjustment is remembered

    _REQUEST_MEMORY = 65_536  # requests whose latest access is remembered (ids: note_request)
    _TIED_MEMORY = 4_096  # pending transition labels tied to a request

    def note_request(self, request: str, t_req: float, leaf: str, blocks: int, key_block: int, key_cell: int) -> None:
        """Request ``request`` (an id: the hex key of the last whole block of its tokens) accessed
        ``blocks`` blocks at ``t_req``, the deepest one ``leaf`` (predictor id ``key_block`` in
        ``key_cell``). It becomes the most recent request (what untied signals apply to)."""
        self.requests[request] = RequestRecord(t_req, leaf, blocks, key_block, key_cell)
        self.requests.move_to_end(request)
        self.last_request = request
        while len(self.requests) > self._REQUEST_MEMORY:
            self.requests.popitem(last=False)

    def tie_transition(self, request: str, transition: int) -> None:
        """Label the next access of request ``request`` (and no other) with ``transition``."""
        self.transitions_for[request] = transition
        self.transitions_for.move_to_end(request)
        while len(self.transitions_for) > self._TIED_MEMORY:
            self.transitions_for.popitem(last=False)

    def take_transition(self, request: str | None) -> int | None:
        """The transition label tied to ``request`` (consumed), or None."""
        if request is None:
            return None
        return self.transitions_for.pop(request, None)

    def respond(self, response_tokens: int, request: str | None = None) -> float | None:
        """The answer to a request had ``response_tokens`` tokens and is complete now. Learn from it and
        re-rank that request's blocks (see the module docstring); return the priority delta, or None when
        it is not attributed (already answered; untied: no request yet).

        ``request`` (an id, :meth:`note_request`): that request's latest access; InputError when it is
        not remembered. None: the most recent request (the predictor's last batch), as before requests
        had ids."""
        pred = self.predictor
        if request is None:
            t_req, batch = pred.last_batch
            if not batch or t_req <= self._resp_done_t:
                return None
            rid = self.last_request
            last = self.requests.get(rid) if rid is not None else None
            if rid is not None and last is not None and last.t_req == t_req:
                if last.answered:
                    return None
                self.requests[rid] = dataclasses.replace(last, answered=True)
            key_block, key_cell = batch[0]  # blocks are observed leaf first: the deepest block
            blocks = len(batch)
        else:
            rec = self.requests.get(request)
            if rec is None:
                raise InputError("response_tokens: unknown request (no put/get of these tokens is remembered)")
            if rec.answered:
                return None
            self.requests[request] = dataclasses.replace(rec, answered=True)
            t_req, key_block, key_cell, blocks = rec.t_req, rec.key_block, rec.key_cell, rec.blocks
        self._resp_done_t = max(self._resp_done_t, t_req)
        now = self.now()
        cls = response_class(response_tokens)
        model = self.response
        model.advance(now, pred.last_reuse, pred.horizon)
        model.observe(now, key_block, cls, pred.table[key_cell])
        if self.policy == "lru":
            return None
        adj, dt = model.adjustment(cls), max(0.0, now - t_req)
        # the request's entries carry t_last = t_req + (n - i) * 1e-6 (Reader.record_access)
        i = bisect.bisect_right(self._resp_start, t_req)
        self._resp_start.insert(i, t_req)
        self._resp_end.insert(i, t_req + (blocks + 1) * 1e-6)
        self._resp_adj.insert(i, adj)
        self._resp_dt.insert(i, dt)
        if len(self._resp_start) > 2 * self._RESPONSE_MEMORY:
            for lst in (self._resp_start, self._resp_end, self._resp_adj, self._resp_dt):
                del lst[: self._RESPONSE_MEMORY]
        return adj + dt / self.tau_s

    def p_reuse(self, cell: int) -> float:
        return float(self.predictor.table[cell])

    # ------------------------------------------------------------------ gate
    def set_codec(self, tier: int, ratio: float | None, decode_Bps: float | None = None) -> None:
        """Tier ``tier`` stores its blocks through a codec of compression ratio ``ratio`` (raw bytes /
        stored bytes) that decodes ``decode_Bps`` raw bytes per second (the codec's estimate; refined by
        :meth:`observe_decode`); ``ratio=None``: raw bytes, no decode cost. The core calls it when it
        makes (or re-chooses) a tier's codec."""
        if ratio is None:
            self.codecs[tier] = None
            return
        if not math.isfinite(ratio) or ratio <= 0:
            raise ConfigError(f"tiers[{tier}].codec ratio", ratio, "a finite number > 0")
        if decode_Bps is None or not math.isfinite(decode_Bps) or decode_Bps <= 0:
            raise ConfigError(f"tiers[{tier}].codec decode rate", decode_Bps, "a finite number of bytes/s > 0")
        old = self.codecs[tier]
        est = RateEstimator(decode_Bps)
        if old is not None and old[1].samples:
            est = old[1]  # keep what was measured
        self.codecs[tier] = (ratio, est)

    def observe_decode(self, tier: int, raw_bytes: int, seconds: float) -> None:
        """A measured decode on tier ``tier``: ``raw_bytes`` of KV out in ``seconds``."""
        c = self.codecs[tier]
        if c is not None:
            c[1].observe(raw_bytes, seconds)

    def decode_seconds(self, bytes_by_tier: Mapping[int, int]) -> float:
        """Modelled codec decode time of raw ``bytes_by_tier`` (0 for tiers without a codec)."""
        total = 0.0
        for ti, n in bytes_by_tier.items():
            c = self.codecs[ti]
            if c is not None:
                total += c[1].seconds_for(n)
        return total

    def gate(
        self,
        tokens: int,
        bytes_by_tier: Mapping[int, int],
        decode_s: float | Mapping[int, float] | None = None,
        *,
        now: float | None = None,
    ) -> GateDecision | None:
        """Fetch-vs-recompute for a prefix of ``tokens`` spread over tiers (``bytes_by_tier``: raw KV bytes
        per tier index); None when the gate is off (no prefill rate configured).

        * Transfer: each tier's stored bytes (raw / its codec's ratio) at its trusted bandwidth, one round
          trip at the largest trusted latency; an unmeasured tier is not trusted
          (:meth:`~tierkv.scheduler.TierEstimator.trusted`).
        * Decode: ``decode_s`` (seconds in all, or seconds per tier), else the tiers' codec decode
          estimates (:meth:`set_codec`, :meth:`observe_decode`).
        * Probe: when the answer is recompute and a tier of the prefix has not been probed for
          ``gate_probe_interval_s`` (of :meth:`now`, or ``now``), the fetch goes ahead anyway
          (``probe=True``) and re-measures the tiers of the prefix.
        """
        if self.prefill_tokens_per_s is None:
            return None
        total = sum(bytes_by_tier.values())
        if total == 0 or tokens == 0:
            return gate(0, 1.0, 1.0, 0.0, self.prefill_tokens_per_s)
        latency = 0.0
        seconds = 0.0
        for ti, n in bytes_by_tier.items():
            lat, bw = self.estimators[ti].trusted()
            latency = max(latency, lat)
            c = self.codecs[ti]
            seconds += n / (c[0] if c is not None else 1.0) / bw
        if decode_s is None:
            dec = self.decode_seconds(bytes_by_tier)
        elif isinstance(decode_s, Mapping):
            dec = float(sum(decode_s.values()))
        else:
            dec = float(decode_s)
        # one equivalent tier: same latency, bandwidth giving the summed transfer time
        bw_eq = total / seconds if seconds > 0 else math.inf
        d = gate(tokens, total / tokens, bw_eq, latency, self.prefill_tokens_per_s, decode_s=dec)
        if not d.fetch:
            t = self.now() if now is None else now
            if any(self.probes[ti].due(t) for ti in bytes_by_tier):
                for ti in bytes_by_tier:
                    self.probes[ti].take(t)
                self.gate_decisions["probe"] += 1
                d = dataclasses.replace(d, fetch=True, probe=True, reason=f"probe: re-measuring ({d.reason})")
        self.gate_decisions["fetch" if d.fetch else "recompute"] += 1
        return d

    # ------------------------------------------------------------- placement
    def promotion_target(
        self, cell: int, tokens: int, nbytes: int, current: int, healthy: Sequence[bool], hits: int = 2
    ) -> int | None:
        """The faster tier a block should move to, or None.

        The value of a tier is :func:`~tierkv.scheduler.placement_value`; its
        absolute level is dominated by the prefill it saves, which every tier
        saves alike, so the decision compares the *difference*: promote when
        the best tier's value beats the current one by more than
        ``placement.abs_usd`` and the block has been hit at least twice (a
        one-off hit never moves a block: hysteresis against flapping).
        """
        if not self.promote or current == 0 or hits < 2:
            return None
        if self.recency:  # recency: a block hit twice belongs in the fastest healthy tier
            return next((ti for ti in range(current) if healthy[ti]), None)
        p = self.p_reuse(cell)
        rate = self.prefill_tokens_per_s or 10_000.0
        values: dict[int, float] = {}
        for ti in range(current + 1):
            if not healthy[ti]:
                continue
            est = self.estimators[ti]
            fetch_s = est.latency_s + nbytes / est.bandwidth_Bps
            kind = self.kinds[ti] if self.kinds[ti] in self.placement.tier_usd_per_gb_hour else "pfs"
            values[ti] = placement_value(p, tokens, nbytes, kind, fetch_s, rate, self.placement)
        if current not in values:
            return None
        best = max(values, key=lambda t: values[t])
        if best < current and values[best] - values[current] > self.placement.abs_usd:
            return best
        return None

    def protected(self, fanout: int) -> bool:
        return self.policy != "lru" and fanout >= self.placement.protect_fanout  # (a ranking key term)
