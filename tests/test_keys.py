"""Key derivation: canonical scope, chained block hashes, no delimiter ambiguity."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierkv import ConfigError, Scope, TokensError
from tierkv._keys import block_keys, tenant_salt, to_token_array

BASE = Scope(
    model_name="m",
    model_revision="r",
    weights_fingerprint="w",
    lora_adapter="l",
    tokenizer_revision="t",
    kv_dtype="float16",
    attention_layout="gqa",
    world_size=2,
    kv_rank=1,
    object_group="kv",
    block_tokens=4,
    tenant_salt="s",
)


def _mutations() -> list[tuple[str, object]]:
    out: list[tuple[str, object]] = []
    for f in dataclasses.fields(Scope):
        v = getattr(BASE, f.name)
        if isinstance(v, str):
            out.append((f.name, v + "x"))
        elif f.name == "world_size":
            out.append((f.name, 3))
        elif f.name == "kv_rank":
            out.append((f.name, 0))
        else:
            out.append((f.name, v + 1))
    return out


TOKENS = np.arange(40, dtype=np.int64)


@pytest.mark.parametrize(("field", "value"), _mutations(), ids=[m[0] for m in _mutations()])
def test_changing_any_scope_field_changes_every_key(field: str, value: object) -> None:
    changed = dataclasses.replace(BASE, **{field: value})
    bt = changed.block_tokens
    a = block_keys(BASE.digest(), TOKENS, BASE.block_tokens)
    b = block_keys(changed.digest(), TOKENS, bt)
    assert a and b
    assert not set(a) & set(b)


def test_every_scope_field_is_covered() -> None:
    assert {f.name for f in dataclasses.fields(Scope)} == {m[0] for m in _mutations()}


@settings(max_examples=200, deadline=None)
@given(
    field=st.sampled_from([f.name for f in dataclasses.fields(Scope) if f.type in ("str", str)]),
    value=st.text(max_size=20),
)
def test_property_any_string_field_change_changes_keys(field: str, value: str) -> None:
    if field == "model_name" and not value:
        return
    if getattr(BASE, field) == value:
        return
    other = dataclasses.replace(BASE, **{field: value})
    assert not set(block_keys(BASE.digest(), TOKENS, 4)) & set(block_keys(other.digest(), TOKENS, 4))


def test_no_delimiter_ambiguity() -> None:
    a = Scope(model_name="a", model_revision="b:c")
    b = Scope(model_name="a:b", model_revision="c")
    assert a.digest() != b.digest()
    c = Scope(model_name="a", model_revision='b","model_revision":"c')
    assert c.digest() != a.digest()


def test_chained_prefix_property() -> None:
    d = BASE.digest()
    full = block_keys(d, TOKENS, 4)
    assert len(full) == 10
    assert block_keys(d, TOKENS[:23], 4) == full[:5]  # partial trailing block has no key
    t2 = TOKENS.copy()
    t2[9] = 999  # change one token in block 2
    k2 = block_keys(d, t2, 4)
    assert k2[:2] == full[:2]
    assert not set(k2[2:]) & set(full[2:])


def test_token_conversion_and_errors() -> None:
    assert to_token_array([1, 2, 3]).dtype == np.int64
    assert to_token_array(np.array([1, 2], dtype=np.uint32)).tolist() == [1, 2]
    for bad in ([1.5], [True], "abc", np.zeros((2, 2), dtype=np.int64), np.array([0.5]), [-1], 3):
        with pytest.raises(TokensError):
            to_token_array(bad)


def test_torch_tokens() -> None:
    torch = pytest.importorskip("torch")
    assert to_token_array(torch.tensor([5, 6, 7])).tolist() == [5, 6, 7]
    with pytest.raises(TokensError):
        to_token_array(torch.tensor([0.5]))


def test_scope_validation() -> None:
    with pytest.raises(ConfigError, match="model_name"):
        Scope(model_name="")
    with pytest.raises(ConfigError, match="kv_rank"):
        Scope(model_name="m", world_size=2, kv_rank=2)
    with pytest.raises(ConfigError, match="block_tokens"):
        Scope(model_name="m", block_tokens=0)


def test_tenant_salt_hides_name() -> None:
    assert tenant_salt(None) == tenant_salt("") == ""
    s = tenant_salt("acme")
    assert s and "acme" not in s and s != tenant_salt("acme2")


# -- the memo of recent chains (KeyChains) -------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 40), st.integers(0, 2)),
        min_size=1,
        max_size=12,
    )
)
def test_key_chains_answer_exactly_what_block_keys_computes(steps: list[tuple[int, int, int]]) -> None:
    """Growing, shrinking, diverging and repeated prompts under two seeds, with a memo small
    enough to evict: every answer equals the pure derivation."""
    from tierkv._keys import KeyChains

    memo = KeyChains(max_tokens=64, per_root=2)
    rng = np.random.default_rng(0)
    base = [rng.integers(0, 5, 48), rng.integers(0, 5, 48)]
    seeds = [bytes(32), b"\x01" * 32]
    for which, length, mutate in steps:
        toks = base[which % 2][:length].copy()
        if mutate and length:
            toks[rng.integers(0, length)] += mutate  # diverge somewhere
        seed = seeds[which // 2]
        got = memo.keys(seed, toks, 4)
        assert got == block_keys(seed, toks, 4)
        got.clear()  # a caller mutating the answer does not change the memo
        assert memo.keys(seed, toks, 4) == block_keys(seed, toks, 4)


def test_key_chains_reuse_a_remembered_prefix_and_keep_seeds_apart() -> None:
    from tierkv._keys import KeyChains

    memo = KeyChains()
    toks = np.arange(4096, dtype=np.int64)
    a = memo.keys(bytes(32), toks[:2048], 256)
    longer = memo.keys(bytes(32), toks, 256)  # extends the remembered chain
    assert longer[:8] == a and longer == block_keys(bytes(32), toks, 256)
    other = memo.keys(b"\x02" * 32, toks, 256)  # another tenant's seed: never the first's keys
    assert set(other).isdisjoint(longer) and other == block_keys(b"\x02" * 32, toks, 256)
    diverged = toks.copy()
    diverged[3000] = 7
    d = memo.keys(bytes(32), diverged, 256)
    assert d[:11] == longer[:11] and d[11:] != longer[11:] and d == block_keys(bytes(32), diverged, 256)


def test_key_chains_grow_an_extended_chain_in_place_and_stay_bounded() -> None:
    """A sequence stored block by block: each extension answers exactly, the caller's array is
    never aliased (mutating it afterwards changes nothing), and the memo's bound counts the
    room a grown chain holds."""
    from tierkv._keys import KeyChains

    memo = KeyChains(max_tokens=1 << 20)
    toks = np.arange(64 * 16, dtype=np.int64)
    for b in range(1, 65):
        part = toks[: b * 16].copy()
        assert memo.keys(bytes(32), part, 16) == block_keys(bytes(32), part, 16)
        part[:] = -1  # the caller reuses its buffer: the memo kept its own copy
    assert memo.keys(bytes(32), toks, 16) == block_keys(bytes(32), toks, 16)
    (chain,) = next(iter(memo._chains.values()))
    assert chain.n == len(toks) and len(chain.base) < 2 * len(toks) + 16
    assert memo._tokens == len(chain.base)  # the room counts
    small = KeyChains(max_tokens=100)
    for b in range(1, 20):
        small.keys(bytes(32), toks[: b * 16], 16)
        assert small._tokens <= 100


def test_list_tokens_name_the_bad_element() -> None:
    with pytest.raises(TokensError, match=r"tokens\[2\].*bool"):
        to_token_array([5, 6, True, 9])
    with pytest.raises(TokensError, match=r"tokens\[1\].*float"):
        to_token_array([5, 1.0, 3])
    with pytest.raises(TokensError, match="int64"):
        to_token_array([5, 2**70])
    assert to_token_array([0, 1, 2**40]).tolist() == [0, 1, 2**40]
    assert to_token_array((np.int32(3), 0)).tolist() == [3, 0]
