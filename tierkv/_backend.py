"""Compatibility alias of :mod:`tierkv.backend` while the core moves to it; import from ``tierkv.backend``."""

from .backend import *  # noqa: F403
from .backend import __all__ as __all__
