"""The ``profile`` scheme of the cachegen codec: sensitivity-weighted fixed steps, sink rows, fast zstd decode.

Quantizer. Every (layer, K/V, channel) group ``g`` gets one step for all the
tokens of a block, ``step_g = 2 ** (code_g / 8)`` (eighth-octave codes, int16).
The encoder derives the codes from a *sensitivity profile*: relative steps
``w_g = F_g ** -0.5`` from the diagonal Fisher information ``F_g`` of the
model's next-token distributions with respect to that KV channel (measured
once per model, see :mod:`tierkv.codecs._profiles`), times the level's
``step_scale``. This is reverse water-filling: the expected KL of a small
perturbation is ``~ 1/2 sum_g F_g step_g**2 / 12``, so equal ``F_g step_g**2``
spends the bits where the model is sensitive. A code is raised where the
block's absmax of the group would not fit ``[-127, 127]`` steps. Without a
profile for the KV's shape the steps follow the block's per-(layer, K/V) RMS
(``fallback_scale``; untuned).

Sink rows. Tokens whose key rows are much smaller than the block's median in
most layers (the attention sink: the first token of a sequence has ~10^4
times the sensitivity of a typical token) are detected and stored as 8-bit
absmax rows (255 levels, float16 step per row); their slots in the main
symbol stream hold the channel's centre symbol.

Entropy coding. Per group the median symbol is subtracted (mod 256), the
groups are sorted by their mean absolute centred symbol, and the channel-major
symbol bytes go through zstd (by default with parameters tuned for such
near-noise symbols, :data:`TUNED`: nearly all literals, Huffman-coded, within
a few percent of zstd level 19 and of a per-channel static entropy model, at
hundreds of MB/s both ways; any level 1-22 may be chosen instead). Side
information (codes, centres, sort keys, sink rows) is zstd-compressed
separately.

Decode builds a float16 table of ``(v - 128) * step`` for each distinct code
between the block's least and greatest code and gathers it by ``(code - least) * 256 + symbol`` one layer at a
time: no float32 array of the block, no float32->float16 cast, no Python loop
over tokens or channels.

Payload (little-endian)::

    u8 scheme version (2)   u8 mode   u16 sink count n   u32 side length   u32 stream length
    mode 1 only: 8-byte digest of the profile (:mod:`tierkv.codecs._profiles`)
    side   = zstd(codes int16[G] (mode 1: minus the profile's codes) | centres uint8[G]
                  | mode 0 only: sort keys uint8[G]
                  | sink tokens uint16[n] | sink steps float16[n, L, 2] | sink symbols uint8[n, L, 2, C])
    stream = zstd(symbols - centre + 128 (mod 256) as uint8[G, T], groups in the profile's order (mode 1)
                  or by sort key (mode 0))

with ``G = L * 2 * C``. Mode 0 (no profile for the KV's shape) is self-contained; mode 1 needs the named
profile registered in the reader (built-in profiles always are), else DecodeError. Every length is checked.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from ..errors import CodecError, DecodeError
from ._floats import from_f32
from ._profiles import Profile, profile_by_digest

__all__ = [
    "SCHEME_VERSION",
    "decode_profile",
    "dequantize_profile",
    "detect_sinks",
    "encode_profile",
    "quantize_profile",
]

SCHEME_VERSION = 2
_HEAD = struct.Struct("<BBHII")
_CODE_MIN, _CODE_MAX = -640, 640  # steps 2**-80 .. 2**80 (float32 range)
_SINK_RATIO = 0.6
_SINK_FRACTION = 0.5


def detect_sinks(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Token indices of attention-sink-like rows of ``x`` (L, 2, T, C) float32.

    A token is a sink when its key row norm is below 0.6x the block's median key row norm in at least
    half of the layers after the first (needs >= 8 tokens and >= 2 layers).
    """
    L, _, T, _ = x.shape
    if T < 8 or L < 2:
        return np.zeros(0, np.int64)
    norms = np.sqrt(np.einsum("ltc,ltc->lt", x[1:, 0], x[1:, 0]))  # (L-1, T)
    med = np.median(norms, axis=1, keepdims=True)
    score = (norms < _SINK_RATIO * med).mean(axis=0)
    return np.flatnonzero(score >= _SINK_FRACTION)


def _codes_for(
    x: np.ndarray[Any, Any], base: np.ndarray[Any, Any] | None, shift: int, fallback_scale: float
) -> np.ndarray[Any, Any]:
    """int16 step codes (L, 2, C): the profile's codes + shift, raised so the absmax fits 127 steps."""
    L, _, _, C = x.shape
    absmax = np.abs(x).max(axis=2) if x.shape[2] else np.zeros((L, 2, C), np.float32)
    if not np.isfinite(absmax).all():
        raise CodecError("cachegen: the KV holds non-finite values (nan or inf)")
    if base is None:
        rms = np.sqrt(np.mean(np.square(x, dtype=np.float64), axis=(2, 3)))  # (L, 2)
        with np.errstate(divide="ignore"):
            want = np.log2(np.maximum(rms * fallback_scale, 1e-30)) * 8
        codes = np.broadcast_to(np.floor(want)[:, :, None], (L, 2, C)).astype(np.float64)
    else:
        codes = base.astype(np.float64) + shift
    with np.errstate(divide="ignore"):
        need = np.ceil(np.log2(np.maximum(absmax.astype(np.float64), 1e-38) / 127.0) * 8)
    codes = np.maximum(codes, need)
    # the clamp must hold after float32 rounding of the step
    codes = np.clip(codes, _CODE_MIN, _CODE_MAX).astype(np.int16)
    step = np.exp2(codes.astype(np.float32) / np.float32(8))
    over = absmax / step > 127.0
    codes[over] += 1
    result: np.ndarray[Any, Any] = codes
    return result


def _steps(codes: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    steps: np.ndarray[Any, Any] = np.exp2(codes.astype(np.float32) / np.float32(8))
    return steps


def quantize_profile(
    x: np.ndarray[Any, Any],
    base: np.ndarray[Any, Any] | None,
    shift: int,
    *,
    fallback_scale: float = 0.5,
    sinks: bool = True,
    deadzone: float = 0.0,
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Quantize ``x`` (L, 2, T, C) float32: (symbols int16 in [-127, 127], codes int16 (L, 2, C), sink tokens).

    ``deadzone`` in [0, 0.5) widens the zero bin: ``|x| / step < 0.5 + deadzone`` maps to 0 (fewer bits,
    slightly more error on small values); other values round to nearest.
    """
    sink_idx = detect_sinks(x) if sinks else np.zeros(0, np.int64)
    codes = _codes_for(x, base, shift, fallback_scale)
    q = x / _steps(codes)[:, :, None, :]
    small = np.abs(q) < 0.5 + deadzone if deadzone > 0 else None
    np.rint(q, out=q)
    if small is not None:
        q[small] = 0.0
    np.clip(q, -127, 127, out=q)
    return q.astype(np.int16), codes, sink_idx


def dequantize_profile(sym: np.ndarray[Any, Any], codes: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """float32 reconstruction of symbols (L, 2, T, C) with codes (L, 2, C) (sink rows not applied)."""
    out: np.ndarray[Any, Any] = sym.astype(np.float32) * _steps(codes)[:, :, None, :]
    return out


def _sink_rows(rows: np.ndarray[Any, Any]) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """8-bit absmax rows: rows (n, L, 2, C) float32 -> (steps float16 (n, L, 2), symbols uint8 in [0, 254])."""
    absmax = np.abs(rows).max(axis=-1) if rows.shape[-1] else np.zeros(rows.shape[:-1], np.float32)
    with np.errstate(over="ignore"):
        step = (absmax / 127.0).astype(np.float16)
    if not np.isfinite(step).all():
        raise CodecError("cachegen: a KV row's absmax is too large for a float16 step")
    step[step == 0] = 1.0
    q = np.rint(rows / step.astype(np.float32)[..., None])
    np.clip(q, -127, 127, out=q)
    return step, (q + 127).astype(np.uint8)


def _sink_values(step: np.ndarray[Any, Any], sym: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    return (sym.astype(np.float32) - 127.0) * step.astype(np.float32)[..., None]


#: ``zstd_level`` 0: parameters tuned for centred quantization symbols, which are close to
#: noise: a fast strategy with tiny match tables and a minimum match of 7, so nearly every
#: byte is a Huffman-coded literal over 128 KiB blocks. Measured on SmolLM2 KV (level 2):
#: 0.96x the size of zstd level 19's output at ~80x its encode speed and the same decode speed
#: (level 19's optimal parser mostly avoids unprofitable matches; these tables avoid finding
#: them). A standard zstd frame: any decoder reads it.
TUNED = 0


def _compressor(zstd_level: int) -> Any:
    import zstandard

    if zstd_level != TUNED:
        return zstandard.ZstdCompressor(level=zstd_level)
    params = zstandard.ZstdCompressionParameters(
        window_log=17,
        hash_log=6,
        chain_log=6,
        search_log=1,
        min_match=7,
        strategy=zstandard.STRATEGY_FAST,
    )
    return zstandard.ZstdCompressor(compression_params=params)


def encode_profile(
    x: np.ndarray[Any, Any],
    profile: Profile | None,
    shift: int,
    *,
    zstd_level: int = TUNED,
    fallback_scale: float = 0.5,
    sinks: bool = True,
    deadzone: float = 0.0,
) -> bytes:
    """Encode ``x`` (L, 2, T, C) float32 into a profile-scheme payload (see the module docstring)."""
    L, _, T, C = x.shape
    G = L * 2 * C
    base = profile.codes if profile is not None else None
    sym, codes, sink_idx = quantize_profile(
        x, base, shift, fallback_scale=fallback_scale, sinks=sinks, deadzone=deadzone
    )
    sym_t = sym.transpose(0, 1, 3, 2).reshape(G, T)  # channel-major: a group's tokens together
    centre = np.rint(np.median(sym_t, axis=1)).astype(np.int16) if T else np.zeros(G, np.int16)
    dev = sym_t - centre[:, None]
    if len(sink_idx):
        dev[:, sink_idx] = 0
        sink_step, sink_sym = _sink_rows(np.ascontiguousarray(x[:, :, sink_idx].transpose(2, 0, 1, 3)))
    else:
        sink_step, sink_sym = np.zeros((0, L, 2), np.float16), np.zeros((0, L, 2, C), np.uint8)
    if profile is not None:
        order = profile.order
        parts = [(codes.astype(np.int32) - base).astype("<i2").tobytes()]  # type: ignore[operator]
        digest = profile.digest
    else:
        mad = np.abs(dev).mean(axis=1) if T else np.zeros(G)
        key = np.minimum(np.rint(mad * 16), 255).astype(np.uint8)
        order = np.argsort(key, kind="stable")
        parts = [codes.astype("<i2").tobytes()]
        digest = b""
    parts.append((centre & 0xFF).astype(np.uint8).tobytes())
    if profile is None:
        parts.append(key.tobytes())
    parts += [sink_idx.astype("<u2").tobytes(), sink_step.astype("<f2").tobytes(), sink_sym.tobytes()]
    body = ((dev[order] + 128) & 0xFF).astype(np.uint8)
    zc = _compressor(zstd_level)
    side_z = zc.compress(b"".join(parts))
    stream = zc.compress(body.tobytes())
    head = _HEAD.pack(SCHEME_VERSION, 1 if profile is not None else 0, len(sink_idx), len(side_z), len(stream))
    return b"".join((head, digest, side_z, stream))


def _lut(codes: np.ndarray[Any, Any], dtype: Any) -> np.ndarray[Any, Any]:
    """Reconstruction table: row i holds ``(v - 128) * step(codes[i])`` for v in 0..255, in ``dtype``."""
    levels = np.arange(256, dtype=np.float32) - np.float32(128)
    table = levels[None, :] * _steps(codes)[:, None]
    flat: np.ndarray[Any, Any] = table.astype(dtype).reshape(-1)
    return flat


def decode_profile(payload: memoryview, shape: tuple[int, int, int, int], dtype: str) -> np.ndarray[Any, Any]:
    """Decode a profile-scheme payload into (L, 2, T, C) of ``dtype`` (float16, bfloat16 bits, float32)."""
    import zstandard

    L, _, T, C = shape
    G = L * 2 * C
    if len(payload) < _HEAD.size:
        raise DecodeError("cachegen: payload truncated")
    version, mode, n_sinks, side_len, stream_len = _HEAD.unpack_from(payload, 0)
    if version != SCHEME_VERSION:
        raise DecodeError(f"cachegen: unknown profile scheme version {version} (this tierkv reads {SCHEME_VERSION})")
    if mode not in (0, 1):
        raise DecodeError(f"cachegen: unknown profile payload mode {mode}")
    pos = _HEAD.size
    profile: Profile | None = None
    if mode == 1:
        if len(payload) < pos + 8:
            raise DecodeError("cachegen: payload truncated")
        digest = bytes(payload[pos : pos + 8])
        profile = profile_by_digest(digest)
        if profile is None:
            raise DecodeError(f"cachegen: block needs sensitivity profile {digest.hex()}, not registered here")
        if profile.codes.shape != (L, 2, C):
            raise DecodeError(f"cachegen: profile {profile.name} is for {profile.codes.shape}, block is {(L, 2, C)}")
        pos += 8
    if len(payload) != pos + side_len + stream_len:
        raise DecodeError("cachegen: payload length does not match its sections")
    if n_sinks > T:
        raise DecodeError("cachegen: more sink rows than tokens")
    side_size = G * (3 if mode == 1 else 4) + n_sinks * (2 + L * 2 * 2 + L * 2 * C)
    dz = zstandard.ZstdDecompressor()
    try:
        side = dz.decompress(payload[pos : pos + side_len], max_output_size=side_size)
        body = dz.decompress(payload[pos + side_len :], max_output_size=G * T)
    except zstandard.ZstdError as exc:
        raise DecodeError(f"cachegen: corrupted zstd section ({exc})") from exc
    if len(side) != side_size or len(body) != G * T:
        raise DecodeError("cachegen: a section decompresses to the wrong size")
    codes = np.frombuffer(side, "<i2", G, 0).astype(np.int32)
    pos = 2 * G
    centre = np.frombuffer(side, np.uint8, G, pos)
    pos += G
    if profile is not None:
        codes += profile.codes.reshape(-1)
        order: np.ndarray[Any, Any] = profile.order
    else:
        order = np.argsort(np.frombuffer(side, np.uint8, G, pos), kind="stable")
        pos += G
    sink_idx = np.frombuffer(side, "<u2", n_sinks, pos).astype(np.intp)
    pos += 2 * n_sinks
    sink_step = np.frombuffer(side, "<f2", n_sinks * L * 2, pos).reshape(n_sinks, L, 2)
    pos += 2 * n_sinks * L * 2
    sink_sym = np.frombuffer(side, np.uint8, n_sinks * L * 2 * C, pos).reshape(n_sinks, L, 2, C)
    if codes.size and (codes.min() < _CODE_MIN or codes.max() > _CODE_MAX):
        raise DecodeError("cachegen: step code out of range")
    if n_sinks and (sink_idx.max() >= T or (sink_sym > 254).any() or not np.isfinite(sink_step).all()):
        raise DecodeError("cachegen: bad sink rows")
    sym = np.empty((G, T), np.uint8)
    sym[order] = np.frombuffer(body, np.uint8).reshape(G, T)
    sym += centre[:, None]  # mod 256: (s - centre + 128) + centre = s + 128
    lo = int(codes.min()) if codes.size else 0
    hi = int(codes.max()) if codes.size else 0
    base = ((codes.astype(np.intp) - lo) * 256).reshape(L, 2, 1, C)
    out_dtype = np.float16 if dtype == "float16" else np.float32
    with np.errstate(over="ignore"):
        lut = _lut(np.arange(lo, hi + 1, dtype=np.int32), out_dtype)
    if out_dtype == np.float16:
        out = np.empty((L, 2, T, C), out_dtype)
        sym4 = sym.reshape(L, 2, C, T)
        idx = np.empty((2, T, C), np.intp)
        for layer in range(L):  # one layer at a time: the index array stays in cache
            np.add(sym4[layer].transpose(0, 2, 1), base[layer], out=idx)
            np.take(lut, idx, out=out[layer], mode="clip")  # indices are in range by construction
    else:
        out = lut[np.add(sym.reshape(L, 2, C, T).transpose(0, 1, 3, 2), base)]
    if n_sinks:
        out[:, :, sink_idx] = _sink_values(sink_step, sink_sym).transpose(1, 2, 0, 3)
    if dtype == "float16" or dtype == "float32":
        return out
    return from_f32(out, dtype)
