"""CacheGen-style lossy KV codec (after Liu et al., SIGCOMM'24) and the int8 reference quantizer.

Input: a KV array of layout ``(layers, 2, tokens, kv_heads, head_dim)`` in
float16, bfloat16 (``uint16`` bit patterns, ``dtype="bfloat16"``) or float32.

Two schemes, named in the block's params (``scheme``):

* ``"profile"`` (the default, levels :data:`LEVELS` 1-3): one step per
  (layer, K/V, channel) from a measured sensitivity profile, attention-sink rows
  in 8 bits, zstd over centred, profile-ordered symbols, table-driven float16
  decode. See :mod:`tierkv.codecs._profile`.
* ``"rowmax"`` (the first scheme, levels :data:`ROWMAX_LEVELS` 1-4): per-token
  absmax rows with layer-grouped bins, optional anchor/delta tokens and channel
  scales, ``ans`` (rANS), ``zstd`` or ``raw`` entropy coding. Blocks without a
  ``scheme`` field were written by it and still decode. See
  :mod:`tierkv.codecs._rowmax`.

This module owns the codec plugin, :class:`CacheGenCodec` (the entry point
``tierkv.codecs._cachegen:CacheGenCodec``): its parameters and level presets
(:data:`LEVELS` here, :data:`ROWMAX_LEVELS` re-exported), their validation,
the dispatch of ``encode``/``decode`` to a scheme, the rowmax payload's
sections (``u32 table length | u32 stream length | steps | channel scales |
table | stream``) with the ``raw``/``zstd`` symbol coders, and the int8
reference (:func:`int8_codec`). It re-exports the rowmax names it always
offered (:func:`quantize`, :func:`dequantize`, :class:`StaticModel`,
:func:`register_static_model`, :func:`get_static_model`). May not touch: the
quantizers and the rANS kernels themselves (:mod:`._rowmax`, :mod:`._profile`;
they never import this module), the block header (:mod:`._format`) or any I/O.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from typing import Any, Self

import numpy as np

from .._options import opt_choice, opt_int, reject_unknown
from ..errors import CodecError, ConfigError, DecodeError
from ._base import BlockMeta, Codec, ParamValue
from ._floats import from_f32, to_f32
from ._profile import decode_profile, encode_profile
from ._profiles import Profile, find_profile, get_profile
from ._rowmax import (
    ROWMAX_LEVELS,
    StaticModel,
    ans_decode,
    ans_encode,
    dequant_f16,
    dequantize,
    get_static_model,
    quantize,
    register_static_model,
)

__all__ = [
    "DEFAULT_LEVEL",
    "LEVELS",
    "ROWMAX_LEVELS",
    "SCHEMES",
    "CacheGenCodec",
    "StaticModel",
    "dequantize",
    "get_static_model",
    "int8_codec",
    "quantize",
    "register_static_model",
]

DEFAULT_LEVEL = 2

#: Presets of the ``profile`` scheme (the default): ``step_scale`` multiplies the sensitivity profile's
#: relative steps; zstd with tuned literal-coding parameters (``zstd_level`` 0, the default; 1-22 pick a
#: standard level: 19 is ~4% smaller and ~80x slower to encode, 1 is ~5% larger).
LEVELS: Mapping[int, Mapping[str, ParamValue]] = {
    1: {"step_scale": 6e-5},
    2: {"step_scale": 1e-4},
    3: {"step_scale": 1.6e-4},
}

SCHEMES = ("profile", "rowmax")
_DEFAULT_STEP_SCALE = 1e-4  # the fallback's steps (no profile) scale with step_scale relative to this
_ENTROPY = ("ans", "zstd", "raw")
_SUB = struct.Struct("<II")
_ROWMAX_ONLY = frozenset(
    {"key_bins", "key_hi_layers", "value_bins", "value_hi_layers", "anchor", "channel_scale", "channel_power", "table"}
)
_PROFILE_ONLY = frozenset({"profile", "step_scale", "sinks", "deadzone", "fallback_scale"})
_KNOWN = _ROWMAX_ONLY | _PROFILE_ONLY | {"level", "scheme", "entropy", "zstd_level"}
_CHANNEL_SCALE = ("none", "k", "kv")
_KV_DTYPES = ("float16", "bfloat16", "float32")


# ----------------------------------------------------------------------------- codec


def _bins_pair(params: Mapping[str, Any], key: str, default: list[int], entropy: str) -> list[int]:
    raw = params.get(key, default)
    hi = 256
    if (
        not isinstance(raw, (list, tuple))
        or len(raw) != 2
        or not all(isinstance(b, int) and not isinstance(b, bool) and 3 <= b <= hi for b in raw)
    ):
        raise ConfigError(f"codec.{key}", raw, f"a pair [bins_first_layers, bins_other_layers] of ints in [3, {hi}]")
    return [int(raw[0]), int(raw[1])]


class CacheGenCodec(Codec):
    """CacheGen-style quantization + entropy coding of a (layers, 2, tokens, kv_heads, head_dim) KV array.

    Two schemes (see the module docstring and :mod:`tierkv.codecs._profile`): ``"profile"`` (the default:
    sensitivity-weighted per-channel steps, sink rows, zstd) and ``"rowmax"`` (per-token absmax with
    layer-grouped bins, ``ans``/``zstd``/``raw`` entropy coding; the codec's first scheme). Without an
    explicit ``scheme``, any rowmax-only field (bins, anchor, channel scale, table, ``entropy`` other than
    zstd) selects ``rowmax``: blocks written before the profile scheme existed carry such fields and
    decode as before. ``encode`` raises :class:`~tierkv.CodecError` for a wrong layout or dtype,
    non-finite values, or a static model that does not fit the KV; ``decode`` raises
    :class:`~tierkv.DecodeError`. Thread-safe.
    """

    name = "cachegen"
    lossy = True
    encode_mbps = 6.0
    decode_mbps = 700.0

    def __init__(
        self,
        *,
        level: int | None = DEFAULT_LEVEL,
        scheme: str | None = None,
        key_bins: list[int] | None = None,
        key_hi_layers: int | str = "third",
        value_bins: list[int] | None = None,
        value_hi_layers: int | str = 2,
        anchor: int | None = None,
        channel_scale: str | None = None,
        channel_power: float | None = None,
        entropy: str | None = None,
        zstd_level: int | None = None,
        table: str = "chunk",
        profile: str = "auto",
        step_scale: float | None = None,
        sinks: bool = True,
        deadzone: float = 0.0,
        fallback_scale: float = 0.5,
    ) -> None:
        if scheme is None:
            rowmax_args = (key_bins, value_bins, anchor, channel_scale, channel_power)
            rowmax = any(a is not None for a in rowmax_args) or table != "chunk" or entropy in ("ans", "raw")
            scheme = "rowmax" if rowmax else "profile"
        if scheme not in SCHEMES:
            raise ConfigError("codec.scheme", scheme, "one of " + ", ".join(SCHEMES))
        self.scheme = scheme
        presets = LEVELS if scheme == "profile" else ROWMAX_LEVELS
        if level is not None and level not in presets:
            raise ConfigError("codec.level", level, "one of " + ", ".join(map(str, presets)) + " or null")
        preset = presets[level] if level is not None else presets[DEFAULT_LEVEL]
        self.level = level
        if scheme == "profile":
            self.entropy = entropy if entropy is not None else "zstd"
            if self.entropy != "zstd":
                raise ConfigError("codec.entropy", self.entropy, "'zstd' (the profile scheme's only entropy coder)")
            self.zstd_level = zstd_level if zstd_level is not None else 0
            self.step_scale = float(step_scale if step_scale is not None else preset["step_scale"])  # type: ignore[arg-type]
            if not (math.isfinite(self.step_scale) and self.step_scale > 0):
                raise ConfigError("codec.step_scale", step_scale, "a positive number")
            if not 0.0 <= deadzone < 0.5:
                raise ConfigError("codec.deadzone", deadzone, "a number in [0, 0.5)")
            if not (math.isfinite(fallback_scale) and fallback_scale > 0):
                raise ConfigError("codec.fallback_scale", fallback_scale, "a positive number")
            if profile not in ("auto", "none"):
                get_profile(profile)  # ConfigError for an unknown profile
            self.profile = profile
            self.sinks = bool(sinks)
            self.deadzone = float(deadzone)
            self.fallback_scale = float(fallback_scale)
            self.table = "chunk"
            self._static: StaticModel | None = None
            import zstandard

            return
        self.key_bins = list(key_bins) if key_bins is not None else list(preset["key_bins"])  # type: ignore[arg-type]
        self.value_bins = list(value_bins) if value_bins is not None else list(preset["value_bins"])  # type: ignore[arg-type]
        self.key_hi_layers = key_hi_layers
        self.value_hi_layers = value_hi_layers
        self.anchor = int(anchor if anchor is not None else preset["anchor"])  # type: ignore[arg-type]
        self.channel_scale = str(channel_scale if channel_scale is not None else preset.get("channel_scale", "none"))
        self.channel_power = float(channel_power if channel_power is not None else preset.get("channel_power", 1.0))  # type: ignore[arg-type]
        if not 0.0 < self.channel_power <= 1.0:
            raise ConfigError("codec.channel_power", channel_power, "a number in (0, 1]")
        self.entropy = entropy if entropy is not None else "ans"
        self.zstd_level = zstd_level if zstd_level is not None else 1
        self.table = table
        self._static = get_static_model(table) if table != "chunk" else None
        if self._static is not None and dict(self._static.quantizer) != dict(self.quantizer_params):
            raise ConfigError("codec.table", table, "a static model calibrated with this codec's quantizer params")
        if self.entropy == "zstd":
            import zstandard  # noqa: F401
        elif self.entropy == "ans":
            import constriction  # noqa: F401

    # -- params

    @property
    def quantizer_params(self) -> Mapping[str, ParamValue]:
        """Quantizer fields of the rowmax scheme (what a StaticModel is calibrated for); ``{}`` for profile."""
        if self.scheme == "profile":
            return {}
        return {
            "key_bins": list(self.key_bins),
            "key_hi_layers": self.key_hi_layers,
            "value_bins": list(self.value_bins),
            "value_hi_layers": self.value_hi_layers,
            "anchor": self.anchor,
            "channel_scale": self.channel_scale,
            "channel_power": self.channel_power,
        }

    @property
    def params(self) -> Mapping[str, ParamValue]:
        if self.scheme == "profile":
            return {
                "scheme": "profile",
                "level": self.level,
                "profile": self.profile,
                "step_scale": self.step_scale,
                "sinks": self.sinks,
                "deadzone": self.deadzone,
                "fallback_scale": self.fallback_scale,
                "entropy": self.entropy,
                "zstd_level": self.zstd_level,
            }
        p = dict(self.quantizer_params)
        p.update(scheme="rowmax", level=self.level, entropy=self.entropy, table=self.table)
        if self.entropy == "zstd":
            p["zstd_level"] = self.zstd_level
        return p

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> Self:
        reject_unknown(params, _KNOWN, prefix="codec")
        scheme = params.get("scheme")
        if scheme is None:
            rowmax = bool(_ROWMAX_ONLY & set(params)) or params.get("entropy") in ("ans", "raw")
            scheme = "rowmax" if rowmax else "profile"
        if scheme not in SCHEMES:
            raise ConfigError("codec.scheme", scheme, "one of " + ", ".join(SCHEMES) + " (a newer tierkv wrote it?)")
        presets = LEVELS if scheme == "profile" else ROWMAX_LEVELS
        level_raw = params.get("level", DEFAULT_LEVEL)
        if level_raw is not None and (isinstance(level_raw, bool) or level_raw not in presets):
            raise ConfigError("codec.level", level_raw, "one of " + ", ".join(map(str, presets)) + " or null")
        preset = presets[level_raw if level_raw is not None else DEFAULT_LEVEL]
        if scheme == "profile":
            stray = sorted(_ROWMAX_ONLY & set(params))
            if stray:
                raise ConfigError(f"codec.{stray[0]}", params[stray[0]], "absent with scheme 'profile'")
            entropy = opt_choice(params, "entropy", ("zstd",), "zstd", prefix="codec")
            profile = params.get("profile", "auto")
            if not isinstance(profile, str) or not profile:
                raise ConfigError("codec.profile", profile, "'auto', 'none' or a registered profile name")
            sinks = params.get("sinks", True)
            if not isinstance(sinks, bool):
                raise ConfigError("codec.sinks", sinks, "true or false")
            return cls(
                level=level_raw,
                scheme="profile",
                entropy=entropy,
                zstd_level=opt_int(params, "zstd_level", 0, prefix="codec", minimum=0, maximum=22),
                profile=profile,
                step_scale=_positive(params, "step_scale", preset["step_scale"]),
                sinks=sinks,
                deadzone=_number(params, "deadzone", 0.0),
                fallback_scale=_positive(params, "fallback_scale", 0.5),
            )
        stray = sorted(_PROFILE_ONLY & set(params))
        if stray:
            raise ConfigError(f"codec.{stray[0]}", params[stray[0]], "absent with scheme 'rowmax'")
        entropy = opt_choice(params, "entropy", _ENTROPY, "ans", prefix="codec")
        hi_layers = []
        for key, default in (("key_hi_layers", "third"), ("value_hi_layers", 2)):
            v = params.get(key, default)
            if v != "third" and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise ConfigError(f"codec.{key}", v, "'third' or a non-negative int")
            hi_layers.append(v)
        table = params.get("table", "chunk")
        if not isinstance(table, str) or not table:
            raise ConfigError("codec.table", table, "'chunk' or a static model id")
        if table != "chunk" and entropy != "ans":
            raise ConfigError("codec.table", table, "'chunk' unless entropy is 'ans'")
        return cls(
            level=level_raw,
            scheme="rowmax",
            key_bins=_bins_pair(params, "key_bins", preset["key_bins"], entropy),  # type: ignore[arg-type]
            value_bins=_bins_pair(params, "value_bins", preset["value_bins"], entropy),  # type: ignore[arg-type]
            key_hi_layers=hi_layers[0],
            value_hi_layers=hi_layers[1],
            anchor=opt_int(params, "anchor", preset["anchor"], prefix="codec", minimum=0, maximum=4096),  # type: ignore[arg-type]
            channel_scale=opt_choice(
                params, "channel_scale", _CHANNEL_SCALE, str(preset.get("channel_scale", "none")), prefix="codec"
            ),
            channel_power=_channel_power(params, preset),
            entropy=entropy,
            zstd_level=opt_int(params, "zstd_level", 1, prefix="codec", minimum=-7, maximum=22),
            table=table,
        )

    # -- layout helpers

    def half_ranges(self, layers: int) -> np.ndarray[Any, Any]:
        """M per (layer, K/V): symbols of a row lie in ``[0, 2M]``."""
        m = np.empty((layers, 2), np.int64)
        for kv, (bins, hi) in enumerate(((self.key_bins, self.key_hi_layers), (self.value_bins, self.value_hi_layers))):
            n_hi = layers // 3 if hi == "third" else int(hi)
            m[:, kv] = (bins[1] - 1) // 2
            m[: min(n_hi, layers), kv] = (bins[0] - 1) // 2
        return m

    def _rows(self, array: np.ndarray[Any, Any], dtype: str) -> np.ndarray[Any, Any]:
        if dtype not in _KV_DTYPES:
            raise CodecError(f"cachegen: KV dtype must be one of {', '.join(_KV_DTYPES)}, got {dtype}")
        if array.ndim != 5 or array.shape[1] != 2:
            raise CodecError(f"cachegen: KV must be (layers, 2, tokens, kv_heads, head_dim), got shape {array.shape}")
        L, _, T, H, D = array.shape
        x = to_f32(np.ascontiguousarray(array), dtype).reshape(L, 2, T, H * D)
        return x

    # -- encode / decode

    def quantize_array(
        self, array: np.ndarray[Any, Any], dtype: str
    ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], bytes, np.ndarray[Any, Any]]:
        """Rowmax scheme: (symbols (L,2,T,C) uint8, steps (L,2,T) float16, channel scales bytes, M (L,2))."""
        if self.scheme != "rowmax":
            raise CodecError("cachegen: quantize_array is the rowmax scheme's; use quantize_profile for 'profile'")
        x = self._rows(array, dtype)
        m = self.half_ranges(x.shape[0])
        scales = b""
        n_scaled = self._n_scaled()
        if n_scaled:
            cmax = np.abs(x[:, :n_scaled]).max(axis=2)  # (L, n, C): per-channel absmax over the tokens
            if self.channel_power != 1.0:
                cmax = cmax**self.channel_power
            cs = cmax.astype(np.float16)
            if not np.isfinite(cs).all():
                raise CodecError("cachegen: the KV holds values too large for float16 channel scales")
            cs[cs == 0] = 1.0
            if np.shares_memory(x, array):
                x = x.copy()
            x[:, :n_scaled] /= cs.astype(np.float32)[:, :, None, :]
            scales = cs.tobytes()
        sym, step = quantize(x, m, self.anchor)
        return sym, step, scales, m

    def profile_for(self, layers: int, channels: int) -> Profile | None:
        """The sensitivity profile this codec uses for KV of that shape (None: the RMS fallback)."""
        if self.profile == "none":
            return None
        if self.profile == "auto":
            return find_profile(layers, channels)
        profile = get_profile(self.profile)
        if profile.codes.shape != (layers, 2, channels):
            raise CodecError(
                f"cachegen: profile {profile.name} is for {profile.codes.shape}, the KV is {(layers, 2, channels)}"
            )
        return profile

    def encode(self, array: np.ndarray[Any, Any], *, meta: BlockMeta) -> bytes:
        if self.scheme == "profile":
            x = self._rows(array, meta.dtype)
            return encode_profile(
                x,
                self.profile_for(x.shape[0], x.shape[3]),
                self.code_shift,
                zstd_level=self.zstd_level,
                fallback_scale=self.fallback_scale * self.step_scale / _DEFAULT_STEP_SCALE,
                sinks=self.sinks,
                deadzone=self.deadzone,
            )
        sym, step, scales, m = self.quantize_array(array, meta.dtype)
        sym_t = np.ascontiguousarray(sym.transpose(0, 1, 3, 2))  # (L, 2, C, T): one channel's tokens together
        table = b""
        if self.entropy == "raw":
            stream = sym_t.tobytes()
        elif self.entropy == "zstd":
            import zstandard

            stream = zstandard.ZstdCompressor(level=self.zstd_level).compress(sym_t.tobytes())
        else:
            table, stream = ans_encode(sym_t, m, self._static, self.table)
        return b"".join((_SUB.pack(len(table), len(stream)), step.tobytes(), scales, table, stream))

    @property
    def code_shift(self) -> int:
        """``step_scale`` in eighth-octave step-code units (profile scheme)."""
        return round(8 * math.log2(self.step_scale))

    def _n_scaled(self) -> int:
        return {"none": 0, "k": 1, "kv": 2}[self.channel_scale]

    def decode(self, payload: bytes | memoryview, *, meta: BlockMeta) -> np.ndarray[Any, Any]:
        if meta.dtype not in _KV_DTYPES or len(meta.shape) != 5 or meta.shape[1] != 2:
            raise DecodeError(f"cachegen: block meta {meta} is not a KV layout")
        L, _, T, H, D = meta.shape
        C = H * D
        view = memoryview(payload).cast("B")
        if self.scheme == "profile":
            return decode_profile(view, (L, 2, T, C), meta.dtype).reshape(meta.shape)
        n_steps = L * 2 * T * 2
        n_scaled = self._n_scaled()
        n_scales = L * n_scaled * C * 2
        if len(view) < _SUB.size:
            raise DecodeError("cachegen: payload truncated")
        table_len, stream_len = _SUB.unpack_from(view, 0)
        if len(view) != _SUB.size + n_steps + n_scales + table_len + stream_len:
            raise DecodeError("cachegen: payload length does not match its sections")
        pos = _SUB.size
        step = np.frombuffer(view[pos : pos + n_steps], np.float16).reshape(L, 2, T)
        pos += n_steps
        cs = np.frombuffer(view[pos : pos + n_scales], np.float16).reshape(L, n_scaled, C)
        pos += n_scales
        table = view[pos : pos + table_len]
        stream = view[pos + table_len :]
        m = self.half_ranges(L)
        if self.entropy == "raw":
            if len(stream) != L * 2 * C * T or table_len:
                raise DecodeError("cachegen: raw symbol section has the wrong size")
            sym_t = np.frombuffer(stream, np.uint8).reshape(L, 2, C, T)
        elif self.entropy == "zstd":
            import zstandard

            try:
                data = zstandard.ZstdDecompressor().decompress(stream, max_output_size=L * 2 * C * T)
            except zstandard.ZstdError as exc:
                raise DecodeError(f"cachegen: corrupted zstd symbol stream ({exc})") from exc
            if len(data) != L * 2 * C * T:
                raise DecodeError("cachegen: symbol stream has the wrong size")
            sym_t = np.frombuffer(data, np.uint8).reshape(L, 2, C, T)
        else:
            sym_t = ans_decode(table, stream, m, (L, C, T), self._static, self.table)
        if (sym_t.reshape(L, 2, -1).max(axis=-1, initial=0) > 2 * m).any():
            raise DecodeError("cachegen: symbol out of range")
        sym = np.ascontiguousarray(sym_t.transpose(0, 1, 3, 2))  # uint8 transpose: 4x cheaper than on floats
        if meta.dtype == "float16" and self.anchor <= 1:
            return dequant_f16(sym, step, m, cs).reshape(meta.shape)
        x = dequantize(sym, step, m, self.anchor)
        if n_scaled:
            x[:, :n_scaled] *= cs.astype(np.float32)[:, :, None, :]
        return from_f32(x.reshape(meta.shape), meta.dtype)


def _number(params: Mapping[str, Any], key: str, default: Any) -> float:
    raw = params.get(key, default)
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw):
        raise ConfigError(f"codec.{key}", raw, "a finite number")
    return float(raw)


def _positive(params: Mapping[str, Any], key: str, default: Any) -> float:
    value = _number(params, key, default)
    if value <= 0:
        raise ConfigError(f"codec.{key}", value, "a positive number")
    return value


def _channel_power(params: Mapping[str, Any], preset: Mapping[str, Any]) -> float:
    raw = params.get("channel_power", preset.get("channel_power", 1.0))
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not 0.0 < float(raw) <= 1.0:
        raise ConfigError("codec.channel_power", raw, "a number in (0, 1]")
    return float(raw)


def int8_codec() -> CacheGenCodec:
    """The 8-bit reference: the same absmax quantizer with 256 bins (255 levels) everywhere, no entropy coding."""
    return CacheGenCodec(
        level=None, scheme="rowmax", key_bins=[256, 256], value_bins=[256, 256], anchor=0, entropy="raw"
    )
