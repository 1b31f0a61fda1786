"""Adversarial traces the policies were never tuned on (Mooncake JSON lines, 512-token block ids).

Run: ``python benchmarks/adversarial_traces.py OUT_DIR [--seeds 1,2]``, then for instance
``python -m tierkv replay OUT_DIR/loopscan_s1.jsonl --policies lru,arc,s3fifo,tinylfu,belady,tierkv-adaptive``.
Writes, per seed, four shapes built to break one kind of policy each:

* ``loopscan`` -- 6,000 requests, half of them a loop over 60 fixed documents (10-40 blocks, in a fixed
  order, plus 1-3 fresh blocks) and half one-shot scans of 10-60 fresh blocks; arrivals exponential
  (mean 0.3 s). A recency cache smaller than the loop gets nothing from it (LRU's worst case).
* ``zipfshort`` -- 20,000 requests on 2,000 short shared prompts (2-11 blocks, Zipf(0.9)) followed by
  1-3 fresh blocks; arrivals exponential (mean 0.1 s). Frequency matters, recency wastes the cache on
  one-shot suffixes (``tierkv.lab.synth``'s ``sysprompt`` shape is the lab's version of it).
* ``multiround`` -- 900 requests: 60 users' long contexts (a shared system prompt and 10-40 blocks each)
  asked one question each per round for 15 rounds, in a random order (``multiround``'s docstring): a loop
  far larger than the cache, with a long shared head (where the adaptive policy's ARC mode once emptied
  its frequent list).
* ``shift`` -- 8,000 requests in 8 phases, each on its own 300 documents (5-30 blocks, Pareto(1.2)
  popularity); 40% of the requests continue one of 50 growing conversations on a document, the rest
  ask a document with 1-5 fresh blocks. The popular set changes all at once, eight times.

The output is a pure function of the seed. Owns nothing the library imports.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import numpy as np

Request = tuple[float, list[int], int]


class _Fresh:
    def __init__(self) -> None:
        self.next = 0

    def __call__(self, k: int) -> list[int]:
        r = list(range(self.next, self.next + k))
        self.next += k
        return r


def write(path: Path, reqs: list[Request]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for t, ids, out in reqs:
            row = {"timestamp": int(t), "input_length": len(ids) * 512, "output_length": out, "hash_ids": ids}
            f.write(json.dumps(row) + "\n")


def loopscan(seed: int, n: int = 6000) -> list[Request]:
    rng, fresh = random.Random(seed), _Fresh()
    docs = [fresh(rng.randint(10, 40)) for _ in range(60)]
    reqs: list[Request] = []
    t, i = 0.0, 0
    for _ in range(n):
        t += rng.expovariate(1 / 300)
        if rng.random() < 0.5:
            reqs.append((t, docs[i % len(docs)] + fresh(rng.randint(1, 3)), 200))
            i += 1
        else:
            reqs.append((t, fresh(rng.randint(10, 60)), 200))
    return reqs


def zipfshort(seed: int, n: int = 20000) -> list[Request]:
    rng, fresh = np.random.default_rng(seed), _Fresh()
    prompts = [fresh(int(rng.integers(2, 12))) for _ in range(2000)]
    w = 1 / np.arange(1, 2001) ** 0.9
    w /= w.sum()
    reqs: list[Request] = []
    t = 0.0
    for _ in range(n):
        t += rng.exponential(100)
        reqs.append((t, prompts[int(rng.choice(2000, p=w))] + fresh(int(rng.integers(1, 4))), 100))
    return reqs


def shift(seed: int, n: int = 8000) -> list[Request]:
    rng, fresh = random.Random(seed), _Fresh()
    reqs: list[Request] = []
    t = 0.0
    for _ in range(8):
        docs = [fresh(rng.randint(5, 30)) for _ in range(300)]
        convs: dict[int, list[int]] = {}
        for _ in range(n // 8):
            t += rng.expovariate(1 / 200)
            d = docs[min(int(rng.paretovariate(1.2)) - 1, 299)]
            if rng.random() < 0.4:
                c = rng.randrange(50)
                ids = convs.get(c, d) + fresh(rng.randint(1, 4))
                convs[c] = ids
            else:
                ids = d + fresh(rng.randint(1, 5))
            reqs.append((t, ids, 150))
    return reqs


def multiround(seed: int, users: int = 60, rounds: int = 15) -> list[Request]:
    """Multi-round QA over long per-user contexts (as LMCache's multi-round QA benchmark drives an
    engine): ``users`` users, each with a shared 2-block system prompt and a context of 10-40 blocks of
    its own, ask ``rounds`` rounds of questions, every user once per round in a random order, about one
    second apart (exponential). A question is one new block; it and the answer (0-1 more blocks) join
    the user's history for the next round. Each context comes back once per round: a loop far larger
    than the cache, with a long shared head."""
    rng, fresh = random.Random(seed), _Fresh()
    system = fresh(2)
    ctx = {u: system + fresh(rng.randint(10, 40)) for u in range(users)}
    reqs: list[Request] = []
    t = 0.0
    for _ in range(rounds):
        order = list(range(users))
        rng.shuffle(order)
        for u in order:
            t += rng.expovariate(1 / 1000)
            ids = ctx[u] + fresh(1)
            reqs.append((t, ids, rng.randint(50, 500)))
            ctx[u] = ids + fresh(rng.randint(0, 1))
    return reqs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("--seeds", default="1,2")
    args = ap.parse_args()
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for s in (int(x) for x in args.seeds.split(",")):
        for name, gen in (
            ("loopscan", loopscan),
            ("zipfshort", zipfshort),
            ("shift", shift),
            ("multiround", multiround),
        ):
            write(out / f"{name}_s{s}.jsonl", gen(s))
            print(out / f"{name}_s{s}.jsonl")


if __name__ == "__main__":
    main()
