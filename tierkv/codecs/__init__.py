"""Codecs for KV blocks: self-describing block format, lossless and CacheGen-style lossy codecs.

Codecs are plugins of the ``tierkv.codecs`` entry-point group (built-ins:
``raw``, ``lz4``, ``zstd``, ``cachegen``). Importing this package does no I/O
and imports no compression library; codecs import theirs when built.

The core uses one :class:`TierCodec` per tier::

    tc = TierCodec.from_config(tier_codec_table_or_None, bandwidth_Bps=tier_bandwidth)
    block = tc.encode(kv); kv = tc.decode(block); kv = await tc.adecode(block)
    tc.name, tc.lossless, tc.ratio_estimate, tc.decode_Bps, tc.reasoning

(see :mod:`tierkv.codecs._tier` for the config keys, errors and concurrency).
"""

from ._base import DTYPE_NAMES, BlockMeta, Codec, meta_for
from ._cachegen import (
    DEFAULT_LEVEL,
    LEVELS,
    ROWMAX_LEVELS,
    SCHEMES,
    CacheGenCodec,
    StaticModel,
    get_static_model,
    int8_codec,
    register_static_model,
)
from ._choice import (
    MEASURED_CANDIDATES,
    CodecCandidate,
    CodecChoice,
    break_even_bandwidth,
    choose_codec,
    fetch_decode_seconds,
)
from ._format import FORMAT_VERSION, BlockHeader, decode_block, encode_block, peek_header
from ._lossless import Lz4Codec, RawCodec, ZstdCodec
from ._pipeline import CodecPipeline, adecode_block, aencode_block
from ._profiles import Profile, find_profile, get_profile, register_profile
from ._registry import BUILTIN_CODECS, codec_from_params, list_codecs, load_codec_class
from ._tier import TierCodec

__all__ = [
    "BUILTIN_CODECS",
    "DEFAULT_LEVEL",
    "DTYPE_NAMES",
    "FORMAT_VERSION",
    "LEVELS",
    "MEASURED_CANDIDATES",
    "ROWMAX_LEVELS",
    "SCHEMES",
    "BlockHeader",
    "BlockMeta",
    "CacheGenCodec",
    "Codec",
    "CodecCandidate",
    "CodecChoice",
    "CodecPipeline",
    "Profile",
    "Lz4Codec",
    "RawCodec",
    "StaticModel",
    "TierCodec",
    "ZstdCodec",
    "adecode_block",
    "aencode_block",
    "break_even_bandwidth",
    "choose_codec",
    "codec_from_params",
    "decode_block",
    "encode_block",
    "fetch_decode_seconds",
    "find_profile",
    "get_profile",
    "get_static_model",
    "int8_codec",
    "list_codecs",
    "load_codec_class",
    "meta_for",
    "peek_header",
    "register_profile",
    "register_static_model",
]
