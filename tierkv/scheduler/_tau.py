"""Online choice of the eviction ranking's recency time constant ``tau`` (pure, no I/O).

The ``tierkv`` ranking keys a block by ``value + t_last / tau`` (``value`` = the log reuse probability
and its boosts): ``tau`` sets how much a predicted-valuable block may outlive a more recent one. No fixed
``tau`` suits every workload: on the Mooncake conversation trace (turn gaps of minutes) 300 s is best at
every capacity, on a mix of fast agent loops and slow chats 30 s is (300 s puts the ranking under LRU).

:class:`TauAdapter` picks ``tau`` among candidates by *shadow caches*: a spatially sampled mini-cache per
candidate (blocks whose id hashes under a threshold, so that each holds about ``sample_blocks`` blocks
whatever the real capacity, the sample rate being ``sample_blocks / capacity``) replays the same accesses
with the same values, ranked with that candidate's ``tau`` and the same bypass rule as the real cache
(a block ranking below the mini-cache's victim is not admitted). Every ``every`` requests the candidate
with the most sampled hits (counts decayed by ``decay`` per decision, so the choice follows drift)
becomes ``tau`` if it beats the current one by ``margin`` (hysteresis: sampling noise must not flip the
ranking back and forth). Spatial sampling of this kind is how miniature simulations estimate miss-ratio
curves; the choice only uses what happened before it (causal).

With ``recency=True`` (the library's ``adaptive`` policy) the adapter also keeps LRU, LRU-with-admission,
segmented-LRU-with-admission (by slowly and by freshly aged counts) and ARC shadows of the same sampled
accesses, counts the session shadow's (run by the caller), and chooses between recency and the predictor
(:meth:`TauAdapter._choose_mode`, with an exploration budget for the predictor's trials); there every
count, the candidates' included, is of *leading* hits (a request's sampled blocks root first up to the
first one not held: what a prefix cache can serve), not of every held block.

The caller owns the real cache: the replay lab re-keys its resident blocks when ``tau`` changes (its keys
are static), the library ranks on demand and just reads :attr:`TauAdapter.tau`.

Cost: the sampled fraction of accesses is served once per candidate, in batches at each decision; the
mini-caches are quantised FIFO buckets under a min-heap like the replay policy's cache.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Container, Sequence

from ..errors import ConfigError
from ._admission import FrequencySketch
from ._arc import ArcShadow, ArcTarget
from ._buckets import PROVISIONAL_RANK, bucketize, lowest, push

__all__ = ["TauAdapter"]

_QUANTA = 64.0  # keys are quantised to 1/64 of a natural-log unit, as the replay policy's
_HASH_MUL = 2654435761  # Knuth's multiplicative hash (block ids are already hashes; this mixes the low bits)
_OFFSET = 64.0  # added to values so that quantised keys stay positive for any realistic value


_TRUE = frozenset((True,))  # (a request's hit flags "hold" exactly the True ones)


def _leading(ids: Sequence[object], lo: int, hi: int, held: Container[object]) -> int:
    """One buffered request's leading run: its entries ``ids[lo:hi]`` (buffered leaf first) read root
    first, up to the first one not in ``held``. A prefix cache serves a request only up to its first
    miss, so this, not the held blocks, is what a cache is worth; every shadow counts it alike, on its
    state when the request comes (the real cache by :meth:`TauAdapter.add`'s ``hit`` flags)."""
    n = 0
    for x in range(hi - 1, lo - 1, -1):
        if ids[x] not in held:
            break
        n += 1
    return n


class _Segmented:
    """One segmented admission shadow (see :meth:`TauAdapter._serve_admission`): TinyLFU's filter by the
    counts of ``freq`` in front of a segmented LRU of ``cap`` blocks (blocks held -> whether protected; the
    probation and protected segments, least recent first; ARC's ghost lists of the ids it evicted, as the
    library's send a returning block to ARC's frequent list), and its sampled leading hits (``hits``:
    ``mode_decay``, ``slow``: ``decay``)."""

    __slots__ = ("freq", "ghosts", "held", "hits", "prob", "prot", "slow")

    def __init__(self, cap: int, freq: FrequencySketch) -> None:
        self.freq = freq
        self.held: dict[int, bool] = {}
        self.prob: OrderedDict[int, None] = OrderedDict()
        self.prot: OrderedDict[int, None] = OrderedDict()
        self.ghosts = ArcTarget(cap)
        self.hits = 0.0
        self.slow = 0.0

    def touch(self, b: int) -> None:
        """A held ``b`` is used again: it moves to (the most recent end of) the protected segment."""
        p = self.held.get(b)
        if p is not None:
            if not p:
                del self.prob[b]
                self.held[b] = True
            self.prot[b] = None
            self.prot.move_to_end(b)

    def victim(self, own: Container[int]) -> int:
        """The next victim (the shadow must hold a block): the probation segment's least recent block,
        unless that is one of the current request's ``own`` (then every later one is: the request's new
        blocks are probation's most recent, and the library passes over a put's own blocks and leaves
        that list at the first), else the protected one's."""
        prob, prot = self.prob, self.prot
        if prob:
            v = next(iter(prob))
            if v not in own or not prot:
                return v
        return next(iter(prot))

    def serve(self, ids: Sequence[int], lo: int, hi: int, cap: int) -> None:
        """Admit the missed blocks of one request (``ids[lo:hi]``, buffered leaf first, held blocks
        touched and every block counted), touch it leaf first, trim the protected segment."""
        seg, prob, prot, freq = self.held, self.prob, self.prot, self.freq
        full = len(seg) + sum(1 for x in range(lo, hi) if ids[x] not in seg) > cap
        own = set(ids[lo:hi]) if full else ()
        victim = freq.get(self.victim(own)) if own and seg else -1  # (an empty one has no victim)
        for x in range(hi - 1, lo - 1, -1):
            b = ids[x]
            if b in seg:
                continue
            if freq.get(b) <= victim:
                break
            back = self.ghosts.returning(b)
            (prot if back else prob)[b] = None
            seg[b] = back
            if len(seg) > cap:
                v = self.victim(own)
                frequent = seg.pop(v)
                del (prot if frequent else prob)[v]
                self.ghosts.lost(v, frequent, len(prob))
        for x in range(lo, hi):
            p = seg.get(ids[x])
            if p is not None:
                (prot if p else prob).move_to_end(ids[x])
        limit = int(TauAdapter.PROTECTED * len(seg)) if len(seg) >= cap else len(seg)  # trimmed once full
        while len(prot) > limit:
            b, _ = prot.popitem(last=False)
            prob[b] = None
            seg[b] = False


#: the recency modes behind the admission filter (admission, segmented by slow counts, by fresh counts,
#: as TauAdapter._set_recency numbers them): between them the leader takes over with no margin
_FILTERED = (1, 2, 5)


class TauAdapter:
    """Chooses ``tau`` among ``taus`` by sampled shadow caches (see the module docstring).

    Not thread-safe (one event loop, or the replay's single thread). Raises ConfigError for bad
    parameters; the methods never raise for any input of the declared types.
    """

    __slots__ = (
        "_adm",
        "_adm_freq",
        "_adm_hits",
        "_adm_slow",
        "_age",
        "_arc",
        "_arc_hits",
        "_arc_slow",
        "_backoff",
        "_buf_b",
        "_buf_h",
        "_buf_r",
        "_buf_t",
        "_buf_v",
        "_bypass",
        "_caches",
        "_cap",
        "_cost",
        "_decay",
        "_every",
        "_fslru",
        "_hits",
        "_jump",
        "_last",
        "_lead_cap",
        "_live_buf",
        "_live_hits",
        "_loss",
        "_margin",
        "_mode_decay",
        "_next",
        "_prov",
        "_rec",
        "_rec_fast",
        "_rec_hits",
        "_rec_total",
        "_recover",
        "_requests",
        "_sample",
        "_ses_buf",
        "_ses_hits",
        "_ses_slow",
        "_since_compact",
        "_slru",
        "_thr",
        "_trial_loss",
        "_wait",
        "admit_mode",
        "arc_mode",
        "fresh_mode",
        "recency",
        "recency_mode",
        "session_mode",
        "slru_mode",
        "tau",
        "taus",
        "trace",
    )

    _GRACE = 8  # decisions after a switch to the predictor before recency may take it back by a lead below _UNDO_Z
    _TRIAL = 32  # decisions on the predictor after which a trial has succeeded
    _BACKOFF0 = 8  # decisions on recency before the first trial (doubled by each failed trial)
    _BACKOFF_MAX = 1024
    _REGRET = 0.01  # the exploration budget: a fraction of recency's sampled leading hits (see _choose_mode)
    _RECOVER = 32  # decisions on recency after a stay on the predictor that are still charged to it
    _TRIALS = False  # trials of the predictor without its shadow's lead (off: see _choose_mode)
    PROTECTED = 0.8  # the segmented mode's protected share of the cache (as W-TinyLFU's main cache)
    _JUMP_DECAY = 0.5  # the recency shadows' recent hits (about the last two decisions: change points)
    _JUMP_Z = 4.0  # how many standard deviations a recent lead must reach to count as a change point
    _PROVISIONAL = 2  # decisions after a change point during which the data since it can undo it
    _UNDO_Z = 2.0  # standard deviations of a lead that undoes a change point or ends the predictor's grace

    def __init__(
        self,
        taus: Sequence[float],
        start: float,
        capacity_blocks: int,
        *,
        sample_blocks: int = 1024,
        margin: float = 0.02,
        every: int = 32,
        decay: float = 0.98,
        mode_decay: float = 0.95,
        lead_cap: float = 1.0,
        recency: bool = False,
        bypass: bool = True,
    ) -> None:
        if not taus or not all(
            isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and t > 0 for t in taus
        ):
            raise ConfigError("tau_candidates_s", list(taus), "one or more finite numbers > 0")
        if not (isinstance(start, (int, float)) and math.isfinite(start) and start > 0):
            raise ConfigError("tau_s", start, "a finite number > 0")
        for name, v in (("capacity_blocks", capacity_blocks), ("sample_blocks", sample_blocks), ("every", every)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(name, v, "an integer >= 1")
        if not (isinstance(margin, (int, float)) and math.isfinite(margin) and margin >= 0):
            raise ConfigError("margin", margin, "a finite number >= 0")
        for name, f in (("decay", decay), ("mode_decay", mode_decay)):
            if isinstance(f, bool) or not (isinstance(f, (int, float)) and 0 < f <= 1):
                raise ConfigError(name, f, "a number in (0, 1]")
        if isinstance(lead_cap, bool) or not (isinstance(lead_cap, (int, float)) and 0 <= lead_cap < math.inf):
            raise ConfigError("lead_cap", lead_cap, "a finite number >= 0")
        self.taus = tuple(float(t) for t in taus)
        self.tau = float(start)
        self._sample = sample_blocks
        self._margin = float(margin)
        self._every = every
        self._decay = float(decay)
        self._mode_decay = float(mode_decay)
        self._lead_cap = float(lead_cap)
        self._hits = [0.0] * len(self.taus)
        # per candidate: resident block -> quantised key, key -> FIFO of blocks, heap of keys with a bucket
        self._caches: list[tuple[dict[int, int], dict[int, deque[int]], list[int], float]] = [
            ({}, {}, [], 1.0 / t) for t in self.taus
        ]
        self._buf_b: list[int] = []
        self._buf_v: list[float] = []
        self._buf_t: list[float] = []
        self._buf_h: list[bool] = []  # (staged) whether the real cache held the block
        self._buf_r: list[int] = []  # (staged) the end of each request's accesses in the buffers
        self._bypass = bool(bypass)
        # the recency shadow (``recency=True``): an LRU of the same sampled accesses
        self.recency = bool(recency)
        self.recency_mode = False  # (with ``recency``) starts on the predictor, in its grace period
        self._age = 0  # decisions since the last switch to the predictor
        self._backoff = self._BACKOFF0  # decisions on recency before the next trial of the predictor
        self._wait = 0
        self._live_buf = 0  # sampled hits of the real cache since the last decision
        self._live_hits = 0.0  # and their decayed count (``mode_decay``)
        self._rec: OrderedDict[int, None] = OrderedDict()
        self._rec_hits = 0.0
        # (with ``recency``) the admission shadow: an LRU of the same sampled accesses that admits a
        # missed block into a full cache only if it is more frequent than the victim (TinyLFU's
        # filter, as Writer applies it while ``admit_mode``), and its hits (``mode_decay``)
        self._adm: OrderedDict[int, None] = OrderedDict()
        self._adm_freq = FrequencySketch(1)
        self._adm_hits = 0.0
        self._adm_slow = 0.0  # the same hits decayed by ``decay`` (vs the predictive shadows')
        self.admit_mode = False
        # (with ``recency``) the segmented admission shadow: the same filter in front of a segmented
        # LRU (blocks held -> whether protected; the probation and protected segments, least recent
        # first; ARC's ghost lists of the ids it evicted, as the library's send a returning block to
        # ARC's frequent list), and its hits; ``slru_mode``: the cache follows it while it follows recency
        self._slru = _Segmented(1, self._adm_freq)
        # (with ``recency``) the same segmented shadow by counts aged as TinyLFU's reference
        # implementation ages them (``FrequencySketch(fresh=True)``: they forget faster, and a change
        # of the popular set gets in sooner; the slower counts keep a popular set that returns at long
        # distances, in a small cache); ``fresh_mode``: the segmented mode follows this one
        self._fslru = _Segmented(1, FrequencySketch(1, fresh=True))
        self.slru_mode = False
        self.fresh_mode = False
        # (with ``recency``) the ARC shadow: a whole ARC of the same sampled accesses (ArcShadow), and
        # its hits (``mode_decay``, and ``decay`` vs the predictive shadows'); ``arc_mode``: the cache
        # follows ARC while it follows recency
        self._arc = ArcShadow(1)
        self._arc_hits = 0.0
        self._arc_slow = 0.0
        self.arc_mode = False
        # (with ``recency``) the session shadow (:class:`~tierkv.scheduler.SessionPolicy`, run by the
        # caller on every request at the real capacity: :meth:`add_session`): its sampled leading hits
        # since the last decision, and their counts (``mode_decay``, ``decay``); ``session_mode``: the
        # cache follows it while it follows recency
        self._ses_buf = 0
        self._ses_hits = 0.0
        self._ses_slow = 0.0
        self.session_mode = False
        self._rec_fast = 0.0  # the LRU shadow's sampled hits decayed by ``mode_decay`` (vs _live_hits)
        # the recency shadows' (LRU, admission, segmented, ARC, session, fresh segmented) hits decayed by _JUMP_DECAY
        self._jump = [0.0] * 6
        self._last = [0.0] * 6  # the same shadows' hits in the latest decision alone
        # a change point not confirmed yet (see _choose_recency): (the mode left, the mode taken, what the
        # restart added to each fast count, decisions since, each shadow's hits since); None: none pending
        self._prov: tuple[int, int, list[float], int, list[float]] | None = None
        # (with ``recency``) the exploration budget (see _choose_mode): recency's best shadow's sampled
        # hits since the start (undecayed); the real cache's net sampled loss against it over every
        # decision on the predictor and the ``_RECOVER`` decisions after each stay (negative: a gain);
        # that loss in the current stay and its recovery; the cost of the last failed trial; and the
        # recovery's decisions left (they add to that cost when the stay failed: _recover_cost)
        self._rec_total = 0.0
        self._loss = 0.0
        self._trial_loss = 0.0
        self._cost = 0.0
        self._recover = 0
        self._since_compact = 0
        self._requests = 0
        self._next = every
        self._thr = 0
        self._cap = 1
        self.trace: list[tuple[float, float]] = []  # (time, new tau) of every switch
        self.resize(capacity_blocks)

    # ------------------------------------------------------------------ input
    def resize(self, capacity_blocks: int) -> None:
        """Set the real cache's capacity in blocks: the sample rate and the mini-caches' size. A
        change empties the mini-caches and their counts (they described another cache)."""
        if isinstance(capacity_blocks, bool) or not isinstance(capacity_blocks, int) or capacity_blocks < 1:
            raise ConfigError("capacity_blocks", capacity_blocks, "an integer >= 1")
        r = min(1.0, self._sample / capacity_blocks)
        thr, cap = int(r * 4294967296.0), max(1, round(capacity_blocks * r))
        if (thr, cap) == (self._thr, self._cap):
            return
        self._thr, self._cap = thr, cap
        for sc, buckets, bheap, _inv in self._caches:
            sc.clear()
            buckets.clear()
            bheap.clear()
        self._hits = [0.0] * len(self.taus)
        self._rec.clear()
        self._rec_hits = 0.0
        self._rec_fast = 0.0
        self._jump = [0.0] * 6
        self._last = [0.0] * 6
        self._prov = None
        self._ses_buf = 0
        self._ses_hits = self._ses_slow = 0.0
        self.session_mode = False
        self._adm.clear()
        self._adm_freq = FrequencySketch(cap)
        self._adm_hits = self._adm_slow = 0.0
        self.admit_mode = False
        self._slru = _Segmented(cap, self._adm_freq)
        self._fslru = _Segmented(cap, FrequencySketch(cap, fresh=True))
        self.slru_mode = self.fresh_mode = False
        self._arc = ArcShadow(cap)
        self._arc_hits = self._arc_slow = 0.0
        self.arc_mode = False
        self._live_hits = 0.0
        self._rec_total = self._loss = self._trial_loss = self._cost = 0.0
        self._recover = 0
        self._live_buf = 0
        self._buf_b.clear()
        self._buf_v.clear()
        self._buf_t.clear()
        self._buf_h.clear()
        self._buf_r.clear()

    def sampled(self, block: int) -> bool:
        """Whether accesses of ``block`` (an integer id) feed the shadow caches."""
        return ((block * _HASH_MUL) & 0xFFFFFFFF) < self._thr

    def add(self, block: int, value: float, t: float, hit: bool = False) -> None:
        """Buffer one access of a sampled block: its ranking ``value`` (without the time term) at time
        ``t``. Within a request, add blocks in the order the real cache admits them (leaf first).

        The adaptive policy's shadows (``recency=True``) serve a request as the library's put does
        (:meth:`Writer.put_blocks <tierkv._engine._writer.Writer.put_blocks>`): its missing blocks
        are placed root first, each above every ranked block (the provisional rank: a put never
        evicts its own blocks while others remain, so a request's stored part stays one prefix),
        then every block of the request still held is re-keyed with ``value``, leaf first.
        ``hit``: the real cache held the block when the request came (the adaptive policy
        compares the real cache's sampled leading hits with recency's shadows' while it follows
        the predictor and in the recovery after it, and charges the difference to its exploration
        budget; a request's blocks must come leaf first for its leading run to be read root first)."""
        self._buf_b.append(block)
        self._buf_v.append(value + _OFFSET)
        self._buf_t.append(t)
        self._buf_h.append(hit)

    def add_session(self, leading: int) -> None:
        """The session shadow's sampled leading hits on one request (its blocks that :meth:`sampled`
        selects, root first, up to the first one it did not hold): counted at the next decision
        beside the sampled shadows' (``recency=True``; the caller runs the shadow)."""
        self._ses_buf += leading

    def request(self, now: float) -> float | None:
        """One request was served (its sampled blocks added). Every ``every`` requests: serve the
        buffered accesses in the shadow caches and choose; return the new ``tau`` when it changed."""
        self._requests += 1
        if self.recency:
            self._buf_r.append(len(self._buf_b))
        if self._requests < self._next:
            return None
        self._next = self._requests + self._every
        self._serve()
        return self._choose(now)

    @property
    def hits(self) -> tuple[float, ...]:
        """Each candidate's decayed count of sampled hits (served accesses only; leading hits with
        ``recency``)."""
        return tuple(self._hits)

    @property
    def recency_hits(self) -> float:
        """The LRU shadow's decayed count of sampled leading hits (0 without ``recency``)."""
        return self._rec_hits

    @property
    def _recover_cost(self) -> bool:
        """Whether the recovery under way adds to ``_cost``: the stay it follows failed (ended before
        ``_TRIAL`` decisions; ``_age`` stays as it was until the next switch to the predictor)."""
        return self._age < self._TRIAL

    # --------------------------------------------------------------- internals
    def _serve(self) -> None:
        sb, sv, st = self._buf_b, self._buf_v, self._buf_t
        cap, hits = self._cap, self._hits
        n = len(sb)
        self._since_compact += n
        compact = self._since_compact > 4 * cap + 256
        if compact:
            self._since_compact = 0
        if self.recency:
            bh, lo, live = self._buf_h, 0, 0
            for hi in self._buf_r:  # the real cache's: its hit flags, held when True
                live += _leading(bh, lo, hi, _TRUE)
                lo = hi
            self._live_buf = live
        for i, (sc, buckets, bheap, inv) in enumerate(self._caches):
            if self.recency:
                hits[i] += self._serve_staged(sc, buckets, bheap, inv)
                if compact:
                    nb, nh = bucketize(sc)
                    buckets.clear()
                    buckets.update(nb)
                    bheap[:] = nh
                continue
            h = 0
            for x in range(n):
                b = sb[x]
                q = int((sv[x] + st[x] * inv) * _QUANTA)
                if b in sc:
                    h += 1
                    if sc[b] == q:
                        continue
                elif len(sc) >= cap:
                    qv, dq = lowest(sc, buckets, bheap)  # the victim heads dq
                    if q <= qv and self._bypass:
                        continue  # bypass, as the real cache
                    del sc[dq.popleft()]
                sc[b] = q
                push(buckets, bheap, b, q)
            hits[i] += h
            if compact:  # drop stale bucket entries
                nb, nh = bucketize(sc)
                buckets.clear()
                buckets.update(nb)
                bheap[:] = nh
        if self.recency:
            rec, h, lo = self._rec, 0, 0
            for hi in self._buf_r:
                h += _leading(sb, lo, hi, rec)
                for x in range(lo, hi):
                    b = sb[x]
                    if b in rec:
                        rec.move_to_end(b)
                    else:
                        rec[b] = None
                        if len(rec) > cap:
                            rec.popitem(last=False)
                lo = hi
            self._rec_hits += h
            self._rec_fast += h
            self._live_hits += self._live_buf
            h_lru = h
            h_adm, h_slru, h_fslru = self._serve_admission()
            self._adm_hits += h_adm
            self._adm_slow += h_adm
            for sh, x in ((self._slru, h_slru), (self._fslru, h_fslru)):
                sh.hits += x
                sh.slow += x
            h, lo, arc = 0, 0, self._arc
            for hi in self._buf_r:  # (buffered leaf first: served root first)
                h += _leading(sb, lo, hi, arc)
                arc.request(sb[lo:hi][::-1])
                lo = hi
            self._arc_hits += h
            self._arc_slow += h
            h_ses, self._ses_buf = self._ses_buf, 0
            self._ses_hits += h_ses
            self._ses_slow += h_ses
            jd, j = self._JUMP_DECAY, self._jump
            for i, x in enumerate((h_lru, h_adm, h_slru, h, h_ses, h_fslru)):
                j[i] = j[i] * jd + x
                self._last[i] = float(x)
            m = 1.0 + self._margin
            best = max(
                float(h_lru), max(h_adm, h_slru, h, h_ses, h_fslru) / m
            )  # recency's best shadow in this decision
            self._rec_total += best
            if not self.recency_mode or self._recover > 0:
                self._loss += best - self._live_buf
                self._trial_loss += best - self._live_buf
                self._loss = max(self._loss, -self._REGRET * self._rec_total)  # a bounded credit
                if self.recency_mode:  # recovering from a stay on the predictor
                    self._recover -= 1
                    if self._recover_cost:
                        self._cost = max(0.0, self._trial_loss)
        self._live_buf = 0
        sb.clear()
        sv.clear()
        st.clear()
        self._buf_h.clear()
        self._buf_r.clear()

    def _choose_mode(self, now: float, cur: int) -> float | None:
        """Recency or the predictor (``recency=True``); returns ``math.inf`` for a switch to recency, the
        current ``tau`` for one to the predictor, None when the mode stays.

        The LRU shadow is faithful in either mode (recency uses no feature); the predictive shadows
        only while the real cache follows the predictor: the predictor's features (access count,
        fanout, the resident leading run) are read from the real cache, and a cache run by recency
        gives them other values. Hence:

        * on the predictor, recency takes the cache back as soon as its shadow leads *the real cache*
          (its sampled hits, :meth:`add`'s ``hit``: what the predictor really achieves, whatever its
          shadow says) at all, once the ``_GRACE`` decisions after a switch to the predictor have
          passed (the features settle). Within them the stay is provisional, as a change point is
          in its window (:meth:`_unconfirmed`): a lead of more than ``_UNDO_Z`` standard deviations
          of the two counts ends it. The cache starts on the predictor, in its grace, on no evidence;
          with the grace alone, on a short trace (the multi-round QA traces of
          ``benchmarks/adversarial_traces.py``: 900 requests, 28 decisions) the predictor held the
          cache to the tenth decision, a third of the trace, while the segmented shadow had led the
          real cache by 4 standard deviations since the sixth; on the first 8% of the lab's traces
          (150-1,200 requests) 33 of 42 rows were below the best classical policy (of four), by 148.5 points in
          all (with this rule 29, by 54.9: ``benchmarks/results/2026-12-05-session20.txt``). These
          two counts decay by ``mode_decay`` (0.95: about the last 20 decisions), faster than the
          candidates' ``decay``: the mode must follow a workload's phases. And the real cache's lead is capped at ``lead_cap`` decisions' worth of
          the shadow's hits (a saturating counter, as set dueling's selector): a lead banked in a
          phase where prediction won cannot hold the cache on the predictor through a later phase
          where recency wins (on the bursty shape, recency's 5-7% per decision would need dozens of
          decisions to pay back an uncapped lead);
        * on recency, the predictor gets the cache back when its (pessimistic) shadow leads by the
          margin anyway, or, with ``_TRIALS`` on, for a *trial* once ``_wait`` decisions have passed:
          both counts restart equal, and a trial that fails doubles the wait (up to
          ``_BACKOFF_MAX``), one that lasts ``_TRIAL`` decisions resets it. Trials are off: on the
          lab's 93 rows (``benchmarks/lab_table.py`` at seeds 7, 11, 13 with the Mooncake trace, and
          at 17, 19) they cost more than they found, 12 and 8 rows below the best classical policy
          with them against 7 and 7 without, and without them no row lost more than 0.3 points
          (``benchmarks/results/2026-12-05-session13.txt``): a failed trial and the recovery after
          it cost 1-2 points, as much as the margins at 10% capacity. The shadow's lead alone hands
          the predictor the cache, and its stays are charged as below;
        * and a trial must fit the *exploration budget*: the real cache's net loss against recency's
          best shadow (per decision, the best of the recency shadows' sampled leading hits in that
          decision) over every decision it spent on the predictor so far, and over the ``_RECOVER``
          decisions on recency after each such stay, while the real cache still holds what the
          predictor kept (``_loss``; a gain counts against it, the credit capped at the budget).
          A recovery is charged in full: the gap the real cache shows against the best of the
          sampled shadows on recency anyway is counted too, an estimate that errs towards recency
          (on a trace of short shared prompts with one-shot suffixes at 5%, the first ten decisions
          after a stay ran 6.3% under the best shadow, those after sixty 1.0%; elsewhere the
          recovery can be lost in that gap). Plus what the last stay on the predictor that ended
          within ``_TRIAL`` decisions cost with its recovery so far (``_cost``: a failed trial, or
          the first stay or a shadow-led one; the estimate of the next trial's cost; a trial may
          start before the recovery ends, on a cost not yet complete), must stay within
          ``_REGRET`` (1%) of the sum of those per-decision bests since the start. The stays the
          shadow's lead starts are not held to it (that is evidence, not exploration), but their
          loss is charged. So, on a workload where prediction carries no signal, the trials add
          about 1% of recency's hits over a run plus about one stay's cost, however often they
          fail (an estimate, not a guarantee: the next trial may cost more than the last); where
          prediction wins, its gains pay for later trials. (Backing off alone bounded their
          *number*, not their cost: on the lab's mixture shape failed trials ran 17-55% of some
          tenths at up to 6 points below ARC.)

        Every count here is of *leading* hits (:func:`_leading`): a prefix cache serves a request
        only up to its first miss.
        """
        hits = self._hits
        cur_hits = hits[cur] if cur >= 0 else max(hits)
        rec = max(self._rec_hits, self._adm_slow, self._slru.slow, self._arc_slow, self._ses_slow, self._fslru.slow)
        live = self._live_hits
        if self.recency_mode:
            self._wait -= 1
            trial = cur_hits <= rec * (1.0 + self._margin)
            if trial and (
                not self._TRIALS or self._wait > 0 or self._loss + self._cost > self._REGRET * self._rec_total
            ):
                return None
            self._live_hits = self._recency_best()  # from now on the real cache answers for the predictor
            if trial:  # the evidence restarts level
                for i in range(len(hits)):
                    hits[i] = rec
            self.recency_mode = False
            self._age = 0
            self._trial_loss = 0.0
            self._recover = 0
            self.trace.append((now, self.tau))
            return self.tau
        self._age += 1
        if self._age == self._TRIAL:
            self._backoff = self._BACKOFF0  # the predictor held: a later failure waits little
        best = self._recency_best()
        if best <= live:
            return None
        if self._age <= self._GRACE and best - live <= self._UNDO_Z * math.sqrt(best + live):
            return None  # in the grace, only a lead past the undo threshold counts
        self.recency_mode = True  # no margin: recency is the safe side
        self._recover = self._RECOVER
        if self._recover_cost:
            self._backoff = min(self._BACKOFF_MAX, 2 * self._backoff)
            self._cost = max(0.0, self._trial_loss)  # what the next trial is expected to cost
        self._wait = self._backoff
        self.trace.append((now, math.inf))
        return math.inf

    def _serve_staged(self, sc: dict[int, int], buckets: dict[int, deque[int]], bheap: list[int], inv: float) -> int:
        """Serve the buffered requests in one predictive shadow as the library does (see :meth:`add`)."""
        sb, sv, st = self._buf_b, self._buf_v, self._buf_t
        cap, h, lo = self._cap, 0, 0
        for hi in self._buf_r:
            h += _leading(sb, lo, hi, sc)
            present = [sb[x] in sc for x in range(lo, hi)]
            for x in range(hi - 1, lo - 1, -1):  # new blocks placed root first, provisionally on top
                if present[x - lo]:
                    continue
                b = sb[x]
                if b in sc:
                    continue
                if len(sc) >= cap:
                    _qv, dq = lowest(sc, buckets, bheap)
                    del sc[dq.popleft()]
                q = PROVISIONAL_RANK - (hi - 1 - x)
                sc[b] = q
                push(buckets, bheap, b, q)
            for x in range(lo, hi):  # then the request is ranked, leaf first
                b = sb[x]
                old = sc.get(b)
                if old is None:
                    continue  # placed and pushed out again by its own request
                q = int((sv[x] + st[x] * inv) * _QUANTA)
                if old != q:
                    sc[b] = q
                    push(buckets, bheap, b, q)
            lo = hi
        return h

    def _serve_admission(self) -> tuple[int, int, int]:
        """Serve the buffered requests in the three admission shadows (see :meth:`_choose_recency`);
        returns their sampled leading hits (LRU main, segmented main, segmented main by fresh counts).
        Per request (buffered leaf first) the held blocks are touched (as the real put's access touches
        them: the victim is never one of the request's own; in the segmented shadow a held block is
        promoted to the protected segment, as a second use moves it to ARC's frequent list), every block is counted root first (as the
        put counts its missed blocks), then, if the cache has no room for all of the missed blocks,
        they are admitted root first until one is not more frequent than the cache's victim (a block
        after it would be unreachable; the counts compared are read after every count, as
        ``Writer._admitted`` reads them), then the request is touched leaf first. An approximation:
        after a ``lookup`` the library counts and promotes the held blocks only when the put records
        its access, after the missed ones are stored, so the two differ where a sketch aging falls
        inside a request or a held block would be the victim (within 0.5 points of the library held
        in the mode on the lab's shapes, ``tests/test_segmented.py``). The segmented
        shadow's victim is the probation segment's least recent block, or the protected one's when
        that block is the request's own (see :meth:`_Segmented.victim`); once the request is touched, a full
        cache's protected segment is trimmed to ``PROTECTED`` of it (its least recent blocks go back
        to probation as its most recent), as :meth:`Tier.trim_frequent
        <tierkv._engine._residency.Tier.trim_frequent>` does when the library has recorded a
        request's access (a block demoted in the middle of a put would land behind the put's own
        new blocks, where the victim search no longer looks). A block its ARC ghost lists remember
        comes back protected (the library keeps one :class:`~tierkv.scheduler._arc.ArcTarget` for
        ARC and this mode, each shadow its own). Every block is counted in both sketches, as the library
        counts every access in both (``SchedulerState.count_access``: a put its missed blocks, the
        access it records the held ones)."""
        sb, rec, freq, cap = self._buf_b, self._adm, self._adm_freq, self._cap
        segs = (self._slru, self._fslru)
        fresh = self._fslru.freq
        h = hs = hf = lo = 0
        for hi in self._buf_r:
            h += _leading(sb, lo, hi, rec)
            hs += _leading(sb, lo, hi, segs[0].held)
            hf += _leading(sb, lo, hi, segs[1].held)
            for x in range(lo, hi):  # the lookup touches what is held: it is not the victim
                b = sb[x]
                if b in rec:
                    rec.move_to_end(b)
                for sg in segs:
                    sg.touch(b)
            for x in range(hi - 1, lo - 1, -1):  # counted root first, as the put counts its new blocks
                freq.add(sb[x])
                fresh.add(sb[x])
            full = len(rec) + sum(1 for x in range(lo, hi) if sb[x] not in rec) > cap  # no room for them all
            victim = freq.get(next(iter(rec))) if full and rec else -1  # (an empty one has no victim)
            for x in range(hi - 1, lo - 1, -1):
                b = sb[x]
                if b in rec:
                    continue
                if freq.get(b) <= victim:
                    break
                rec[b] = None
                if len(rec) > cap:
                    rec.popitem(last=False)
            for x in range(lo, hi):
                b = sb[x]
                if b in rec:
                    rec.move_to_end(b)
            for sg in segs:
                sg.serve(sb, lo, hi, cap)
            lo = hi
        return h, hs, hf

    def _recency_best(self) -> float:
        """What recency scores against the predictor (``mode_decay`` counts): the best of plain LRU, LRU
        with admission, segmented LRU with admission (both counts), ARC and the session shadow, all but LRU
        discounted by the margin (only plain LRU is the safe side; and the best of several noisy sampled
        counts is biased upward)."""
        m = 1.0 + self._margin
        return max(
            self._rec_fast, max(self._adm_hits, self._slru.hits, self._arc_hits, self._ses_hits, self._fslru.hits) / m
        )

    def _choose_recency(self) -> None:
        """Which recency the cache follows while on recency (``recency=True``): plain LRU, LRU with
        frequency admission (``admit_mode``), the same filter in front of a segmented LRU
        (``slru_mode``; by the freshly aged counts with ``fresh_mode`` too: W-TinyLFU's own aging,
        which lets a new popular set in sooner and forgets one that returns at long distances), ARC
        (``arc_mode``) or the session shadow (``session_mode``). From LRU, the best of the others
        takes over once its shadow's sampled hits lead the LRU shadow's by the margin; back to LRU as
        soon as LRU's are at least the current one's (LRU is the safe side); between the others, the
        best takes over once it leads the current one by the margin, except that among the three modes
        behind the admission filter (admission, and the two segmented ones) whichever leads takes over
        at once: they keep the same lists in the tiers (ARC's serve as the segments) and differ in the
        order of victims and the counts the filter compares, so a switch between them leaves little to
        converge (rag s13 at 10%: the fresh counts took the cache two tenths of the trace after the
        popularity reshuffle with the margin, at it without, ``benchmarks/results/2026-12-05-session15.txt``;
        sysprompt at 10%: the segmented mode, above W-TinyLFU, took the cache from admission six tenths
        sooner; the lab's 93 rows lost 2.4 points in all to the best classical policies instead of 3.1,
        ``benchmarks/results/2026-12-05-session16.txt``).
        The sampled shadows are faithful in either mode (they read no feature of the real cache);
        counts decayed by ``mode_decay`` (about the last 20 decisions), so that noise does not flip
        the mode.

        Except at a *change point* while the cache follows recency (on the predictor these counts also
        weigh recency against the real cache's, over the same ~20 decisions): when over about the last
        two decisions (counts decayed by ``_JUMP_DECAY``) a shadow leads the current mode's by more than ``_JUMP_Z`` standard
        deviations (counts of hits: a difference ``d`` of two counts ``a``, ``b`` is significant when
        ``d > z * sqrt(a + b)``), the workload changed: that shadow takes over at once and the slower
        counts restart from the recent ones (the older evidence describes another phase; kept, it would
        switch back). On the synthetic ``agent_tools`` shape (seed 19, 5%) admission led during the dense
        first phase and fell 28 points below LRU in the sparse tail, where the slow counts took
        four decisions of the tail's twelve to follow (``benchmarks/results/2026-12-05-session13.txt``).
        A change point stays provisional for ``_PROVISIONAL`` decisions: when the hits since it show the
        mode left ahead of the mode taken by ``_UNDO_Z`` standard deviations, it is undone
        (:meth:`_unconfirmed`; ``benchmarks/results/2026-12-05-session19.txt``)."""
        counts = self._fast_counts()
        cur = self._recency_index
        if self._unconfirmed(counts, cur):
            return
        j = self._jump
        b = max(range(len(j)), key=j.__getitem__)
        if self.recency_mode and b != cur and j[b] - j[cur] > self._JUMP_Z * math.sqrt(j[b] + j[cur]):
            scale = (1.0 - self._JUMP_DECAY) / (1.0 - self._mode_decay) if self._mode_decay < 1.0 else 1.0
            restart = [x * scale for x in j]
            self._prov = (cur, b, [r - c for r, c in zip(restart, counts, strict=True)], 0, [0.0] * len(j))
            self._set_fast_counts(restart)
            self._set_recency(b)
            return
        rec = counts[0]
        m = 1.0 + self._margin
        best = max(range(1, len(counts)), key=counts.__getitem__)
        if cur == 0:  # on LRU
            if counts[best] > rec * m:
                self._set_recency(best)
            return
        if rec >= counts[cur]:
            self._set_recency(0)
        elif counts[best] > counts[cur] * m:
            self._set_recency(best)
        elif cur in _FILTERED:
            other = max((k for k in _FILTERED if k != cur), key=counts.__getitem__)
            if counts[other] > counts[cur]:
                self._set_recency(other)  # another mode behind the admission filter: no margin

    def _fast_counts(self) -> list[float]:
        """The recency shadows' ``mode_decay`` counts, numbered as :meth:`_set_recency` numbers the modes."""
        return [self._rec_fast, self._adm_hits, self._slru.hits, self._arc_hits, self._ses_hits, self._fslru.hits]

    def _set_fast_counts(self, c: Sequence[float]) -> None:
        self._rec_fast, self._adm_hits, self._slru.hits, self._arc_hits, self._ses_hits, self._fslru.hits = c

    def _unconfirmed(self, counts: list[float], cur: int) -> bool:
        """Whether the decisions since a change point undid it (then the mode it left is followed again
        and the restart of the counts is taken back: True). A change point is a hypothesis drawn from
        about two decisions' hits, which cluster (a request's blocks hit together): on the Mooncake
        synthetic trace at 5% one or two long requests held by LRU alone wiped twenty decisions of a
        segmented lead. For ``_PROVISIONAL`` decisions after it, the shadows' hits since it (not
        those that made it) are compared; when the mode left leads the mode taken by more than
        ``_UNDO_Z`` standard deviations (``d > z sqrt(a + b)``, as the change point's own test), the
        change did not happen: the restart's additions to every shadow's counts (decayed since, the
        counts being linear in them) are subtracted, the mode left is followed again, and the burst
        that made the change point is taken out of the recent counts (the mode taken keeps no more
        there than the mode left: left in, it would make the same change point at the next decision).
        When the ordinary rule has gone back to the mode left within the window, the restart is taken
        back too; when it has gone elsewhere (or to the predictor), or a second change point came, the
        restart stands (one change point is pending at a time)."""
        prov = self._prov
        if prov is None:
            return False
        left, taken, added, k, since = prov
        if not self.recency_mode or cur not in (left, taken):
            self._prov = None  # superseded
            return False
        k += 1
        for i, x in enumerate(self._last):
            since[i] += x
        d = since[left] - since[taken]
        undo = cur == left or d > self._UNDO_Z * math.sqrt(since[left] + since[taken])
        if undo:
            f = self._mode_decay**k
            self._set_fast_counts([max(0.0, c - a * f) for c, a in zip(counts, added, strict=True)])
            j = self._jump
            j[taken] = min(j[taken], j[left])
            self._prov = None
            if cur == taken:
                self._set_recency(left)
                return True
            return False
        self._prov = None if k >= self._PROVISIONAL else (left, taken, added, k, since)
        return False

    @property
    def _recency_index(self) -> int:
        """The recency mode followed, as :meth:`_set_recency` numbers it."""
        if self.slru_mode:
            return 5 if self.fresh_mode else 2
        return 1 if self.admit_mode else 3 if self.arc_mode else 4 if self.session_mode else 0

    def _set_recency(self, mode: int) -> None:
        """Follow recency mode ``mode``: 0 LRU, 1 admission, 2 segmented, 3 ARC, 4 session, 5 segmented by
        fresh counts (``slru_mode`` and ``fresh_mode``)."""
        self.admit_mode, self.slru_mode, self.arc_mode, self.session_mode = (
            mode == 1,
            mode in (2, 5),
            mode == 3,
            mode == 4,
        )
        self.fresh_mode = mode == 5

    def _choose(self, now: float) -> float | None:
        hits, taus = self._hits, self.taus
        best = max(range(len(hits)), key=hits.__getitem__)
        t = taus[best]
        new: float | None = None
        if t != self.tau:
            cur = taus.index(self.tau) if self.tau in taus else -1
            if cur < 0 or hits[best] > hits[cur] * (1.0 + self._margin):
                self.tau = t
                self.trace.append((now, t))
                new = t
        if self.recency:
            new = self._choose_mode(now, taus.index(self.tau) if self.tau in taus else -1) or new
            self._choose_recency()
        d = self._decay
        for i in range(len(hits)):
            hits[i] *= d
        self._rec_hits *= d
        self._adm_slow *= d
        self._slru.slow *= d
        self._fslru.slow *= d
        self._arc_slow *= d
        self._ses_slow *= d
        md = self._mode_decay
        self._set_fast_counts([c * md for c in self._fast_counts()])
        self._live_hits *= md
        if not self.recency_mode:  # the predictor's banked lead is capped (see _choose_mode)
            self._live_hits = min(self._live_hits, self._recency_best() * (1.0 + self._lead_cap * (1.0 - md)))
        return new
