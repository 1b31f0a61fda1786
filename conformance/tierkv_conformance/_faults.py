"""A backend wrapper that injects faults: errors, latency and torn writes.

Used to check that the core degrades as specified (retries, circuit breaker,
checksum detection of torn blocks). Every decision comes from one seeded
``random.Random``, so a run with the same seed and the same call order injects
the same faults.

Fault semantics (each drawn independently per call of an op listed in ``ops``):

* latency: sleep a random time in ``latency_s`` before the call (a
  cancellation point, like slow I/O);
* error: the call raises :class:`~tierkv.BackendIOError` and changes nothing —
  except a failed ``write``, which releases the reservation (as the contract
  says a failed write does);
* torn write: ``write`` commits a block of the right length whose tail after a
  random cut is zeroed, and returns normally. Only a checksum above the
  backend can notice; the torn keys are listed in :attr:`FaultInjectingBackend.torn_keys`.
"""

from __future__ import annotations

import random
import types
from dataclasses import dataclass, field
from typing import Any

import anyio

from tierkv.backend import (
    Allocation,
    Backend,
    BackendStats,
    BlockInfo,
    Buffer,
    Capabilities,
    SupportsScan,
    as_byte_view,
)
from tierkv.errors import BackendError, BackendIOError, ConfigError

__all__ = ["FaultConfig", "FaultInjectingBackend", "FaultStats"]

_OPS = frozenset({"allocate", "write", "read", "evict", "contains"})


@dataclass(frozen=True, slots=True)
class FaultConfig:
    """Rates are probabilities in [0, 1] per call."""

    error_rate: float = 0.0
    latency_rate: float = 0.0
    latency_s: tuple[float, float] = (0.0005, 0.005)
    torn_write_rate: float = 0.0
    ops: frozenset[str] = _OPS
    seed: int = 0

    def __post_init__(self) -> None:
        for f in ("error_rate", "latency_rate", "torn_write_rate"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0:
                raise ConfigError(f"faults.{f}", v, "a probability between 0 and 1")
        lo, hi = self.latency_s
        if not 0.0 <= lo <= hi:
            raise ConfigError("faults.latency_s", self.latency_s, "(low, high) seconds with 0 <= low <= high")
        if not set(self.ops) <= _OPS:
            raise ConfigError("faults.ops", sorted(self.ops), "a subset of " + ", ".join(sorted(_OPS)))


@dataclass(frozen=True, slots=True)
class FaultStats:
    """How many faults were injected so far."""

    calls: int = 0
    errors: int = 0
    delays: int = 0
    torn_writes: int = 0
    by_op: dict[str, int] = field(default_factory=dict)


class FaultInjectingBackend(Backend):
    """Wrap an *opened* backend and inject faults into its calls.

    The wrapper owns the inner backend: ``aclose`` closes it. If the inner
    backend implements ``scan`` the wrapper does too. Rates can be changed at
    run time with :meth:`set_faults` (e.g. to heal a tier).
    """

    def __new__(cls, inner: Backend, faults: FaultConfig | None = None, *, name: str = "") -> FaultInjectingBackend:
        if cls is FaultInjectingBackend and isinstance(inner, SupportsScan):
            cls = _ScanningFaultInjectingBackend
        return super().__new__(cls)

    def __init__(self, inner: Backend, faults: FaultConfig | None = None, *, name: str = "") -> None:
        super().__init__({}, name=name or inner.name)
        self.inner = inner
        self._faults = faults or FaultConfig()
        self._rng = random.Random(self._faults.seed)
        self._counts: dict[str, int] = {"calls": 0, "errors": 0, "delays": 0, "torn_writes": 0}
        self._by_op: dict[str, int] = {}
        self.torn_keys: set[str] = set()
        self._opened = True

    @property
    def faults(self) -> FaultConfig:
        return self._faults

    def set_faults(self, faults: FaultConfig) -> None:
        """Replace the fault rates (the RNG continues its sequence)."""
        self._faults = faults

    def fault_stats(self) -> FaultStats:
        return FaultStats(**self._counts, by_op=dict(self._by_op))

    @property
    def capabilities(self) -> Capabilities:
        return self.inner.capabilities

    async def _close(self) -> None:
        await self.inner.aclose()

    async def _inject(self, op: str) -> bool:
        """Maybe sleep; return True if this call must fail."""
        self._check_open()
        f = self._faults
        self._counts["calls"] += 1
        if op not in f.ops:
            return False
        if f.latency_rate and self._rng.random() < f.latency_rate:
            self._counts["delays"] += 1
            await anyio.sleep(self._rng.uniform(*f.latency_s))
        if f.error_rate and self._rng.random() < f.error_rate:
            self._counts["errors"] += 1
            self._by_op[op] = self._by_op.get(op, 0) + 1
            return True
        return False

    def _error(self, op: str, key: str) -> BackendIOError:
        return BackendIOError(f"injected fault: {op} {key!r} failed", tier=self.name)

    async def allocate(self, key: str, nbytes: int, *, tag: bytes = b"") -> Allocation:
        if await self._inject("allocate"):
            raise self._error("allocate", key)
        return await self.inner.allocate(key, nbytes, tag=tag)

    async def write(self, allocation: Allocation, data: Buffer) -> None:
        if await self._inject("write"):
            with anyio.CancelScope(shield=True):
                try:
                    await self.inner.evict(allocation.key)
                except BackendError:
                    pass
            raise self._error("write", allocation.key)
        f = self._faults
        if "write" in f.ops and f.torn_write_rate and allocation.nbytes and self._rng.random() < f.torn_write_rate:
            mv = as_byte_view(data)
            torn = bytearray(len(mv))
            cut = self._rng.randrange(0, len(mv))
            torn[:cut] = mv[:cut]
            self._counts["torn_writes"] += 1
            self.torn_keys.add(allocation.key)
            await self.inner.write(allocation, torn)
            return
        self.torn_keys.discard(allocation.key)
        await self.inner.write(allocation, data)

    async def read(self, key: str, *, into: Buffer | None = None) -> memoryview:
        if await self._inject("read"):
            raise self._error("read", key)
        return await self.inner.read(key, into=into)

    async def evict(self, key: str) -> bool:
        if await self._inject("evict"):
            raise self._error("evict", key)
        removed = await self.inner.evict(key)
        self.torn_keys.discard(key)
        return removed

    async def contains(self, key: str) -> bool:
        if await self._inject("contains"):
            raise self._error("contains", key)
        return await self.inner.contains(key)

    def stats(self) -> BackendStats:
        s = self.inner.stats()
        details: dict[str, Any] = dict(s.details)
        details["faults"] = {**self._counts, "by_op": dict(self._by_op)}
        fields = {name: getattr(s, name) for name in BackendStats.__dataclass_fields__}
        fields["details"] = types.MappingProxyType(details)
        return BackendStats(**fields)


class _ScanningFaultInjectingBackend(FaultInjectingBackend):
    async def scan(self) -> list[BlockInfo]:
        self._check_open()
        return await self.inner.scan()  # type: ignore[attr-defined, no-any-return]
