"""The raw-reference protocol of ``tierkv certify``; it lives in :mod:`tierkv.backend`.

A backend implements :class:`~tierkv.backend.SupportsRawReference` (importing it
from ``tierkv.backend``) to give the certification envelope the plain client of
its medium; see that class.
"""

from __future__ import annotations

from tierkv.backend import RawMeasurement, SupportsRawReference

__all__ = ["RawMeasurement", "SupportsRawReference"]
