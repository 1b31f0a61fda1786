"""Typed readers for option mappings (config tables of tiers, codecs, the core).

Backend and codec authors import them from :mod:`tierkv.backend`, which re-exports them.

Each reader raises :class:`~tierkv.ConfigError` naming the dotted field, the
value and what is allowed. Sizes accept an int (bytes) or a string with a
binary or decimal unit: ``"64MiB"``, ``"2 GiB"``, ``"512k"``, ``"1.5GB"``.
These are pure functions: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

from .errors import ConfigError

__all__ = [
    "config_path",
    "opt_bool",
    "opt_choice",
    "opt_float",
    "opt_int",
    "opt_path",
    "opt_size",
    "opt_str",
    "parse_size",
    "reject_unknown",
]

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kb": 1000,
    "kib": 1024,
    "m": 1024**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1024**3,
    "gb": 1000**3,
    "gib": 1024**3,
    "t": 1024**4,
    "tb": 1000**4,
    "tib": 1024**4,
}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")
_MISSING = object()
T = TypeVar("T")


def parse_size(field: str, value: object) -> int:
    """Parse a byte size; raise ConfigError naming ``field`` if it is not one."""
    allowed = "a non-negative int of bytes or a string like '64MiB', '2GB', '512k'"
    if isinstance(value, bool):
        raise ConfigError(field, value, allowed)
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(field, value, allowed)
        return value
    if isinstance(value, str):
        m = _SIZE_RE.match(value)
        if m and m.group(2).lower() in _UNITS:
            return int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    raise ConfigError(field, value, allowed)


def _get(options: Mapping[str, Any], key: str, default: object) -> object:
    if key in options:
        return options[key]
    return default


def _name(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def opt_size(
    options: Mapping[str, Any],
    key: str,
    default: int | str | None = None,
    *,
    prefix: str = "",
    minimum: int = 0,
    maximum: int | None = None,
) -> int:
    """Read a byte size (see :func:`parse_size`) within ``[minimum, maximum]``."""
    raw = _get(options, key, default)
    field = _name(prefix, key)
    if raw is None:
        raise ConfigError(field, raw, "a byte size (required)")
    v = parse_size(field, raw)
    if v < minimum or (maximum is not None and v > maximum):
        hi = f"{maximum}" if maximum is not None else "inf"
        raise ConfigError(field, raw, f"a size in bytes between {minimum} and {hi}")
    return v


def opt_int(
    options: Mapping[str, Any],
    key: str,
    default: int | None = None,
    *,
    prefix: str = "",
    minimum: int | None = None,
    maximum: int | None = None,
) -> int:
    """Read an int within ``[minimum, maximum]``; bools are rejected."""
    raw = _get(options, key, default)
    field = _name(prefix, key)
    lo = "-inf" if minimum is None else str(minimum)
    hi = "inf" if maximum is None else str(maximum)
    allowed = f"an integer in [{lo}, {hi}]"
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise ConfigError(field, raw, allowed)
    if (minimum is not None and raw < minimum) or (maximum is not None and raw > maximum):
        raise ConfigError(field, raw, allowed)
    return raw


def opt_float(
    options: Mapping[str, Any],
    key: str,
    default: float | None = None,
    *,
    prefix: str = "",
    minimum: float | None = None,
    maximum: float | None = None,
) -> float:
    """Read a finite float within ``[minimum, maximum]`` (ints accepted)."""
    raw = _get(options, key, default)
    field = _name(prefix, key)
    lo = "-inf" if minimum is None else str(minimum)
    hi = "inf" if maximum is None else str(maximum)
    allowed = f"a number in [{lo}, {hi}]"
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        raise ConfigError(field, raw, allowed)
    v = float(raw)
    if v != v or v in (float("inf"), float("-inf")):
        raise ConfigError(field, raw, allowed)
    if (minimum is not None and v < minimum) or (maximum is not None and v > maximum):
        raise ConfigError(field, raw, allowed)
    return v


def opt_bool(options: Mapping[str, Any], key: str, default: bool | None = None, *, prefix: str = "") -> bool:
    """Read a bool (only ``True``/``False``; no truthy strings)."""
    raw = _get(options, key, default)
    if not isinstance(raw, bool):
        raise ConfigError(_name(prefix, key), raw, "true or false")
    return raw


def opt_str(
    options: Mapping[str, Any],
    key: str,
    default: str | None = None,
    *,
    prefix: str = "",
    allow_empty: bool = False,
) -> str:
    """Read a string; a NUL character is never allowed (no path, name or address holds one)."""
    raw = _get(options, key, default)
    if not isinstance(raw, str) or (not allow_empty and not raw):
        raise ConfigError(_name(prefix, key), raw, "a non-empty string" if not allow_empty else "a string")
    if "\x00" in raw:
        raise ConfigError(_name(prefix, key), raw, "a string without NUL characters")
    return raw


def opt_path(options: Mapping[str, Any], key: str, default: str | None = None, *, prefix: str = "") -> str:
    """Read a filesystem path: a non-empty string (or ``os.PathLike``) without NUL characters."""
    raw = _get(options, key, default)
    if raw is not None and not isinstance(raw, str) and hasattr(raw, "__fspath__"):
        raw = str(raw)
    if not isinstance(raw, str) or not raw:
        raise ConfigError(_name(prefix, key), raw, "a non-empty path")
    if "\x00" in raw:
        raise ConfigError(_name(prefix, key), raw, "a path without NUL characters")
    return raw


def opt_choice(
    options: Mapping[str, Any],
    key: str,
    choices: tuple[str, ...],
    default: str | None = None,
    *,
    prefix: str = "",
) -> str:
    """Read a string that must be one of ``choices``."""
    raw = _get(options, key, default)
    if not isinstance(raw, str) or raw not in choices:
        raise ConfigError(_name(prefix, key), raw, "one of " + ", ".join(repr(c) for c in choices))
    return raw


@contextmanager
def config_path(prefix: str) -> Iterator[None]:
    """Put ``prefix`` before the field of a :class:`~tierkv.ConfigError` raised inside.

    Readers of a sub-table (a backend reading its tier's options, a model
    reading its ``hf_config``) name fields relative to that table; the caller
    that knows where the table sits in the config says so::

        with config_path("tiers[0]"):
            backend = await backend_cls.open(t.options, name=t.name)

    turns ``capcity`` into ``tiers[0].capcity``. A field already under
    ``prefix`` is left alone. The new error is chained to the original.
    """
    try:
        yield
    except ConfigError as exc:
        if not prefix or exc.field == prefix or exc.field.startswith((prefix + ".", prefix + "[")):
            raise
        sep = "" if exc.field.startswith("[") else "."
        raise ConfigError(f"{prefix}{sep}{exc.field}", exc.value, exc.allowed) from exc


def reject_unknown(options: Mapping[str, Any], known: set[str] | frozenset[str], *, prefix: str = "") -> None:
    """Raise ConfigError for the first key of ``options`` not in ``known``."""
    for key in options:
        if key not in known:
            raise ConfigError(
                _name(prefix, str(key)), options[key], "one of the known fields: " + ", ".join(sorted(known))
            )
