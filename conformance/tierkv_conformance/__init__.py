"""tierkv_conformance: the certification suite for tierkv backends.

* :class:`BackendConformance` — pytest base class; subclass it in a backend's tests.
* :class:`FaultInjectingBackend` — wrapper injecting errors, latency and torn writes.
* :class:`RefMemoryBackend`, :class:`RefFileBackend` — reference backends: the
  smallest complete backends written against ``tierkv.backend``.
* :data:`PASS_RULES` — the pass rule of ``tierkv certify`` for each tier kind
  (the suite's; a backend cannot set its own).
* :class:`SupportsRawReference`, :class:`RawMeasurement` — the raw-reference
  protocol (defined in :mod:`tierkv.backend`, re-exported here).
* ``tierkv certify`` is :func:`tierkv_conformance._certify.main`.

Importing this package does no I/O and imports nothing of tierkv until a name is used:
its pytest plugin (``tierkv_conformance.plugin``, loaded by every pytest run where
tierkv is installed) costs a session nothing.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._faults import FaultConfig, FaultInjectingBackend, FaultStats
    from ._loader import load_backend_class
    from ._reference import RawMeasurement, SupportsRawReference
    from ._rules import PASS_RULES, PassRule, pass_rule
    from ._suite import BackendConformance, block_key, pattern_bytes
    from .reference_backends import RefFileBackend, RefMemoryBackend

_WHERE = {
    "BackendConformance": "._suite",
    "block_key": "._suite",
    "pattern_bytes": "._suite",
    "FaultConfig": "._faults",
    "FaultInjectingBackend": "._faults",
    "FaultStats": "._faults",
    "load_backend_class": "._loader",
    "RawMeasurement": "._reference",
    "SupportsRawReference": "._reference",
    "PASS_RULES": "._rules",
    "PassRule": "._rules",
    "pass_rule": "._rules",
    "RefFileBackend": ".reference_backends",
    "RefMemoryBackend": ".reference_backends",
}

__all__ = [
    "PASS_RULES",
    "BackendConformance",
    "FaultConfig",
    "FaultInjectingBackend",
    "FaultStats",
    "PassRule",
    "RawMeasurement",
    "RefFileBackend",
    "RefMemoryBackend",
    "SupportsRawReference",
    "block_key",
    "load_backend_class",
    "pass_rule",
    "pattern_bytes",
]


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(where, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
