"""Compatibility alias of :mod:`tierkv.errors` while the core moves to it; import from ``tierkv.errors``."""

from .errors import *  # noqa: F403
from .errors import __all__ as __all__
