"""The demo's story, shared by both engines (``tierkv demo`` and ``tierkv demo --engine vllm``).

One owner for what the two demos have in common: the prompts (a real ShareGPT conversation cut to a
token budget, then a first question; a follow-up that repeats it with the answer and a second question),
the tier layout (DRAM sized to about half the prompt's KV, PFS behind it), the progress lines, the summary
(TTFT recompute vs cached, medians, the ratio, where the cached TTFT went, the tiers hit, identical tokens),
the common keys of ``--json`` and the fresh-process warm start (a request file, a child process, a result
file). The engine-specific parts live in :mod:`tierkv.demo.run` (``transformers``) and
:mod:`tierkv.demo.vllm_engine` (vLLM with :class:`~tierkv.integrations.vllm.TierKVConnector`).

Imports nothing heavy: the tokenizer is whatever the caller passes (anything with ``encode``, ``decode``
and ``apply_chat_template``).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tierkv.errors import TierKVError
from tierkv.integrations.transformers import chat_prompt_ids

from .sharegpt import sharegpt_conversations

__all__ = [
    "Q1",
    "Q2",
    "auto_dram_bytes",
    "build_prompts",
    "first_prompt",
    "followup_prompt",
    "read_warm_request",
    "say",
    "say_runs",
    "summarize",
    "tier_list",
    "warm_start_in_fresh_process",
    "write_warm_result",
]

Q1 = "Given the conversation above, what is its main topic? Answer in one sentence."
Q2 = "Thanks. Now list three follow-up questions I could ask about it."
_REQUEST = "warm_request.json"
_RESULT = "warm_result.json"


def say(msg: str) -> None:
    """One progress line of the demo on stdout (flushed: the demo runs for minutes)."""
    print(f"[tierkv demo] {msg}", flush=True)


def build_prompts(tokenizer: Any, target_tokens: int, *, seed: int = 0) -> tuple[list[tuple[str, str]], int]:
    """History turns from one long ShareGPT conversation, cut so that history + first question
    is about ``target_tokens`` tokens under the chat template; returns (history, its conversation index)."""
    conv = sharegpt_conversations(1, min_turns=2, min_chars=max(400, target_tokens * 5), seed=seed)[0]
    q1 = ("user", Q1)
    history: list[tuple[str, str]] = []
    for role, text in conv:
        if len(chat_prompt_ids(tokenizer, [*history, (role, text), q1])) <= target_tokens:
            history.append((role, text))
            continue
        budget = target_tokens - len(chat_prompt_ids(tokenizer, [*history, (role, ""), q1]))
        if budget > 16:
            ids = tokenizer.encode(text, add_special_tokens=False)[:budget]
            history.append((role, tokenizer.decode(ids)))
        break
    return history, seed


def first_prompt(tokenizer: Any, prompt_tokens: int, seed: int) -> tuple[list[tuple[str, str]], list[int]]:
    """The conversation and the first request's token ids (history + the first question); says what it built."""
    history, conv_seed = build_prompts(tokenizer, prompt_tokens, seed=seed)
    first = chat_prompt_ids(tokenizer, [*history, ("user", Q1)])
    say(
        f"prompt: {len(history)} turns of a real ShareGPT conversation (seed {conv_seed}) + a question = {len(first)} tokens"
    )
    return history, first


def followup_prompt(tokenizer: Any, history: Sequence[tuple[str, str]], first: Sequence[int], answer: str) -> list[int]:
    """The follow-up's token ids: the conversation, the first question, its ``answer``, the second question."""
    followup = chat_prompt_ids(tokenizer, [*history, ("user", Q1), ("assistant", answer), ("user", Q2)])
    shared = next((i for i, (a, b) in enumerate(zip(first, followup, strict=False)) if a != b), len(first))
    say(f"follow-up: {len(followup)} tokens, sharing its first {shared} tokens with the first prompt")
    return followup


def auto_dram_bytes(dram_capacity: str, kv_bytes_per_token: int, block_tokens: int, prompt_len: int) -> int | None:
    """The DRAM tier's capacity for ``--dram-capacity auto``: about half the prompt's whole blocks, so the
    placement policy spills the least recently used ones to PFS; ``None`` for an explicit size."""
    if dram_capacity != "auto":
        return None
    return max(1, (prompt_len // block_tokens + 1) // 2) * kv_bytes_per_token * block_tokens


def tier_list(pfs_dir: Path, dram_bytes: int | None, dram_capacity: str | None) -> list[dict[str, Any]]:
    """The tier list: a DRAM tier (``dram_bytes``, else ``dram_capacity`` as given, else none) over a PFS tier."""
    out: list[dict[str, Any]] = []
    if dram_bytes is not None:
        out.append({"name": "dram", "backend": "dram", "capacity": str(dram_bytes)})
    elif dram_capacity is not None:
        out.append({"name": "dram", "backend": "dram", "capacity": dram_capacity})
    out.append({"name": "pfs", "backend": "pfs", "path": str(pfs_dir), "capacity": "8GiB"})
    return out


def say_runs(ttfts: Sequence[float], prefix: str = "") -> None:
    for t in ttfts:
        say(f"    {prefix}TTFT {t:.3f} s")


def summarize(
    *,
    base_ttfts: Sequence[float],
    cached_ttfts: Sequence[float],
    identical: bool,
    tiers_hit: Sequence[str],
    prefix: int,
    first: Sequence[int],
    followup: Sequence[int],
    new_tokens: int,
    fetch_s: float,
    went_to: Sequence[tuple[str, float]],
    generated_text: str,
) -> dict[str, Any]:
    """Print the summary lines and return the keys of ``--json`` both engines have.

    ``fetch_s`` is the median time spent bringing the stored prefix in (lookup + get for ``transformers``,
    the connector's load for vLLM); ``went_to`` lists (what, seconds) of the cached TTFT, in order.
    """
    runs = len(base_ttfts)
    recompute, cached = statistics.median(base_ttfts), statistics.median(cached_ttfts)
    result: dict[str, Any] = {
        "ttft_recompute_s": recompute,
        "ttft_cached_s": cached,
        "ttft_ratio": recompute / cached,
        "identical": identical,
        "tiers_hit": list(tiers_hit),
        "prefix_tokens": prefix,
        "prompt_tokens": len(first),
        "followup_tokens": len(followup),
        "suffix_tokens_prefilled": len(followup) - prefix,
        "new_tokens": new_tokens,
        "fetch_s": fetch_s,
        "runs": runs,
        "ttft_recompute_runs_s": list(base_ttfts),
        "ttft_cached_runs_s": list(cached_ttfts),
        "generated_text": generated_text,
        "warm_start": None,
    }
    say(f"answer 2: {generated_text!r}")
    say(
        f"TTFT recompute {recompute:.3f} s | with tierkv {cached:.3f} s (fetch {fetch_s:.3f} s)"
        f" | ratio {result['ttft_ratio']:.1f}x (medians of {runs})"
    )
    say("cached TTFT went to: " + ", ".join(f"{what} {s * 1e3:.1f} ms" for what, s in went_to))
    say(f"prefix {prefix} tokens from tiers {list(tiers_hit)}; generated tokens identical: {identical}")
    return result


def warm_start_in_fresh_process(
    workdir: Path, request: Mapping[str, Any], args: Sequence[str], result: dict[str, Any]
) -> dict[str, Any]:
    """Step (c): write ``request`` to ``workdir``, run ``python -m tierkv demo ARGS --warm-start-only WORKDIR``
    in a new process (same interpreter and environment), read its result, fold it into ``result``
    (``warm_start``; ``identical`` is the conjunction) and say it. Blocks until the child exits (call it
    from a worker thread in async code).

    The child calls :func:`read_warm_request` and :func:`write_warm_result`.

    Raises:
        TierKVError: the child failed or wrote no result.
    """
    (workdir / _REQUEST).write_text(json.dumps(request))
    (workdir / _RESULT).unlink(missing_ok=True)
    say("(c) fresh process, PFS tier only (warm start from scan()) ...")
    cmd = [sys.executable, "-m", "tierkv", "demo", *args, "--warm-start-only", str(workdir)]
    proc = subprocess.run(cmd, check=False)
    result_file = workdir / _RESULT
    if proc.returncode != 0 or not result_file.exists():
        raise TierKVError(f"the warm-start process failed with exit status {proc.returncode}")
    warm: dict[str, Any] = json.loads(result_file.read_text())
    result["warm_start"] = warm
    result["identical"] = bool(result["identical"]) and bool(warm["identical"])
    say(
        f"warm start: {warm['prefix_tokens']} prefix tokens from {warm['tiers_hit']}, TTFT {warm['ttft_cached_s']:.3f} s"
        f" vs recompute {result['ttft_recompute_s']:.3f} s; identical: {warm['identical']}"
    )
    return warm


def read_warm_request(workdir: Path) -> dict[str, Any]:
    """The request :func:`warm_start_in_fresh_process` wrote (in the child)."""
    request: dict[str, Any] = json.loads((workdir / _REQUEST).read_text())
    return request


def write_warm_result(workdir: Path, warm: Mapping[str, Any]) -> None:
    """The child's result, for :func:`warm_start_in_fresh_process`."""
    (workdir / _RESULT).write_text(json.dumps(dict(warm)))
