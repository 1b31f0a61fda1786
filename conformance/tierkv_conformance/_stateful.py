"""Hypothesis stateful test: drive a backend against a plain dict model.

The machine runs in the test's thread and calls into the backend's event loop
through an anyio blocking portal, so the same machine serves asyncio and trio.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

from anyio.from_thread import BlockingPortal
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from tierkv.backend import Allocation, Backend
from tierkv.errors import BlockExistsError, BlockNotFoundError, CapacityError, TierKVError

__all__ = ["run_stateful"]

_KEYS = [f"{c * 64}" for c in "0a5f"]


def _data(key: str, size: int, gen: int) -> bytes:
    pat = f"{key[:4]}:{gen}:".encode()
    return (pat * (size // len(pat) + 1))[:size]


def run_stateful(
    portal: BlockingPortal,
    open_backend: Callable[[], Awaitable[Backend]],
    *,
    max_examples: int,
    steps: int,
) -> None:
    """Run the state machine ``max_examples`` times (each on a freshly opened backend)."""

    class BackendMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.b: Backend = portal.call(open_backend)
            caps = self.b.capabilities
            self.base = self.b.stats()
            self.capacity = self.base.capacity_bytes
            cap = min(caps.max_block_bytes, max(0, self.capacity - self.base.used_bytes))
            self.sizes = sorted({s for s in (0, 1, caps.alignment, caps.alignment + 1, 3000) if s <= cap})
            self.model: dict[str, bytes] = {}
            self.pending: dict[str, Allocation] = {}
            self.spent: list[Allocation] = []
            self.gen = 0

        def call(self, fn: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> Any:
            return portal.call(functools.partial(fn, *args, **kwargs))

        def fp(self, n: int) -> int:
            g = self.base.details.get("granule", 1)
            g = g if isinstance(g, int) and not isinstance(g, bool) and g >= 1 else 1
            return -(-n // g) * g

        def used(self) -> int:
            return sum(self.fp(len(v)) for v in self.model.values()) + sum(
                self.fp(a.nbytes) for a in self.pending.values()
            )

        @rule(key=st.sampled_from(_KEYS), idx=st.integers(0, 4), tag=st.binary(max_size=8))
        def allocate(self, key: str, idx: int, tag: bytes) -> None:
            size = self.sizes[idx % len(self.sizes)]
            if key in self.model or key in self.pending:
                expected: type[TierKVError] | None = BlockExistsError
            elif self.base.used_bytes + self.used() + self.fp(size) > self.capacity:
                expected = CapacityError
            else:
                expected = None
            try:
                a = self.call(self.b.allocate, key, size, tag=tag)
            except TierKVError as exc:
                assert expected is not None and isinstance(exc, expected), f"allocate raised {type(exc).__name__}"
                return
            assert expected is None, f"allocate should have raised {expected.__name__}"
            assert a.nbytes == size
            self.pending[key] = a

        @precondition(lambda self: bool(self.pending))
        @rule(data=st.data())
        def write(self, data: st.DataObject) -> None:
            key = data.draw(st.sampled_from(sorted(self.pending)))
            a = self.pending.pop(key)
            self.gen += 1
            payload = _data(key, a.nbytes, self.gen)
            self.call(self.b.write, a, payload)
            self.model[key] = payload
            self.spent.append(a)

        @precondition(lambda self: bool(self.spent))
        @rule(data=st.data())
        def write_spent_allocation(self, data: st.DataObject) -> None:
            a = data.draw(st.sampled_from(self.spent))
            if a.key in self.pending:
                return
            try:
                self.call(self.b.write, a, _data(a.key, a.nbytes, -1))
            except BlockNotFoundError:
                return
            raise AssertionError("writing a consumed allocation must raise BlockNotFoundError")

        @rule(key=st.sampled_from(_KEYS), into=st.booleans())
        def read(self, key: str, into: bool) -> None:
            if key in self.model:
                want = self.model[key]
                buf = bytearray(len(want) + 3) if into else None
                got = self.call(self.b.read, key, into=buf)
                assert bytes(got) == want, f"read {key[:8]}: wrong bytes"
            else:
                try:
                    self.call(self.b.read, key)
                except BlockNotFoundError:
                    return
                raise AssertionError(f"read of absent {key[:8]} did not raise BlockNotFoundError")

        @rule(key=st.sampled_from(_KEYS))
        def evict(self, key: str) -> None:
            expected = key in self.model or key in self.pending
            assert self.call(self.b.evict, key) is expected
            self.model.pop(key, None)
            self.pending.pop(key, None)

        @rule(key=st.sampled_from(_KEYS))
        def contains(self, key: str) -> None:
            assert self.call(self.b.contains, key) is (key in self.model)

        @invariant()
        def accounting(self) -> None:
            s = self.b.stats()
            assert s.used_bytes == self.base.used_bytes + self.used(), (s.used_bytes, self.used())
            assert s.reserved_bytes == self.base.reserved_bytes + sum(self.fp(a.nbytes) for a in self.pending.values())
            assert s.blocks == self.base.blocks + len(self.model)

        def teardown(self) -> None:
            try:
                for key in _KEYS:
                    self.call(self.b.evict, key)
            finally:
                self.call(self.b.aclose)

    run_state_machine_as_test(
        BackendMachine,
        settings=settings(
            max_examples=max_examples,
            stateful_step_count=steps,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,
        ),
    )
