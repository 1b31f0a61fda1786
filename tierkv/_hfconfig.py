"""Reading a Hugging Face ``config.json`` (already parsed into a mapping) for :class:`~tierkv.ModelSpec`.

Owns:

* the layer-type vocabulary of Hugging Face configs and its canonical form
  (:func:`canonical_layer_type`: the legacy ``"attention"`` reads as
  ``"full_attention"``);
* :data:`NON_KV_CONFIG_FIELDS` and the detection of RoPE scaling;
* the canonical forward-config JSON (:func:`forward_config_json`), the
  :attr:`ModelSpec.forward_config <tierkv.ModelSpec.forward_config>` part of
  the key scope;
* :func:`read_hf_config`, the parsing behind
  :meth:`ModelSpec.from_hf_config <tierkv.ModelSpec.from_hf_config>`, and its
  :class:`_HFReader` helper (typed fields of one config, aliases, the layer
  pattern).

May not touch: this module is pure computation (no I/O, no torch, no
transformers) and never imports :mod:`tierkv._model`: it reads fields and
names Hugging Face fields in errors, and the spec's constructor, handed in by
the caller, validates the geometry as a whole. Every problem with a
configuration raises :class:`~tierkv.ConfigError` naming the Hugging Face
field (``text_config.`` prefixed when read from a nested ``text_config``).

Forward config
--------------
:attr:`ModelSpec.forward_config <tierkv.ModelSpec.forward_config>` holds the
Hugging Face config fields that shape the forward pass (hence the K and V of
every layer after the first): ``rope_theta``, ``rope_scaling``,
``partial_rotary_factor``, ``sliding_window``, ``rms_norm_eps``,
``hidden_act``, ``attention_bias``, the MoE routing fields, ``torch_dtype``,
... . The rule is conservative: *every* field of the config is kept except
those listed in :data:`NON_KV_CONFIG_FIELDS` (identity, token ids, generation
defaults, training-only fields, output switches, vocabulary size, tied
embeddings) and ``max_position_embeddings`` unless RoPE scaling is configured;
keys starting with ``_`` are dropped as well, and ``null`` reads as absent.
A field nobody anticipated therefore changes the keys (a cache miss) rather
than serving stale KV.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from .errors import ConfigError

__all__ = ["NON_KV_CONFIG_FIELDS", "canonical_layer_type", "forward_config_json", "read_hf_config"]

_T = TypeVar("_T")

# Legacy spellings found in Hugging Face configs.
_LAYER_TYPE_ALIASES: dict[str, str] = {"attention": "full_attention"}


def canonical_layer_type(t: str) -> str:
    """The canonical name of a layer type (``"attention"`` is ``"full_attention"``); others unchanged."""
    return _LAYER_TYPE_ALIASES.get(t) or t


#: Hugging Face config fields that never change a KV byte (identity, token ids,
#: generation defaults, training-only switches, outputs, vocabulary size, tied
#: embeddings): they are left out of :attr:`~tierkv.ModelSpec.forward_config`. Every other
#: field is kept. ``max_position_embeddings`` is kept only when RoPE scaling is
#: configured (``rope_scaling``, or a non-default ``rope_parameters.rope_type``),
#: where it enters the scaled frequencies.
NON_KV_CONFIG_FIELDS: frozenset[str] = frozenset(
    {
        # identity and packaging
        "architectures",
        "auto_map",
        "transformers_version",
        "tokenizer_class",
        "name_or_path",
        "prefix",
        "finetuning_task",
        "task_specific_params",
        "id2label",
        "label2id",
        "num_labels",
        "problem_type",
        # token ids (what the prompt holds, not how it is processed)
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "sep_token_id",
        "decoder_start_token_id",
        "forced_bos_token_id",
        "forced_eos_token_id",
        "suppress_tokens",
        "begin_suppress_tokens",
        "bad_words_ids",
        # output switches and generation defaults
        "use_cache",
        "output_attentions",
        "output_hidden_states",
        "output_router_logits",
        "output_scores",
        "return_dict",
        "use_return_dict",
        "return_dict_in_generate",
        "torchscript",
        "max_length",
        "min_length",
        "do_sample",
        "early_stopping",
        "num_beams",
        "num_beam_groups",
        "diversity_penalty",
        "temperature",
        "top_k",
        "top_p",
        "typical_p",
        "repetition_penalty",
        "length_penalty",
        "no_repeat_ngram_size",
        "encoder_no_repeat_ngram_size",
        "num_return_sequences",
        "remove_invalid_values",
        "exponential_decay_length_penalty",
        "chunk_size_feed_forward",
        # training only (no effect at inference)
        "initializer_range",
        "initializer_factor",
        "attention_dropout",
        "hidden_dropout",
        "hidden_dropout_prob",
        "attention_probs_dropout_prob",
        "classifier_dropout",
        "embd_pdrop",
        "resid_pdrop",
        "attn_pdrop",
        "dropout",
        "router_aux_loss_coef",
        "aux_loss_alpha",
        "seq_aux",
        "gradient_checkpointing",
        # the embedding table's size and the LM head (no KV depends on them)
        "vocab_size",
        "tie_word_embeddings",
        "max_position_embeddings",
    }
)


#: Hugging Face fields the geometry is read from (:meth:`~tierkv.ModelSpec.from_hf_config`).
#: They enter :meth:`~tierkv.ModelSpec.kv_digest` through the canonical geometry fields, so
#: two spellings of one model (``layer_types`` listed or given by
#: ``full_attention_interval``; ``head_dim`` given or derived) digest alike.
_GEOMETRY_HF_FIELDS: frozenset[str] = frozenset(
    {
        "num_hidden_layers",
        "n_layer",
        "num_layers",
        "num_attention_heads",
        "n_head",
        "num_key_value_heads",
        "num_kv_heads",
        "head_dim",
        "hidden_size",
        "n_embd",
        "d_model",
        "kv_lora_rank",
        "qk_rope_head_dim",
        "layer_types",
        "full_attention_interval",
        "attn_layer_period",
        "attn_layer_offset",
        "sliding_window",
        "sliding_window_pattern",
        "use_sliding_window",
        "max_window_layers",
    }
)


def _rope_scaled(cfg: Mapping[str, Any]) -> bool:
    rs = cfg.get("rope_scaling")
    if isinstance(rs, Mapping) and rs:
        return True
    rp = cfg.get("rope_parameters")
    if isinstance(rp, Mapping):
        kind = rp.get("rope_type", rp.get("type"))
        return kind not in (None, "default")
    return False


def _canonical_value(value: Any, field: str, *, config_level: bool) -> Any:
    """Plain JSON form of a config value (see :attr:`~tierkv.ModelSpec.forward_config`)."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ConfigError(field, value, "a finite number")
        return int(value) if value.is_integer() and abs(value) < 2**63 else value
    if isinstance(value, Mapping):
        return _canonical_table(value, field, config_level=config_level)
    if isinstance(value, (list, tuple)):
        return [_canonical_value(v, f"{field}[{i}]", config_level=False) for i, v in enumerate(value)]
    raise ConfigError(field, value, "a JSON value (string, number, bool, list or table)")


def _canonical_table(
    cfg: Mapping[str, Any], prefix: str, *, config_level: bool, skip: frozenset[str] = frozenset()
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    scaled = config_level and _rope_scaled(cfg)
    for key, value in cfg.items():
        if not isinstance(key, str):
            raise ConfigError(prefix or "forward_config", key, "string keys")
        if value is None:
            continue
        if config_level:
            if key.startswith("_") or key in skip:
                continue
            if key in NON_KV_CONFIG_FIELDS and not (scaled and key == "max_position_embeddings"):
                continue
        field = f"{prefix}.{key}" if prefix else key
        # a nested sub-model config (text_config, vision_config, ...) follows the same rule
        out[key] = _canonical_value(value, field, config_level=config_level and key.endswith("_config"))
    return out


def forward_config_json(config: Mapping[str, Any], *, geometry: bool = False) -> str:
    """Canonical JSON (sorted keys, no whitespace) of the KV-relevant fields of a Hugging Face config.

    Keeps every field except :data:`NON_KV_CONFIG_FIELDS`, keys starting with
    ``_`` and ``null`` values (``max_position_embeddings`` stays when RoPE
    scaling is configured); applies the same rule inside nested ``*_config``
    tables; writes integral floats as integers (``500000.0`` and ``500000``
    are the same value). Returns ``""`` when nothing is left. With
    ``geometry=True`` (what :meth:`~tierkv.ModelSpec.from_hf_config` passes) the
    fields the geometry is read from (layer counts, heads, ``head_dim``,
    ``hidden_size``, the MLA ranks, the layer pattern and ``sliding_window``)
    are left out too: the geometry fields of the spec hold them canonically.

    Raises:
        ConfigError: a value is not plain JSON (or a non-finite number).
    """
    skip = _GEOMETRY_HF_FIELDS if geometry else frozenset()
    table = _canonical_table(config, "", config_level=True, skip=skip)
    if not table:
        return ""
    return json.dumps(table, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


#: ModelSpec fields whose Hugging Face name differs (for errors raised by the spec's constructor).
_HF_FIELD = {"num_layers": "num_hidden_layers", "num_kv_heads": "num_key_value_heads"}


def read_hf_config(config: Mapping[str, Any], *, name: str | None, build: Callable[..., _T]) -> _T:
    """Read a parsed Hugging Face ``config.json`` and call ``build`` with the ModelSpec fields.

    The parsing behind :meth:`ModelSpec.from_hf_config
    <tierkv.ModelSpec.from_hf_config>` (which documents the fields read and
    the detection rules); ``build`` is the spec's constructor, called with
    keyword arguments named like the :class:`~tierkv.ModelSpec` fields. A
    :class:`~tierkv.ConfigError` that ``build`` raises about a spec field is
    raised again naming the Hugging Face field it was read from.

    Raises:
        ConfigError: a required field is missing or a field is invalid; the
            error names the Hugging Face field (``text_config.`` prefixed
            when read from there).
    """
    if not isinstance(config, Mapping):
        raise ConfigError("config", config, "a mapping (a parsed config.json)")
    cfg: Mapping[str, Any] = config
    pre = ""
    tc = config.get("text_config")
    if tc is not None:
        if not isinstance(tc, Mapping):
            raise ConfigError("text_config", tc, "a mapping of the language model's config")
        cfg, pre = tc, "text_config."
    reader = _HFReader(cfg, pre)

    if name is None:
        for src in (config, cfg):
            for key in ("_name_or_path", "model_type"):
                v = src.get(key)
                if isinstance(v, str) and v:
                    name = v
                    break
            if name is not None:
                break
    if not isinstance(name, str) or not name:
        raise ConfigError("name", name, "pass name=, or a config with '_name_or_path' or 'model_type'")

    num_layers = reader.req_int(("num_hidden_layers", "n_layer", "num_layers"))
    heads = reader.req_int(("num_attention_heads", "n_head"))
    hidden = reader.opt_int(("hidden_size", "n_embd", "d_model"), minimum=1) or 0

    mla_rank = reader.opt_int(("kv_lora_rank",), minimum=1)
    rope = reader.opt_int(("qk_rope_head_dim",), minimum=0)
    if mla_rank is not None or rope is not None:
        if mla_rank is None:
            raise ConfigError(pre + "kv_lora_rank", cfg.get("kv_lora_rank"), "a positive integer (MLA)")
        if rope is None:
            raise ConfigError(pre + "qk_rope_head_dim", cfg.get("qk_rope_head_dim"), "an integer >= 0 (MLA)")
        attention, kv_heads = "mla", 1
        head_dim = reader.opt_int(("qk_nope_head_dim", "v_head_dim"), minimum=1)
        if head_dim is None:
            head_dim = reader.head_dim(heads, hidden)
    else:
        mla_rank, rope = 0, 0
        kv = reader.opt_int(("num_key_value_heads", "num_kv_heads"), minimum=1)
        kv_heads = heads if kv is None else kv
        if kv_heads > heads or heads % kv_heads:
            raise ConfigError(pre + reader.last_key, kv_heads, f"a divisor of num_attention_heads ({heads})")
        attention = "mha" if kv_heads == heads else "mqa" if kv_heads == 1 else "gqa"
        head_dim = reader.head_dim(heads, hidden)

    layer_types, window = reader.layer_types(num_layers)
    forward = forward_config_json(cfg, geometry=True)  # the language model's config (text_config when nested)
    try:
        return build(
            name=name,
            num_layers=num_layers,
            num_attention_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            attention=attention,
            kv_lora_rank=mla_rank,
            qk_rope_head_dim=rope,
            layer_types=layer_types,
            sliding_window=window,
            hidden_size=hidden,
            forward_config=forward,
        )
    except ConfigError as exc:
        hf = _HF_FIELD.get(exc.field, exc.field)
        raise ConfigError(pre + hf, exc.value, exc.allowed) from exc


class _HFReader:
    """Reads typed fields of one Hugging Face config mapping; errors name ``prefix + key``."""

    def __init__(self, cfg: Mapping[str, Any], prefix: str) -> None:
        self.cfg = cfg
        self.prefix = prefix
        self.last_key = ""

    def _find(self, keys: tuple[str, ...]) -> tuple[str, Any]:
        for k in keys:
            if k in self.cfg and self.cfg[k] is not None:
                return k, self.cfg[k]
        return keys[0], None

    def opt_int(self, keys: tuple[str, ...], *, minimum: int) -> int | None:
        key, v = self._find(keys)
        self.last_key = key
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise ConfigError(self.prefix + key, v, f"an integer >= {minimum}")
        return v

    def req_int(self, keys: tuple[str, ...]) -> int:
        v = self.opt_int(keys, minimum=1)
        if v is None:
            raise ConfigError(self.prefix + keys[0], self.cfg.get(keys[0]), "a positive integer (required)")
        return v

    def head_dim(self, heads: int, hidden: int) -> int:
        hd = self.opt_int(("head_dim",), minimum=1)
        if hd is not None:
            return hd
        if hidden <= 0:
            raise ConfigError(self.prefix + "head_dim", None, "a positive integer, or a hidden_size to derive it from")
        if hidden % heads:
            raise ConfigError(
                self.prefix + "head_dim",
                None,
                f"a positive integer (hidden_size {hidden} is not divisible by num_attention_heads {heads})",
            )
        return hidden // heads

    def layer_types(self, n: int) -> tuple[tuple[str, ...], int | None]:
        cfg, p = self.cfg, self.prefix
        window = self.opt_int(("sliding_window",), minimum=1)
        raw = cfg.get("layer_types")
        if raw is not None:
            if isinstance(raw, str) or not isinstance(raw, Sequence) or not all(isinstance(t, str) for t in raw):
                raise ConfigError(p + "layer_types", raw, "a list of layer type names")
            types = tuple(canonical_layer_type(t) for t in raw)
            return types, window if "sliding_attention" in types else None
        interval = self.opt_int(("full_attention_interval",), minimum=1)
        if interval is not None:
            return tuple("full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n)), None
        period = self.opt_int(("attn_layer_period",), minimum=1)
        if period is not None:
            offset = self.opt_int(("attn_layer_offset",), minimum=0)
            if offset is None or offset >= period:
                raise ConfigError(p + "attn_layer_offset", cfg.get("attn_layer_offset"), f"an integer in [0, {period})")
            return tuple("full_attention" if i % period == offset else "mamba" for i in range(n)), None
        if window is None:
            return (), None
        pattern = self.opt_int(("sliding_window_pattern",), minimum=1)
        if pattern is not None:
            return tuple("full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(n)), window
        use = cfg.get("use_sliding_window")
        if use is not None and not isinstance(use, bool):
            raise ConfigError(p + "use_sliding_window", use, "true or false")
        if use is False:
            return (), None
        first = 0
        if use is True:
            mwl = self.opt_int(("max_window_layers",), minimum=0)
            first = 0 if mwl is None else mwl
        return tuple("sliding_attention" if i >= first else "full_attention" for i in range(n)), window
