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

These are pure functions (no I/O, no global state), and :class:`KeyChains`, a bounded
memo of recent chains that a store owns: an engine asks for the keys of the same prompt
several times (lookup, then get; a scheduler polling a waiting request; a conversation's
next turn extending the last one), and SHA-256 over int64 tokens costs ~2.5 µs per
256-token block. The memo answers with exactly what :func:`block_keys` would (it compares
the tokens themselves, never a hash of them) and recomputes only the blocks past the
longest remembered prefix.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
import xxhash

from .errors import ConfigError, TokensError

__all__ = ["SCHEMA_VERSION", "KeyChains", "Scope", "block_keys", "tail_key", "tenant_salt", "to_token_array"]

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
    """A list/tuple/range of ints as int64, converted in C (no per-token Python work):
    ``struct`` packs only integers (a float, a string or None is an error, named here by
    its position; an id beyond int64 is out of range). A bool packs too, as 0 or 1, so the
    elements that converted to 0 or 1 (and only those) are looked at for bools."""
    if isinstance(tokens, range):
        return np.arange(tokens.start, tokens.stop, tokens.step, dtype=np.int64)
    try:
        arr = np.frombuffer(struct.pack(f"<{len(tokens)}q", *tokens), dtype="<i8")
    except struct.error as exc:
        _check_each(tokens)
        raise TokensError(f"tokens: a token id does not fit in int64 ({exc})") from None
    if arr.size:
        for i in np.flatnonzero(arr <= 1).tolist():
            v = tokens[i]
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise TokensError(f"tokens[{i}]: expected an int token id, got {type(v).__name__} {v!r}")
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


def tail_key(parent: bytes, tokens: np.ndarray[Any, np.dtype[np.int64]]) -> bytes:
    """The key of a partial last block (a *tail*) of ``len(tokens)`` tokens under ``parent``
    (the key of the last whole block before it, or the chain seed for a sequence shorter
    than one block): SHA-256 over a domain tag, the parent, the token count and the tokens
    (fixed-width little-endian int64). The domain tag keeps it apart from every whole
    block's key (``H(parent || tokens)``) and the count from any other tail's, so a tail
    key names exactly these tokens after exactly that prefix."""
    if len(parent) != 32:
        raise ValueError("parent key must be 32 bytes")
    raw = np.ascontiguousarray(tokens, dtype="<i8").tobytes()
    return hashlib.sha256(b"tierkv.tail\x00" + parent + struct.pack("<Q", len(tokens)) + raw).digest()


def _chain(h: bytes, raw: bytes, step: int, n: int, out: list[bytes]) -> None:
    sha = hashlib.sha256
    for i in range(n):
        h = sha(h + raw[i * step : (i + 1) * step]).digest()
        out.append(h)


class _Chain:
    """One remembered chain: its whole blocks' tokens (``base[:n]``; ``base`` has room to grow,
    so a chain extended block by block is not copied whole each time) and their keys."""

    __slots__ = ("base", "keys", "n")

    def __init__(self, base: np.ndarray[Any, np.dtype[np.int64]], n: int, keys: list[bytes]) -> None:
        self.base, self.n, self.keys = base, n, keys

    @property
    def tokens(self) -> np.ndarray[Any, np.dtype[np.int64]]:
        return self.base[: self.n]

    def extend(self, whole: np.ndarray[Any, np.dtype[np.int64]], keys: list[bytes]) -> int:
        """Become ``whole`` (which starts with this chain's tokens) and ``keys``; returns the
        tokens of room added (the memo's bound counts room, not just tokens)."""
        n, cap = len(whole), len(self.base)
        grown = 0
        if n > cap:
            base = np.empty(max(n, 2 * cap), dtype="<i8")
            base[: self.n] = self.base[: self.n]
            grown = len(base) - cap
            self.base = base
        self.base[self.n : n] = whole[self.n :]
        self.n, self.keys = n, keys
        return grown


class KeyChains:
    """A bounded memo of recent key chains: ``keys(seed, tokens, block_tokens)`` equals
    :func:`block_keys` of the same arguments, computing only the blocks past the longest
    prefix of ``tokens`` remembered under the same seed.

    A chain is remembered under (seed, block size, a digest of its first block's tokens),
    at most ``per_root`` chains per such root, most recent first, and at most
    ``max_tokens`` tokens in all (least recently used chains go first; a chain's room to grow
    counts). A remembered prefix is reused only after comparing its tokens with the caller's,
    element by element, so a digest collision costs a recomputation, never a wrong key; and the
    seed (scope, tenant, layout) is part of the memo's key, so one tenant's chains never answer
    another's. A chain that extends a remembered one (a sequence stored block by block) grows
    that one in place (amortised: its room doubles), so each extension copies only its new
    tokens. Not thread-safe: one store's event loop owns it (no await inside)."""

    __slots__ = ("_chains", "_max_tokens", "_per_root", "_tokens")

    def __init__(self, max_tokens: int = 4 << 20, per_root: int = 4) -> None:
        #: root -> chains, most recent first; dict order: LRU
        self._chains: dict[tuple[bytes, int, int], list[_Chain]] = {}
        self._max_tokens = max_tokens
        self._per_root = per_root
        self._tokens = 0

    def keys(self, seed: bytes, tokens: np.ndarray[Any, np.dtype[np.int64]], block_tokens: int) -> list[bytes]:
        if len(seed) != 32:
            raise ValueError("scope digest must be 32 bytes")
        n = len(tokens) // block_tokens
        if n == 0 or self._max_tokens <= 0:
            return block_keys(seed, tokens, block_tokens)
        whole = np.ascontiguousarray(tokens[: n * block_tokens], dtype="<i8")
        root = (seed, block_tokens, xxhash.xxh3_64_intdigest(whole[:block_tokens].tobytes()))
        chains = self._chains.pop(root, None)
        best, best_i = 0, -1
        for i, ch in enumerate(chains or ()):
            m = min(ch.n, len(whole)) // block_tokens
            if m <= best:
                continue
            t = ch.base
            diff = np.flatnonzero(t[: m * block_tokens] != whole[: m * block_tokens])
            same = m if not diff.size else int(diff[0]) // block_tokens
            if same > best:
                best, best_i = same, i
        if chains is not None and best_i >= 0:
            ks = chains[best_i].keys
            if best == n and len(ks) >= n:  # a prefix of (or equal to) a remembered chain
                chains.insert(0, chains.pop(best_i))
                self._chains[root] = chains
                return ks[:n]
            out = ks[:best]
        else:
            out = []
        step = block_tokens * 8
        raw = whole[best * block_tokens :].tobytes()
        _chain(out[-1] if out else seed, raw, step, n - best, out)
        chains = chains or []
        if best_i >= 0 and best >= len(chains[best_i].keys):  # this chain extends that one: grown
            ch = chains.pop(best_i)
            self._tokens += ch.extend(whole, out)
        else:
            ch = _Chain(whole.copy(), len(whole), out)
            self._tokens += len(whole)
        chains.insert(0, ch)
        while len(chains) > self._per_root:
            self._tokens -= len(chains.pop().base)
        self._chains[root] = chains
        while self._tokens > self._max_tokens and self._chains:
            old = next(iter(self._chains))
            for c in self._chains.pop(old):
                self._tokens -= len(c.base)
        return list(out)

    def clear(self) -> None:
        self._chains.clear()
        self._tokens = 0
