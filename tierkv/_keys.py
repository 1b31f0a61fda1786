"""Block keys: chained hashes over token ids, seeded by a canonical scope.

A block key names the KV of one whole prefix: key_i = H(key_{i-1} || tokens of
block i), with key_{-1} = H(canonical scope). Two prefixes share a key only if
every token up to the end of the block matches *and* the scope matches.

The scope holds everything that changes the bytes of the KV (model, revision,
weights fingerprint, LoRA adapter, tokenizer revision, KV dtype, attention
layout, the model digest, world size, KV rank, object group, block size, schema
version) plus the tenant salt. The model digest
(:meth:`tierkv.ModelSpec.kv_digest`) covers every field of the model's
configuration that changes a KV byte: the attention geometry and the
forward-pass fields of ``hf_config`` such as ``rope_theta``, ``rope_scaling``
or ``sliding_window``, so a changed model never serves the old KV. It is serialised as canonical JSON (sorted keys, no whitespace,
UTF-8) so there is no delimiter ambiguity: model ``"a"`` + revision ``"b:c"``
and model ``"a:b"`` + revision ``"c"`` are different JSON objects, hence
different digests. The hash is SHA-256. Token blocks are hashed as fixed-width
little-endian int64 after a fixed-width 32-byte parent digest, so the chained
input is unambiguous too.

These are pure functions: no I/O, no global state.
"""

from __future__ import annotations

import array
import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import ConfigError, TokensError

__all__ = ["SCHEMA_VERSION", "Scope", "block_keys", "tenant_salt", "to_token_array"]

#: Version of the key schema; bump when the derivation changes.
SCHEMA_VERSION = 1

_MAX_TOKEN = 2**63 - 1


@dataclass(frozen=True, slots=True)
class Scope:
    """Everything that must match for two KV blocks to be interchangeable."""

    model_name: str
    model_revision: str = ""
    weights_fingerprint: str = ""
    lora_adapter: str = ""
    tokenizer_revision: str = ""
    kv_dtype: str = "float16"
    attention_layout: str = ""
    model_digest: str = ""
    world_size: int = 1
    kv_rank: int = 0
    object_group: str = "kv"
    block_tokens: int = 128
    tenant_salt: str = ""
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.type in ("str", str) and not isinstance(v, str):
                raise ConfigError(f"scope.{f.name}", v, "a string")
            if f.type in ("int", int) and (isinstance(v, bool) or not isinstance(v, int)):
                raise ConfigError(f"scope.{f.name}", v, "an integer")
        if not self.model_name:
            raise ConfigError("scope.model_name", self.model_name, "a non-empty string")
        if self.world_size < 1:
            raise ConfigError("scope.world_size", self.world_size, "an integer >= 1")
        if not 0 <= self.kv_rank < self.world_size:
            raise ConfigError("scope.kv_rank", self.kv_rank, f"an integer in [0, {self.world_size - 1}]")
        if self.block_tokens < 1:
            raise ConfigError("scope.block_tokens", self.block_tokens, "an integer >= 1")

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def canonical_json(self) -> bytes:
        """The canonical serialisation hashed into :meth:`digest`."""
        return json.dumps(self.as_dict(), sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")

    def digest(self) -> bytes:
        """32-byte SHA-256 of the canonical JSON (domain-separated)."""
        return hashlib.sha256(b"tierkv.scope\x00" + self.canonical_json()).digest()

    def with_tenant(self, salt: str) -> Scope:
        return dataclasses.replace(self, tenant_salt=salt)


def tenant_salt(tenant: str | None) -> str:
    """The salt a tenant contributes to the scope ("" for the default tenant).

    The tenant name is hashed so that raw tenant names never appear in keys,
    tags or traces. Validation of the name is the caller's job.
    """
    if tenant is None or tenant == "":
        return ""
    return hashlib.sha256(b"tierkv.tenant\x00" + tenant.encode("utf-8")).hexdigest()[:32]


def _check_each(tokens: list[Any] | tuple[Any, ...] | range) -> None:
    """Name the first element that is not an int token id (bools are not token ids)."""
    for i, v in enumerate(tokens):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise TokensError(f"tokens[{i}]: expected an int token id, got {type(v).__name__} {v!r}")


def _ints_of(tokens: list[Any] | tuple[Any, ...] | range) -> np.ndarray[Any, Any]:
    """A list/tuple/range of ints as int64, converted in C (no per-token Python work): the
    ``array`` module takes only integers (a float, a string or None is a TypeError; an id
    beyond int64 an OverflowError). A bool converts too, as 0 or 1, so only a sequence
    holding a 0 or a 1 is scanned element by element for bools."""
    if isinstance(tokens, range):
        return np.arange(tokens.start, tokens.stop, tokens.step, dtype=np.int64)
    try:
        arr = np.frombuffer(array.array("q", tokens), dtype=np.int64)
    except TypeError:
        _check_each(tokens)
        raise TokensError("tokens: expected int token ids") from None  # pragma: no cover (named above)
    except OverflowError as exc:
        raise TokensError(f"tokens: a token id does not fit in int64: {exc}") from exc
    if arr.size and bool((arr <= 1).any()):
        _check_each(tokens)
    return arr


def to_token_array(tokens: object) -> np.ndarray[Any, np.dtype[np.int64]]:
    """Convert token ids (list/tuple of ints, 1-D integer numpy array or torch
    tensor) to a 1-D int64 array.

    Raises:
        TokensError: not a sequence of integers, not 1-D, a float/bool dtype,
            or a negative id.
    """
    arr: np.ndarray[Any, Any]
    if isinstance(tokens, np.ndarray):
        arr = tokens
    elif type(tokens).__module__.startswith("torch"):
        t: Any = tokens
        dev = getattr(getattr(t, "device", None), "type", "cpu")
        if dev == "meta":
            raise TokensError("tokens: a tensor on the 'meta' device holds no data (pass real token ids)")
        try:
            if dev != "cpu":
                t = t.detach().cpu()
            arr = t.detach().numpy()
        except (TypeError, RuntimeError, AttributeError, NotImplementedError) as exc:
            raise TokensError(f"tokens: cannot convert {type(tokens).__name__} to numpy: {exc}") from exc
    elif isinstance(tokens, (list, tuple, range)):
        arr = _ints_of(tokens)
    else:
        raise TokensError(
            f"tokens: expected a list of ints, a 1-D integer numpy array or torch tensor, got {type(tokens).__name__}"
        )
    if arr.ndim != 1:
        raise TokensError(f"tokens: expected a 1-D sequence, got shape {tuple(arr.shape)}")
    if arr.dtype.kind not in "iu":
        raise TokensError(f"tokens: expected an integer dtype, got {arr.dtype}")
    if arr.dtype.kind == "u" and arr.dtype.itemsize == 8 and arr.size and int(arr.max()) > _MAX_TOKEN:
        raise TokensError("tokens: a token id does not fit in int64")
    out = arr.astype(np.int64, copy=False)
    if out.size and int(out.min()) < 0:
        raise TokensError(f"tokens: token ids must be >= 0, got {int(out.min())}")
    return out


def layout_digest(scope_digest: bytes, layout_id: bytes) -> bytes:
    """The key seed of blocks stored in an engine-native layout (``layout_id``, see
    :attr:`tierkv.PagedLayout.key_id`): their keys never meet those of another layout or
    of the canonical layout, whose seed is ``scope_digest`` itself."""
    return hashlib.sha256(b"tierkv-layout\x00" + scope_digest + layout_id).digest()


def block_keys(scope_digest: bytes, tokens: np.ndarray[Any, np.dtype[np.int64]], block_tokens: int) -> list[bytes]:
    """Chained 32-byte digests, one per *whole* block of ``tokens``.

    A trailing partial block gets no key (it is never stored).
    """
    if len(scope_digest) != 32:
        raise ValueError("scope digest must be 32 bytes")
    n = len(tokens) // block_tokens
    if n == 0:
        return []
    raw = np.ascontiguousarray(tokens[: n * block_tokens], dtype="<i8").tobytes()
    step = block_tokens * 8
    out: list[bytes] = []
    h = scope_digest
    sha = hashlib.sha256
    for i in range(n):
        h = sha(h + raw[i * step : (i + 1) * step]).digest()
        out.append(h)
    return out
