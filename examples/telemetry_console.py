"""tierkv telemetry printed to the terminal with the OpenTelemetry SDK's console exporters.

Needs the SDK (``pip install opentelemetry-sdk``; tierkv itself depends on the API only).

Run: python examples/telemetry_console.py [--requests 8]

Every span (``tierkv.put``, ``tierkv.get``, ``tierkv.decision.demote``, ...) is printed as JSON when it
ends; the metrics (``tierkv.hits``, ``tierkv.misses``, ``tierkv.tier.used``, ``tierkv.cost.storage``, ...)
are printed once, at shutdown.
"""

from __future__ import annotations

import argparse

import anyio
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
from telemetry_workload import run_workload


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=8, help="prompts to put and get (2 blocks each)")
    args = p.parse_args()
    resource = Resource.create({"service.name": "tierkv-console-example"})
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
    # one export at shutdown (the interval is longer than the run)
    reader = PeriodicExportingMetricReader(ConsoleMetricExporter(), export_interval_millis=3_600_000)
    meter_provider = MeterProvider(resource=resource, metric_readers=[reader])
    try:
        misses = anyio.run(
            lambda: run_workload(args.requests, tracer_provider=tracer_provider, meter_provider=meter_provider)
        )
    finally:
        tracer_provider.shutdown()
        meter_provider.shutdown()  # exports the metrics once
    print(f"misses by reason: {misses}")


if __name__ == "__main__":
    main()
