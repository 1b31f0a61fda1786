"""Bayesian reuse predictor: Beta posteriors per (block type x transition type) plus per-block evidence.

Model
-----
For every *context* ``(block_type, transition_type)`` (4 x 4 = 16 contexts) the predictor keeps a Beta
posterior ``Beta(alpha, beta)`` over "this block is reused within its horizon", starting from the prior
``Beta(alpha0, beta0)`` (1, 1 by default: uniform). Each resolved observation adds 1 to ``alpha`` (reused)
or to ``beta`` (not reused). Its point estimate is the posterior mean ``alpha / (alpha + beta)``.

Confidence saturates with the (exponentially weighted) number of observations ``n`` in the sliding window
(the window's counts decay by ``(1 - 1/window)`` per resolved observation, applied in batches):
``confidence(n) = n / (n + k)`` (``k = confidence_k``, 32 by default), so it is 0 with no data,
0.5 after ``k`` observations and tends to 1. The context estimate blends the posterior (all history,
prior-regularised) with the empirical frequency of the last ``window`` outcomes (which tracks drift),
trusting the window in proportion to its confidence::

    p_ctx = (1 - c) * alpha / (alpha + beta) + c * window_hits / window_n,    c = n_win / (n_win + k)

Per-block evidence is combined naive-Bayes style in log-odds: frequency (how many times the block -- or,
for a new block, its session's prefix -- was accessed before, bucketed 0..5+), prefix fanout (distinct
sessions / continuations that used the block, bucketed 0, 1, 2-3, 4+) and prompt shape (blocks in the
prompt and the block's position in it, log2 buckets: :func:`size_bucket`) each have their own blended Beta/window reuse rate and contribute the log-likelihood
ratio ``logit(p_bucket) - logit(p_all)``::

    p_nb = sigmoid(logit(p_ctx) + llr_count[cb] + llr_fanout[fb] + llr_size[sb])

Finally each full cell ``(ctx, cb, fb, sb)`` has its own Beta posterior whose prior is ``p_nb`` with
strength ``k``: ``p = (hits_cell + k * p_nb) / (n_cell + k)`` -- the naive-Bayes estimate where a cell has
few observations, the cell's own rate where it has many (interactions between the factors).

Recency is not a factor of ``p``: it enters the caller's eviction priority through ageing (see the tierkv
replay policy), because "reused within the horizon" already conditions on it.

No information from the future: an access at time ``t`` is an *observation* whose outcome is resolved
only at ``t + horizon`` (:meth:`ReusePredictor.advance`): reused iff the same block was accessed again in
``(t, t + horizon]``. Until then it does not touch any posterior.

Speed: all state is ints/floats in dicts and flat lists; the combined probability table is recomputed
only every ``refresh_every`` resolutions, so :meth:`ReusePredictor.probability` is one list index. The
library and the replay lab use this same class.

Label derivation (when the caller gives no labels)
--------------------------------------------------
Block type (:func:`derive_block_type`), first rule that matches:

1. ``system_prompt`` -- the first block of a prompt (position 0), or a block already used by two or more
   distinct sessions / continuations (fanout >= 2): a shared prefix.
2. ``intermediate_reasoning`` -- the trailing, partially filled block of a prompt: the block that the
   generated tokens extend. With chained prefix hashes its id changes as soon as tokens are appended.
3. ``user_context`` -- every other block.

``tool_context`` is only ever given by the caller (``block_type="tool_context"``).

Transition type (:func:`derive_transition`), first rule that matches:

1. ``reasoning_step`` -- the request continues a session (see 2) less than ``quick_step_s`` (30 s) after
   the session's previous turn: a tight, likely automated loop (agent step, tool result fed back).
2. ``same_tool_repeat`` -- the request continues a session: its leading run of already-seen blocks
   extends past the first block (the previous turn's prompt is re-used).
3. ``agent_handoff`` -- the first request of a session: at most the shared first block was seen before.

``tool_switch`` comes from the caller (``kv.hint(transition=...)``), which may also override any rule.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import repeat

import numpy as np

from ..errors import ConfigError

__all__ = [
    "BLOCK_TYPES",
    "TRANSITIONS",
    "PredictorConfig",
    "ReusePredictor",
    "N_CELLS",
    "beta_mean",
    "cell_index",
    "blend",
    "confidence",
    "count_bucket",
    "derive_block_type",
    "derive_transition",
    "fanout_bucket",
    "size_bucket",
]

BLOCK_TYPES: tuple[str, ...] = ("system_prompt", "tool_context", "user_context", "intermediate_reasoning")
TRANSITIONS: tuple[str, ...] = ("same_tool_repeat", "tool_switch", "reasoning_step", "agent_handoff")
N_COUNT_BUCKETS = 6
N_FANOUT_BUCKETS = 4
N_SIZE_BUCKETS = 49  # 7 prompt-length buckets x 7 position buckets
N_CELLS = 16 * N_COUNT_BUCKETS * N_FANOUT_BUCKETS * N_SIZE_BUCKETS
_FANOUT_BUCKET = (0, 1, 2, 2)  # 0, 1, 2, 3 -> buckets; 4+ -> 3


def beta_mean(alpha: float, beta: float) -> float:
    """Posterior mean ``alpha / (alpha + beta)``; ``alpha`` and ``beta`` must be > 0."""
    return alpha / (alpha + beta)


def confidence(n: float, k: float) -> float:
    """Saturating confidence ``n / (n + k)``: 0 at ``n == 0``, 1/2 at ``n == k``, -> 1 as ``n`` grows."""
    if n <= 0:
        return 0.0
    return n / (n + k)


def blend(posterior: float, window_freq: float, conf: float) -> float:
    """``(1 - conf) * posterior + conf * window_freq``: trust the recent window as it fills up."""
    return (1.0 - conf) * posterior + conf * window_freq


def count_bucket(count: int) -> int:
    """Bucket of the number of earlier accesses of a block: 0..4, then 5 for five or more."""
    return count if count < 5 else 5


def fanout_bucket(fanout: int) -> int:
    """Bucket of a block's fanout (distinct sessions/continuations): 0, 1, 2-3, 4+ -> 0..3."""
    return _FANOUT_BUCKET[fanout] if fanout < 4 else 3


def size_bucket(prompt_blocks: int, position: int) -> int:
    """Shape bucket ``7 * length_bucket + position_bucket`` in ``[0, 49)``.

    Length buckets of the prompt in blocks: <=2, <=4, <=8, <=16, <=32, <=64, more -> 0..6; position
    buckets of the block's index: 0, 1, 2-3, 4-7, 8-15, 16-31, 32+ -> 0..6.
    """
    lb = 0 if prompt_blocks <= 2 else min(6, (prompt_blocks - 1).bit_length() - 1)
    return 7 * lb + min(6, position.bit_length())


def cell_index(ctx: int, cb: int, fb: int, sb: int) -> int:
    """Flat index of the cell ``(context, count bucket, fanout bucket, size bucket)``."""
    return ((ctx * N_COUNT_BUCKETS + cb) * N_FANOUT_BUCKETS + fb) * N_SIZE_BUCKETS + sb


def derive_block_type(position: int, is_tail: bool, fanout: int) -> int:
    """Index into :data:`BLOCK_TYPES` from causal signals (rules in the module docstring)."""
    if position == 0 or fanout >= 2:
        return 0
    if is_tail:
        return 3
    return 2


def derive_transition(leading_seen: int, since_previous_turn_s: float | None = None, quick_step_s: float = 30.0) -> int:
    """Index into :data:`TRANSITIONS` from the request's leading run of seen blocks and the time since the
    session's previous turn (None: unknown); rules in the module docstring."""
    if leading_seen <= 1:
        return 3
    if since_previous_turn_s is not None and since_previous_turn_s < quick_step_s:
        return 2
    return 0


def _logit(p: float) -> float:
    p = min(max(p, 1e-6), 1.0 - 1e-6)
    return math.log(p / (1.0 - p))


@dataclass(frozen=True, slots=True)
class PredictorConfig:
    """Tunables of :class:`ReusePredictor` (validated on construction; errors are ``ConfigError``)."""

    alpha0: float = 1.0
    beta0: float = 1.0
    confidence_k: float = 32.0
    window: int = 32768
    horizon_s: float = 300.0
    refresh_every: int = 4096

    def __post_init__(self) -> None:
        for name in ("alpha0", "beta0", "confidence_k", "horizon_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and v > 0 and math.isfinite(v)):
                raise ConfigError(f"scheduler.predictor.{name}", v, "a finite number > 0")
        for name in ("window", "refresh_every"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"scheduler.predictor.{name}", v, "an integer >= 1")


class ReusePredictor:
    """Online reuse-probability estimator (single-threaded; callers serialise access).

    ``observe(now, block, cell)`` records an access (``cell`` from :func:`cell_index`); ``advance(now)``
    resolves every observation whose horizon has passed; ``probability(cell)`` returns the combined
    estimate, one list index. Times are seconds on any monotonic scale. Never raises after construction.

    Only per-cell counts are updated per resolution (all-time hits/n and windowed hits/n); the marginal
    posteriors of contexts and evidence buckets are sums over cells, computed at :meth:`refresh`.
    """

    __slots__ = (
        "_batch",
        "_batch_t",
        "_ch",
        "_cn",
        "_last",
        "_log_table",
        "_pending",
        "_res_all",
        "_res_hit",
        "_since_refresh",
        "_table",
        "_wh",
        "_wn",
        "config",
        "horizon",
        "resolved",
    )

    def __init__(self, config: PredictorConfig | None = None) -> None:
        cfg = config or PredictorConfig()
        self.config = cfg
        self.horizon = cfg.horizon_s
        self._ch = np.zeros(N_CELLS)
        self._cn = np.zeros(N_CELLS)
        self._wh = np.zeros(N_CELLS)
        self._wn = np.zeros(N_CELLS)
        self._res_all: list[int] = []  # cells resolved since the last refresh
        self._res_hit: list[int] = []  # ... of which reused
        self._pending: deque[tuple[float, int, int]] = deque()  # (time, block, cell) in time order
        self._last: dict[int, float] = {}
        self._batch: list[tuple[int, int]] = []  # (block, cell) observed by observe() at _batch_t
        self._batch_t = -math.inf
        self._since_refresh = 0
        self.resolved = 0
        self._table: list[float] = []
        self._log_table: list[float] = []
        self.refresh()

    @property
    def table(self) -> list[float]:
        """The combined probability per cell (a list owned by the predictor; replaced at each refresh)."""
        return self._table

    @property
    def log_table(self) -> list[float]:
        """Natural log of :attr:`table` (floored at 1e-12), for rankings in log space."""
        return self._log_table

    def observe(self, now: float, block: int, cell: int) -> None:
        """Record an access of ``block`` at ``now`` (non-decreasing) in ``cell``.

        The accesses recorded with the same ``now`` form the *last batch* (one request: :attr:`last_batch`).
        """
        self._last[block] = now
        self._pending.append((now, block, cell))
        if now != self._batch_t:
            self._batch_t = now
            self._batch = []
        self._batch.append((block, cell))

    @property
    def last_batch(self) -> tuple[float, list[tuple[int, int]]]:
        """``(time, [(block, cell), ...])`` of the accesses :meth:`observe` recorded at the latest time."""
        return self._batch_t, self._batch

    def last_reuse(self, block: int) -> float | None:
        """Time of the block's latest (credited) access still remembered, or None (forgotten once an
        observation of it resolves as not reused)."""
        return self._last.get(block)

    def observe_many(
        self, now: float, blocks: Sequence[int], cells: Sequence[int], credit: Sequence[bool] | None = None
    ) -> None:
        """:meth:`observe` for several blocks accessed at the same time (same length sequences).

        ``credit`` (optional): per block, whether this access counts as a *useful* reuse of the block's
        previous observation (for instance, an OPTgen verdict that an optimal cache of this size would have
        kept it). An uncredited access does not mark the previous observation as reused.
        """
        if credit is None:
            self._last.update(zip(blocks, repeat(now, len(blocks)), strict=False))
        else:
            last = self._last
            for b, c in zip(blocks, credit, strict=True):
                if c:
                    last[b] = now
        self._pending.extend(zip(repeat(now, len(blocks)), blocks, cells, strict=False))

    def advance(self, now: float) -> int:
        """Resolve every observation older than ``now - horizon``; return how many were resolved."""
        pending = self._pending
        limit = now - self.horizon
        if not pending or pending[0][0] > limit:
            return 0
        last = self._last
        ra, rh = self._res_all.append, self._res_hit.append
        n = 0
        pop = pending.popleft
        while pending and pending[0][0] <= limit:
            t, block, cell = pop()
            ra(cell)
            if last.get(block, t) > t:
                rh(cell)
            else:
                last.pop(block, None)
            n += 1
        self.resolved += n
        self._since_refresh += n
        if self._since_refresh >= self.config.refresh_every:
            self.refresh()
        return n

    def _shaped(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        shape = (16, N_COUNT_BUCKETS, N_FANOUT_BUCKETS, N_SIZE_BUCKETS)
        self._fold()
        return (
            self._ch.reshape(shape),
            self._cn.reshape(shape),
            self._wh.reshape(shape),
            self._wn.reshape(shape),
        )

    def _fold(self) -> None:
        """Add the observations resolved since the last fold to the counts (window decayed first)."""
        if not self._res_all:
            return
        f = (1.0 - 1.0 / self.config.window) ** len(self._res_all)
        na = np.bincount(np.asarray(self._res_all, dtype=np.int64), minlength=N_CELLS).astype(np.float64)
        nh = np.bincount(np.asarray(self._res_hit, dtype=np.int64), minlength=N_CELLS).astype(np.float64)
        self._cn += na
        self._ch += nh
        self._wn = self._wn * f + na
        self._wh = self._wh * f + nh
        self._res_all.clear()
        self._res_hit.clear()

    def _marginal(self, axis: int | None) -> np.ndarray:
        """Blended estimate per index of ``axis`` (None: all observations), as a 1-D array."""
        cfg = self.config
        ch, cn, wh, wn = self._shaped()
        axes = tuple(a for a in range(4) if a != axis)
        h, n, w_h, w_n = (x.sum(axis=axes) if axis is not None else np.atleast_1d(x.sum()) for x in (ch, cn, wh, wn))
        post = (cfg.alpha0 + h) / (cfg.alpha0 + cfg.beta0 + n)
        freq = np.divide(w_h, w_n, out=np.zeros_like(w_h), where=w_n > 0)
        c = w_n / (w_n + cfg.confidence_k)
        return np.asarray((1.0 - c) * post + c * freq)

    def refresh(self) -> None:
        """Decay the window, recompute the marginal posteriors and the combined probability table."""
        self._fold()
        self._since_refresh = 0

        def logit(p: np.ndarray) -> np.ndarray:
            q = np.clip(p, 1e-6, 1.0 - 1e-6)
            return np.asarray(np.log(q / (1.0 - q)))

        base = logit(self._marginal(None))[0]
        x = (
            logit(self._marginal(0))[:, None, None, None]
            + (logit(self._marginal(1)) - base)[None, :, None, None]
            + (logit(self._marginal(2)) - base)[None, None, :, None]
            + (logit(self._marginal(3)) - base)[None, None, None, :]
        )
        p_nb = 1.0 / (1.0 + np.exp(-x.reshape(-1)))
        m = self.config.confidence_k
        p = (self._ch + m * p_nb) / (self._cn + m)
        self._table = p.tolist()
        self._log_table = np.log(np.maximum(p, 1e-12)).tolist()

    def probability(self, cell: int) -> float:
        """Combined reuse probability in [0, 1] of a cell (as of the last :meth:`refresh`)."""
        return self._table[cell]

    def posterior(self, block_type: str, transition: str) -> tuple[float, float]:
        """``(alpha, beta)`` of a context's Beta posterior (unknown labels raise ConfigError)."""
        ctx = self.context(block_type, transition)
        ch, cn, _, _ = self._shaped()
        h, n = float(ch[ctx].sum()), float(cn[ctx].sum())
        return self.config.alpha0 + h, self.config.beta0 + n - h

    def context_estimate(self, block_type: str, transition: str) -> float:
        """Blended posterior/window estimate of one context (no per-block evidence)."""
        return float(self._marginal(0)[self.context(block_type, transition)])

    @staticmethod
    def context(block_type: str, transition: str) -> int:
        """Context index for label names; raises ``ConfigError`` on an unknown label."""
        if block_type not in BLOCK_TYPES:
            raise ConfigError("block_type", block_type, "one of " + ", ".join(BLOCK_TYPES))
        if transition not in TRANSITIONS:
            raise ConfigError("transition", transition, "one of " + ", ".join(TRANSITIONS))
        return BLOCK_TYPES.index(block_type) * len(TRANSITIONS) + TRANSITIONS.index(transition)

    @property
    def pending(self) -> int:
        """Number of observations not yet resolved."""
        return len(self._pending)
