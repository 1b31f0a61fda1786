"""Find a backend class by entry-point name (or ``module:Class`` spec).

An entry-point name is loaded and validated as the core loads it
(:func:`tierkv.backend.load_backend_class`); a ``package.module:Class`` spec is
imported here and validated by the same rules (:func:`tierkv.backend.validate_backend_class`).
"""

from __future__ import annotations

import importlib
import importlib.metadata
from typing import Any

from tierkv import backend as api
from tierkv.backend import Backend
from tierkv.errors import PluginUnavailableError

__all__ = ["GROUP", "backend_distribution", "load_backend_class"]

GROUP = "tierkv.backends"


def load_backend_class(name: str) -> type[Backend]:
    """Return the backend class registered as ``name`` (or given as ``pkg.module:Class``).

    Raises PluginNotFoundError, PluginConflictError, PluginUnavailableError (the
    import failed) or PluginValidationError (not a concrete Backend of this API version).
    """
    if ":" not in name:
        return api.load_backend_class(name)
    mod, _, attr = name.partition(":")
    try:
        obj: Any = importlib.import_module(mod)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise PluginUnavailableError(f"cannot import {name!r}: {exc}", group=GROUP, name=name) from exc
    return api.validate_backend_class(obj, name=name)


def _entry_points(name: str) -> list[importlib.metadata.EntryPoint]:
    return [ep for ep in importlib.metadata.entry_points(group=GROUP) if ep.name == name]


def backend_distribution(cls: type[Backend], name: str) -> tuple[str, str]:
    """(distribution name, version) that provides ``cls``; ``("", "")`` when unknown."""
    for ep in _entry_points(name):
        dist = getattr(ep, "dist", None)
        if dist is not None:
            return str(dist.metadata["Name"]), str(dist.version)
    top = cls.__module__.split(".")[0]
    dists = importlib.metadata.packages_distributions().get(top, [])
    if dists:
        try:
            return dists[0], importlib.metadata.version(dists[0])
        except importlib.metadata.PackageNotFoundError:
            return dists[0], ""
    return "", ""
