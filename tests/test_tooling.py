"""The project's tooling holds: strict typing of every shipped package, warnings as errors,
coverage in the default target, and a pytest plugin that costs other test sessions nothing."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_mypy_is_strict_on_every_shipped_package() -> None:
    mypy = PYPROJECT["tool"]["mypy"]
    assert mypy["strict"] is True and mypy["warn_unused_ignores"] is True
    assert {"tierkv", "tierkv_backends", "conformance/tierkv_conformance"} <= set(mypy["files"])


def test_warnings_are_errors() -> None:
    filters = PYPROJECT["tool"]["pytest"]["ini_options"]["filterwarnings"]
    assert filters[0] == "error"
    assert all(f.startswith("ignore:") for f in filters[1:])  # every exception is explicit


def test_the_default_target_reports_coverage() -> None:
    script = (ROOT / "scripts" / "test.sh").read_text()
    default = script.split("default)", 1)[1].split(";;", 1)[0]
    assert "--cov=tierkv " in default and "--cov=tierkv_backends" in default
    assert any(dep.startswith("pytest-cov") for dep in PYPROJECT["project"]["optional-dependencies"]["test"])


def test_the_conformance_plugin_imports_nothing_of_tierkv() -> None:
    # registered under pytest11, it loads in every pytest session where tierkv is installed
    code = "import sys, tierkv_conformance.plugin; print(sorted(m for m in ('tierkv', 'numpy') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    code = "from tierkv_conformance import BackendConformance, PASS_RULES; print(BackendConformance.__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "BackendConformance"
