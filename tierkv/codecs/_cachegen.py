"""CacheGen-style lossy KV codec (after Liu et al., SIGCOMM'24) and the int8 reference quantizer.

Input: a KV array of layout ``(layers, 2, tokens, kv_heads, head_dim)`` in
float16, bfloat16 (``uint16`` bit patterns, ``dtype="bfloat16"``) or float32.

Two schemes, named in the block's params (``scheme``):

* ``"profile"`` (the default, levels :data:`LEVELS` 1-3): one step per
  (layer, K/V, channel) from a measured sensitivity profile, attention-sink rows
  in 8 bits, zstd over centred, profile-ordered symbols, table-driven float16
  decode. See :mod:`tierkv.codecs._profile`.
* ``"rowmax"`` (the first scheme, levels :data:`ROWMAX_LEVELS` 1-4), described
  below. Blocks without a ``scheme`` field were written by it and still decode.

Rowmax quantization: every (layer, K/V, token) row of ``kv_heads * head_dim``
channels is scaled by its absolute maximum and rounded to ``2M + 1`` levels,
``M = (bins - 1) // 2`` (32 bins -> 31 levels, 16 -> 15, 256 -> 255 as in int8
absmax). The step ``absmax / M`` is stored as float16 per row; an all-zero row
gets step 1 ("clamped"), so it decodes to zeros. Bin counts are grouped by
layer: keys use ``key_bins[0]`` in the first ``key_hi_layers`` layers
(``"third"``: ``layers // 3``) and ``key_bins[1]`` after; values likewise with
``value_bins`` / ``value_hi_layers``. Defaults follow CacheGen's released code
(keys 32 bins in the first third then 16; values 32 in the first 2 layers then
16).

Anchor/delta mode (``anchor=G`` > 0): tokens are grouped by ``G``; the first
token of a group (the anchor) is quantized as above, the others as the delta
to the *reconstructed* anchor (so errors do not accumulate).

Entropy coding of the symbols, one probability model per (layer, K/V,
channel) — the symbols of one channel over the tokens of a chunk:

* ``entropy="ans"``: rANS (``constriction``'s AnsCoder, categorical models).
  ``table="chunk"`` stores the model with the block (uint8-quantized counts,
  zstd-compressed; a channel with a single symbol costs no stream bits);
  ``table=<id>`` uses a calibrated :class:`StaticModel` registered in this
  process (see :func:`register_static_model`), so short chunks do not pay for
  a table.
* ``entropy="zstd"``: zstd over the channel-major symbol bytes: faster, larger.
* ``entropy="raw"``: one byte per symbol (used by the int8 reference).

Rowmax levels (presets; every field may be overridden):

========  ==============================  ===================  ======  ======================
level     key bins (hi/lo)                value bins (hi/lo)   anchor  key channel scale
========  ==============================  ===================  ======  ======================
1         64 / 32 (first third / rest)    64 / 32 (2 / rest)   off     k, absmax^1
2 (def.)  32 / 16                         32 / 16              off     k, absmax^0.5
3         32 / 16 (CacheGen defaults)     32 / 16              off     none (plain CacheGen)
4         16 / 8                          16 / 8               off     none
========  ==============================  ===================  ======  ======================

``channel_scale="k"`` (or ``"kv"``) first divides every key (and value)
channel by ``absmax ** channel_power``, its absmax over the block's tokens
(stored as float16 per layer and channel) raised to ``channel_power`` in
(0, 1], before the per-token quantization. Power 1 equalizes the channels
(KIVI-style per-channel keys: the best quality, more bits); power 0.5 is the
geometric middle between per-token (outlier channels keep fine absolute
steps, the attention logits depend on them most) and per-channel scaling.
"""

from __future__ import annotations

import hashlib
import io
import math
import struct
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import numpy as np

from .._errors import CodecError, ConfigError, DecodeError, InputError
from .._options import opt_choice, opt_int, reject_unknown
from ._base import BlockMeta, Codec, ParamValue
from ._floats import from_f32, to_f32
from ._profile import decode_profile, encode_profile
from ._profiles import Profile, find_profile, get_profile

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

#: Presets of the ``rowmax`` scheme (the codec before profile steps; blocks written with it still decode).
ROWMAX_LEVELS: Mapping[int, Mapping[str, ParamValue]] = {
    1: {"key_bins": [64, 32], "value_bins": [64, 32], "anchor": 0, "channel_scale": "k", "channel_power": 1.0},
    2: {"key_bins": [32, 16], "value_bins": [32, 16], "anchor": 0, "channel_scale": "k", "channel_power": 0.5},
    3: {"key_bins": [32, 16], "value_bins": [32, 16], "anchor": 0, "channel_scale": "none", "channel_power": 1.0},
    4: {"key_bins": [16, 8], "value_bins": [16, 8], "anchor": 0, "channel_scale": "none", "channel_power": 1.0},
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


# ----------------------------------------------------------------------------- quantizer


def _quant_rows(x: np.ndarray[Any, Any], mf: np.ndarray[Any, Any]) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """x (L,2,T,C) float32, mf (L,2) float32 -> symbols uint8 (L,2,T,C), steps float16 (L,2,T)."""
    absmax = np.abs(x).max(axis=-1) if x.shape[-1] else np.zeros(x.shape[:-1], np.float32)
    if not np.isfinite(absmax).all():
        raise CodecError("cachegen: the KV holds non-finite values (nan or inf)")
    with np.errstate(over="ignore"):
        step = (absmax / mf[:, :, None]).astype(np.float16)
    if not np.isfinite(step).all():
        raise CodecError("cachegen: a KV row's absmax is too large for a float16 step")
    step[step == 0] = 1.0  # zero (or underflowing) rows: clamp the step, they decode to 0
    q = x / step.astype(np.float32)[..., None]
    np.rint(q, out=q)
    m = mf[:, :, None, None]
    np.clip(q, -m, m, out=q)
    q += m
    return q.astype(np.uint8), step


def _dequant_rows(
    sym: np.ndarray[Any, Any], step: np.ndarray[Any, Any], mf: np.ndarray[Any, Any]
) -> np.ndarray[Any, Any]:
    x = sym.astype(np.float32)
    x -= mf[:, :, None, None]
    x *= step.astype(np.float32)[..., None]
    return x


def quantize(
    x: np.ndarray[Any, Any], m: np.ndarray[Any, Any], anchor: int = 0
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Quantize ``x`` (L, 2, T, C) float32 with ``m`` (L, 2) half-ranges.

    Returns symbols (uint8 in ``[0, 2m]``, same shape) and float16 steps
    (L, 2, T). With ``anchor=G`` tokens ``t % G != 0`` are coded as deltas to
    the reconstructed anchor ``t - t % G``. Raises CodecError for non-finite input.
    """
    mf = m.astype(np.float32)
    if anchor <= 1 or x.shape[2] <= 1:
        return _quant_rows(x, mf)
    sa, stepa = _quant_rows(np.ascontiguousarray(x[:, :, ::anchor]), mf)
    ref = np.repeat(_dequant_rows(sa, stepa, mf), anchor, axis=2)[:, :, : x.shape[2]]
    ref[:, :, ::anchor] = 0.0
    return _quant_rows(x - ref, mf)


def dequantize(
    sym: np.ndarray[Any, Any], step: np.ndarray[Any, Any], m: np.ndarray[Any, Any], anchor: int = 0
) -> np.ndarray[Any, Any]:
    """Inverse of :func:`quantize` (up to the quantization error); float32 (L, 2, T, C)."""
    mf = m.astype(np.float32)
    x = _dequant_rows(sym, step, mf)
    if anchor > 1 and x.shape[2] > 1:
        ref = np.repeat(x[:, :, ::anchor], anchor, axis=2)[:, :, : x.shape[2]]
        ref[:, :, ::anchor] = 0.0
        x += ref
    return x


# ----------------------------------------------------------------------------- static models

_STATIC: dict[str, StaticModel] = {}
_STATIC_LOCK = threading.Lock()


@dataclass(frozen=True, slots=True, eq=False)
class StaticModel:
    """A calibrated probability table per (layer, K/V, channel), stored once instead of per chunk.

    ``counts`` has shape (layers, 2, channels, alphabet), uint16, every entry
    >= 1 (so any symbol stays encodable). ``quantizer`` holds the quantizer
    params it was calibrated with (bins, layer split, anchor); a codec using
    the model must have the same ones. ``id`` is a content hash.
    """

    counts: np.ndarray[Any, Any]
    quantizer: Mapping[str, ParamValue]
    id: str = ""
    _models: list[Any] = field(default_factory=list, repr=False)

    @classmethod
    def create(cls, counts: np.ndarray[Any, Any], quantizer: Mapping[str, ParamValue]) -> StaticModel:
        counts = np.ascontiguousarray(counts, dtype=np.uint16)
        if counts.ndim != 4 or counts.shape[1] != 2 or (counts.size and counts.min() < 1):
            raise InputError("static model counts must be (layers, 2, channels, alphabet) with entries >= 1")
        h = hashlib.sha256(repr(sorted(dict(quantizer).items())).encode())
        h.update(repr(counts.shape).encode())
        h.update(counts.tobytes())
        return cls(counts=counts, quantizer=dict(quantizer), id="sm-" + h.hexdigest()[:16])

    @classmethod
    def calibrate(
        cls, samples: Iterable[np.ndarray[Any, Any]], codec: CacheGenCodec, *, dtype: str = "float16"
    ) -> StaticModel:
        """Count symbols of ``codec``'s quantizer over sample KV arrays (same layer count and channels)."""
        total: np.ndarray[Any, Any] | None = None
        for sample in samples:
            sym, _, _, m = codec.quantize_array(sample, dtype)
            a = int(2 * m.max() + 1)
            c = _channel_counts(np.ascontiguousarray(sym.transpose(0, 1, 3, 2)), a)
            total = c if total is None else total + c
        if total is None:
            raise InputError("calibration needs at least one sample")
        scaled = np.ceil((total + 1) * (65535.0 / (total.max(axis=-1, keepdims=True) + 1)))
        return cls.create(np.minimum(scaled, 65535).astype(np.uint16), codec.quantizer_params)

    def models(self) -> list[Any]:
        """constriction categorical models, one per (layer, K/V, channel), built once (thread-safe)."""
        if not self._models:
            import constriction

            cat = constriction.stream.model.Categorical
            flat = self.counts.reshape(-1, self.counts.shape[-1]).astype(np.float64)
            built = [cat(row, perfect=False) for row in flat]
            with _STATIC_LOCK:
                if not self._models:
                    self._models.extend(built)
        return self._models

    def save(self, path: str | Path) -> None:
        """Write the model to ``path`` (npz); blocking I/O."""
        import json

        with open(path, "wb") as f:
            np.savez(
                f, counts=self.counts, quantizer=np.frombuffer(json.dumps(dict(self.quantizer)).encode(), np.uint8)
            )

    @classmethod
    def load(cls, path: str | Path) -> StaticModel:
        """Read a model written by :meth:`save`; raises InputError for a file that is not one."""
        import json

        try:
            with np.load(io.BytesIO(Path(path).read_bytes())) as z:
                return cls.create(z["counts"], json.loads(bytes(z["quantizer"]).decode()))
        except (OSError, ValueError, KeyError) as exc:
            raise InputError(f"not a static codec model: {path}: {exc}") from exc


def register_static_model(model: StaticModel) -> str:
    """Make ``model`` available to codecs (and to :func:`decode_block`) in this process; returns its id."""
    with _STATIC_LOCK:
        _STATIC[model.id] = model
    return model.id


def get_static_model(model_id: str) -> StaticModel:
    """The registered model with that id; raises ConfigError when none is registered."""
    with _STATIC_LOCK:
        model = _STATIC.get(model_id)
    if model is None:
        raise ConfigError(
            "codec.table", model_id, "'chunk' or the id of a model registered with register_static_model()"
        )
    return model


def _channel_counts(sym_t: np.ndarray[Any, Any], alphabet: int) -> np.ndarray[Any, Any]:
    """Histogram of symbols per (layer, K/V, channel); sym_t is (L, 2, C, T) uint8."""
    L, _, C, T = sym_t.shape
    groups = L * 2 * C
    idx = sym_t.reshape(groups, T).astype(np.int64)
    idx += (np.arange(groups, dtype=np.int64) * alphabet)[:, None]
    return np.bincount(idx.ravel(), minlength=groups * alphabet).reshape(L, 2, C, alphabet)


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
            table, stream = self._ans_encode(sym_t, m)
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
            sym_t = self._ans_decode(table, stream, m, (L, C, T))
        if (sym_t.reshape(L, 2, -1).max(axis=-1, initial=0) > 2 * m).any():
            raise DecodeError("cachegen: symbol out of range")
        sym = np.ascontiguousarray(sym_t.transpose(0, 1, 3, 2))  # uint8 transpose: 4x cheaper than on floats
        if meta.dtype == "float16" and self.anchor <= 1:
            return _dequant_f16(sym, step, m, cs).reshape(meta.shape)
        x = dequantize(sym, step, m, self.anchor)
        if n_scaled:
            x[:, :n_scaled] *= cs.astype(np.float32)[:, :, None, :]
        return from_f32(x.reshape(meta.shape), meta.dtype)

    # -- rANS

    def _ans_encode(self, sym_t: np.ndarray[Any, Any], m: np.ndarray[Any, Any]) -> tuple[bytes, bytes]:
        import constriction
        import zstandard

        L, _, C, T = sym_t.shape
        alphabet = int(2 * m.max() + 1)
        flat = sym_t.reshape(-1, T).astype(np.int32)
        sizes = np.repeat((2 * m + 1).reshape(-1), C)
        if self._static is not None:
            if self._static.counts.shape[:3] != (L, 2, C):
                raise CodecError(
                    f"cachegen: static model {self.table} is for {self._static.counts.shape[:3]}, KV is {(L, 2, C)}"
                )
            models = self._static.models()
            table = b""
            active: list[int] = list(range(flat.shape[0]))
        else:
            counts = _channel_counts(sym_t, alphabet).reshape(-1, alphabet)
            top = counts.max(axis=-1, keepdims=True)
            q8 = np.minimum(np.ceil(counts * (255.0 / np.maximum(top, 1))), 255).astype(np.uint8)
            table = zstandard.ZstdCompressor(level=3).compress(q8.tobytes())
            models, active = _chunk_models(q8, sizes)
        coder = constriction.stream.stack.AnsCoder()
        for g in reversed(active):
            coder.encode_reverse(flat[g], models[g])
        return table, coder.get_compressed().tobytes()

    def _ans_decode(
        self, table: memoryview, stream: memoryview, m: np.ndarray[Any, Any], dims: tuple[int, int, int]
    ) -> np.ndarray[Any, Any]:
        import constriction
        import zstandard

        L, C, T = dims
        alphabet = int(2 * m.max() + 1)
        groups = L * 2 * C
        sizes = np.repeat((2 * m + 1).reshape(-1), C)
        out = np.empty((groups, T), np.int32)
        if self._static is not None:
            if self._static.counts.shape[:3] != (L, 2, C) or len(table):
                raise DecodeError(f"cachegen: static model {self.table} does not fit this block")
            models = self._static.models()
            active: Iterable[int] = range(groups)
        else:
            try:
                raw = zstandard.ZstdDecompressor().decompress(table, max_output_size=groups * alphabet)
            except zstandard.ZstdError as exc:
                raise DecodeError(f"cachegen: corrupted model table ({exc})") from exc
            if len(raw) != groups * alphabet:
                raise DecodeError("cachegen: model table has the wrong size")
            q8 = np.frombuffer(raw, np.uint8).reshape(groups, alphabet)
            models, active = _chunk_models(q8, sizes)
            out[:] = q8.argmax(axis=-1)[:, None]  # single-symbol channels carry no stream bits
        if len(stream) % 4:
            raise DecodeError("cachegen: rANS stream is not whole 32-bit words")
        try:
            decoder = constriction.stream.stack.AnsCoder(np.frombuffer(stream, np.uint32).copy())
            for g in active:
                out[g] = decoder.decode(models[g], T)
        except Exception as exc:
            raise DecodeError(f"cachegen: corrupted rANS stream ({exc})") from exc
        return out.astype(np.uint8).reshape(L, 2, C, T)


def _chunk_models(q8: np.ndarray[Any, Any], sizes: np.ndarray[Any, Any]) -> tuple[list[Any], list[int]]:
    import constriction

    cat = constriction.stream.model.Categorical
    nonzero = (q8 > 0).sum(axis=-1)
    active = np.flatnonzero(nonzero > 1).tolist()
    models: list[Any] = [None] * q8.shape[0]
    rows = q8.astype(np.float64)
    for g in active:
        models[g] = cat(rows[g, : sizes[g]], perfect=False)
    return models, active


def _dequant_f16(
    sym: np.ndarray[Any, Any], step: np.ndarray[Any, Any], m: np.ndarray[Any, Any], cs: np.ndarray[Any, Any]
) -> np.ndarray[Any, Any]:
    """Fast float16 dequantization, bit-identical to ``from_f32(dequantize(...) * cs)``.

    Rows without channel scales go through a per-row float16 table of the ``2M+1`` reconstruction values
    (float32 product rounded once, exactly as the float32 path), gathered by symbol: no float32 array
    of the block is built and no float32->float16 cast of it (numpy's cast is the slowest step).
    Channel-scaled rows (``cs``: (L, n_scaled, C)) take the float32 path.
    """
    L, _, T, _ = sym.shape
    n_scaled = cs.shape[1]
    out = np.empty(sym.shape, np.float16)
    if n_scaled:
        x = dequantize(sym[:, :n_scaled], step[:, :n_scaled], m[:, :n_scaled])
        x *= cs.astype(np.float32)[:, :, None, :]
        out[:, :n_scaled] = x
    if n_scaled < 2:
        a = int(2 * m.max() + 1)
        sub_m = m[:, n_scaled:].astype(np.float32)  # (L, k)
        levels = np.arange(a, dtype=np.float32)[None, None, None, :] - sub_m[:, :, None, None]
        lut = (levels * step[:, n_scaled:].astype(np.float32)[..., None]).astype(np.float16)  # (L, k, T, a)
        rows = sym[:, n_scaled:].astype(np.intp)
        rows += (np.arange(rows.shape[0] * rows.shape[1] * T, dtype=np.intp) * a).reshape(L, -1, T, 1)
        out[:, n_scaled:] = lut.reshape(-1)[rows]
    return out


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
