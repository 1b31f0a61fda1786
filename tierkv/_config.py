"""Configuration: a dict, a TOML file, or a :class:`Config` object.

Example (TOML)::

    kv_dtype = "float16"
    block_tokens = 128            # optional; default by attention kind (MLA 512, GQA/MQA 128, MHA 64)
    load_failure = "recompute"    # or "fail"
    share_across_tenants = false

    [model]
    name = "meta-llama/Llama-3.1-8B-Instruct"
    revision = "0e9e39f"
    weights_fingerprint = "sha256:..."   # a digest of the weights, or an id you manage
    tokenizer_revision = "0e9e39f"
    lora_adapter = ""
    hf_config = { num_hidden_layers = 32, num_attention_heads = 32, num_key_value_heads = 8, hidden_size = 4096 }

    [[tiers]]
    name = "dram"
    backend = "dram"
    capacity = "16GiB"
    high_watermark = 0.9

    [[tiers]]
    name = "pfs"
    backend = "pfs"
    path = "/lustre/kv"
    capacity = "2TiB"

Tiers are listed fastest first. Every field is validated when the config is
built; a bad field raises :class:`~tierkv.ConfigError` naming the dotted field,
the value and what is allowed. Parsing is pure (reading a TOML path is the only
I/O, done by :meth:`Config.load`).
"""

from __future__ import annotations

import tomllib
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ._errors import ConfigError
from ._keys import Scope
from ._model import ModelSpec
from ._options import opt_bool, opt_choice, opt_float, opt_int, opt_str, reject_unknown

__all__ = ["KV_DTYPES", "Config", "TierConfig"]

#: Supported KV dtypes and their size in bytes. ``bfloat16`` arrives from numpy
#: callers as ``uint16`` bit patterns (numpy has no bfloat16).
KV_DTYPES: Mapping[str, int] = types.MappingProxyType(
    {"float16": 2, "bfloat16": 2, "float32": 4, "float8_e4m3fn": 1, "float8_e5m2": 1}
)

_TOP = frozenset(
    {
        "model",
        "kv_dtype",
        "block_tokens",
        "tiers",
        "world_size",
        "kv_rank",
        "object_group",
        "share_across_tenants",
        "load_failure",
        "scheduler",
        "codecs",
        "telemetry",
    }
)
_MODEL = frozenset(
    {"name", "revision", "weights_fingerprint", "tokenizer_revision", "lora_adapter", "hf_config", "spec"}
)
_TIER_CORE = frozenset({"name", "backend", "high_watermark", "low_watermark", "codec"})


@dataclass(frozen=True, slots=True)
class TierConfig:
    """One tier: which backend (entry-point name) with which options.

    ``high_watermark``/``low_watermark`` are fractions of capacity: past the
    high mark the least valuable blocks move down one tier until the low mark.
    """

    name: str
    backend: str
    options: Mapping[str, Any] = field(default_factory=lambda: types.MappingProxyType({}))
    high_watermark: float = 0.9
    low_watermark: float = 0.8
    codec: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Config:
    """A validated tierkv configuration (build with :meth:`from_dict` or :meth:`load`)."""

    model: ModelSpec
    tiers: tuple[TierConfig, ...]
    model_name: str
    model_revision: str = ""
    weights_fingerprint: str = ""
    tokenizer_revision: str = ""
    lora_adapter: str = ""
    kv_dtype: str = "float16"
    block_tokens: int = 0
    world_size: int = 1
    kv_rank: int = 0
    object_group: str = "kv"
    share_across_tenants: bool = False
    load_failure: Literal["recompute", "fail"] = "recompute"
    scheduler: Mapping[str, Any] = field(default_factory=lambda: types.MappingProxyType({}))
    codecs: Mapping[str, Any] = field(default_factory=lambda: types.MappingProxyType({}))
    telemetry: Mapping[str, Any] = field(default_factory=lambda: types.MappingProxyType({}))

    @property
    def dtype_bytes(self) -> int:
        return KV_DTYPES[self.kv_dtype]

    @property
    def effective_block_tokens(self) -> int:
        return self.block_tokens or self.model.default_block_tokens()

    def scope(self, tenant_salt: str = "") -> Scope:
        """The key scope of this configuration (see :mod:`tierkv._keys`)."""
        m = self.model
        layout = f"{m.attention}:L{m.kv_layers}:H{m.num_kv_heads}:D{m.head_dim}:R{m.kv_lora_rank}+{m.qk_rope_head_dim}"
        return Scope(
            model_name=self.model_name,
            model_revision=self.model_revision,
            weights_fingerprint=self.weights_fingerprint,
            lora_adapter=self.lora_adapter,
            tokenizer_revision=self.tokenizer_revision,
            kv_dtype=self.kv_dtype,
            attention_layout=layout,
            world_size=self.world_size,
            kv_rank=self.kv_rank,
            object_group=self.object_group,
            block_tokens=self.effective_block_tokens,
            tenant_salt="" if self.share_across_tenants else tenant_salt,
        )

    # ------------------------------------------------------------------ parsing
    @classmethod
    def load(cls, source: Config | Mapping[str, Any] | str | Path) -> Config:
        """Build a config from a Config (returned as is), a mapping or a TOML path."""
        if isinstance(source, Config):
            return source
        if isinstance(source, (str, Path)):
            path = Path(source)
            try:
                data = tomllib.loads(path.read_text(encoding="utf-8"))
            except FileNotFoundError as exc:
                raise ConfigError("config", str(path), "an existing TOML file") from exc
            except (OSError, UnicodeDecodeError) as exc:
                raise ConfigError("config", str(path), f"a readable TOML file ({exc})") from exc
            except tomllib.TOMLDecodeError as exc:
                raise ConfigError("config", str(path), f"valid TOML ({exc})") from exc
            return cls.from_dict(data)
        if isinstance(source, Mapping):
            return cls.from_dict(source)
        raise ConfigError("config", source, "a dict, a path to a TOML file, or a tierkv.Config")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Config:
        """Validate ``data``; raise ConfigError naming the first bad field."""
        if not isinstance(data, Mapping):
            raise ConfigError("config", data, "a table (dict)")
        reject_unknown(data, _TOP)
        model_raw = data.get("model")
        if not isinstance(model_raw, Mapping):
            raise ConfigError("model", model_raw, "a table with name and hf_config (or spec)")
        reject_unknown(model_raw, _MODEL, prefix="model")
        name = opt_str(model_raw, "name", prefix="model")
        if "spec" in model_raw and "hf_config" in model_raw:
            raise ConfigError("model.spec", "<both spec and hf_config>", "only one of model.spec or model.hf_config")
        if "spec" in model_raw:
            spec_raw = model_raw["spec"]
            if not isinstance(spec_raw, Mapping):
                raise ConfigError("model.spec", spec_raw, "a table of ModelSpec fields")
            spec = ModelSpec.from_dict(spec_raw, prefix="model.spec")
        elif isinstance(model_raw.get("hf_config"), Mapping):
            spec = ModelSpec.from_hf_config(model_raw["hf_config"], name=name)
        else:
            raise ConfigError(
                "model.hf_config", model_raw.get("hf_config"), "a table of the model's config.json fields"
            )

        kv_dtype = opt_choice(data, "kv_dtype", tuple(KV_DTYPES), "float16")
        block_tokens = opt_int(data, "block_tokens", 0, minimum=0, maximum=1 << 20)
        if block_tokens == 0:
            block_tokens = spec.default_block_tokens()
        world_size = opt_int(data, "world_size", 1, minimum=1, maximum=1 << 16)
        kv_rank = opt_int(data, "kv_rank", 0, minimum=0, maximum=world_size - 1)

        tiers_raw = data.get("tiers")
        if not isinstance(tiers_raw, (list, tuple)) or not tiers_raw:
            raise ConfigError("tiers", tiers_raw, "a non-empty list of tier tables, fastest first")
        tiers: list[TierConfig] = []
        seen: set[str] = set()
        for i, t in enumerate(tiers_raw):
            where = f"tiers[{i}]"
            if not isinstance(t, Mapping):
                raise ConfigError(where, t, "a table with name, backend and the backend's options")
            backend = opt_str(t, "backend", prefix=where)
            tname = opt_str(t, "name", backend, prefix=where)
            if tname in seen:
                raise ConfigError(f"{where}.name", tname, "a name not used by another tier")
            seen.add(tname)
            hi = opt_float(t, "high_watermark", 0.9, prefix=where, minimum=0.05, maximum=1.0)
            lo = opt_float(t, "low_watermark", min(0.8, hi), prefix=where, minimum=0.0, maximum=hi)
            codec = t.get("codec")
            if codec is not None and not isinstance(codec, Mapping):
                raise ConfigError(
                    f"{where}.codec", codec, "a table like {codec = 'lz4'} or {codec = 'cachegen', level = 2}"
                )
            options = {k: v for k, v in t.items() if k not in _TIER_CORE}
            tiers.append(
                TierConfig(
                    name=tname,
                    backend=backend,
                    options=types.MappingProxyType(options),
                    high_watermark=hi,
                    low_watermark=lo,
                    codec=None if codec is None else types.MappingProxyType(dict(codec)),
                )
            )

        def table(key: str) -> Mapping[str, Any]:
            v = data.get(key, {})
            if not isinstance(v, Mapping):
                raise ConfigError(key, v, "a table")
            return types.MappingProxyType(dict(v))

        return cls(
            model=spec,
            tiers=tuple(tiers),
            model_name=name,
            model_revision=opt_str(model_raw, "revision", "", prefix="model", allow_empty=True),
            weights_fingerprint=opt_str(model_raw, "weights_fingerprint", "", prefix="model", allow_empty=True),
            tokenizer_revision=opt_str(model_raw, "tokenizer_revision", "", prefix="model", allow_empty=True),
            lora_adapter=opt_str(model_raw, "lora_adapter", "", prefix="model", allow_empty=True),
            kv_dtype=kv_dtype,
            block_tokens=block_tokens,
            world_size=world_size,
            kv_rank=kv_rank,
            object_group=opt_str(data, "object_group", "kv"),
            share_across_tenants=opt_bool(data, "share_across_tenants", False),
            load_failure="fail"
            if opt_choice(data, "load_failure", ("recompute", "fail"), "recompute") == "fail"
            else "recompute",
            scheduler=table("scheduler"),
            codecs=table("codecs"),
            telemetry=table("telemetry"),
        )
