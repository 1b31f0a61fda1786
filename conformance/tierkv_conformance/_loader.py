"""Find a backend class by entry-point name (or ``module:Class`` spec).

Uses ``tierkv._registry.load_backend_class`` when the core provides it, else a
small importlib.metadata lookup with the same errors, so the suite works
either way.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from typing import Any

from tierkv._backend import API_VERSION, Backend
from tierkv._errors import PluginConflictError, PluginNotFoundError, PluginUnavailableError, PluginValidationError

__all__ = ["GROUP", "backend_distribution", "load_backend_class"]

GROUP = "tierkv.backends"


def _entry_points(name: str) -> list[importlib.metadata.EntryPoint]:
    return [ep for ep in importlib.metadata.entry_points(group=GROUP) if ep.name == name]


def _check(obj: Any, name: str) -> type[Backend]:
    if not (isinstance(obj, type) and issubclass(obj, Backend)):
        raise PluginValidationError(
            f"{name!r} does not name a tierkv.Backend subclass: {obj!r}", group=GROUP, name=name
        )
    if getattr(obj, "api_version", None) != API_VERSION:
        raise PluginValidationError(
            f"{name!r} implements backend API {getattr(obj, 'api_version', None)}, tierkv has {API_VERSION}",
            group=GROUP,
            name=name,
        )
    return obj


def load_backend_class(name: str) -> type[Backend]:
    """Return the backend class registered as ``name`` (or given as ``pkg.module:Class``).

    Raises PluginNotFoundError, PluginConflictError, PluginUnavailableError (the
    import failed) or PluginValidationError (not a Backend of this API version).
    """
    if ":" in name:
        mod, _, attr = name.partition(":")
        try:
            obj: Any = importlib.import_module(mod)
            for part in attr.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError) as exc:
            raise PluginUnavailableError(f"cannot import {name!r}: {exc}", group=GROUP, name=name) from exc
        return _check(obj, name)
    registry: Any = None
    try:
        from tierkv import _registry as registry
    except ImportError:
        pass
    if registry is not None and hasattr(registry, "load_backend_class"):
        return _check(registry.load_backend_class(name), name)
    eps = _entry_points(name)
    if not eps:
        known = sorted({ep.name for ep in importlib.metadata.entry_points(group=GROUP)})
        raise PluginNotFoundError(
            f"no backend named {name!r}; installed: {', '.join(known) or 'none'}", group=GROUP, name=name
        )
    if len({ep.value for ep in eps}) > 1:
        raise PluginConflictError(
            f"backend {name!r} is registered more than once: {', '.join(ep.value for ep in eps)}",
            group=GROUP,
            name=name,
        )
    try:
        obj = eps[0].load()
    except (ImportError, AttributeError) as exc:
        raise PluginUnavailableError(
            f"cannot load backend {name!r} ({eps[0].value}): {exc}", group=GROUP, name=name
        ) from exc
    return _check(obj, name)


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
