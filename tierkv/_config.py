"""Configuration: a dict, a TOML file, or a :class:`Config` object.

Example (TOML)::

    kv_dtype = "float16"
    block_tokens = 128            # optional; default by attention kind (MLA 512, GQA/MQA 128, MHA 64)
    load_failure = "recompute"    # or "fail"
    share_across_tenants = false
    partial_blocks = false        # true: put also stores the trailing partial block

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
built; a bad field raises :class:`~tierkv.ConfigError` naming the dotted field
(``tiers[0].capacity``, ``telemetry.enabled``), the value and what is allowed.
Every unknown key is an error naming its dotted path (``telemetry.foo``,
``scheduler.predictor.foo``); a tier's own options are checked by its backend
when the tier opens, named the same way (``tiers[0].capcity``). There is no
top-level ``[codecs]`` table: a codec is set per tier (``tiers[i].codec``).
No string anywhere may hold a NUL character, and a tier's ``capacity``, when
given, is a size of at least one byte.

Environment overrides (twelve-factor): :meth:`Config.load` applies variables
named ``TIERKV_<PATH>`` over the file or mapping, ``__`` separating the path
segments, a list entry addressed by its index (or, for ``tiers``, by the tier's
name), names case-insensitive::

    TIERKV_KV_DTYPE=bfloat16
    TIERKV_TIERS__0__CAPACITY=1GiB        # or TIERKV_TIERS__DRAM__CAPACITY
    TIERKV_SCHEDULER__POLICY=lru
    TIERKV_MODEL__HF_CONFIG__ROPE_THETA=1000000.0

A value is read as a TOML value when it is one (``true``, ``0.5``, ``128``,
``[1, 2]``, ``"quoted"``) and as a plain string otherwise (``1GiB``, ``lru``);
quote a string that looks like a number (``TIERKV_MODEL__REVISION='"1234"'``).
A variable with a ``__`` path always names a field: an unknown field, a list
index out of range or a path through a value is a :class:`~tierkv.ConfigError`
naming the variable, and so is a bad value. A ``TIERKV_`` name without ``__``
is an override only when it is a top-level field; other such names
(``TIERKV_TEST_VENV``, ``TIERKV_CRASH_KILLS``) belong to tierkv's scripts and
are not read, unless they look like a misspelt field (``TIERKV_KV_DTYP``),
which is an error. Overrides apply to files and mappings, not to a
:class:`Config` object (already built and validated). See docs/configuration.md.

Parsing is pure apart from :meth:`Config.load`, which reads the TOML path and
the environment.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import tomllib
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ._keys import Scope
from ._model import ModelSpec
from ._options import config_path, opt_bool, opt_choice, opt_float, opt_int, opt_size, opt_str, reject_unknown
from ._scheduling import _KNOWN as _SCHEDULER_FIELDS
from .errors import ConfigError
from .scheduler import PlacementConfig, PredictorConfig

__all__ = ["ENV_PREFIX", "KV_DTYPES", "Config", "TierConfig"]

#: Prefix of the environment variables :meth:`Config.load` applies.
ENV_PREFIX = "TIERKV_"

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
        "partial_blocks",
        "scheduler",
        "telemetry",
        "tenants",
    }
)
#: Top-level fields that hold a single value (not a table or a list).
_TOP_SCALARS = frozenset(_TOP - {"model", "tiers", "scheduler", "telemetry", "tenants"})
#: Fields of a ``[tenants.NAME]`` table.
_TENANT_FIELDS = frozenset({"quota"})
#: Fields of the ``[telemetry]`` table (read by :class:`tierkv._telemetry.Telemetry`).
_TELEMETRY = frozenset({"enabled", "cost_per_gb_hour", "prefill_cost_per_million_tokens"})
#: Sub-tables of ``[scheduler]`` whose fields are those of a dataclass.
_SCHEDULER_TABLES: Mapping[str, frozenset[str]] = types.MappingProxyType(
    {
        "predictor": frozenset(f.name for f in dataclasses.fields(PredictorConfig)),
        "placement": frozenset(f.name for f in dataclasses.fields(PlacementConfig)),
        "breaker": frozenset({"failure_threshold", "cooldown_s", "probe_successes"}),
    }
)
_MODEL = frozenset(
    {"name", "revision", "weights_fingerprint", "tokenizer_revision", "lora_adapter", "hf_config", "spec"}
)
_TIER_CORE = frozenset({"name", "backend", "high_watermark", "low_watermark", "codec", "verify"})


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
    #: verify every block read from this tier against its checksum; None (the default):
    #: yes for persistent and network tiers, no for memory tiers (dram, cxl, hbm), whose
    #: blocks then carry no checksum until they are first copied to a verifying tier
    verify: bool | None = None


@dataclass(frozen=True, slots=True)
class TenantQuota:
    """How many bytes one tenant's blocks may hold: ``total`` over every tier (each copy
    counts where it is stored), and/or per tier (``per_tier``: tier name -> bytes). None:
    no limit. A tenant at its quota makes room by evicting *its own* lowest-ranked blocks,
    never another tenant's; a block it cannot make room for is a CapacityError."""

    total: int | None = None
    per_tier: Mapping[str, int] = field(default_factory=lambda: types.MappingProxyType({}))


@dataclass(frozen=True, slots=True)
class Config:
    """A validated tierkv configuration (build with :meth:`from_dict` or :meth:`load`).

    ``tenants`` maps a tenant name to its :class:`TenantQuota`; the name ``default``
    applies to every tenant without a table of its own (the default tenant, ``tenant=None``,
    included)::

        [tenants.default]
        quota = "1GiB"                                # total over all tiers
        [tenants.alice]
        quota = { dram = "256MiB", pfs = "4GiB" }     # per tier
    """

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
    #: ``put`` also stores the trailing partial block of a sequence (a tail) under its own key
    partial_blocks: bool = False
    scheduler: Mapping[str, Any] = field(default_factory=lambda: types.MappingProxyType({}))
    telemetry: Mapping[str, Any] = field(default_factory=lambda: types.MappingProxyType({}))
    tenants: Mapping[str, TenantQuota] = field(default_factory=lambda: types.MappingProxyType({}))

    def quota_of(self, tenant: str | None) -> TenantQuota | None:
        """The quota of ``tenant`` (its own table, else ``default``), or None."""
        q = self.tenants.get(tenant) if tenant is not None else None
        return q if q is not None else self.tenants.get("default")

    @property
    def dtype_bytes(self) -> int:
        return KV_DTYPES[self.kv_dtype]

    @property
    def effective_block_tokens(self) -> int:
        return self.block_tokens or self.model.default_block_tokens()

    def scope(self, tenant_salt: str = "") -> Scope:
        """The key scope of this configuration (see :mod:`tierkv._keys`).

        The model enters through :meth:`ModelSpec.kv_digest` (every field of
        the model's configuration that changes a KV byte, ``rope_theta`` and
        ``sliding_window`` included), so editing such a field of
        ``hf_config`` changes every key: blocks stored for the old model are
        never served to the new one.
        """
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
            model_digest=m.kv_digest(),
            world_size=self.world_size,
            kv_rank=self.kv_rank,
            object_group=self.object_group,
            block_tokens=self.effective_block_tokens,
            tenant_salt="" if self.share_across_tenants else tenant_salt,
        )

    # ------------------------------------------------------------------ parsing
    @classmethod
    def load(cls, source: Config | Mapping[str, Any] | str | Path, *, env: Mapping[str, str] | None = None) -> Config:
        """Build a config from a Config (returned as is), a mapping or a TOML path.

        ``TIERKV_...`` variables of ``env`` (default: ``os.environ``) override
        fields of a mapping or a file (see the module docstring); pass
        ``env={}`` to ignore the environment. A :class:`Config` is returned as
        is, without overrides.

        Raises:
            ConfigError: the file is missing or not TOML, a field is invalid or
                unknown, or an override names no field or sets a bad value (the
                message names the variable).
        """
        if isinstance(source, Config):
            return source
        environ: Mapping[str, str] = os.environ if env is None else env
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
            return cls._from_dict_with_env(data, environ)
        if isinstance(source, Mapping):
            return cls._from_dict_with_env(source, environ)
        raise ConfigError("config", source, "a dict, a path to a TOML file, or a tierkv.Config")

    @classmethod
    def _from_dict_with_env(cls, data: Mapping[str, Any], env: Mapping[str, str]) -> Config:
        overrides = _env_overrides(env)
        if not overrides:
            return cls.from_dict(data)
        tree = _plain(data) if isinstance(data, Mapping) else data
        if not isinstance(tree, dict):
            raise ConfigError("config", data, "a table (dict)")
        applied = [(var, _apply_override(tree, var, segs, raw)) for var, segs, raw in overrides]
        try:
            return cls.from_dict(tree)
        except ConfigError as exc:
            for var, where in applied:
                if _related(exc.field, where):
                    raise ConfigError(exc.field, exc.value, f"{exc.allowed} (set by {var})") from exc
            names = ", ".join(var for var, _ in applied)
            raise ConfigError(
                exc.field, exc.value, f"{exc.allowed} (environment overrides in effect: {names})"
            ) from exc

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Config:
        """Validate ``data``; raise ConfigError naming the first bad field."""
        if not isinstance(data, Mapping):
            raise ConfigError("config", data, "a table (dict)")
        if "codecs" in data:
            raise ConfigError(
                "codecs",
                data["codecs"],
                "no top-level codecs table: set a codec per tier, e.g. tiers[0].codec = {codec = 'lz4'}",
            )
        reject_unknown(data, _TOP)
        _reject_nul(data, "")
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
            with config_path("model.hf_config"):
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
            verify = None if t.get("verify", "auto") == "auto" else opt_bool(t, "verify", prefix=where)
            options = {k: v for k, v in t.items() if k not in _TIER_CORE}
            if "capacity" in options:  # every backend reads it; a tier that holds nothing is a mistake
                opt_size(options, "capacity", prefix=where, minimum=1)
            tiers.append(
                TierConfig(
                    name=tname,
                    backend=backend,
                    options=types.MappingProxyType(options),
                    high_watermark=hi,
                    low_watermark=lo,
                    codec=None if codec is None else types.MappingProxyType(dict(codec)),
                    verify=verify,
                )
            )

        def table(key: str) -> Mapping[str, Any]:
            v = data.get(key, {})
            if not isinstance(v, Mapping):
                raise ConfigError(key, v, "a table")
            return types.MappingProxyType(dict(v))

        scheduler = table("scheduler")
        reject_unknown(scheduler, _SCHEDULER_FIELDS, prefix="scheduler")
        for sub, known in _SCHEDULER_TABLES.items():
            sub_table = scheduler.get(sub, {})
            if not isinstance(sub_table, Mapping):
                raise ConfigError(f"scheduler.{sub}", sub_table, "a table")
            reject_unknown(sub_table, known, prefix=f"scheduler.{sub}")
        telemetry = table("telemetry")
        reject_unknown(telemetry, _TELEMETRY, prefix="telemetry")
        tenants = _tenant_quotas(table("tenants"), {t.name for t in tiers})

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
            partial_blocks=opt_bool(data, "partial_blocks", False),
            scheduler=scheduler,
            telemetry=telemetry,
            tenants=tenants,
        )


# ---------------------------------------------------------------------- validation helpers


def _tenant_quotas(raw: Mapping[str, Any], tier_names: set[str]) -> Mapping[str, TenantQuota]:
    """The ``[tenants]`` table: ``NAME = {quota = SIZE | {TIER = SIZE, ...}}``."""
    out: dict[str, TenantQuota] = {}
    for name, t in raw.items():
        where = f"tenants.{name}"
        if not isinstance(t, Mapping):
            raise ConfigError(where, t, "a table like {quota = '2GiB'}")
        reject_unknown(t, _TENANT_FIELDS, prefix=where)
        q = t.get("quota")
        if isinstance(q, Mapping):
            per: dict[str, int] = {}
            for tier, size in q.items():
                if tier not in tier_names:
                    raise ConfigError(f"{where}.quota.{tier}", size, f"a tier name ({', '.join(sorted(tier_names))})")
                per[str(tier)] = opt_size(q, str(tier), prefix=f"{where}.quota", minimum=1)
            out[str(name)] = TenantQuota(per_tier=types.MappingProxyType(per))
        elif q is None:
            out[str(name)] = TenantQuota()
        else:
            out[str(name)] = TenantQuota(total=opt_size(t, "quota", prefix=where, minimum=1))
    return types.MappingProxyType(out)


def _reject_nul(value: object, where: str) -> None:
    """ConfigError naming the dotted path of the first string (key or value) holding a NUL."""
    if isinstance(value, str):
        if "\x00" in value:
            raise ConfigError(where or "config", value, "a string without NUL characters")
    elif isinstance(value, Mapping):
        for k, v in value.items():
            sub = f"{where}.{k}" if where else str(k)
            if isinstance(k, str) and "\x00" in k:
                raise ConfigError(sub, k, "a key without NUL characters")
            _reject_nul(v, sub)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _reject_nul(v, f"{where}[{i}]")


# ---------------------------------------------------------------------- environment overrides


def _env_overrides(env: Mapping[str, str]) -> list[tuple[str, list[str], str]]:
    """``(variable, lower-case path segments, raw value)`` of each override in ``env``, sorted by name."""
    out: list[tuple[str, list[str], str]] = []
    for var in sorted(env):
        if not var.startswith(ENV_PREFIX):
            continue
        raw = env[var]
        rest = var[len(ENV_PREFIX) :].lower()
        if "__" in rest:
            segs = rest.split("__")
            if not all(segs):
                raise ConfigError(var, raw, "a path like TIERKV_TIERS__0__CAPACITY (segments joined by '__')")
        elif rest in _TOP:
            segs = [rest]
        else:
            close = difflib.get_close_matches(rest, sorted(_TOP), n=1, cutoff=0.8)
            if close:
                raise ConfigError(
                    var,
                    raw,
                    f"an existing config field: {rest!r} is unknown (did you mean {ENV_PREFIX}{close[0].upper()}?)",
                )
            continue  # not a config variable (tierkv's scripts read TIERKV_TEST_VENV, TIERKV_CRASH_KILLS, ...)
        out.append((var, segs, raw))
    return out


def _env_value(raw: str) -> Any:
    """A TOML value when ``raw`` is one (``true``, ``0.5``, ``[1, 2]``, ``"x"``), else ``raw`` itself."""
    try:
        parsed = tomllib.loads(f"v = {raw}")
    except tomllib.TOMLDecodeError:
        return raw
    if set(parsed) != {"v"}:
        return raw
    return parsed["v"]


def _plain(value: Any) -> Any:
    """A deep copy of a config tree as plain dicts and lists (overrides are written into it)."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _apply_override(tree: dict[str, Any], var: str, segs: list[str], raw: str) -> str:
    """Write the value of ``var`` at ``segs`` into ``tree``; return its dotted path (``tiers[0].capacity``)."""
    value = _env_value(raw)
    node: Any = tree
    where = ""
    for i, seg in enumerate(segs):
        last = i == len(segs) - 1
        if isinstance(node, list):
            idx = _list_index(node, seg, where)
            if idx is None:
                names = [str(t.get("name", t.get("backend"))) for t in node if isinstance(t, Mapping)]
                what = f"an index in [0, {len(node) - 1}]" if node else "an index (the list is empty)"
                if where == "tiers" and names:
                    what += " or a tier name (" + ", ".join(names) + ")"
                raise ConfigError(var, raw, f"a path into {where}: {seg!r} is not {what}")
            where = f"{where}[{idx}]"
            if last:
                node[idx] = value
                break
            nxt = node[idx]
        elif isinstance(node, dict):
            key = next((k for k in node if isinstance(k, str) and k.lower() == seg), seg)
            where = f"{where}.{key}" if where else key
            if last:
                node[key] = value
                break
            nxt = node.get(key)
            if nxt is None:
                nxt = {}
                node[key] = nxt
        else:
            raise ConfigError(var, raw, f"a path through tables: {where} is a value ({node!r}), not a table")
        if not isinstance(nxt, (dict, list)):
            raise ConfigError(var, raw, f"a path through tables: {where} is a value ({nxt!r}), not a table")
        node = nxt
    return where


def _list_index(node: list[Any], seg: str, where: str) -> int | None:
    if seg.isdigit():
        i = int(seg)
        return i if i < len(node) else None
    if where == "tiers":
        for i, t in enumerate(node):
            if isinstance(t, Mapping) and str(t.get("name", t.get("backend", ""))).lower() == seg:
                return i
    return None


def _related(field: str, where: str) -> bool:
    """Whether the error on ``field`` is about the override written at ``where`` (one contains the other)."""

    def under(a: str, b: str) -> bool:
        return a == b or a.startswith((b + ".", b + "["))

    return under(field, where) or under(where, field)
