"""Synthetic Mooncake-format traces: other workload shapes for the replay lab (generalisation checks).

``python -m tierkv.lab.synth OUT.jsonl [--shape SHAPE] [--seed N] [--sessions N]`` writes one JSON object
per request (``timestamp`` ms, ``input_length``, ``output_length``, ``hash_ids`` chained 512-token
prefix-block ids, dense in order of first appearance, and ``shape``: the name of the shape that generated
the request -- ``chat`` or ``agent`` inside ``mixed``, the sub-shape inside ``mixture``), readable by
``tierkv replay`` (which reports per-shape results when the rows carry ``shape``). The output is a pure
function of (shape, seed, sessions).

Shapes (sessions arrive as a Poisson process, one per second on average):

* ``chat`` -- human conversations on one shared 1-block system prompt. Each turn re-uses the previous
  prompt's whole blocks (its partial tail block changes) and appends the previous answer and a new message;
  a session continues with probability 0.6 per turn (at most 12 turns); gaps are lognormal (median 60 s,
  sigma 1.0) plus a "dead time" of generation and reading (5 s + 20 ms per output token).
* ``agent`` -- agent loops on 24 shared multi-block tool prompts (2-12 blocks, picked by a Zipf(1.1) law:
  high prefix fanout across sessions); 3-30 steps per session, gaps exponential (mean 8 s) with a 5%
  chance of a long human pause (mean 10 min); small appended tool results.
* ``mixed`` -- both interleaved (half the sessions each).
* ``noise`` -- no predictive signal: ``4 x sessions`` requests, each one of 400 documents of 1-4 blocks picked
  uniformly at random (independent reuse: no feature -- position, turn, gap, count, fanout, length --
  says anything about the next use), arrivals a Poisson process of one per second.
* ``rag`` -- retrieval-augmented questions over a corpus of 40 long shared documents (8-40 blocks each,
  4-20 k tokens) behind a 1-block system prompt. A request is the system prompt, one document (picked by a
  Zipf(0.9) law over a popularity ranking) and, with probability 0.3, a second one (one of 3 documents
  related to the first: its blocks are reused only under that first document), then a short distinct
  question (20-400 tokens, a partial block); 25% of the questions get a follow-up (at most 3 turns,
  lognormal gaps, median 40 s). The popularity ranking is reshuffled in 6 equal phases of the trace (the
  popular set drifts). Why: few long prompts, each reused at a long distance (many other long requests in
  between, so the LRU stack distance of a reuse is many request sizes): recency alone does poorly at small
  caches, frequency (with ageing, as the popular set drifts) and size (a document costs many blocks;
  the one-off question blocks should not displace it) matter.
* ``agent_tools`` -- agent loops with tool outputs: a shared system + tool-definitions prefix (4 variants
  of 3-8 blocks, weights 0.45/0.3/0.15/0.1), a task of 100-2000 tokens, then 4-40 steps (a branch stops
  past 48 k tokens of context); each step appends the model's action (20-300 tokens) and a tool output
  that is empty with probability 0.25 and otherwise Pareto(1.0)-distributed (128-token minimum, median 256
  tokens, capped at 32 blocks: heavy-tailed). Steps are fast (20 ms per action token plus a lognormal tool
  time, median 2 s) except for a 5% chance of a slow tool (lognormal, median 3 min). With probability 0.04
  per step the session forks (a retry or a second sample: another branch of 1-10 steps continues from the
  same context): prefix fanout inside a session. Why: context that grows by very uneven amounts, tight
  reuse at second scale broken by minute-long waits, and branches that share a long session prefix.
* ``bursty`` -- alternating phases on one shared 2-block system prompt: calm phases (200-500 s) in which
  long-lived chat-like sessions start (0.25 per second; continue with probability 0.88 per turn, at most
  30 turns, gaps lognormal with median 60 s plus the chat dead time) and bursts (15-45 s) of first turns
  (10 per second) of sessions that mostly never continue (probability 0.1 per turn, at most 4 turns);
  the first phase is calm; ``sessions`` counts both kinds (about 390 per calm + burst cycle of about
  380 s). Why: a burst brings hundreds of one-off prompts within seconds -- it
  flushes a naive recency cache, and the long-lived sessions' next turns (often after the burst) miss;
  a policy should let the burst's first turns pass through.
* ``longdoc`` -- a document-QA service over long documents, 512-token blocks: ``sessions`` requests (each a
  question of its own), arrivals a Poisson process of one request every 2 s. A request is one document
  (lognormal length, median 28 blocks, sigma 0.45, 6-64 blocks; its first block also holds a short
  instruction) and a distinct question (20-400 tokens, a partial block); no block is shared between
  documents. Two phases by time: in the first 40% of the trace almost every document is a one-off (10%
  are asked a second time); from 40% on a new document is asked 3-8 times in all. The next question on a
  document is due a log-uniform 140-750 requests after the previous one (served at the first free request:
  a due question always goes before a new document). With 12,000 sessions (seeds 1, 2): median prompt
  about 14,500 tokens; 5th-95th percentiles of a reuse's LRU stack distance about 4,900-13,700 blocks
  after 40% (about 97% of them within 4,000-14,000); reused accesses about 8% before 40%, 77% after
  (``benchmarks/trace_properties.py`` prints these). Why: few long prompts reused at long distances after
  a phase of one-off documents -- a policy tuned on the first phase sees no reuse, recency alone keeps a
  document only in a cache larger than its reuse distance, and frequency needs a second access before it
  can help. Not part of ``mixture`` (its traces stay as they were).
* ``sysprompt`` -- API traffic on shared system prompts, 512-token blocks: ``sessions`` one-shot requests,
  arrivals a Poisson process of ten per second. A request is one of 2,000 system prompts (2-12 blocks
  each, picked by a Zipf(0.9) law) and a distinct user message (100-1,500 tokens: 1-3 blocks, the last
  usually partial); nothing else is ever reused. Why: the commonest production pattern (many applications, each
  with its own instructions, queried one-shot): only shared prefixes are reused, at frequencies spanning
  three orders of magnitude, while each request brings blocks that are never used again -- recency keeps
  the one-shot suffixes and rare prompts, frequency (admission) and size matter. Not part of ``mixture``.
* ``mixture`` -- all of ``chat``, ``agent``, ``noise``, ``rag``, ``agent_tools`` and ``bursty`` interleaved
  in one time window: each gets ``sessions // 6`` sessions (``noise`` a quarter of that, its requests
  being sessions of their own) drawn from its own generator seeded by ``(seed, shape)``, and the trace
  stops at the earliest end of the six (``rag`` or ``noise``, at about ``sessions // 6`` seconds; the later
  turns of the other shapes' sessions are cut, as in a window of a real trace); the rows name their
  sub-shape.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

__all__ = [
    "BURSTY_BURST",
    "BURSTY_BURST_RATE",
    "BURSTY_CALM",
    "BURSTY_GAP_SIGMA",
    "CHAT_DEAD_PER_OUT_TOKEN_S",
    "CHAT_DEAD_S",
    "CHAT_GAP_MEDIAN_S",
    "CHAT_GAP_SIGMA",
    "CHAT_MAX_TURNS",
    "CHAT_P_CONTINUE",
    "SHAPES",
    "stack_distances",
    "synthetic_requests",
    "write_jsonl",
    "write_synthetic",
]

SHAPES: tuple[str, ...] = (
    "chat",
    "agent",
    "mixed",
    "noise",
    "rag",
    "agent_tools",
    "bursty",
    "mixture",
    "longdoc",
    "sysprompt",
)
_BT = 512
#: the shapes ``mixture`` interleaves, in generation order
_MIXTURE: tuple[str, ...] = ("chat", "agent", "noise", "rag", "agent_tools", "bursty")

#: one request: (time s, input tokens, output tokens, chained block ids before renumbering, shape)
_Event = tuple[float, int, int, list[int], str]


class _Ids:
    """Dense chained ids: ``child(parent_chain_id, salt)`` -> a new id per distinct prefix."""

    def __init__(self) -> None:
        self.ids: dict[tuple[int, int], int] = {}

    def child(self, parent: int, salt: int) -> int:
        key = (parent, salt)
        v = self.ids.get(key)
        if v is None:
            v = self.ids[key] = len(self.ids)
        return v


def _chain(ids: _Ids, tokens: list[int]) -> list[int]:
    """Block ids of a token-segment list (each entry a segment id of ``_BT`` tokens, last one partial)."""
    out: list[int] = []
    parent = -1
    for seg in tokens:
        parent = ids.child(parent, seg)
        out.append(parent)
    return out


class _Ctx:
    """What the shapes of one trace share: the chained ids and the counter of fresh segment ids."""

    def __init__(self) -> None:
        self.ids = _Ids()
        self.seg = 1 << 40

    def fresh(self) -> int:
        self.seg += 1
        return self.seg

    def chain(self, segs: list[int]) -> list[int]:
        return _chain(self.ids, segs)


def _noise(rnd: random.Random, ctx: _Ctx, sessions: int) -> list[_Event]:
    docs = [[ctx.fresh() for _ in range(rnd.randint(1, 4))] for _ in range(400)]
    t, noise = 0.0, []
    for _ in range(4 * sessions):
        t += rnd.expovariate(1.0)
        d = docs[rnd.randrange(len(docs))]
        noise.append((t, _BT * len(d), rnd.randint(10, 500), ctx.chain(d), "noise"))
    return noise


#: the ``chat`` shape's session law (``benchmarks/online_headroom.py`` reads it): at most this many turns,
#: each followed by another with this probability (a coin drawn after the turn, independent of everything
#: a cache observes), after a gap of ``CHAT_DEAD_S + CHAT_DEAD_PER_OUT_TOKEN_S x output tokens`` plus a
#: lognormal with this median and sigma
CHAT_MAX_TURNS = 12
CHAT_P_CONTINUE = 0.6
CHAT_GAP_MEDIAN_S = 60.0
CHAT_GAP_SIGMA = 1.0
CHAT_DEAD_S = 5.0
CHAT_DEAD_PER_OUT_TOKEN_S = 0.02


def _chat_agent(rnd: random.Random, ctx: _Ctx, shape: str, sessions: int) -> list[_Event]:
    """``chat``, ``agent`` or ``mixed`` (the random draws are those of the first version: same traces)."""
    fresh = ctx.fresh
    tool_prompts = [[fresh() for _ in range(rnd.randint(2, 12))] for _ in range(24)]
    zipf = [1.0 / (k + 1) ** 1.1 for k in range(len(tool_prompts))]
    events: list[_Event] = []
    t = 0.0
    for s in range(sessions):
        t += rnd.expovariate(1.0)
        kind = shape if shape != "mixed" else ("chat" if s % 2 == 0 else "agent")
        if kind == "chat":
            segs = [0]  # shared system prompt (segment 0)
            tokens = _BT * 1 + rnd.randint(50, 4000)
            max_turns, p_cont = CHAT_MAX_TURNS, CHAT_P_CONTINUE
        else:
            segs = list(tool_prompts[rnd.choices(range(len(tool_prompts)), zipf)[0]])
            tokens = _BT * len(segs) + rnd.randint(50, 1500)
            max_turns, p_cont = rnd.randint(3, 30), 0.93
        ts = t
        for turn in range(max_turns):
            n_blocks = math.ceil(tokens / _BT)
            while len(segs) < n_blocks:
                segs.append(fresh())
            out_len = rnd.randint(20, 900) if kind == "chat" else rnd.randint(10, 200)
            events.append((ts, tokens, out_len, ctx.chain(segs[:n_blocks]), kind))
            if turn + 1 >= max_turns or rnd.random() > p_cont:
                break
            if tokens % _BT:  # the partial tail block changes once tokens are appended
                segs = segs[: tokens // _BT]
            if kind == "chat":
                gap = (
                    CHAT_DEAD_S
                    + CHAT_DEAD_PER_OUT_TOKEN_S * out_len
                    + rnd.lognormvariate(math.log(CHAT_GAP_MEDIAN_S), CHAT_GAP_SIGMA)
                )
                tokens += out_len + rnd.randint(20, 1500)
            else:
                gap = rnd.expovariate(1 / 600.0) if rnd.random() < 0.05 else rnd.expovariate(1 / 8.0)
                tokens += out_len + rnd.randint(50, 800)
            ts += gap
    events.sort(key=lambda e: e[0])
    return events


def _conversation(
    rnd: random.Random,
    ctx: _Ctx,
    events: list[_Event],
    shape: str,
    start: float,
    segs: list[int],
    tokens: int,
    max_turns: int,
    p_cont: float,
    gap: Callable[[int], float],
    added: Callable[[int], int],
) -> None:
    """Append the turns of one linear session: each turn keeps the previous prompt's whole blocks (its
    partial tail changes) and grows by ``added(output tokens)``; ``gap(output tokens)`` seconds apart."""
    ts = start
    for turn in range(max_turns):
        n_blocks = math.ceil(tokens / _BT)
        while len(segs) < n_blocks:
            segs.append(ctx.fresh())
        out_len = rnd.randint(20, 900)
        events.append((ts, tokens, out_len, ctx.chain(segs[:n_blocks]), shape))
        if turn + 1 >= max_turns or rnd.random() > p_cont:
            return
        if tokens % _BT:
            segs = segs[: tokens // _BT]
        ts += gap(out_len)
        tokens += added(out_len)


def _rag(rnd: random.Random, ctx: _Ctx, sessions: int) -> list[_Event]:
    n_docs, phases = 40, 6
    docs = [[ctx.fresh() for _ in range(rnd.randint(8, 40))] for _ in range(n_docs)]
    related = [rnd.sample([j for j in range(n_docs) if j != d], 3) for d in range(n_docs)]
    system = [ctx.fresh()]
    zipf = [1.0 / (k + 1) ** 0.9 for k in range(n_docs)]
    rank = list(range(n_docs))
    events: list[_Event] = []
    t, phase = 0.0, -1
    for s in range(sessions):
        t += rnd.expovariate(1.0)
        if s * phases // sessions != phase:  # a new phase: the popular set drifts
            phase = s * phases // sessions
            rnd.shuffle(rank)
        d = rank[rnd.choices(range(n_docs), zipf)[0]]
        segs = system + docs[d]
        if rnd.random() < 0.3:
            segs += docs[rnd.choice(related[d])]
        _conversation(
            rnd,
            ctx,
            events,
            "rag",
            t,
            segs,
            _BT * len(segs) + rnd.randint(20, 400),
            3,
            0.25,
            lambda out: 5.0 + 0.02 * out + rnd.lognormvariate(math.log(40.0), 0.8),
            lambda out: out + rnd.randint(20, 400),
        )
    events.sort(key=lambda e: e[0])
    return events


def _agent_tools(rnd: random.Random, ctx: _Ctx, sessions: int) -> list[_Event]:
    variants = [[ctx.fresh() for _ in range(rnd.randint(3, 8))] for _ in range(4)]
    weights = [0.45, 0.3, 0.15, 0.1]
    max_context = 48 * 1024

    def step(out_len: int) -> tuple[float, int]:
        """(seconds to the next step, tokens it adds): the action and a heavy-tailed tool output."""
        tool = 0 if rnd.random() < 0.25 else min(32 * _BT, int(128 * rnd.paretovariate(1.0)))
        slow = rnd.random() < 0.05
        wait = rnd.lognormvariate(math.log(180.0 if slow else 2.0), 0.7)
        return 0.02 * out_len + wait, out_len + tool

    events: list[_Event] = []
    t = 0.0
    for _ in range(sessions):
        t += rnd.expovariate(1.0)
        segs0 = list(variants[rnd.choices(range(len(variants)), weights)[0]])
        # branches still to generate: (time of the next request, segments, its tokens, steps left, may fork)
        todo = [(t, segs0, _BT * len(segs0) + rnd.randint(100, 2000), rnd.randint(4, 40), True)]
        while todo:
            ts, segs, tokens, steps, may_fork = todo.pop()
            for k in range(steps):
                n_blocks = math.ceil(tokens / _BT)
                while len(segs) < n_blocks:
                    segs.append(ctx.fresh())
                out_len = rnd.randint(20, 300)
                events.append((ts, tokens, out_len, ctx.chain(segs[:n_blocks]), "agent_tools"))
                if k + 1 >= steps or tokens > max_context:
                    break
                if tokens % _BT:
                    segs = segs[: tokens // _BT]
                if may_fork and rnd.random() < 0.04:  # another branch from this step's context
                    wait, add = step(rnd.randint(20, 300))
                    todo.append((ts + wait, list(segs), tokens + add, rnd.randint(1, 10), False))
                wait, add = step(out_len)
                ts += wait
                tokens += add
    events.sort(key=lambda e: e[0])
    return events


#: the ``bursty`` shape's session laws (``benchmarks/online_headroom.py`` reads them): (at most turns,
#: continuation probability) of a calm phase's session and of a burst's, and the lognormal part's sigma of
#: the gap (its median and dead time are chat's); bursts of first turns at this rate per second
BURSTY_CALM = (30, 0.88)
BURSTY_BURST = (4, 0.1)
BURSTY_GAP_SIGMA = 0.8
BURSTY_BURST_RATE = 10.0


def _bursty(rnd: random.Random, ctx: _Ctx, sessions: int) -> list[_Event]:
    system = [ctx.fresh(), ctx.fresh()]
    events: list[_Event] = []

    def gap(out: int) -> float:
        return (
            CHAT_DEAD_S
            + CHAT_DEAD_PER_OUT_TOKEN_S * out
            + rnd.lognormvariate(math.log(CHAT_GAP_MEDIAN_S), BURSTY_GAP_SIGMA)
        )

    def added(out: int) -> int:
        return out + rnd.randint(20, 1500)

    t, started, burst = 0.0, 0, False
    while started < sessions:
        end = t + (rnd.uniform(15.0, 45.0) if burst else rnd.uniform(200.0, 500.0))
        rate = BURSTY_BURST_RATE if burst else 0.25
        while started < sessions:
            t += rnd.expovariate(rate)
            if t >= end:
                t = end
                break
            started += 1
            max_turns, p_cont = BURSTY_BURST if burst else BURSTY_CALM
            tokens = _BT * len(system) + rnd.randint(100, 3000)
            _conversation(rnd, ctx, events, "bursty", t, list(system), tokens, max_turns, p_cont, gap, added)
        burst = not burst
    events.sort(key=lambda e: e[0])
    return events


def _longdoc(rnd: random.Random, ctx: _Ctx, sessions: int) -> list[_Event]:
    """``longdoc``: ``sessions`` requests, one-off documents in the first 40% of the time, then documents
    asked 3-8 times at long gaps (see the module docstring)."""
    times: list[float] = []
    t = 0.0
    for _ in range(sessions):
        t += rnd.expovariate(0.5)
        times.append(t)
    t_phase = times[0] + 0.4 * (times[-1] - times[0]) if times else 0.0
    lo, hi = math.log(140.0), math.log(750.0)
    due: list[tuple[int, int, list[int], int]] = []  # (request index due, document, its blocks, asks left)
    events: list[_Event] = []
    n_docs = 0
    for i, ts in enumerate(times):
        if due and due[0][0] <= i:
            _, d, doc, left = heapq.heappop(due)
        else:
            n_blocks = max(6, min(64, round(rnd.lognormvariate(math.log(28.0), 0.45))))
            doc = [ctx.fresh() for _ in range(n_blocks)]
            d, n_docs = n_docs, n_docs + 1
            left = rnd.randint(3, 8) - 1 if ts >= t_phase else int(rnd.random() < 0.1)
        if left > 0:
            heapq.heappush(due, (i + round(math.exp(rnd.uniform(lo, hi))), d, doc, left - 1))
        question = rnd.randint(20, 400)
        segs = [*doc, ctx.fresh()]
        events.append((ts, _BT * len(doc) + question, rnd.randint(20, 400), ctx.chain(segs), "longdoc"))
    return events


def _sysprompt(rnd: random.Random, ctx: _Ctx, sessions: int) -> list[_Event]:
    """``sysprompt``: ``sessions`` one-shot requests on Zipf-popular shared system prompts (see the module
    docstring)."""
    n_prompts = 2000
    prompts = [[ctx.fresh() for _ in range(rnd.randint(2, 12))] for _ in range(n_prompts)]
    cum, acc = [], 0.0
    for k in range(n_prompts):
        acc += 1.0 / (k + 1) ** 0.9
        cum.append(acc)
    events: list[_Event] = []
    t = 0.0
    for _ in range(sessions):
        t += rnd.expovariate(10.0)
        prompt = prompts[rnd.choices(range(n_prompts), cum_weights=cum)[0]]
        user = rnd.randint(100, 1500)
        segs = [*prompt, *(ctx.fresh() for _ in range(-(-user // _BT)))]
        events.append((t, _BT * len(prompt) + user, rnd.randint(20, 400), ctx.chain(segs), "sysprompt"))
    return events


def _events(shape: str, rnd: random.Random, ctx: _Ctx, sessions: int) -> list[_Event]:
    if shape == "noise":
        return _noise(rnd, ctx, sessions)
    if shape in ("chat", "agent", "mixed"):
        return _chat_agent(rnd, ctx, shape, sessions)
    if shape == "rag":
        return _rag(rnd, ctx, sessions)
    if shape == "agent_tools":
        return _agent_tools(rnd, ctx, sessions)
    if shape == "bursty":
        return _bursty(rnd, ctx, sessions)
    if shape == "longdoc":
        return _longdoc(rnd, ctx, sessions)
    if shape == "sysprompt":
        return _sysprompt(rnd, ctx, sessions)
    raise ValueError(f"unknown shape {shape!r}; known: {', '.join(SHAPES)}")


def synthetic_requests(shape: str, seed: int = 7, sessions: int = 3000) -> list[dict[str, int | str | list[int]]]:
    """Generate the requests of a synthetic trace (sorted by timestamp); ``ValueError`` on an unknown shape.

    Deterministic: the same (shape, seed, sessions) always gives the same rows.
    """
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; known: {', '.join(SHAPES)}")
    ctx = _Ctx()
    if shape == "mixture":
        share = max(1, sessions // len(_MIXTURE))
        parts = [
            _events(sub, random.Random(f"mixture/{seed}/{sub}"), ctx, max(1, share // 4) if sub == "noise" else share)
            for sub in _MIXTURE
        ]
        end = min(p[-1][0] for p in parts)  # the common window: every shape runs until its end
        events = sorted((e for p in parts for e in p if e[0] <= end), key=lambda e: e[0])
    else:
        events = _events(shape, random.Random(seed), ctx, sessions)
    dense: dict[int, int] = {}  # renumber in order of first appearance, as in the Mooncake release
    return [
        {
            "timestamp": round(e[0] * 1000),
            "input_length": e[1],
            "output_length": e[2],
            "hash_ids": [dense.setdefault(b, len(dense)) for b in e[3]],
            "shape": e[4],
        }
        for e in events
    ]


def write_jsonl(path: str | Path, rows: Sequence[Mapping[str, object]]) -> int:
    """Write ``rows`` (trace records) as JSON lines to ``path``; return the number of rows."""
    with open(path, "w", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps(r) + "\n")
    return len(rows)


def write_synthetic(path: str | Path, shape: str, seed: int = 7, sessions: int = 3000) -> int:
    """Write :func:`synthetic_requests` as JSON lines to ``path``; return the number of requests."""
    return write_jsonl(path, synthetic_requests(shape, seed, sessions))


def stack_distances(reqs: Sequence[Sequence[int]]) -> list[list[int]]:
    """Per request (a sequence of block ids), the LRU stack distance of each of its reuses: the
    distinct blocks accessed since the block's previous access (a Fenwick tree over access times,
    1 where a block's latest access is; O(accesses log accesses))."""
    n = sum(len(r) for r in reqs)
    tree = [0] * (n + 1)

    def add(i: int, v: int) -> None:
        i += 1
        while i <= n:
            tree[i] += v
            i += i & -i

    def prefix(i: int) -> int:
        s, i = 0, i + 1
        while i > 0:
            s += tree[i]
            i -= i & -i
        return s

    last: dict[int, int] = {}
    out: list[list[int]] = []
    t = 0
    for r in reqs:
        mine: list[int] = []
        for b in r:
            p = last.get(b)
            if p is not None:
                mine.append(prefix(t - 1) - prefix(p))
                add(p, -1)
            last[b] = t
            add(t, 1)
            t += 1
        out.append(mine)
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m tierkv.lab.synth", description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--shape", default="chat", choices=SHAPES)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--sessions", type=int, default=3000)
    args = ap.parse_args(argv)
    n = write_synthetic(args.out, args.shape, args.seed, args.sessions)
    print(f"wrote {n} requests to {args.out}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main(sys.argv[1:]))
