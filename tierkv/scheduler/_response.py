"""Response-length signal: how a request's answer length changes the value of its blocks (causal).

A conversation's next turn re-uses the whole prompt of the previous one, so a request's blocks are worth
keeping about as much as its session is likely to come back soon. When the engine has *finished* answering
a request, the length of the answer is known, and it is informative: on the Mooncake conversation trace a
turn answered in fewer than 32 tokens is continued within 300 s in 17-22% of the cases, against 28-38%
otherwise (a one-word answer often closes a topic; a long one takes a while to read).

The signal is only used once it exists: at the request's *completion* (the library: when the engine calls
``TierKV.hint(response_tokens=...)``; the replay lab: at the modelled completion time
:func:`completion_time`, ``arrival + input_tokens / 10,000 tok/s + output_tokens x 30 ms``). At that time

* the request's blocks that no later request has touched get ``delta`` added to their eviction key
  ``ln P(reuse) + t_last / tau``, with ``delta = (t_done - t_arrival) / tau + adjustment(class)``: their
  recency counts from the completion (an answer that took long to generate is younger than its arrival
  time says) and their value is re-weighted by the answer's class;
* :class:`ResponseModel` learns ``adjustment(class)`` online as a calibration ratio: for each completed
  request it records the predictor's estimate ``p`` of its deepest full block (the block the next turn
  must re-use) and, once ``horizon`` seconds have passed *after the completion*, whether that block was
  reused (usefully: in the replay, as judged by OPTgen) in between. Per class::

      adjustment(c) = ln((hits_c + m) / (expected_c + m))        (m = prior_strength, clipped to +-3)

  i.e. how much more (or less) often than the predictor expected a request of this answer class was
  continued. Counts decay by ``1 - 1/window`` per resolved request (drift). An unknown class gets 0.

Response classes (:func:`response_class`): fewer than 8, 32, 128, 512 answer tokens, or more -> 0..4.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable

from ..errors import ConfigError

__all__ = [
    "N_RESPONSE_CLASSES",
    "RESPONSE_EDGES",
    "ResponseModel",
    "completion_time",
    "response_class",
]

RESPONSE_EDGES: tuple[int, ...] = (8, 32, 128, 512)
N_RESPONSE_CLASSES = len(RESPONSE_EDGES) + 1
_CLIP = 3.0


def response_class(tokens: int) -> int:
    """Class of an answer of ``tokens`` tokens: < 8, < 32, < 128, < 512, more -> 0..4."""
    for c, edge in enumerate(RESPONSE_EDGES):
        if tokens < edge:
            return c
    return len(RESPONSE_EDGES)


def completion_time(
    arrival_s: float,
    input_tokens: int,
    output_tokens: int,
    prefill_tokens_per_s: float = 10_000.0,
    decode_s_per_token: float = 0.03,
) -> float:
    """Modelled completion of a request (seconds): arrival + prefill of the prompt + decode of the answer."""
    return arrival_s + input_tokens / prefill_tokens_per_s + output_tokens * decode_s_per_token


class ResponseModel:
    """Online per-answer-class calibration of the reuse predictor (single-threaded; see the module doc).

    ``observe(t_done, block, cls, expected)`` records a completed request (its deepest full block, its
    answer class, the predictor's reuse probability for that block); ``advance(now, last_reuse, horizon)``
    resolves the records older than ``now - horizon``: reused iff ``last_reuse(block) > t_done`` (the last
    useful access, ``-inf`` / None if none); ``adjustment(cls)`` is one list index. Never raises after
    construction.
    """

    __slots__ = ("_exp", "_hits", "_pending", "adjust", "decay", "prior_strength", "resolved")

    def __init__(self, prior_strength: float = 32.0, window: int = 8192) -> None:
        if not (isinstance(prior_strength, (int, float)) and math.isfinite(prior_strength) and prior_strength > 0):
            raise ConfigError("scheduler.response.prior_strength", prior_strength, "a finite number > 0")
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ConfigError("scheduler.response.window", window, "an integer >= 1")
        self.prior_strength = float(prior_strength)
        self.decay = 1.0 - 1.0 / window
        self._hits = [0.0] * N_RESPONSE_CLASSES
        self._exp = [0.0] * N_RESPONSE_CLASSES
        self._pending: deque[tuple[float, int, int, float]] = deque()
        self.adjust = [0.0] * N_RESPONSE_CLASSES
        self.resolved = 0

    def observe(self, t_done: float, block: int, cls: int, expected: float) -> None:
        """Record a request completed at ``t_done`` (non-decreasing) whose next turn would re-use ``block``."""
        if 0 <= cls < N_RESPONSE_CLASSES:
            self._pending.append((t_done, block, cls, min(max(expected, 0.0), 1.0)))

    def advance(self, now: float, last_reuse: Callable[[int], float | None], horizon: float) -> int:
        """Resolve the records whose horizon has passed; return how many were resolved."""
        pending = self._pending
        limit = now - horizon
        if not pending or pending[0][0] > limit:
            return 0
        hits, exp = self._hits, self._exp
        new_h = [0.0] * N_RESPONSE_CLASSES
        new_e = [0.0] * N_RESPONSE_CLASSES
        n = 0
        while pending and pending[0][0] <= limit:
            t, block, c, e = pending.popleft()
            last = last_reuse(block)
            if last is not None and last > t:
                new_h[c] += 1.0
            new_e[c] += e
            n += 1
        f = self.decay**n  # the batch is decayed as a whole (its members resolve at the same call)
        for k in range(N_RESPONSE_CLASSES):
            hits[k] = hits[k] * f + new_h[k]
            exp[k] = exp[k] * f + new_e[k]
        m = self.prior_strength
        ref = math.log((sum(hits) + m) / (sum(exp) + m))  # the predictor's overall bias on these blocks
        self.adjust = [
            max(-_CLIP, min(_CLIP, math.log((h + m) / (x + m)) - ref)) for h, x in zip(hits, exp, strict=True)
        ]
        self.resolved += n
        return n

    def adjustment(self, cls: int) -> float:
        """Log calibration ratio of an answer class (0 for an unknown class or before any data)."""
        return self.adjust[cls] if 0 <= cls < N_RESPONSE_CLASSES else 0.0

    @property
    def pending(self) -> int:
        """Completed requests not yet resolved."""
        return len(self._pending)
