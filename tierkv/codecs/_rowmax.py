"""The ``rowmax`` scheme of the cachegen codec: per-token absmax quantizer, static models, rANS kernels.

Owns the scheme's level presets (:data:`ROWMAX_LEVELS`), its quantizer (:func:`quantize` /
:func:`dequantize` and the fast float16 decode :func:`dequant_f16`), the calibrated probability tables
(:class:`StaticModel` and the process-wide registry :func:`register_static_model` /
:func:`get_static_model`) and the rANS kernels (:func:`ans_encode` / :func:`ans_decode`). May not touch:
the codec plugin (its parameters, their validation, the payload's sections and the ``raw``/``zstd``
entropy coders live in :mod:`tierkv.codecs._cachegen`, which imports this module; this module imports
nothing from it, nor from the ``profile`` scheme, :mod:`tierkv.codecs._profile`), the block format or
any I/O but :meth:`StaticModel.save` / :meth:`StaticModel.load`.

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
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ..errors import CodecError, ConfigError, DecodeError, InputError
from ._base import ParamValue

__all__ = [
    "ROWMAX_LEVELS",
    "RowmaxQuantizer",
    "StaticModel",
    "ans_decode",
    "ans_encode",
    "dequant_f16",
    "dequantize",
    "get_static_model",
    "quantize",
    "register_static_model",
]

#: Presets of the ``rowmax`` scheme (the codec before profile steps; blocks written with it still decode).
#: Presets of the ``rowmax`` scheme (the codec before profile steps; blocks written with it still decode).
ROWMAX_LEVELS: Mapping[int, Mapping[str, ParamValue]] = {
    1: {"key_bins": [64, 32], "value_bins": [64, 32], "anchor": 0, "channel_scale": "k", "channel_power": 1.0},
    2: {"key_bins": [32, 16], "value_bins": [32, 16], "anchor": 0, "channel_scale": "k", "channel_power": 0.5},
    3: {"key_bins": [32, 16], "value_bins": [32, 16], "anchor": 0, "channel_scale": "none", "channel_power": 1.0},
    4: {"key_bins": [16, 8], "value_bins": [16, 8], "anchor": 0, "channel_scale": "none", "channel_power": 1.0},
}


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


class RowmaxQuantizer(Protocol):
    """What :meth:`StaticModel.calibrate` needs of a codec (:class:`~tierkv.codecs.CacheGenCodec` is one)."""

    @property
    def quantizer_params(self) -> Mapping[str, ParamValue]: ...

    def quantize_array(
        self, array: np.ndarray[Any, Any], dtype: str
    ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], bytes, np.ndarray[Any, Any]]: ...


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
        cls, samples: Iterable[np.ndarray[Any, Any]], codec: RowmaxQuantizer, *, dtype: str = "float16"
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


# ----------------------------------------------------------------------------- rANS


def ans_encode(
    sym_t: np.ndarray[Any, Any], m: np.ndarray[Any, Any], static: StaticModel | None, table_id: str
) -> tuple[bytes, bytes]:
    """rANS-code ``sym_t`` (L, 2, C, T) uint8 with half-ranges ``m`` (L, 2): (model table bytes, stream bytes).

    With ``static`` (the registered model named ``table_id``) the table is empty; otherwise it is the
    chunk's uint8-quantized counts, zstd-compressed. Raises CodecError for a static model of another shape.
    """
    import constriction
    import zstandard

    L, _, C, T = sym_t.shape
    alphabet = int(2 * m.max() + 1)
    flat = sym_t.reshape(-1, T).astype(np.int32)
    sizes = np.repeat((2 * m + 1).reshape(-1), C)
    if static is not None:
        if static.counts.shape[:3] != (L, 2, C):
            raise CodecError(f"cachegen: static model {table_id} is for {static.counts.shape[:3]}, KV is {(L, 2, C)}")
        models = static.models()
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


def ans_decode(
    table: memoryview,
    stream: memoryview,
    m: np.ndarray[Any, Any],
    dims: tuple[int, int, int],
    static: StaticModel | None,
    table_id: str,
) -> np.ndarray[Any, Any]:
    """Inverse of :func:`ans_encode`: symbols (L, 2, C, T) uint8 for ``dims`` = (L, C, T); raises DecodeError."""
    import constriction
    import zstandard

    L, C, T = dims
    alphabet = int(2 * m.max() + 1)
    groups = L * 2 * C
    sizes = np.repeat((2 * m + 1).reshape(-1), C)
    out = np.empty((groups, T), np.int32)
    if static is not None:
        if static.counts.shape[:3] != (L, 2, C) or len(table):
            raise DecodeError(f"cachegen: static model {table_id} does not fit this block")
        models = static.models()
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


def dequant_f16(
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
