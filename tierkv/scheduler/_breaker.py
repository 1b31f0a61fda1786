"""Circuit breaker per tier: a pure state machine with an injectable clock.

States: ``CLOSED`` (healthy: requests flow), ``OPEN`` (unhealthy: the tier is out of the promotion/demotion
graph and its blocks count as misses), ``HALF_OPEN`` (recovery: up to ``probe_limit`` probe requests are
let through).

Transitions:

* CLOSED --``failure_threshold`` consecutive failures--> OPEN (a success resets the count).
* OPEN --``cooldown_s`` elapsed since opening (checked by :meth:`allow`)--> HALF_OPEN.
* HALF_OPEN --``probe_successes`` successes--> CLOSED; --any failure--> OPEN (cooldown restarts).

Not thread-safe; the scheduler calls it from one event loop. ``clock`` is any monotonic callable returning
seconds (default :func:`time.monotonic`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from enum import Enum

from ..errors import ConfigError

__all__ = ["BreakerState", "CircuitBreaker"]


class BreakerState(Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class CircuitBreaker:
    """See the module docstring. ``ConfigError`` on invalid thresholds."""

    __slots__ = (
        "_clock",
        "_failures",
        "_opened_at",
        "_probes",
        "_successes",
        "cooldown_s",
        "failure_threshold",
        "probe_limit",
        "probe_successes",
        "state",
        "tier",
    )

    def __init__(
        self,
        tier: str = "",
        *,
        failure_threshold: int = 5,
        cooldown_s: float = 5.0,
        probe_successes: int = 2,
        probe_limit: int = 1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        for name, v in (
            ("failure_threshold", failure_threshold),
            ("probe_successes", probe_successes),
            ("probe_limit", probe_limit),
        ):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"scheduler.breaker.{name}", v, "an integer >= 1")
        if not cooldown_s >= 0:
            raise ConfigError("scheduler.breaker.cooldown_s", cooldown_s, "a number >= 0")
        self.tier = tier
        self.failure_threshold = failure_threshold
        self.cooldown_s = float(cooldown_s)
        self.probe_successes = probe_successes
        self.probe_limit = probe_limit
        self._clock = clock
        self.state = BreakerState.CLOSED
        self._failures = 0
        self._successes = 0
        self._probes = 0
        self._opened_at = 0.0

    @property
    def healthy(self) -> bool:
        """True when CLOSED (the tier takes part in placement)."""
        return self.state is BreakerState.CLOSED

    def allow(self) -> bool:
        """May a request go to the tier now? In HALF_OPEN each ``True`` consumes one probe slot."""
        if self.state is BreakerState.CLOSED:
            return True
        if self.state is BreakerState.OPEN:
            if self._clock() - self._opened_at < self.cooldown_s:
                return False
            self.state = BreakerState.HALF_OPEN
            self._successes = 0
            self._probes = 0
        if self._probes < self.probe_limit:
            self._probes += 1
            return True
        return False

    def record_success(self) -> None:
        """Report a request that succeeded."""
        if self.state is BreakerState.HALF_OPEN:
            self._probes = max(0, self._probes - 1)
            self._successes += 1
            if self._successes >= self.probe_successes:
                self.state = BreakerState.CLOSED
                self._failures = 0
        elif self.state is BreakerState.CLOSED:
            self._failures = 0

    def record_failure(self) -> None:
        """Report a request that failed (a backend I/O error, a timeout)."""
        if self.state is BreakerState.HALF_OPEN:
            self._open()
        elif self.state is BreakerState.CLOSED:
            self._failures += 1
            if self._failures >= self.failure_threshold:
                self._open()

    def _open(self) -> None:
        self.state = BreakerState.OPEN
        self._opened_at = self._clock()
        self._failures = 0
        self._successes = 0
        self._probes = 0
