"""tierkv telemetry sent to an OpenTelemetry Collector over OTLP/gRPC.

Needs ``pip install opentelemetry-sdk opentelemetry-exporter-otlp`` and a collector listening on
127.0.0.1:4317 (for instance ``docker run -p 127.0.0.1:4317:4317 otel/opentelemetry-collector``).
Without a collector the example stops at once with a clear message (exit status 1) instead of
retrying in the background.

Run: python examples/telemetry_otlp.py [--endpoint 127.0.0.1:4317] [--requests 8]
"""

from __future__ import annotations

import argparse
import socket
import sys

import anyio
from telemetry_workload import run_workload


def collector_reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--endpoint", default="127.0.0.1:4317", help="host:port of the collector's OTLP/gRPC receiver")
    p.add_argument("--requests", type=int, default=8, help="prompts to put and get (2 blocks each)")
    args = p.parse_args()
    try:
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        print(f"telemetry_otlp: {exc}; install with: pip install opentelemetry-exporter-otlp", file=sys.stderr)
        return 1
    host, _, port = args.endpoint.rpartition(":")
    if not collector_reachable(host, int(port)):
        print(
            f"telemetry_otlp: no OTLP collector at {args.endpoint} (connection refused); "
            "start one, e.g. docker run -p 127.0.0.1:4317:4317 otel/opentelemetry-collector",
            file=sys.stderr,
        )
        return 1
    resource = Resource.create({"service.name": "tierkv-otlp-example"})
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=args.endpoint, insecure=True)))
    reader = PeriodicExportingMetricReader(
        OTLPMetricExporter(endpoint=args.endpoint, insecure=True), export_interval_millis=5_000
    )
    meter_provider = MeterProvider(resource=resource, metric_readers=[reader])
    try:
        misses = anyio.run(
            lambda: run_workload(args.requests, tracer_provider=tracer_provider, meter_provider=meter_provider)
        )
    finally:
        tracer_provider.shutdown()  # flushes the batched spans
        meter_provider.shutdown()  # exports the last metrics
    print(f"sent to {args.endpoint}; misses by reason: {misses}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
