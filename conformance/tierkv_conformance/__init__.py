"""tierkv_conformance: the certification suite for tierkv backends.

* :class:`BackendConformance` — pytest base class; subclass it in a backend's tests.
* :class:`FaultInjectingBackend` — wrapper injecting errors, latency and torn writes.
* :class:`SupportsRawReference` — optional protocol a backend implements to give
  ``tierkv certify`` the raw reference of its medium (network tiers).
* ``tierkv certify`` is :func:`tierkv_conformance._certify.main`.

Importing this package does no I/O.
"""

from __future__ import annotations

from ._faults import FaultConfig, FaultInjectingBackend, FaultStats
from ._loader import load_backend_class
from ._reference import RawMeasurement, SupportsRawReference
from ._suite import BackendConformance, block_key, pattern_bytes

__all__ = [
    "BackendConformance",
    "FaultConfig",
    "FaultInjectingBackend",
    "FaultStats",
    "RawMeasurement",
    "SupportsRawReference",
    "block_key",
    "load_backend_class",
    "pattern_bytes",
]
