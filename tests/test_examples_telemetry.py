"""The telemetry examples run end to end in subprocesses with short workloads."""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

pytest.importorskip("opentelemetry.sdk")


def test_console_example_prints_spans_and_metrics() -> None:
    r = subprocess.run(
        [sys.executable, str(EXAMPLES / "telemetry_console.py"), "--requests", "4"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    out = r.stdout
    for name in ('"name": "tierkv.put"', '"name": "tierkv.get"', '"name": "tierkv.decision.demote"'):
        assert name in out
    for metric in ("tierkv.hits", "tierkv.misses", "tierkv.tier.used", "tierkv.cost.storage"):
        assert f'"name": "{metric}"' in out
    assert "'different_scope': 1" in out and "'never_stored': 1" in out


def test_prometheus_example_serves_metrics() -> None:
    pytest.importorskip("opentelemetry.exporter.prometheus")
    with subprocess.Popen(  # the with block closes the pipes (an unclosed pipe is an error)
        [sys.executable, str(EXAMPLES / "telemetry_prometheus.py"), "--port", "0", "--requests", "4"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        try:
            assert proc.stdout is not None
            url = ""
            for line in proc.stdout:
                if line.startswith("serving "):
                    url = line.split()[1]
                    break
            assert url.startswith("http://127.0.0.1:"), proc.stderr.read() if proc.stderr else ""
            with urllib.request.urlopen(url, timeout=10) as resp:
                body = resp.read().decode()
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    assert "tierkv_misses_total{" in body and 'reason="different_scope"' in body
    assert "tierkv_hits_total{" in body and 'tier="dram"' in body
    assert "tierkv_operation_duration_seconds_bucket{" in body
    assert "tierkv_tier_capacity" in body and "tierkv_cost_storage" in body


def test_otlp_example_fails_clearly_without_collector() -> None:
    pytest.importorskip("opentelemetry.exporter.otlp.proto.grpc")
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = subprocess.run(
        [sys.executable, str(EXAMPLES / "telemetry_otlp.py"), "--endpoint", f"127.0.0.1:{port}", "--requests", "2"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 1
    assert "no OTLP collector" in r.stderr
