"""Sensitivity profiles for the ``profile`` scheme of the cachegen codec.

A :class:`Profile` holds, per (layer, K/V, channel) group of a model's KV:

* ``codes`` (int16): ``8 * log2(F ** -0.5)``, rounded, where ``F`` is the diagonal Fisher information of the
  model's next-token distributions with respect to that KV channel, averaged over prefix tokens (the first
  token, the attention sink, excluded) and continuation positions. The codec adds the level's
  ``8 * log2(step_scale)`` to get the step codes of a block.
* ``order`` (a permutation of the groups): the groups sorted by their mean absolute centred symbol on
  calibration KV at the default level, the order in which their symbols enter zstd (groups of similar
  statistics together compress better than any per-block order that must be stored).

A block written with a profile stores its step codes as deltas to the profile's and names the profile by
``digest`` (8 bytes of SHA-256 over codes and order), so a reader needs the same profile registered (the
built-in ones always are). A block names a profile by content, never by a name whose content could change:
if a later tierkv recalibrates a built-in profile it must keep the old one registered, or old blocks raise
DecodeError (never decode wrong).

Built-in profiles are package data (``tierkv/codecs/data/<name>.npz``, read with :mod:`importlib.resources`
on first use). ``smollm2-135m`` (30 layers, 3 KV heads x 64): measured by ``tierkv codec-eval
--calibrate-profile`` on 4 ShareGPT conversations (seed 1000, 1024-token prompts, 127 sampled continuation
positions, 4 random-sign probes each), disjoint from the evaluation conversations (seed 0).
"""

from __future__ import annotations

import hashlib
import io
import threading
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any

import numpy as np

from ..errors import ConfigError, InputError

__all__ = ["Profile", "builtin_profile_file", "find_profile", "get_profile", "profile_by_digest", "register_profile"]


@dataclass(frozen=True, slots=True, eq=False)
class Profile:
    """Step codes (layers, 2, channels) int16 and the zstd group order (a permutation of layers*2*channels)."""

    name: str
    codes: np.ndarray[Any, Any]
    order: np.ndarray[Any, Any]
    digest: bytes

    @classmethod
    def create(cls, name: str, codes: np.ndarray[Any, Any], order: np.ndarray[Any, Any] | None = None) -> Profile:
        """Validate and freeze; ``order=None`` keeps the natural group order. Raises InputError."""
        arr = np.asarray(codes)
        if arr.ndim != 3 or arr.shape[1] != 2 or not np.issubdtype(arr.dtype, np.integer):
            raise InputError("profile codes must be an integer array shaped (layers, 2, channels)")
        if arr.size and (arr.min() < -512 or arr.max() > 512):
            raise InputError("profile codes must lie in [-512, 512]")
        groups = arr.size
        perm = np.arange(groups) if order is None else np.asarray(order)
        if perm.shape != (groups,) or not np.array_equal(np.sort(perm), np.arange(groups)):
            raise InputError("profile order must be a permutation of layers * 2 * channels groups")
        c16 = np.ascontiguousarray(arr, dtype="<i2")
        p32 = np.ascontiguousarray(perm, dtype="<u4")
        c16.setflags(write=False)
        p32.setflags(write=False)
        digest = hashlib.sha256(repr(c16.shape).encode() + c16.tobytes() + p32.tobytes()).digest()[:8]
        return cls(name=name, codes=c16, order=p32, digest=digest)


#: built-in profiles: name -> file under ``tierkv/codecs/data/`` (package data; ``.npz`` with ``codes``
#: (layers, 2, channels) int16 and ``order`` (layers * 2 * channels,) uint16, as ``codec-eval
#: --calibrate-profile`` writes them)
_BUILTIN: dict[str, str] = {
    "smollm2-135m": "smollm2-135m.npz",
}
_PROFILES: dict[str, Profile] = {}
_BY_DIGEST: dict[bytes, Profile] = {}
_LOCK = threading.Lock()


def builtin_profile_file(name: str) -> Traversable:
    """The package-data file of built-in profile ``name`` (KeyError for a name that is not built in)."""
    return resources.files("tierkv.codecs").joinpath("data", _BUILTIN[name])


def _read_builtin(name: str) -> Profile:
    with np.load(io.BytesIO(builtin_profile_file(name).read_bytes()), allow_pickle=False) as data:
        return Profile.create(name, data["codes"], data["order"])


def _load_builtins() -> None:
    with _LOCK:
        if _PROFILES:
            return
    for name in _BUILTIN:
        _put(_read_builtin(name))


def _put(profile: Profile) -> None:
    with _LOCK:
        _PROFILES[profile.name] = profile
        _BY_DIGEST[profile.digest] = profile


def register_profile(profile: Profile) -> None:
    """Make ``profile`` usable by codecs (``profile=<name>``, or ``"auto"`` for its shape) and by readers."""
    if profile.name in ("", "auto", "none"):
        raise InputError(f"profile name {profile.name!r} is reserved")
    _load_builtins()
    _put(profile)


def get_profile(name: str) -> Profile:
    """The registered profile ``name``; ConfigError for an unknown one."""
    _load_builtins()
    with _LOCK:
        profile = _PROFILES.get(name)
        names = ", ".join(_PROFILES)
    if profile is None:
        raise ConfigError("codec.profile", name, f"'auto', 'none' or a registered profile ({names})")
    return profile


def profile_by_digest(digest: bytes) -> Profile | None:
    """The registered profile with that content digest, or None."""
    _load_builtins()
    with _LOCK:
        return _BY_DIGEST.get(bytes(digest))


def find_profile(layers: int, channels: int) -> Profile | None:
    """The most recently registered profile for KV of ``layers`` x ``channels`` (``kv_heads * head_dim``)."""
    _load_builtins()
    with _LOCK:
        found = [p for p in _PROFILES.values() if p.codes.shape == (layers, 2, channels)]
    return found[-1] if found else None
