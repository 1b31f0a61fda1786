"""pytest plugin of the tierkv conformance suite (registered under ``pytest11``).

It only adds options and markers; it defines no global fixture, so installing
``tierkv[conformance]`` changes nothing for other test suites. The suite's
fixtures (``anyio_backend``, ``backend_options``, ``backend``) live on
:class:`tierkv_conformance.BackendConformance`.
"""

from __future__ import annotations

import pytest

__all__ = ["pytest_addoption", "pytest_configure", "pytest_report_header"]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("tierkv-conformance")
    group.addoption(
        "--tierkv-quick",
        action="store_true",
        default=False,
        dest="tierkv_quick",
        help="tierkv conformance: fewer cancellation iterations and hypothesis examples",
    )
    group.addoption(
        "--tierkv-seed",
        type=int,
        default=None,
        dest="tierkv_seed",
        help="tierkv conformance: seed for the suite's random choices",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "tierkv_conformance: a test of the tierkv backend conformance suite")


def pytest_report_header(config: pytest.Config) -> str | None:
    if config.getoption("tierkv_quick", default=False):
        return "tierkv-conformance: quick mode"
    return None
