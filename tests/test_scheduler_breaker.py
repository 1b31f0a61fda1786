from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tierkv import ConfigError
from tierkv.scheduler import BreakerState, CircuitBreaker


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def make(**kw: object) -> tuple[CircuitBreaker, Clock]:
    c = Clock()
    return CircuitBreaker("nvme", failure_threshold=3, cooldown_s=10.0, probe_successes=2, clock=c, **kw), c  # type: ignore[arg-type]


def test_opens_after_threshold_consecutive_failures() -> None:
    b, _ = make()
    b.record_failure()
    b.record_failure()
    b.record_success()  # resets the count
    b.record_failure()
    b.record_failure()
    assert b.state is BreakerState.CLOSED
    b.record_failure()
    assert b.state is BreakerState.OPEN and not b.healthy
    assert not b.allow()


def test_half_open_after_cooldown_then_closes_on_probes() -> None:
    b, clk = make()
    for _ in range(3):
        b.record_failure()
    clk.t = 9.9
    assert not b.allow()
    clk.t = 10.0
    assert b.allow()  # first probe
    assert b.state is BreakerState.HALF_OPEN
    assert not b.allow()  # probe_limit = 1: only one in flight
    b.record_success()
    assert b.state is BreakerState.HALF_OPEN
    assert b.allow()
    b.record_success()
    assert b.state is BreakerState.CLOSED and b.healthy


def test_probe_failure_reopens_and_restarts_cooldown() -> None:
    b, clk = make()
    for _ in range(3):
        b.record_failure()
    clk.t = 10.0
    assert b.allow()
    b.record_failure()
    assert b.state is BreakerState.OPEN
    clk.t = 19.0
    assert not b.allow()
    clk.t = 20.0
    assert b.allow()


def test_config_errors() -> None:
    with pytest.raises(ConfigError):
        CircuitBreaker(failure_threshold=0)
    with pytest.raises(ConfigError):
        CircuitBreaker(cooldown_s=-1)


@given(st.lists(st.sampled_from(["ok", "fail", "tick", "allow"]), max_size=80))
def test_state_machine_invariants(ops: list[str]) -> None:
    b, clk = make()
    for op in ops:
        before = b.state
        if op == "ok":
            b.record_success()
            assert b.state is not BreakerState.OPEN or before is BreakerState.OPEN
        elif op == "fail":
            b.record_failure()
            if before is BreakerState.HALF_OPEN:
                assert b.state is BreakerState.OPEN
        elif op == "tick":
            clk.t += 4.0
        else:
            allowed = b.allow()
            if b.state is BreakerState.CLOSED:
                assert allowed
            if b.state is BreakerState.OPEN:
                assert not allowed
