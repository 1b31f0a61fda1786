"""The argument checks every backend makes: keys, allocations, buffers.

Import them from :mod:`tierkv.backend`, which re-exports them. Owns the key
alphabet, :data:`MAX_TAG_BYTES` and the buffer views; pure functions, no I/O, no
other tierkv module but :mod:`tierkv.errors`.
"""

from __future__ import annotations

import re

import numpy as np

from .errors import InputError

__all__ = ["MAX_TAG_BYTES", "as_byte_view", "check_allocation", "into_view", "validate_key"]

#: Largest ``tag`` a backend must be able to store with a block.
MAX_TAG_BYTES = 256

_KEY_RE = re.compile(r"[0-9A-Za-z._-]{1,128}")


def validate_key(key: object, *, tier: str = "") -> str:
    """Return ``key`` if it is a valid block key, else raise :class:`~tierkv.InputError`."""
    if not isinstance(key, str) or not _KEY_RE.fullmatch(key):
        raise InputError(
            f"{'[' + tier + '] ' if tier else ''}invalid block key {key!r}: "
            "expected 1-128 characters from [0-9A-Za-z._-]"
        )
    return key


def check_allocation(key: object, nbytes: object, tag: object, *, max_block_bytes: int, tier: str = "") -> None:
    """Validate the arguments of :meth:`Backend.allocate` as every backend must:
    a valid key, ``nbytes`` a non-negative int of at most ``max_block_bytes``,
    ``tag`` bytes of at most :data:`MAX_TAG_BYTES`. Raises :class:`~tierkv.InputError`."""
    validate_key(key, tier=tier)
    where = f"[{tier}] " if tier else ""
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
        raise InputError(f"{where}nbytes must be a non-negative int, got {nbytes!r}")
    if nbytes > max_block_bytes:
        raise InputError(f"{where}block of {nbytes} bytes exceeds max_block_bytes={max_block_bytes}")
    if not isinstance(tag, (bytes, bytearray)) or len(tag) > MAX_TAG_BYTES:
        raise InputError(f"{where}tag must be bytes of at most {MAX_TAG_BYTES} bytes")


def into_view(into: object, nbytes: int, *, tier: str = "") -> memoryview:
    """The first ``nbytes`` bytes of a caller's ``read(into=...)`` buffer, as a
    writable contiguous view. Raises :class:`~tierkv.InputError` when ``into`` is
    read-only, not contiguous or smaller than the block."""
    mv = as_byte_view(into, writable=True, what="into")
    if mv.nbytes < nbytes:
        raise InputError(f"{'[' + tier + '] ' if tier else ''}into has {mv.nbytes} bytes, block has {nbytes}")
    return mv[:nbytes]


def as_byte_view(data: object, *, writable: bool = False, what: str = "data") -> memoryview:
    """View ``data`` as a flat, C-contiguous ``memoryview`` of bytes (no copy).

    Raises :class:`~tierkv.InputError` for objects without the buffer protocol,
    non-contiguous memory, or (with ``writable``) read-only memory.
    """
    if isinstance(data, np.ndarray):
        if not data.flags.c_contiguous:
            raise InputError(f"{what}: numpy array is not C-contiguous")
        try:
            mv = data.reshape(-1).view(np.uint8).data
        except (ValueError, TypeError) as exc:
            raise InputError(f"{what}: cannot view array of dtype {data.dtype} as bytes") from exc
    else:
        try:
            mv = memoryview(data)  # type: ignore[arg-type]
        except TypeError as exc:
            raise InputError(f"{what}: {type(data).__name__} does not expose the buffer protocol") from exc
        if not mv.c_contiguous:
            raise InputError(f"{what}: buffer is not C-contiguous")
        if mv.format != "B" or mv.ndim != 1:
            mv = mv.cast("B")
    if writable and mv.readonly:
        raise InputError(f"{what}: buffer is read-only")
    return mv
