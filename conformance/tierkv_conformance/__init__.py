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

Importing this package does no I/O.
"""

from __future__ import annotations

from ._faults import FaultConfig, FaultInjectingBackend, FaultStats
from ._loader import load_backend_class
from ._reference import RawMeasurement, SupportsRawReference
from ._rules import PASS_RULES, PassRule, pass_rule
from ._suite import BackendConformance, block_key, pattern_bytes
from .reference_backends import RefFileBackend, RefMemoryBackend

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
