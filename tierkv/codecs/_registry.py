"""Codec discovery through the ``tierkv.codecs`` entry-point group.

Built-in codecs (``raw``, ``lz4``, ``zstd``, ``cachegen``) are registered in
tierkv's own ``pyproject.toml`` like any third-party codec. Discovery and
loading go through :mod:`tierkv._registry` (lazy: distribution metadata is
read once and cached; a codec module is imported on first use). While tierkv
runs from a checkout whose metadata predates the entry points, the built-in
names fall back to their known ``module:Class`` targets, so a block written
by a built-in codec always decodes.

Errors: :class:`~tierkv.PluginNotFoundError`, :class:`~tierkv.PluginConflictError`,
:class:`~tierkv.PluginUnavailableError` (a missing extra such as ``lz4``),
:class:`~tierkv.PluginValidationError` (the object is not a :class:`Codec`
subclass), :class:`~tierkv.ConfigError` (bad params).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
from collections.abc import Mapping
from typing import Any

from .._registry import CODECS_GROUP, list_plugins, load_plugin
from ..errors import ConfigError, PluginNotFoundError, PluginUnavailableError, PluginValidationError
from ._base import Codec

__all__ = ["BUILTIN_CODECS", "codec_from_params", "list_codecs", "load_codec_class"]

#: The entry points tierkv itself registers (group ``tierkv.codecs``).
BUILTIN_CODECS: Mapping[str, str] = {
    "raw": "tierkv.codecs._lossless:RawCodec",
    "lz4": "tierkv.codecs._lossless:Lz4Codec",
    "zstd": "tierkv.codecs._lossless:ZstdCodec",
    "cachegen": "tierkv.codecs._cachegen:CacheGenCodec",
}
_HINT = "pip install 'tierkv[codecs]'"


def list_codecs() -> list[str]:
    """Names of all codecs: registered entry points plus the built-ins (imports nothing)."""
    return sorted({info.name for info in list_plugins(CODECS_GROUP)} | set(BUILTIN_CODECS))


def _validate(obj: object, name: str) -> type[Codec]:
    if not inspect.isclass(obj) or not issubclass(obj, Codec):
        raise PluginValidationError(
            f"codec {name!r}: {obj!r} is not a subclass of tierkv.codecs.Codec", group=CODECS_GROUP, name=name
        )
    if inspect.isabstract(obj):
        raise PluginValidationError(f"codec {name!r}: {obj.__name__} is abstract", group=CODECS_GROUP, name=name)
    if obj.name != name:
        raise PluginValidationError(f"codec {name!r}: class declares name {obj.name!r}", group=CODECS_GROUP, name=name)
    return obj


@functools.cache
def load_codec_class(name: str) -> type[Codec]:
    """The codec class registered as ``name`` (cached); see the module docstring for errors."""
    try:
        obj = load_plugin(CODECS_GROUP, name)
    except PluginNotFoundError:
        target = BUILTIN_CODECS.get(name)
        if target is None:
            raise
        module_name, _, attr = target.partition(":")
        obj = getattr(importlib.import_module(module_name), attr)
    return _validate(obj, name)


@functools.lru_cache(maxsize=256)
def _cached(name: str, params_json: str) -> Codec:
    cls = load_codec_class(name)
    try:
        return cls.from_params(json.loads(params_json))
    except ImportError as exc:
        raise PluginUnavailableError(
            f"codec {name!r} cannot run: {exc}", group=CODECS_GROUP, name=name, hint=_HINT
        ) from exc


def codec_from_params(name: str, params: Mapping[str, Any]) -> Codec:
    """Build (or reuse a cached) codec ``name`` with ``params``; codecs are immutable, so sharing is safe."""
    try:
        key = json.dumps(dict(params), sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise ConfigError("codec", dict(params), "JSON-representable params") from exc
    return _cached(name, key)
