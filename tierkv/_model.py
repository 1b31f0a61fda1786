"""Model-aware KV sizing: how many bytes the KV cache of a model takes.

:class:`ModelSpec` describes the attention geometry of a decoder-only model:
how many layers hold a KV cache, how the heads are grouped (MHA, GQA, MQA) or
compressed (MLA), which layers use a sliding window, and which layers hold no
KV at all (linear attention, Mamba). From it follow the layout of the KV
tensors tierkv accepts (:meth:`ModelSpec.kv_shape`), the bytes per token and
per block, the default block size, and the largest batch that fits a memory
budget.

:meth:`ModelSpec.from_hf_config` reads a Hugging Face ``config.json`` (already
parsed into a mapping); :meth:`ModelSpec.to_dict` / :meth:`ModelSpec.from_dict`
round-trip a spec through plain JSON/TOML values (used by config files and by
the canonical key scope).

Owns: :class:`ModelSpec` (its fields and their validation, the geometry, the
sizing methods, :meth:`ModelSpec.kv_digest`, the dict round trip and the
:meth:`ModelSpec.from_hf_config` entry point) and the vocabulary it is written
in (:data:`AttentionKind`, :data:`ATTENTION_KINDS`, :data:`LAYER_TYPES`). Reading
a Hugging Face config (aliases, the layer pattern, the forward-config JSON and
:data:`NON_KV_CONFIG_FIELDS`) belongs to :mod:`tierkv._hfconfig`; this module
re-exports :data:`NON_KV_CONFIG_FIELDS` and :func:`forward_config_json` from it.

May not touch: everything here is pure computation (no I/O, no torch), and
it imports nothing of tierkv but the error tree, the option helpers and
:mod:`tierkv._hfconfig`. Every problem with a configuration raises
:class:`~tierkv.ConfigError` naming the field, the value and what is allowed;
a bad argument to a method raises :class:`~tierkv.InputError`.

Conventions
-----------
* ``dtype_bytes`` is the size of one KV element (2 for FP16/BF16, 1 for FP8).
* Bytes per token per layer: ``2 * num_kv_heads * head_dim * dtype_bytes``
  (K and V) for MHA/GQA/MQA; ``(kv_lora_rank + qk_rope_head_dim) * dtype_bytes``
  for MLA (one compressed latent plus the decoupled RoPE key, shared by all heads).
* The MHA-equivalent of a layer is ``2 * num_attention_heads * head_dim *
  dtype_bytes``: what the same layer would store without grouping or
  compression. For MLA, ``head_dim`` is the per-head dimension *d_h* of the
  DeepSeek-V2 paper (``qk_nope_head_dim``, 128 for DeepSeek-V3), which gives
  DeepSeek-V3's 2 x 128 x 128 x 2 = 65,536 bytes against its 1,152 (57x).
* A sliding-window layer attends to at most ``sliding_window`` tokens, so an
  inference engine keeps at most that many tokens of it resident. tierkv itself
  stores the full layout given by :meth:`ModelSpec.kv_shape` (every KV layer
  for every token), so block sizes ignore windows; only the figures that take a
  ``context`` (resident memory of a running sequence) cap sliding layers.
* Tensor parallelism (``tp`` ranks): the sizing methods take ``tp`` and give
  the bytes *one rank* (one GPU) holds. MHA/GQA/MQA shard the K/V heads over
  the ranks, ``ceil(num_kv_heads / tp)`` per rank; with fewer KV heads than
  ranks every rank holds one replicated head. MLA's latent is not sharded: every
  rank holds the whole ``kv_lora_rank + qk_rope_head_dim`` latent.
* Units: every ``*_bytes`` argument and result is a count of bytes. ``30e9``
  (30 GB, decimal) and ``30 * 2**30`` (30 GiB, binary) differ by 7.4%, enough to
  move a batch size by one: DeepSeek-V3, n_max 4,096, TP 8, MHA-equivalent KV:
  ``max_batch(30 * 10**9, ...)`` is 14 (14.66), ``max_batch(30 * 2**30, ...)``
  is 15 (15.74); MLA-aware it is 104 (30e9 / (61 x 1,152 x 4,096) = 104.2).

Key scope
---------
:meth:`ModelSpec.kv_digest` is the model's part of the key scope: a SHA-256 of
every field that changes a KV byte, namely the geometry fields above (all but
``name``, which the scope holds on its own) and :attr:`ModelSpec.forward_config`,
the Hugging Face config fields that shape the forward pass. Which fields those
are (every field but :data:`NON_KV_CONFIG_FIELDS`, so that a field nobody
anticipated changes the keys rather than serving stale KV) is the rule of
:mod:`tierkv._hfconfig`, described there.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast, get_args

from ._hfconfig import NON_KV_CONFIG_FIELDS, canonical_layer_type, forward_config_json, read_hf_config
from ._options import reject_unknown
from .errors import ConfigError, InputError

__all__ = [
    "ATTENTION_KINDS",
    "AttentionKind",
    "KV_LAYER_TYPES",
    "LAYER_TYPES",
    "ModelSpec",
    "NON_KV_CONFIG_FIELDS",
    "NO_KV_LAYER_TYPES",
    "forward_config_json",
]

AttentionKind = Literal["mha", "gqa", "mqa", "mla"]
ATTENTION_KINDS: tuple[str, ...] = get_args(AttentionKind)

#: Layer types that hold a KV cache.
KV_LAYER_TYPES: tuple[str, ...] = ("full_attention", "sliding_attention")
#: Layer types that hold no KV cache (a fixed-size recurrent state instead).
NO_KV_LAYER_TYPES: tuple[str, ...] = ("linear_attention", "mamba")
#: Every layer type :class:`ModelSpec` accepts.
LAYER_TYPES: tuple[str, ...] = KV_LAYER_TYPES + NO_KV_LAYER_TYPES


def _check_tp(tp: object) -> int:
    return _check_count("tp", tp, 1)


_DEFAULT_BLOCK_TOKENS: dict[str, int] = {"mla": 512, "gqa": 128, "mqa": 128, "mha": 64}
_INT_FIELDS = ("num_layers", "num_attention_heads", "num_kv_heads", "head_dim")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_dtype_bytes(dtype_bytes: object) -> int:
    if not _is_int(dtype_bytes) or cast(int, dtype_bytes) < 1:
        raise InputError(f"dtype_bytes must be a positive int (bytes per KV element), got {dtype_bytes!r}")
    return cast(int, dtype_bytes)


def _check_count(what: str, value: object, minimum: int) -> int:
    if not _is_int(value) or cast(int, value) < minimum:
        raise InputError(f"{what} must be an int >= {minimum}, got {value!r}")
    return cast(int, value)


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Attention geometry of a decoder-only model, enough to size its KV cache.

    Fields:
        name: model name (part of the key scope; never parsed).
        num_layers: all decoder layers, including those that hold no KV.
        num_attention_heads: query heads.
        num_kv_heads: K/V heads; equals ``num_attention_heads`` for MHA, 1 for
            MQA, a proper divisor for GQA, and 1 for MLA (one shared latent).
        head_dim: per-head dimension of the attention heads (for MLA, the
            DeepSeek-V2 *d_h*, ``qk_nope_head_dim``: it only enters the
            MHA-equivalent; the stored width is :attr:`latent_dim`).
        attention: ``"mha"``, ``"gqa"``, ``"mqa"`` or ``"mla"``.
        kv_lora_rank, qk_rope_head_dim: MLA only (0 otherwise).
        layer_types: one entry per layer, from :data:`LAYER_TYPES`; empty means
            every layer is ``"full_attention"``. Canonical form: a spec whose
            layers are all full attention is stored with ``()``.
        sliding_window: window of the ``"sliding_attention"`` layers in tokens;
            required when there is one, ``None`` (canonical) otherwise.
        hidden_size: model width (0 when unknown).
        forward_config: canonical JSON of the configuration fields beyond the
            geometry that shape the forward pass and hence the KV bytes
            (``rope_theta``, ``rope_scaling``, ...; see the module docstring
            and :func:`forward_config_json`). Set by :meth:`from_hf_config`;
            ``""`` when the spec is given field by field (pass a table, e.g.
            ``{"rope_theta": 1e6}``, to :meth:`from_dict`). Part of
            :meth:`kv_digest`, never parsed otherwise.

    Raises:
        ConfigError: from ``__init__`` when a field is invalid or the fields
            contradict each other (e.g. ``attention="gqa"`` with as many KV heads
            as query heads); the error names the field.

    Instances are immutable, hashable and safe to share between tasks.
    """

    name: str
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    attention: AttentionKind
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    layer_types: tuple[str, ...] = ()
    sliding_window: int | None = None
    hidden_size: int = 0
    forward_config: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError("name", self.name, "a non-empty string")
        for f in _INT_FIELDS:
            v = getattr(self, f)
            if not _is_int(v) or v < 1:
                raise ConfigError(f, v, "a positive integer")
        for f in ("kv_lora_rank", "qk_rope_head_dim", "hidden_size"):
            v = getattr(self, f)
            if not _is_int(v) or v < 0:
                raise ConfigError(f, v, "a non-negative integer")
        if self.attention not in ATTENTION_KINDS:
            raise ConfigError("attention", self.attention, "one of " + ", ".join(map(repr, ATTENTION_KINDS)))
        self._check_heads()
        self._check_layers()
        fc = self.forward_config
        if not isinstance(fc, str):
            raise ConfigError("forward_config", fc, "canonical JSON of a table (use from_dict for a mapping)")
        if fc:
            try:
                parsed = json.loads(fc)
            except ValueError as exc:
                raise ConfigError("forward_config", fc, f"JSON of a table ({exc})") from exc
            if not isinstance(parsed, dict):
                raise ConfigError("forward_config", fc, "JSON of a table")
            object.__setattr__(self, "forward_config", forward_config_json(parsed))

    def _check_heads(self) -> None:
        h, kv = self.num_attention_heads, self.num_kv_heads
        if self.attention == "mla":
            if kv != 1:
                raise ConfigError("num_kv_heads", kv, "1 for MLA (one latent shared by all heads)")
            if self.kv_lora_rank < 1:
                raise ConfigError("kv_lora_rank", self.kv_lora_rank, "a positive integer for MLA")
            return
        if self.kv_lora_rank or self.qk_rope_head_dim:
            field = "kv_lora_rank" if self.kv_lora_rank else "qk_rope_head_dim"
            raise ConfigError(field, getattr(self, field), "0 unless attention is 'mla'")
        if kv > h or h % kv:
            raise ConfigError("num_kv_heads", kv, f"a divisor of num_attention_heads ({h})")
        expected: AttentionKind = "mha" if kv == h else "mqa" if kv == 1 else "gqa"
        if self.attention != expected:
            raise ConfigError("attention", self.attention, f"{expected!r} for {h} attention heads and {kv} KV heads")

    def _check_layers(self) -> None:
        lt = self.layer_types
        if isinstance(lt, str) or not isinstance(lt, Sequence):
            raise ConfigError("layer_types", lt, "a sequence of layer type names")
        norm = tuple(canonical_layer_type(t) if isinstance(t, str) else t for t in lt)
        if norm:
            if len(norm) != self.num_layers:
                raise ConfigError("layer_types", list(lt), f"exactly num_layers ({self.num_layers}) entries")
            for i, t in enumerate(norm):
                if t not in LAYER_TYPES:
                    raise ConfigError(f"layer_types[{i}]", t, "one of " + ", ".join(map(repr, LAYER_TYPES)))
            if not any(t in KV_LAYER_TYPES for t in norm):
                raise ConfigError("layer_types", list(lt), "at least one attention layer (a layer holding KV)")
            if all(t == "full_attention" for t in norm):
                norm = ()
        object.__setattr__(self, "layer_types", norm)
        sw = self.sliding_window
        if "sliding_attention" in norm:
            if not _is_int(sw) or cast(int, sw) < 1:
                raise ConfigError("sliding_window", sw, "a positive integer (there are sliding_attention layers)")
        elif sw is not None:
            if not _is_int(sw) or sw < 1:
                raise ConfigError("sliding_window", sw, "a positive integer or None")
            # No sliding layer: the window does not apply; keep the canonical form.
            object.__setattr__(self, "sliding_window", None)

    # ------------------------------------------------------------------ geometry

    def layer_type(self, index: int) -> str:
        """Type of layer ``index`` (``"full_attention"`` when ``layer_types`` is empty).

        Raises:
            InputError: ``index`` is not in ``[0, num_layers)``.
        """
        if not _is_int(index) or not 0 <= index < self.num_layers:
            raise InputError(f"layer index must be an int in [0, {self.num_layers}), got {index!r}")
        return self.layer_types[index] if self.layer_types else "full_attention"

    @property
    def kv_layers(self) -> int:
        """Number of layers that hold a KV cache (full and sliding attention).

        Linear-attention and Mamba layers keep a fixed-size state instead and
        are not counted.
        """
        if not self.layer_types:
            return self.num_layers
        return sum(1 for t in self.layer_types if t in KV_LAYER_TYPES)

    @property
    def sliding_layers(self) -> int:
        """Number of ``"sliding_attention"`` layers."""
        return sum(1 for t in self.layer_types if t == "sliding_attention")

    @property
    def latent_dim(self) -> int:
        """MLA: width of the cached latent, ``kv_lora_rank + qk_rope_head_dim``; 0 otherwise."""
        return self.kv_lora_rank + self.qk_rope_head_dim if self.attention == "mla" else 0

    def kv_shape(self, tokens: int) -> tuple[int, ...]:
        """Shape of the KV tensor tierkv accepts for ``tokens`` tokens.

        MHA/GQA/MQA: ``(kv_layers, 2, tokens, num_kv_heads, head_dim)`` with
        K at index 0 and V at index 1 of the second axis. MLA:
        ``(kv_layers, tokens, latent_dim)``. Only KV layers appear, in model
        order; sliding-window layers carry every token like full layers.

        Raises:
            InputError: ``tokens`` is not an int >= 0.
        """
        n = _check_count("tokens", tokens, 0)
        if self.attention == "mla":
            return (self.kv_layers, n, self.latent_dim)
        return (self.kv_layers, 2, n, self.num_kv_heads, self.head_dim)

    # ------------------------------------------------------------------ sizes

    def kv_heads_per_rank(self, tp: int = 1) -> int:
        """K/V heads one of ``tp`` tensor-parallel ranks holds.

        MHA/GQA/MQA: ``ceil(num_kv_heads / tp)``; the heads are sharded, and
        with fewer KV heads than ranks each rank holds one replicated head
        (Llama-3.1-70B, 8 KV heads: 1 per rank at TP 8 and at TP 16). MLA: 1,
        the latent (one "head" of :attr:`latent_dim`) replicated on every rank.

        Raises:
            InputError: ``tp`` is not an int >= 1.
        """
        t = _check_tp(tp)
        return 1 if self.attention == "mla" else -(-self.num_kv_heads // t)

    def bytes_per_token_per_layer(self, dtype_bytes: int = 2, *, tp: int = 1) -> int:
        """KV bytes one token takes in one KV layer (on one of ``tp`` ranks).

        ``2 * kv_heads_per_rank(tp) * head_dim * dtype_bytes`` (``num_kv_heads``
        at ``tp=1``), or for MLA ``latent_dim * dtype_bytes`` whatever ``tp``.

        Raises:
            InputError: ``dtype_bytes`` is not a positive int or ``tp`` not an int >= 1.
        """
        d = _check_dtype_bytes(dtype_bytes)
        if self.attention == "mla":
            _check_tp(tp)
            return self.latent_dim * d
        return 2 * self.kv_heads_per_rank(tp) * self.head_dim * d

    def mha_equivalent_bytes_per_token_per_layer(self, dtype_bytes: int = 2, *, tp: int = 1) -> int:
        """What one token would take in one layer with plain MHA, on one of ``tp`` ranks.

        ``2 * ceil(num_attention_heads / tp) * head_dim * dtype_bytes`` (the
        heads of plain MHA are sharded like KV heads). The ratio to
        :meth:`bytes_per_token_per_layer` is the saving of GQA/MQA
        (``num_attention_heads / num_kv_heads`` at ``tp=1``) or MLA.

        Raises:
            InputError: ``dtype_bytes`` is not a positive int or ``tp`` not an int >= 1.
        """
        heads = -(-self.num_attention_heads // _check_tp(tp))
        return 2 * heads * self.head_dim * _check_dtype_bytes(dtype_bytes)

    def bytes_per_sequence(
        self, tokens: int, dtype_bytes: int = 2, *, tp: int = 1, mha_equivalent: bool = False
    ) -> int:
        """Resident KV bytes of one sequence of ``tokens`` tokens, over all layers.

        Full-attention layers hold every token; sliding-window layers hold at
        most ``sliding_window`` tokens; linear-attention/Mamba layers hold no KV.
        That is ``sum over KV layers l of min(tokens, window_l) *
        bytes_per_token_per_layer``. With ``tp``: what one of ``tp``
        tensor-parallel ranks holds (see :meth:`kv_heads_per_rank`); with
        ``mha_equivalent=True``: what plain MHA would hold
        (:meth:`mha_equivalent_bytes_per_token_per_layer`).

        Raises:
            InputError: ``tokens`` is not an int >= 0, ``dtype_bytes`` is
                invalid, or ``tp`` is not an int >= 1.
        """
        n = _check_count("tokens", tokens, 0)
        per = (
            self.mha_equivalent_bytes_per_token_per_layer(dtype_bytes, tp=tp)
            if mha_equivalent
            else self.bytes_per_token_per_layer(dtype_bytes, tp=tp)
        )
        sliding = self.sliding_layers
        full = self.kv_layers - sliding
        capped = min(n, self.sliding_window) if sliding and self.sliding_window is not None else n
        return (full * n + sliding * capped) * per

    def bytes_per_token(self, dtype_bytes: int = 2, *, context: int | None = None) -> int:
        """KV bytes of one token over the whole model.

        Without ``context``: ``kv_layers * bytes_per_token_per_layer`` — what
        tierkv stores per token (the :meth:`kv_shape` layout). With
        ``context``: the average resident bytes per token of a sequence of
        ``context`` tokens, where sliding-window layers cap at their window,
        i.e. ``ceil(bytes_per_sequence(context) / context)``; equal to the
        plain figure when there is no sliding layer or ``context <=
        sliding_window``.

        Raises:
            InputError: ``context`` is not an int >= 1, or ``dtype_bytes`` is invalid.
        """
        if context is None:
            return self.kv_layers * self.bytes_per_token_per_layer(dtype_bytes)
        n = _check_count("context", context, 1)
        return -(-self.bytes_per_sequence(n, dtype_bytes) // n)

    def bytes_per_block(self, block_tokens: int, dtype_bytes: int = 2) -> int:
        """Bytes of one stored block of ``block_tokens`` tokens: ``block_tokens * bytes_per_token(dtype_bytes)``.

        This is the payload size of the :meth:`kv_shape` layout for
        ``block_tokens`` tokens (windows do not shrink stored blocks).

        Raises:
            InputError: ``block_tokens`` is not an int >= 1, or ``dtype_bytes`` is invalid.
        """
        n = _check_count("block_tokens", block_tokens, 1)
        return n * self.bytes_per_token(dtype_bytes)

    def default_block_tokens(self) -> int:
        """Default block size in tokens by architecture: MLA 512, GQA/MQA 128, MHA 64.

        Smaller KV per token gets longer blocks so that a block stays large
        enough for efficient transfers. The core's ``block_tokens`` option
        overrides it.
        """
        return _DEFAULT_BLOCK_TOKENS[self.attention]

    def max_batch(
        self, memory_bytes: int, n_max: int, dtype_bytes: int = 2, *, tp: int = 1, mha_equivalent: bool = False
    ) -> int:
        """Largest number of concurrent sequences of ``n_max`` tokens whose KV fits ``memory_bytes`` per GPU.

        ``B* = floor(M / (L x B(n_max)))`` where ``M = memory_bytes`` is the
        KV budget of *one* GPU in bytes, ``L`` is the number of KV layers and
        ``B(n_max)`` the bytes one layer holds on one GPU for one sequence of
        ``n_max`` tokens (``n_max * bytes_per_token_per_layer(tp=tp)``; capped
        at the window for sliding layers). In general the denominator is
        :meth:`bytes_per_sequence` ``(n_max, tp=tp)``: the resident KV of one
        sequence of ``n_max`` tokens over all layers on one rank. Returns 0
        when not even one sequence fits. Weights, activations and allocator
        overhead are not counted: pass the memory left for the KV cache.

        ``tp``: the tensor-parallel degree. The sequences run on all ``tp``
        ranks at once, each rank holding its shard of every sequence: MHA/GQA
        KV heads are split ``ceil(num_kv_heads / tp)`` per rank (a replica of
        one head each when there are fewer KV heads than ranks); MLA's latent
        is replicated, so TP does not raise an MLA model's batch.
        ``mha_equivalent=True`` sizes the same model as if it stored plain MHA
        K/V (``num_attention_heads`` heads, sharded the same way).

        Units: ``memory_bytes`` is a count of bytes; mind decimal against
        binary units. DeepSeek-V3, ``n_max`` 4,096, ``tp`` 8: MLA-aware
        ``max_batch(30 * 10**9, 4096, tp=8)`` = 104 (30e9 / (61 x 1,152 x
        4,096) = 104.2); MHA-equivalent (16 of 128 heads per rank, 8,192 bytes
        per token per layer) 14 with ``30 * 10**9`` bytes (14.66) and 15 with
        30 GiB ``30 * 2**30`` (15.74).

        Raises:
            InputError: ``memory_bytes`` is not an int >= 0, ``n_max`` not an
                int >= 1, ``dtype_bytes`` is invalid, or ``tp`` not an int >= 1.
        """
        m = _check_count("memory_bytes", memory_bytes, 0)
        n = _check_count("n_max", n_max, 1)
        return m // self.bytes_per_sequence(n, dtype_bytes, tp=tp, mha_equivalent=mha_equivalent)

    def kv_digest(self) -> str:
        """Hex SHA-256 of every field that changes a KV byte: the model's part of the key scope.

        Covers ``num_layers``, ``num_attention_heads``, ``num_kv_heads``,
        ``head_dim``, ``attention``, ``kv_lora_rank``, ``qk_rope_head_dim``,
        ``layer_types``, ``sliding_window``, ``hidden_size`` and
        :attr:`forward_config` (``rope_theta``, ``rope_scaling``, ...; see the
        module docstring). ``name`` is left out: the scope carries the model
        name itself. Equal specs give equal digests; a spec that differs in any
        of these fields gives a different one (and so every block key differs).
        """
        d = self.to_dict()
        del d["name"]
        d["forward_config"] = json.loads(self.forward_config) if self.forward_config else {}
        raw = json.dumps(d, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        return hashlib.sha256(b"tierkv.model\x00" + raw.encode("utf-8")).hexdigest()

    # ------------------------------------------------------------------ (de)serialisation

    def to_dict(self) -> dict[str, Any]:
        """All fields as plain JSON/TOML values (``layer_types`` as a list; ``sliding_window`` may be None).

        ``ModelSpec.from_dict(spec.to_dict()) == spec`` always holds, and two
        equal specs give equal dicts (the canonical form used in key scopes).
        """
        d: dict[str, Any] = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["layer_types"] = list(self.layer_types)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, prefix: str = "") -> ModelSpec:
        """Build a spec from a mapping with the field names of :class:`ModelSpec`.

        ``name``, ``num_layers``, ``num_attention_heads``, ``head_dim`` and
        ``attention`` are required; ``num_kv_heads`` defaults to
        ``num_attention_heads`` (MHA) or 1 (MLA); the rest have the dataclass
        defaults. ``prefix`` (e.g. ``"model"``) is put before field names in errors.

        Raises:
            ConfigError: unknown, missing or invalid field (named, with ``prefix``).
        """

        def name(key: str) -> str:
            return f"{prefix}.{key}" if prefix else key

        if not isinstance(d, Mapping):
            raise ConfigError(prefix or "model", d, "a table/mapping of ModelSpec fields")
        known = {f.name for f in dataclasses.fields(cls)}
        reject_unknown(d, known, prefix=prefix)
        for key in ("name", "num_layers", "num_attention_heads", "head_dim", "attention"):
            if key not in d:
                raise ConfigError(name(key), None, "a value (required)")
        kwargs = dict(d)
        if "num_kv_heads" not in kwargs:
            kwargs["num_kv_heads"] = 1 if kwargs["attention"] == "mla" else kwargs["num_attention_heads"]
        lt = kwargs.get("layer_types", ())
        if isinstance(lt, str) or not isinstance(lt, Sequence) or not all(isinstance(t, str) for t in lt):
            raise ConfigError(name("layer_types"), lt, "a list of layer type names")
        kwargs["layer_types"] = tuple(lt)
        fc = kwargs.get("forward_config", "")
        if isinstance(fc, Mapping):
            try:
                kwargs["forward_config"] = forward_config_json(fc)
            except ConfigError as exc:
                raise ConfigError(name(f"forward_config.{exc.field}"), exc.value, exc.allowed) from exc
        try:
            return cls(**kwargs)
        except ConfigError as exc:
            raise ConfigError(name(exc.field), exc.value, exc.allowed) from exc

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any], *, name: str | None = None) -> ModelSpec:
        """Build a spec from a parsed Hugging Face ``config.json``.

        Fields read (with the usual aliases): ``num_hidden_layers``,
        ``num_attention_heads``, ``num_key_value_heads`` (absent or null: MHA),
        ``head_dim`` (absent or null: ``hidden_size // num_attention_heads``),
        ``hidden_size``. A nested ``text_config`` (multimodal models such as
        Qwen3.5) is used when present.

        Detection:

        * MLA when ``kv_lora_rank`` and ``qk_rope_head_dim`` are set (DeepSeek
          V2/V3, Kimi K2); ``head_dim`` is then ``qk_nope_head_dim`` (else
          ``v_head_dim``), the per-head *d_h* of the MHA-equivalent.
        * Otherwise MHA (KV heads == heads), MQA (1 KV head) or GQA.
        * Per-layer types, first that applies: an explicit ``layer_types``
          list (gpt-oss, Qwen3-Next/3.5, Gemma 3; legacy ``"attention"`` is read
          as ``"full_attention"``); ``full_attention_interval`` k (every k-th
          layer full attention, the others linear attention — Qwen3-Next);
          ``attn_layer_period``/``attn_layer_offset`` (Jamba: layer i is
          attention when ``i % period == offset``, else Mamba);
          ``sliding_window_pattern`` p with a ``sliding_window`` (Gemma 3:
          every p-th layer full, the others sliding); a ``sliding_window`` with
          ``use_sliding_window`` not false (Mistral: all layers sliding; Qwen2
          with ``max_window_layers`` m: layers >= m sliding). Else all full.

        ``name``: the spec's name; defaults to ``_name_or_path`` then
        ``model_type`` of the config.

        :attr:`forward_config` keeps the KV-relevant rest of the language
        model's config (``text_config`` when present, like the geometry): all
        but :data:`NON_KV_CONFIG_FIELDS` (see :func:`forward_config_json`).

        Raises:
            ConfigError: a required field is missing or a field is invalid; the
                error names the Hugging Face field (``text_config.`` prefixed
                when read from there).
        """
        return read_hf_config(config, name=name, build=cls)
