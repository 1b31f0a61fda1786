"""tierkv metrics exposed for Prometheus through the OpenTelemetry Prometheus exporter.

Needs ``pip install opentelemetry-sdk opentelemetry-exporter-prometheus``. Serves ``/metrics`` on
127.0.0.1 only (``--port``, 0 picks a free one), runs a short workload, prints the URL and keeps
serving for ``--serve-seconds`` (default: until Ctrl-C) so that Prometheus, or curl, can scrape it:

    python examples/telemetry_prometheus.py --port 9464 &
    curl -s http://127.0.0.1:9464/metrics | grep tierkv_

OTel names map to Prometheus ones: ``tierkv.misses`` (unit ``{request}``) becomes
``tierkv_misses_total{reason=...,tenant=...}``, ``tierkv.operation.duration`` becomes the histogram
``tierkv_operation_duration_seconds``, gauges keep their name plus unit (``tierkv_tier_used_bytes``).
"""

from __future__ import annotations

import argparse
import sys

import anyio
from telemetry_workload import run_workload


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, default=9464, help="port on 127.0.0.1 (0: any free port)")
    p.add_argument("--requests", type=int, default=8, help="prompts to put and get (2 blocks each)")
    p.add_argument("--serve-seconds", type=float, default=None, help="stop serving after this long")
    args = p.parse_args()
    try:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.resources import Resource
        from prometheus_client import start_http_server
    except ImportError as exc:
        print(
            f"telemetry_prometheus: {exc}; install with: pip install opentelemetry-exporter-prometheus", file=sys.stderr
        )
        return 1
    server, _thread = start_http_server(args.port, addr="127.0.0.1")
    port = server.server_port
    meter_provider = MeterProvider(
        resource=Resource.create({"service.name": "tierkv-prometheus-example"}),
        metric_readers=[PrometheusMetricReader()],
    )

    async def serve(misses: dict[str, int]) -> None:
        # scraped while the store is open: a closed store reports no tier gauges
        print(f"misses by reason: {misses}")
        print(f"serving http://127.0.0.1:{port}/metrics", flush=True)
        if args.serve_seconds is None:
            await anyio.sleep_forever()
        await anyio.sleep(args.serve_seconds)

    try:
        anyio.run(lambda: run_workload(args.requests, meter_provider=meter_provider, while_open=serve))
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        meter_provider.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
