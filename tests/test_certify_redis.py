"""The example third-party Redis backend, installed like any plugin, is certified
by `tierkv certify` against a real redis-server the command starts on 127.0.0.1."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tierkv_conformance._certify import build_verdict

pytestmark = pytest.mark.slow


def test_certify_the_example_redis_backend(tmp_path: Path) -> None:
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed (scripts/test.sh installs it)")
    pytest.importorskip("tierkv_redis", reason="examples/redis_backend is installed by scripts/test.sh")
    out = tmp_path / "cert"
    proc = subprocess.run(
        [sys.executable, "-m", "tierkv", "certify", "redis", "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    cert = json.loads((out / "certificate.json").read_text())
    assert cert["distribution"] == "tierkv-redis" or "redis" in cert["distribution"]
    assert cert["tests"]["failed"] == 0 and cert["tests"]["passed"] > 0, proc.stdout[-2000:]
    assert {r["block_bytes"] for r in cert["envelope"]} >= {16384, 262144, 2097152}
    assert all(r["raw_gbps"] for r in cert["envelope"])  # measured against the raw client in the same run
    # The verdict is the pass rule applied to the rows measured in this run. Whether a
    # loaded 2-core machine keeps every paired ratio above 0.8 is a measurement, not a
    # test outcome (benchmarks/ holds speed targets); the test asserts that the verdict
    # follows from the rows, that nothing but an envelope ratio can fail it, and that
    # the exit code says so.
    verdict, reasons = build_verdict(
        cert["tests"],
        cert["emulated"],
        cert["envelope"],
        cert["pass_rule"]["min_ratio"],
        small_block_bytes=cert["pass_rule"]["small_block_bytes"],
        small_block_us=cert["pass_rule"]["small_block_us"],
    )
    assert (cert["verdict"], cert["verdict_reasons"]) == (verdict, reasons)
    assert cert["verdict"] in ("CERTIFIED", "FAILED")
    if cert["verdict"] == "FAILED":
        assert all(
            re.fullmatch(r"envelope \d+ B (read|write): ratio [\d.]+ below threshold [\d.]+", r) for r in reasons
        )
    assert (proc.returncode == 0) == (cert["verdict"] == "CERTIFIED")
    assert (out / "certificate.md").read_text().startswith("# tierkv certificate")
