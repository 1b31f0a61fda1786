"""The block-tag format: what :class:`~tierkv.TierKV` stores with every block.

Owns the byte layout of a tag and nothing else; backends treat tags as opaque
bytes (at most :data:`tierkv.backend.MAX_TAG_BYTES`), returned by ``scan()`` and
``tag_of()``. Pure functions, no I/O.

Layout (little-endian, 92 bytes, ``struct`` format ``<2sBB16s16s32sIIQ8s``)::

    offset size field
    0      2    magic b"TK"
    2      1    version (1)
    3      1    flags: bit 0 set = the raw bytes are a lossy codec's reconstruction
    4      16   model scope digest (first 16 bytes; tenant-free)
    20     16   tenant id (16 bytes of the tenant's salt; zeros for the default tenant)
    36     32   parent block key (zeros for position 0)
    68     4    position of the block in its sequence
    72     4    CRC-32 of the block's raw bytes (the bytes exact tiers hold)
    76     8    raw bytes of the block
    84     8    root: a scope-free fingerprint of the sequence's first block tokens

A reader adopts a tag only when it is ours (magic, version, size) and names the
chain being walked (scope, tenant, parent, position); see ``_index.Index.walk``.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Any

import numpy as np

__all__ = [
    "CKPT_TAG",
    "TAG_SIZE",
    "ZERO16",
    "ZERO32",
    "pack_tag",
    "retag",
    "root_of",
    "tag_exact",
    "tag_tenant",
    "unpack_tag",
]

_TAG = struct.Struct("<2sBB16s16s32sIIQ8s")
_TAG_MAGIC = b"TK"
_TAG_VERSION = 1
TAG_SIZE = _TAG.size
ZERO16 = bytes(16)
ZERO32 = bytes(32)
#: the tag of a checkpoint manifest (not a block)
CKPT_TAG = b"TKCKPT1"

#: tag flag: the block's raw bytes are a lossy codec's reconstruction, not the original bits
_FLAG_INEXACT = 0x01


def pack_tag(
    model_scope: bytes,
    tenant: bytes,
    parent: bytes,
    pos: int,
    crc: int,
    nbytes: int,
    root: bytes,
    *,
    exact: bool = True,
) -> bytes:
    flags = 0 if exact else _FLAG_INEXACT
    return _TAG.pack(_TAG_MAGIC, _TAG_VERSION, flags, model_scope[:16], tenant[:16], parent, pos, crc, nbytes, root[:8])


def retag(tag: bytes, crc: int, *, exact: bool) -> bytes:
    """``tag`` with another checksum of the raw bytes and exactness flag."""
    parsed = unpack_tag(tag)
    if parsed is None:
        return tag
    ms, tenant, parent, pos, _crc, nbytes, root = parsed
    return pack_tag(ms, tenant, parent, pos, crc, nbytes, root, exact=exact)


def tag_exact(tag: bytes) -> bool:
    """Whether a tag says its block's raw bytes are the original bits."""
    return len(tag) != _TAG.size or not tag[3] & _FLAG_INEXACT


def unpack_tag(tag: bytes) -> tuple[bytes, bytes, bytes, int, int, int, bytes] | None:
    """(model_scope, tenant, parent, pos, crc, nbytes, root), or None if ``tag`` is not ours."""
    if len(tag) != _TAG.size:
        return None
    magic, version, _flags, ms, tenant, parent, pos, crc, nbytes, root = _TAG.unpack(tag)
    if magic != _TAG_MAGIC or version != _TAG_VERSION:
        return None
    return ms, tenant, parent, pos, crc, nbytes, root


def tag_tenant(tag: bytes) -> bytes | None:
    """The tenant field of a block tag written by :class:`TierKV`, or None when ``tag`` is not
    one of ours. Backends that share content between blocks (the ``pfs`` tier's dedup) use it
    to keep each tenant's content apart without parsing the rest of the tag."""
    parsed = unpack_tag(tag)
    return None if parsed is None else parsed[1]


def root_of(tokens: np.ndarray[Any, Any], block_tokens: int) -> bytes:
    """Scope-free fingerprint of the first block's tokens (to tell a
    ``different_scope`` miss from a ``never_stored`` one; never used as a key)."""
    raw = np.ascontiguousarray(tokens[:block_tokens], dtype="<i8").tobytes()
    return hashlib.sha256(b"tierkv.root\x00" + raw).digest()[:8]
