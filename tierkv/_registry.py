"""Plugin discovery through entry points (groups ``tierkv.backends``, ``tierkv.codecs``).

Built-in backends register in tierkv's own ``pyproject.toml`` exactly as a
third-party distribution would; there is no other way in. Discovery is lazy
and cached: :func:`list_plugins` reads distribution metadata only and never
imports a plugin; :func:`load_plugin` imports one entry point and validates
what it finds. Nothing is ever logged and skipped: every failure raises a
:class:`~tierkv.PluginError` subclass that names the group, the plugin and the
distribution.

Call :func:`refresh` after changing ``sys.path`` (e.g. installing a package at
run time) so the cache is rebuilt.
"""

from __future__ import annotations

import functools
import importlib.metadata as md
import inspect
from dataclasses import dataclass
from typing import Any

from .backend import API_VERSION, Availability, Backend
from .errors import (
    PluginConflictError,
    PluginError,
    PluginNotFoundError,
    PluginUnavailableError,
    PluginValidationError,
)

__all__ = [
    "BACKENDS_GROUP",
    "CODECS_GROUP",
    "BackendListing",
    "PluginInfo",
    "backend_listing",
    "list_plugins",
    "load_backend_class",
    "load_plugin",
    "refresh",
]

BACKENDS_GROUP = "tierkv.backends"
CODECS_GROUP = "tierkv.codecs"

#: Optional extras to suggest when a built-in plugin's import fails.
_EXTRA_HINTS = {
    "nvme": "pip install 'tierkv[nvme]' (kvikio for GPUDirect Storage: 'tierkv[gds]')",
    "cxl": "pip install 'tierkv[cxl]'",
    "hbm": "pip install 'tierkv[hbm]' with a CUDA build of torch",
    "rdma": "pip install 'tierkv[rdma]'",
}


@dataclass(frozen=True, slots=True)
class PluginInfo:
    """One entry point, as read from distribution metadata (nothing imported)."""

    group: str
    name: str
    value: str
    distribution: str
    version: str

    def load(self) -> Any:
        return load_plugin(self.group, self.name)


@functools.cache
def _scan(group: str) -> dict[str, tuple[PluginInfo, ...]]:
    found: dict[str, dict[tuple[str, str], PluginInfo]] = {}
    for dist in md.distributions():
        try:
            eps = dist.entry_points
        except Exception:  # pragma: no cover - broken metadata of an unrelated dist
            continue
        dist_name = (dist.metadata["Name"] if dist.metadata else None) or "unknown"
        for ep in eps:
            if ep.group != group:
                continue
            info = PluginInfo(group, ep.name, ep.value, dist_name, dist.version or "")
            # the same distribution seen twice on sys.path (editable + site) is one claim
            found.setdefault(ep.name, {})[(_norm(dist_name), ep.value)] = info
    return {name: tuple(claims.values()) for name, claims in sorted(found.items())}


def _norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def refresh() -> None:
    """Forget cached discovery results (after ``sys.path`` or installs change)."""
    _scan.cache_clear()
    _load.cache_clear()


def list_plugins(group: str) -> list[PluginInfo]:
    """Every plugin of ``group`` (one row per claim; conflicts show as duplicate names).

    Does not import any plugin.
    """
    return [info for claims in _scan(group).values() for info in claims]


def _claim(group: str, name: str) -> PluginInfo:
    claims = _scan(group).get(name)
    if not claims:
        known = ", ".join(_scan(group)) or "none installed"
        raise PluginNotFoundError(f"no {group} plugin named {name!r} (installed: {known})", group=group, name=name)
    if len(claims) > 1:
        who = "; ".join(f"{c.distribution} {c.version} ({c.value})" for c in claims)
        raise PluginConflictError(
            f"{group} plugin {name!r} is claimed by several distributions: {who}; uninstall all but one",
            group=group,
            name=name,
        )
    return claims[0]


@functools.cache
def _load(group: str, name: str) -> Any:
    info = _claim(group, name)
    module_name, _, attr = info.value.partition(":")
    try:
        import importlib

        module = importlib.import_module(module_name)
    except ImportError as exc:
        hint = _EXTRA_HINTS.get(name, f"install the dependencies of {info.distribution}")
        raise PluginUnavailableError(
            f"{group} plugin {name!r} from {info.distribution} cannot be imported: {exc}",
            group=group,
            name=name,
            hint=hint,
        ) from exc
    except Exception as exc:
        raise PluginValidationError(
            f"{group} plugin {name!r} from {info.distribution}: importing {module_name!r} raised "
            f"{type(exc).__name__}: {exc}",
            group=group,
            name=name,
        ) from exc
    obj: Any = module
    for part in filter(None, attr.split(".")):
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            raise PluginValidationError(
                f"{group} plugin {name!r} from {info.distribution}: {info.value!r} does not exist",
                group=group,
                name=name,
            ) from exc
    return obj


def load_plugin(group: str, name: str) -> Any:
    """Import and return the object behind entry point ``name`` of ``group`` (cached).

    Raises:
        PluginNotFoundError: no such entry point.
        PluginConflictError: several distributions claim ``name``.
        PluginUnavailableError: the module's imports fail (missing extra).
        PluginValidationError: importing raised something else, or the attribute is missing.
    """
    return _load(group, name)


def validate_backend_class(obj: object, *, name: str = "", distribution: str = "") -> type[Backend]:
    """Check that ``obj`` implements the backend protocol; return it typed.

    Raises :class:`~tierkv.PluginValidationError` naming what is wrong.
    """
    where = f"backend {name!r}" + (f" from {distribution}" if distribution else "")

    def bad(why: str) -> PluginValidationError:
        return PluginValidationError(f"{where}: {why}", group=BACKENDS_GROUP, name=name)

    if not inspect.isclass(obj) or not issubclass(obj, Backend):
        raise bad(f"{obj!r} is not a subclass of tierkv.backend.Backend")
    if inspect.isabstract(obj):
        missing = ", ".join(sorted(getattr(obj, "__abstractmethods__", ())))
        raise bad(f"{obj.__name__} is abstract (missing: {missing})")
    version = getattr(obj, "api_version", None)
    if version != API_VERSION:
        raise bad(f"{obj.__name__}.api_version is {version!r}; this tierkv speaks API version {API_VERSION}")
    for meth in (
        "allocate",
        "write",
        "read",
        "evict",
        "contains",
        "aclose",
        "allocate_many",
        "write_many",
        "read_many",
        "evict_many",
    ):
        if not inspect.iscoroutinefunction(getattr(obj, meth, None)):
            raise bad(f"{obj.__name__}.{meth} must be a coroutine function (async def)")
    if inspect.iscoroutinefunction(getattr(obj, "stats", None)):
        raise bad(f"{obj.__name__}.stats must be a plain method (no I/O)")
    return obj


def load_backend_class(name: str) -> type[Backend]:
    """Load and validate the backend class registered as ``name``.

    Raises the errors of :func:`load_plugin` and :class:`~tierkv.PluginValidationError`.
    """
    info = _claim(BACKENDS_GROUP, name)
    return validate_backend_class(load_plugin(BACKENDS_GROUP, name), name=name, distribution=info.distribution)


@dataclass(frozen=True, slots=True)
class BackendListing:
    """A row of ``tierkv backends``."""

    name: str
    distribution: str
    version: str
    value: str
    usable: bool
    reason: str
    hint: str


def backend_listing() -> list[BackendListing]:
    """Every registered backend with whether it is usable here and, if not, why.

    This imports each backend (to call its ``probe()``) but never raises: a
    broken plugin shows as unusable with the error as its reason.
    """
    rows: list[BackendListing] = []
    scanned = _scan(BACKENDS_GROUP)
    for name, claims in scanned.items():
        for info in claims:
            if len(claims) > 1:
                avail = Availability(False, "conflict: claimed by " + ", ".join(c.distribution for c in claims))
            else:
                try:
                    avail = load_backend_class(name).probe()
                except PluginError as exc:
                    avail = Availability(False, str(exc), getattr(exc, "hint", ""))
            rows.append(
                BackendListing(
                    name, info.distribution, info.version, info.value, avail.usable, avail.reason, avail.hint
                )
            )
    return rows
