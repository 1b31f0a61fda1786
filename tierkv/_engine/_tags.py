"""The block-tag format: what :class:`~tierkv.TierKV` stores with every block.

Owns the byte layout of a tag and nothing else; backends treat tags as opaque
bytes (at most :data:`tierkv.backend.MAX_TAG_BYTES`), returned by ``scan()`` and
``tag_of()``. Pure functions, no I/O.

Layout (little-endian, 92 bytes, ``struct`` format ``<2sBB16s16s32sIIQ8s``)::

    offset size field
    0      2    magic b"TK"
    2      1    version (1)
    3      1    flags: bit 0 set = the raw bytes are a lossy codec's reconstruction;
                bit 1 set = the checksum is xxh3-64's low 32 bits (clear: CRC-32, the
                tags written before xxh3); bit 2 set = no checksum computed yet (a
                block on a memory tier whose reads are not verified; checksum 0);
                bit 3 set = a partial last block (a *tail*: fewer than ``block_tokens``
                tokens, a leaf under its parent; its tokens are ``raw bytes`` divided
                by the bytes of one token)
    4      16   model scope digest (first 16 bytes; tenant-free)
    20     16   tenant id (16 bytes of the tenant's salt; zeros for the default tenant)
    36     32   parent block key (zeros for position 0)
                (a tail at position 0: the chain seed, the scope digest of its tenant)
    68     4    position of the block in its sequence
    72     4    checksum of the block's raw bytes (the bytes exact tiers hold)
    76     8    raw bytes of the block
    84     8    root: a scope-free fingerprint of the sequence's first block tokens

The checksum is computed once per block, at memory speed (:func:`checksum`), and only
when a copy of the block goes to a tier that verifies its reads (persistent and network
tiers; a memory tier when configured with ``verify = true``); a block that lives only in
unverified memory carries none until it is first copied to such a tier.

A reader adopts a tag only when it is ours (magic, version, size) and names the
chain being walked (scope, tenant, parent, position); see ``_index.Index.walk``.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from typing import Any

import numpy as np
import xxhash

__all__ = [
    "CKPT_TAG",
    "TAG_SIZE",
    "ZERO16",
    "ZERO32",
    "checked_tag",
    "checksum",
    "pack_tag",
    "pack_tag_flags",
    "retag",
    "root_of",
    "tag_checked",
    "tag_checksum",
    "tag_crc",
    "tag_exact",
    "tag_flags",
    "tag_tail",
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
#: tag flag: the checksum is xxh3-64's low 32 bits (clear: CRC-32)
_FLAG_XXH3 = 0x02
#: tag flag: no checksum computed yet (0 stands in its place)
_FLAG_UNCHECKED = 0x04
#: tag flag: a partial last block (a tail; see ``put`` with ``partial_blocks``)
_FLAG_TAIL = 0x08
_CRC_AT = struct.Struct("<I")


def checksum(data: Any) -> int:
    """The checksum of a block's raw bytes written into new tags: xxh3-64's low 32 bits
    (runs at memory speed; ``zlib.crc32`` ran at about a tenth of a memcpy here)."""
    return xxhash.xxh3_64_intdigest(data) & 0xFFFFFFFF


def tag_checksum(tag: bytes, data: Any) -> int:
    """``data``'s checksum by the algorithm ``tag`` names (CRC-32 for older tags)."""
    if len(tag) == _TAG.size and not tag[3] & _FLAG_XXH3:
        return zlib.crc32(data)
    return checksum(data)


def tag_checked(tag: bytes) -> bool:
    """Whether ``tag`` carries a checksum of its block (False: none computed yet)."""
    return len(tag) != _TAG.size or not tag[3] & _FLAG_UNCHECKED


def tag_crc(tag: bytes) -> int:
    """The checksum field of a block tag (0 for a tag that is not ours)."""
    return int(_CRC_AT.unpack_from(tag, 72)[0]) if len(tag) == _TAG.size else 0


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
    checked: bool = True,
    tail: bool = False,
) -> bytes:
    """A new block tag; ``crc`` is :func:`checksum` of the raw bytes, or 0 with
    ``checked=False`` (none computed yet); ``tail``: a partial last block."""
    flags = (
        _FLAG_XXH3 | (0 if exact else _FLAG_INEXACT) | (0 if checked else _FLAG_UNCHECKED) | (_FLAG_TAIL if tail else 0)
    )
    return _TAG.pack(_TAG_MAGIC, _TAG_VERSION, flags, model_scope[:16], tenant[:16], parent, pos, crc, nbytes, root[:8])


def pack_tag_flags(
    model_scope: bytes, tenant: bytes, parent: bytes, pos: int, crc: int, nbytes: int, root: bytes, flags: int
) -> bytes:
    """A block tag with its flags byte as given (the index rebuilds stored tags with it)."""
    return _TAG.pack(_TAG_MAGIC, _TAG_VERSION, flags, model_scope[:16], tenant[:16], parent, pos, crc, nbytes, root[:8])


def tag_flags(tag: bytes) -> int:
    """The flags byte of a block tag (0 for a tag that is not ours)."""
    return tag[3] if len(tag) == _TAG.size else 0


def retag(tag: bytes, crc: int, *, exact: bool) -> bytes:
    """``tag`` with another checksum (:func:`checksum`) of the raw bytes and exactness flag."""
    parsed = unpack_tag(tag)
    if parsed is None:
        return tag
    ms, tenant, parent, pos, _crc, nbytes, root = parsed
    return pack_tag(ms, tenant, parent, pos, crc, nbytes, root, exact=exact, tail=tag_tail(tag))


def checked_tag(tag: bytes, data: Any) -> bytes:
    """``tag`` itself when it carries a checksum, else ``tag`` with the checksum of ``data``."""
    return tag if tag_checked(tag) else retag(tag, checksum(data), exact=tag_exact(tag))


def tag_tail(tag: bytes) -> bool:
    """Whether a tag is a partial last block's (a tail)."""
    return len(tag) == _TAG.size and bool(tag[3] & _FLAG_TAIL)


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
