"""OpenTelemetry traces and metrics that explain placement decisions.

tierkv depends on ``opentelemetry-api`` only. Without an SDK the API's no-op
providers make every call cheap; with ``telemetry.enabled = false`` tierkv does
not even call them (a shared no-op context manager replaces every span), so
tracing costs nothing when it is off.

Spans (names and attributes are stable):

* ``tierkv.put`` / ``tierkv.get`` / ``tierkv.lookup`` / ``tierkv.prefetch`` —
  ``tierkv.tokens``, ``tierkv.hit_tokens``, ``tierkv.tiers_hit``,
  ``tierkv.bytes``, ``tierkv.codec``, ``tierkv.tenant`` (a hash, never the
  name), ``tierkv.miss_reason``. Raw token ids never appear.
* ``tierkv.decision.promote|demote|evict`` (a prefetch is a promotion with
  reason ``prefetch``) and ``tierkv.decision.tier_unhealthy|tier_healthy|
  predicted_switch|job_failed`` — ``tierkv.block``
  (key prefix), ``tierkv.score``, ``tierkv.posterior``,
  ``tierkv.confidence``, ``tierkv.value.<tier>``, ``tierkv.from_tier``,
  ``tierkv.to_tier``, ``tierkv.reason``.
* ``tierkv.gate`` — ``tierkv.fetch_s``, ``tierkv.recompute_s``,
  ``tierkv.decision``.

Metric instruments: see :class:`Telemetry` (names start with ``tierkv.``). The instruments, and the
observable gauges of the tiers, are made once per meter provider and shared by every
:class:`~tierkv.TierKV` on it (OpenTelemetry identifies an instrument by its name within a meter): each
gauge callback reports the rows of every live store; a store's rows are held through a weak reference
and removed by :meth:`Telemetry.close` (``TierKV.aclose``), so telemetry never keeps a closed store
(its memory, its tiers' file descriptors) alive. Two live stores on one provider should use distinct
tier names: gauge points are told apart by their ``tier`` and ``kind`` attributes only.
Miss reasons: ``never_stored``, ``evicted_local``, ``evicted_remote``,
``gated``, ``tier_unhealthy``, ``integrity``, ``different_scope``,
``tier_error``, ``overloaded``.

Cost accounting uses per-tier $/GB/h (``telemetry.cost_per_gb_hour``; defaults
in :data:`DEFAULT_COST_PER_GB_HOUR`) and a prefill cost
(``telemetry.prefill_cost_per_million_tokens``) to report the dollars per
million prefill tokens saved.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import threading
import time
import types
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from ._options import opt_bool, opt_float
from .errors import ConfigError
from .scheduler._placement import DEFAULT_TIER_USD_PER_GB_HOUR

__all__ = ["DEFAULT_COST_PER_GB_HOUR", "MISS_REASONS", "Telemetry"]

#: Default storage cost per GB-hour by tier kind (USD): the same table the
#: scheduler's placement values use (see :mod:`tierkv.scheduler._placement`
#: for the sources of these assumptions), plus kinds it does not price.
DEFAULT_COST_PER_GB_HOUR: Mapping[str, float] = types.MappingProxyType(
    {**DEFAULT_TIER_USD_PER_GB_HOUR, "remote": 0.0002, "other": 0.001}
)

MISS_REASONS = (
    "never_stored",
    "evicted_local",
    "evicted_remote",
    "gated",
    "tier_unhealthy",
    "integrity",
    "different_scope",
    "tier_error",
    "overloaded",
)

_NOOP = contextlib.nullcontext(None)


class _NoopInstrument:
    __slots__ = ()

    def add(self, amount: float, attributes: Mapping[str, Any] | None = None) -> None:
        pass

    def record(self, amount: float, attributes: Mapping[str, Any] | None = None) -> None:
        pass


_NOOP_INSTRUMENT = _NoopInstrument()

Row = tuple[str, str, int, int, int]  # (tier, kind, capacity, used, blocks)


class _Source:
    """One store's gauge rows: ``observe`` (held weakly when it is a bound method) and its Telemetry
    (held weakly) for the cost figures."""

    __slots__ = ("observe", "tel")

    def __init__(self, observe: Callable[[], Callable[[], Iterable[Row]] | None], tel: weakref.ref[Telemetry]) -> None:
        self.observe = observe
        self.tel = tel

    def rows(self) -> tuple[Telemetry, list[Row]] | None:
        fn, tel = self.observe(), self.tel()
        if fn is None or tel is None:
            return None
        return tel, list(fn())


class _Shared:
    """The instruments of one meter provider, shared by every Telemetry on it, and the tier gauges,
    whose callbacks read every registered (live) source."""

    def __init__(self, meter: Any) -> None:
        from opentelemetry.metrics import Observation

        self.meter = meter
        c = meter.create_counter
        self.hits = c("tierkv.hits", "{block}", "Blocks served, by tier and tenant")
        self.misses = c("tierkv.misses", "{request}", "Requests whose prefix ended early, by reason")
        self.bytes_read = c("tierkv.bytes_read", "By", "Bytes read from a tier")
        self.bytes_written = c("tierkv.bytes_written", "By", "Bytes written to a tier")
        self.promotions = c("tierkv.promotions", "{block}", "Blocks moved to a faster tier")
        self.demotions = c("tierkv.demotions", "{block}", "Blocks moved to a slower tier")
        self.evictions = c("tierkv.evictions", "{block}", "Blocks dropped, by tier and reason")
        self.prefetch = c("tierkv.prefetch", "{block}", "Prefetched blocks, by outcome (useful, wasted)")
        self.gate = c("tierkv.gate.decisions", "{decision}", "Fetch-vs-recompute decisions")
        self.calibration = c(
            "tierkv.predictor.calibration", "{block}", "Resolved reuse outcomes by predicted-probability bin"
        )
        self.tenant_tokens = c("tierkv.tenant.tokens", "{token}", "Tokens put and hit per tenant (hashed)")
        self.saved_tokens = c("tierkv.tokens_saved", "{token}", "Prefill tokens saved by hits")
        self.latency = meter.create_histogram(
            "tierkv.operation.duration",
            "s",
            "Latency of put/get/lookup/prefetch",
            explicit_bucket_boundaries_advisory=[1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05, 0.1, 0.5, 1, 5],
        )
        # collection may run on an exporter thread; the gauges are made on first use, outside ``_lock``
        # (which a collection's callbacks take)
        self._lock = threading.Lock()
        self._make_lock = threading.Lock()
        self._sources: dict[int, _Source] = {}
        self._gauges: list[Any] = []
        self._Observation = Observation

    def add(self, source: _Source) -> int:
        token = next(_TOKENS)
        with self._lock:
            self._sources[token] = source
        with self._make_lock:
            if not self._gauges:
                self._make_gauges()
        return token

    def remove(self, token: int) -> None:
        with self._lock:
            self._sources.pop(token, None)

    def _live(self) -> list[tuple[Telemetry, list[Row]]]:
        with self._lock:
            items = list(self._sources.items())
        out = []
        for token, src in items:
            got = src.rows()
            if got is None:
                self.remove(token)
            else:
                out.append(got)
        return out

    def _make_gauges(self) -> None:
        obs = self._Observation

        def per_tier(field: Callable[[Row], int]) -> Callable[[Any], Iterable[Any]]:
            def callback(_: Any) -> Iterable[Any]:
                return [obs(field(row), {"tier": row[0], "kind": row[1]}) for _t, rows in self._live() for row in rows]

            return callback

        def cost(_: Any) -> Iterable[Any]:
            return [
                obs(tel.tier_cost_per_hour(t, k, u), {"tier": t, "kind": k})
                for tel, rows in self._live()
                for t, k, _c, u, _b in rows
            ]

        def per_million(_: Any) -> Iterable[Any]:
            return [obs(tel.dollars_per_million_saved(rows)) for tel, rows in self._live()]

        m = self.meter
        self._gauges = [
            m.create_observable_gauge("tierkv.tier.capacity", [per_tier(lambda r: r[2])], "By", "Tier capacity"),
            m.create_observable_gauge("tierkv.tier.used", [per_tier(lambda r: r[3])], "By", "Tier bytes in use"),
            m.create_observable_gauge(
                "tierkv.tier.blocks", [per_tier(lambda r: r[4])], "{block}", "Blocks in the tier"
            ),
            m.create_observable_gauge("tierkv.cost.storage", [cost], "USD/h", "Storage cost of the bytes in use"),
            m.create_observable_gauge(
                "tierkv.cost.net_per_million_tokens_saved",
                [per_million],
                "USD",
                "Prefill dollars saved minus storage dollars spent, per million tokens saved",
            ),
        ]


_TOKENS = itertools.count(1)
_SHARED_LOCK = threading.Lock()
#: meter provider -> its shared instruments (a provider that cannot be weakly referenced gets its own per
#: Telemetry; the API's global proxy provider is one long-lived object, so it gets one set for the process)
_SHARED: weakref.WeakKeyDictionary[Any, _Shared] = weakref.WeakKeyDictionary()


def _shared_for(meter_provider: Any) -> _Shared:
    from opentelemetry import metrics

    from . import __version__

    provider = meter_provider if meter_provider is not None else metrics.get_meter_provider()
    with _SHARED_LOCK:
        try:
            got = _SHARED.get(provider)
        except TypeError:  # not weakly referenceable / not hashable: no sharing
            return _Shared(metrics.get_meter("tierkv", __version__, meter_provider=provider))
        if got is None:
            got = _Shared(metrics.get_meter("tierkv", __version__, meter_provider=provider))
            _SHARED[provider] = got
        return got


class Telemetry:
    """Spans and instruments of one :class:`~tierkv.TierKV`.

    ``options`` is the ``[telemetry]`` config table: ``enabled`` (default
    true), ``cost_per_gb_hour`` (table tier name or kind -> $/GB/h),
    ``prefill_cost_per_million_tokens`` ($, default 0.10).
    ``tracer_provider``/``meter_provider`` default to the global providers.
    """

    def __init__(
        self,
        options: Mapping[str, Any] | None = None,
        *,
        tracer_provider: Any = None,
        meter_provider: Any = None,
    ) -> None:
        opts = dict(options or {})
        self.enabled = opt_bool(opts, "enabled", True, prefix="telemetry")
        self.prefill_cost = opt_float(opts, "prefill_cost_per_million_tokens", 0.10, prefix="telemetry", minimum=0.0)
        costs = opts.get("cost_per_gb_hour", {})
        if not isinstance(costs, Mapping):
            raise ConfigError("telemetry.cost_per_gb_hour", costs, "a table of tier name or kind -> $/GB/h")
        self.cost_per_gb_hour: dict[str, float] = dict(DEFAULT_COST_PER_GB_HOUR)
        for k in costs:
            self.cost_per_gb_hour[str(k)] = opt_float(costs, k, prefix="telemetry.cost_per_gb_hour", minimum=0.0)
        self.tokens_saved = 0
        self._t0 = time.monotonic()
        self._storage_dollars = 0.0
        self._tracer: Any = None
        self._gauge_tokens: list[int] = []
        self._shared: _Shared
        if not self.enabled:
            self._noop_instruments()
            return
        from opentelemetry import trace

        from . import __version__

        self._tracer = trace.get_tracer("tierkv", __version__, tracer_provider=tracer_provider)
        sh = self._shared = _shared_for(meter_provider)
        self.hits, self.misses, self.bytes_read, self.bytes_written = (
            sh.hits,
            sh.misses,
            sh.bytes_read,
            sh.bytes_written,
        )
        self.promotions, self.demotions, self.evictions, self.prefetch = (
            sh.promotions,
            sh.demotions,
            sh.evictions,
            sh.prefetch,
        )
        self.gate, self.calibration, self.tenant_tokens = sh.gate, sh.calibration, sh.tenant_tokens
        self.saved_tokens, self.latency = sh.saved_tokens, sh.latency

    def _noop_instruments(self) -> None:
        n: Any = _NOOP_INSTRUMENT
        self.hits = self.misses = self.bytes_read = self.bytes_written = n
        self.promotions = self.demotions = self.evictions = self.prefetch = n
        self.gate = self.calibration = self.tenant_tokens = self.saved_tokens = self.latency = n

    def register_tier_gauges(self, observe: Callable[[], Iterable[Row]]) -> None:
        """Report capacity/used/blocks and storage cost of the rows ``observe()`` returns (tier, kind,
        capacity, used, blocks) through the provider's shared observable gauges, until :meth:`close`.

        A bound method (``TierKV._gauge_rows``) is held weakly: the gauges never keep its owner alive, and
        its rows stop once the owner is collected. Any other callable is held until :meth:`close`."""
        if not self.enabled:
            return
        ref: Callable[[], Callable[[], Iterable[Row]] | None]
        if inspect.ismethod(observe):
            ref = weakref.WeakMethod(observe)
        else:

            def ref() -> Callable[[], Iterable[Row]]:
                return observe

        self._gauge_tokens.append(self._shared.add(_Source(ref, weakref.ref(self))))

    def close(self) -> None:
        """Unregister this Telemetry's gauge rows (``TierKV.aclose`` calls it); idempotent. Spans and
        counters keep working (a closed store records nothing anyway)."""
        tokens, self._gauge_tokens = self._gauge_tokens, []
        for t in tokens:
            self._shared.remove(t)

    # ------------------------------------------------------------------ cost
    def tier_cost_per_hour(self, tier: str, kind: str, used_bytes: int) -> float:
        rate = self.cost_per_gb_hour.get(tier, self.cost_per_gb_hour.get(kind, self.cost_per_gb_hour["other"]))
        return rate * used_bytes / 1e9

    def dollars_per_million_saved(self, rows: Iterable[tuple[str, str, int, int, int]]) -> float:
        """Net $ per million prefill tokens saved: prefill $ avoided minus storage $
        spent so far (at the current occupancy over the elapsed time)."""
        if self.tokens_saved == 0:
            return 0.0
        hours = (time.monotonic() - self._t0) / 3600.0
        storage = sum(self.tier_cost_per_hour(t, k, u) for t, k, _c, u, _b in rows) * hours
        saved = self.tokens_saved / 1e6 * self.prefill_cost
        return (saved - storage) / (self.tokens_saved / 1e6)

    # ----------------------------------------------------------------- spans
    def span(self, name: str, attributes: Mapping[str, Any] | None = None) -> contextlib.AbstractContextManager[Any]:
        """A span context manager (a shared no-op when telemetry is off)."""
        if self._tracer is None:
            return _NOOP
        return self._tracer.start_as_current_span(name, attributes=attributes)  # type: ignore[no-any-return]

    @contextlib.contextmanager
    def timed(self, op: str, attributes: Mapping[str, Any] | None = None) -> Iterator[Any]:
        """A span plus a latency observation for operation ``op``."""
        if self._tracer is None:
            yield None
            return
        t0 = time.perf_counter()
        with self._tracer.start_as_current_span(f"tierkv.{op}", attributes=attributes) as span:
            try:
                yield span
            finally:
                self.latency.record(time.perf_counter() - t0, {"op": op})

    def decision(self, kind: str, attributes: Mapping[str, Any]) -> None:
        """Record a placement decision as a (zero-length) span."""
        if self._tracer is None:
            return
        with self._tracer.start_as_current_span(f"tierkv.decision.{kind}", attributes=attributes):
            pass
