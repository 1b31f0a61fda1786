"""Synthetic Mooncake-format traces: other workload shapes for the replay lab (generalisation checks).

``python -m tierkv.lab.synth OUT.jsonl [--shape chat|agent|mixed] [--seed N] [--sessions N]`` writes
one JSON object per request (``timestamp`` ms, ``input_length``, ``output_length``, ``hash_ids`` chained
512-token prefix-block ids, dense in order of first appearance), readable by ``tierkv replay``.

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
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from pathlib import Path

__all__ = ["SHAPES", "synthetic_requests", "write_synthetic"]

SHAPES: tuple[str, ...] = ("chat", "agent", "mixed", "noise")
_BT = 512


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


def synthetic_requests(shape: str, seed: int = 7, sessions: int = 3000) -> list[dict[str, int | list[int]]]:
    """Generate the requests of a synthetic trace (sorted by timestamp); ``ValueError`` on an unknown shape."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; known: {', '.join(SHAPES)}")
    rnd = random.Random(seed)
    ids = _Ids()
    seg_counter = [1 << 40]

    def fresh() -> int:
        seg_counter[0] += 1
        return seg_counter[0]

    if shape == "noise":
        docs = [[fresh() for _ in range(rnd.randint(1, 4))] for _ in range(400)]
        t, noise = 0.0, []
        for _ in range(4 * sessions):
            t += rnd.expovariate(1.0)
            d = docs[rnd.randrange(len(docs))]
            noise.append((t, _BT * len(d), rnd.randint(10, 500), _chain(ids, d)))
        dense0: dict[int, int] = {}
        return [
            {
                "timestamp": round(e[0] * 1000),
                "input_length": e[1],
                "output_length": e[2],
                "hash_ids": [dense0.setdefault(b, len(dense0)) for b in e[3]],
            }
            for e in noise
        ]
    tool_prompts = [[fresh() for _ in range(rnd.randint(2, 12))] for _ in range(24)]
    zipf = [1.0 / (k + 1) ** 1.1 for k in range(len(tool_prompts))]
    events: list[tuple[float, int, int, list[int]]] = []
    t = 0.0
    for s in range(sessions):
        t += rnd.expovariate(1.0)
        kind = shape if shape != "mixed" else ("chat" if s % 2 == 0 else "agent")
        if kind == "chat":
            segs = [0]  # shared system prompt (segment 0)
            tokens = _BT * 1 + rnd.randint(50, 4000)
            max_turns, p_cont = 12, 0.6
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
            events.append((ts, tokens, out_len, _chain(ids, segs[:n_blocks])))
            if turn + 1 >= max_turns or rnd.random() > p_cont:
                break
            if tokens % _BT:  # the partial tail block changes once tokens are appended
                segs = segs[: tokens // _BT]
            if kind == "chat":
                gap = 5.0 + 0.02 * out_len + rnd.lognormvariate(math.log(60.0), 1.0)
                tokens += out_len + rnd.randint(20, 1500)
            else:
                gap = rnd.expovariate(1 / 600.0) if rnd.random() < 0.05 else rnd.expovariate(1 / 8.0)
                tokens += out_len + rnd.randint(50, 800)
            ts += gap
    events.sort(key=lambda e: e[0])
    dense: dict[int, int] = {}  # renumber in order of first appearance, as in the Mooncake release
    return [
        {
            "timestamp": round(e[0] * 1000),
            "input_length": e[1],
            "output_length": e[2],
            "hash_ids": [dense.setdefault(b, len(dense)) for b in e[3]],
        }
        for e in events
    ]


def write_synthetic(path: str | Path, shape: str, seed: int = 7, sessions: int = 3000) -> int:
    """Write :func:`synthetic_requests` as JSON lines to ``path``; return the number of requests."""
    rows = synthetic_requests(shape, seed, sessions)
    with open(path, "w", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps(r) + "\n")
    return len(rows)


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
