"""Eight more workload shapes, written as a check of the adaptive policy on traces it was never tuned on.

Run: ``python benchmarks/more_shapes.py OUTDIR`` (writes ``OUTDIR/<shape>_s<seed>.jsonl`` for the 8 shapes at
seeds 1 and 2, about 45,000 block accesses each), then, per trace, ``python -m tierkv replay TRACE --policies
lru,arc,s3fifo,s3fifo-2,tinylfu,tinylfu-reset,belady,tierkv-adaptive --json OUT.json`` and
``python benchmarks/replay_table.py OUT*.json`` (``benchmarks/results/2026-12-06-session21.txt``).

The shapes (written by a helper that had not read the policy or the lab's generator, in session 21):
``tot_branch`` (parallel samples and a beam from a shared prefix), ``code_edit`` (a repository context edited
near the cursor), ``fewshot_cls`` (40 long few-shot prefixes, batches of one-block queries, drifting task
popularity), ``diurnal_tenants`` (8 tenants' prompts taking turns over three compressed days),
``mapreduce`` (one-shot chunk maps with retries, a combine step, follow-up questions), ``drift_retrieval``
(300+ long documents, drifting Zipf popularity, trending newcomers), ``retry_spec`` (a quarter of the
prompts re-sent identically within seconds) and ``chat_hugedoc`` (short chats and rare huge one-shot
documents).

Each request is built as a list of block *content labels*; block ids are assigned through a prefix
trie (id = f(parent id, content label)), so the same content after a different prefix gets a
different id, and shared prefixes share ids. The last block of every prompt is partial
(input_length = n*512 - r, 0 <= r < 512) except where noted; the partial tail's content label is
private to the request unless the very same prompt is re-sent (retries, parallel samples).
"""

from __future__ import annotations

import json
import math
import os
import random
import sys

BT = 512
BUDGET = 45_000  # block accesses per trace (the library's adaptive policy is slow)


class Labels:
    def __init__(self) -> None:
        self.n = 0

    def new(self, k: int = 1) -> list:
        out = list(range(self.n, self.n + k))
        self.n += k
        return [("c", x) for x in out]


def emit(path: str, reqs: list[tuple[float, list, int, int | None]]) -> dict:
    """reqs: (t_ms, labels, output_len, tail_trim or None). Assign ids through a trie, write sorted."""
    reqs = sorted(reqs, key=lambda r: r[0])
    trie: dict = {}
    nid = 0
    acc = 0
    with open(path, "w") as fh:
        for t, labels, out, trim in reqs:
            ids = []
            parent = -1
            for lab in labels:
                key = (parent, lab)
                if key not in trie:
                    trie[key] = nid
                    nid += 1
                parent = trie[key]
                ids.append(parent)
            n_in = len(ids) * BT - (trim or 0)
            acc += len(ids)
            fh.write(
                json.dumps({"timestamp": int(t), "input_length": n_in, "output_length": int(out), "hash_ids": ids})
                + "\n"
            )
    return {"requests": len(reqs), "accesses": acc, "distinct": nid, "span_s": (reqs[-1][0] - reqs[0][0]) / 1000}


def outlen(rng: random.Random, mu: float = 5.5, sigma: float = 0.7, lo: int = 8, hi: int = 2048) -> int:
    return max(lo, min(hi, int(rng.lognormvariate(mu, sigma))))


def trim(rng: random.Random) -> int:
    return rng.randrange(BT)


def zipf_pick(rng: random.Random, weights_cum: list[float]) -> int:
    import bisect

    return bisect.bisect_left(weights_cum, rng.random() * weights_cum[-1])


def cum_weights(n: int, s: float) -> list[float]:
    c, out = 0.0, []
    for i in range(n):
        c += 1.0 / (i + 1) ** s
        out.append(c)
    return out


# 1. tree-of-thought / parallel sampling / beam search from a shared prefix
def tot_branch(rng: random.Random, L: Labels) -> list:
    systems = [L.new(3) for _ in range(3)]
    templates = [L.new(rng.randint(4, 8)) for _ in range(5)]
    reqs, acc, t = [], 0, 0.0
    while acc < BUDGET:
        t += rng.expovariate(1 / 3000)
        root = systems[rng.randrange(3)] + templates[zipf_pick(rng, cum_weights(5, 1.0))] + L.new(rng.randint(2, 5))
        n = rng.choice([4, 5, 8])
        # step 0: n parallel samples of the same prompt (identical ids, shared partial tail)
        tail = L.new(1)
        tr = trim(rng)
        for _ in range(n):
            reqs.append((t + rng.uniform(0, 30), root + tail, outlen(rng, 5.2), tr))
            acc += len(root) + 1
        beams = [root + L.new(rng.randint(1, 2)) for _ in range(2)]  # 2 best thoughts kept
        tt = t + rng.uniform(3000, 9000)
        for _depth in range(rng.randint(2, 3)):
            nxt = []
            for b in beams:
                tail = L.new(1)
                tr = trim(rng)
                for _ in range(rng.choice([3, 4])):
                    reqs.append((tt + rng.uniform(0, 50), b + tail, outlen(rng, 5.2), tr))
                    acc += len(b) + 1
                nxt.append(b + L.new(rng.randint(1, 2)))
                nxt.append(b + L.new(rng.randint(1, 2)))
            rng.shuffle(nxt)
            beams = nxt[:2]
            tt += rng.uniform(3000, 9000)
        best = beams[0]
        reqs.append((tt, best + L.new(1), outlen(rng, 6.0), trim(rng)))  # final answer
        acc += len(best) + 1
    return reqs


# 2. code completion: long repo context + a file edited in small increments near the cursor
def code_edit(rng: random.Random, L: Labels) -> list:
    n_repo = 30
    repo_ctx = [L.new(rng.randint(8, 24)) for _ in range(n_repo)]
    cw = cum_weights(n_repo, 1.0)
    reqs, acc, t = [], 0, 0.0
    sessions = []  # (next_t, repo, file blocks, remaining)
    while acc < BUDGET:
        # new sessions arrive ~ every 20 s, up to ~12 concurrent
        if not sessions or (len(sessions) < 12 and rng.random() < 0.06):
            r = zipf_pick(rng, cw)
            if rng.random() < 0.02:  # a commit lands: part of the repo context changes
                k = rng.randrange(len(repo_ctx[r]))
                repo_ctx[r] = repo_ctx[r][:k] + L.new(len(repo_ctx[r]) - k)
            sessions.append([t + rng.uniform(0, 2000), r, L.new(rng.randint(3, 10)), rng.randint(15, 80)])
        sessions.sort(key=lambda s: s[0])
        s = sessions[0]
        t = s[0]
        f = s[2]
        u = rng.random()
        if u < 0.75:  # typing at the cursor near the end: last 1-2 blocks change
            p = max(0, len(f) - rng.randint(1, 2))
        elif u < 0.9:  # cursor moved: edit somewhere in the file
            p = rng.randrange(len(f))
        else:  # appended a block of code
            p = len(f)
        f = f[:p] + L.new(max(1, len(f) - p) + (1 if p == len(f) else 0))
        if len(f) > 16:
            f = f[-16:]  # window slides (prefix changes) -- a new file prefix after the repo ctx
            f = L.new(1) + f[1:]
        s[2] = f
        prompt = repo_ctx[s[1]] + f
        reqs.append((t, prompt, outlen(rng, 3.8, 0.8, 4, 256), trim(rng)))
        acc += len(prompt)
        s[0] = t + rng.expovariate(1 / 2500) + 300
        s[3] -= 1
        if s[3] <= 0:
            sessions.pop(0)
    return reqs


# 3. few-shot classification: a few long exemplar prefixes, many short distinct queries, batchy
def fewshot_cls(rng: random.Random, L: Labels) -> list:
    n_task = 40
    tasks = [L.new(rng.randint(6, 30)) for _ in range(n_task)]
    cw = cum_weights(n_task, 1.2)
    perm = list(range(n_task))
    reqs, acc, t = [], 0, 0.0
    while acc < BUDGET:
        if rng.random() < 0.1:  # popularity of tasks reshuffles slowly
            i, j = rng.randrange(n_task), rng.randrange(n_task)
            perm[i], perm[j] = perm[j], perm[i]
        task = tasks[perm[zipf_pick(rng, cw)]]
        t += rng.expovariate(1 / 4000)
        n = int(rng.paretovariate(1.3) * 8)  # batch size heavy-tailed
        n = min(n, 200)
        tt = t
        for _ in range(n):
            tt += rng.expovariate(1 / 60)  # batch streams at ~16 req/s, interleaved with other batches
            reqs.append((tt, task + L.new(1), rng.randint(1, 6), trim(rng)))
            acc += len(task) + 1
    return reqs


# 4. diurnal tenant mix: tenants with distinct prompts take turns over 3 compressed "days"
def diurnal_tenants(rng: random.Random, L: Labels) -> list:
    n_ten = 8
    pre = [L.new(rng.randint(2, 10)) + L.new(rng.randint(0, 8)) for _ in range(n_ten)]
    kb = [[L.new(rng.randint(2, 6)) for _ in range(12)] for _ in range(n_ten)]  # per-tenant knowledge snippets
    phase = [i / n_ten + rng.uniform(-0.05, 0.05) for i in range(n_ten)]
    day = 600_000.0  # 10 minutes per "day"
    reqs, acc, t = [], 0, 0.0
    while acc < BUDGET:
        t += rng.expovariate(1 / 350)
        w = [(1 + math.cos(2 * math.pi * (t / day - phase[i]))) ** 3 + 0.05 for i in range(n_ten)]
        c = rng.random() * sum(w)
        i = 0
        while c > w[i]:
            c -= w[i]
            i += 1
        prompt = pre[i] + (kb[i][rng.randrange(12)] if rng.random() < 0.5 else [])
        user = prompt + L.new(rng.randint(1, 3))
        tr = trim(rng)
        reqs.append((t, user + L.new(1), outlen(rng), tr))
        acc += len(user) + 1
        tt = t
        while rng.random() < 0.4:  # follow-up turns of the same user
            tt += rng.uniform(15_000, 60_000)
            user = user + L.new(rng.randint(1, 2))
            reqs.append((tt, user + L.new(1), outlen(rng), trim(rng)))
            acc += len(user) + 1
    return reqs


# 5. map-reduce summarisation: one-shot chunk maps, a combine re-reading summaries, verify + follow-ups
def mapreduce(rng: random.Random, L: Labels) -> list:
    map_instr = [L.new(2) for _ in range(2)]
    red_instr = L.new(2)
    reqs, acc, t = [], 0, 0.0
    while acc < BUDGET:
        t += rng.expovariate(1 / 25_000)
        n = rng.randint(8, 30)
        mi = map_instr[rng.randrange(2)]
        ends = []
        for _c in range(n):
            tc = t + rng.uniform(0, 1500)
            p = mi + L.new(rng.randint(3, 6))
            tr = trim(rng)
            o = outlen(rng, 5.6, 0.3, 100, 600)
            reqs.append((tc, p, o, tr))
            acc += len(p)
            e = tc + 300 + o * 25
            if rng.random() < 0.05:  # timeout -> identical retry
                reqs.append((tc + 30_000, p, o, tr))
                acc += len(p)
                e = tc + 30_000 + o * 25
            ends.append(e)
        summ = L.new(math.ceil(n * 320 / BT))
        tr_ = t0 = max(ends) + 200
        comb = red_instr + summ
        reqs.append((t0, comb + L.new(1), 700, trim(rng)))
        acc += len(comb) + 1
        draft = L.new(2)
        t1 = t0 + 700 * 25 + 300
        reqs.append((t1, comb + draft + L.new(1), 300, trim(rng)))  # verify pass re-reads summaries + draft
        acc += len(comb) + 3
        conv = comb + draft
        tq = t1
        for _ in range(rng.choice([0, 0, 1, 2, 3, 5])):  # user follow-up questions on the summary
            tq += rng.uniform(20_000, 240_000)
            conv = conv + L.new(1)
            reqs.append((tq, conv + L.new(1), outlen(rng), trim(rng)))
            acc += len(conv) + 1
        del tr_
    return reqs


# 6. long-context retrieval, heavy-tailed document popularity that drifts (trending docs)
def drift_retrieval(rng: random.Random, L: Labels) -> list:
    sysp = L.new(1)
    docs = [L.new(max(4, min(48, int(rng.lognormvariate(2.8, 0.5))))) for _ in range(300)]
    rank = list(range(len(docs)))
    cw = cum_weights(len(docs), 1.1)
    reqs, acc, t = [], 0, 0.0
    while acc < BUDGET:
        t += rng.expovariate(1 / 600)
        for _ in range(2):  # gradual drift: adjacent swaps
            i = rng.randrange(len(rank) - 1)
            rank[i], rank[i + 1] = rank[i + 1], rank[i]
        if rng.random() < 0.01:  # a new trending document enters near the top
            docs.append(L.new(max(4, min(48, int(rng.lognormvariate(2.8, 0.5))))))
            rank.insert(rng.randrange(5), len(docs) - 1)
            rank.pop()
        d = docs[rank[zipf_pick(rng, cw)]]
        p = sysp + d
        if rng.random() < 0.2:  # two documents in context
            p = p + docs[rank[zipf_pick(rng, cw)]][: rng.randint(4, 12)]
        p = p + L.new(1)
        reqs.append((t, p, outlen(rng, 5.0), trim(rng)))
        acc += len(p)
    return reqs


# 7. agentic / speculative retries: identical prompt re-sent after a short delay, amid one-shot load
def retry_spec(rng: random.Random, L: Labels) -> list:
    agents = [L.new(rng.randint(3, 8)) for _ in range(4)]
    reqs, acc, t = [], 0, 0.0
    while acc < BUDGET:
        t += rng.expovariate(1 / 500)
        p = agents[rng.randrange(4)] + L.new(max(1, int(rng.lognormvariate(2.2, 0.7))))
        tr = trim(rng)
        reqs.append((t, p, outlen(rng), tr))
        acc += len(p)
        u = rng.random()
        if u < 0.25:  # client timeout / speculative duplicate, 1-3 re-sends
            tt = t
            for _ in range(rng.choice([1, 1, 2, 3])):
                tt += rng.uniform(200, 4000)
                reqs.append((tt, p, outlen(rng), tr))
                acc += len(p)
        elif u < 0.35:  # tool-call self-repair: re-sent later with an appended error message
            tt = t + rng.uniform(2000, 20_000)
            q = p + L.new(1)
            reqs.append((tt, q, outlen(rng), trim(rng)))
            acc += len(q)
    return reqs


# 8. short chat + occasional huge one-shot documents (scan pollution), some doc follow-ups
def chat_hugedoc(rng: random.Random, L: Labels) -> list:
    sysp = [L.new(2), L.new(4)]
    reqs, acc, t = [], 0, 0.0
    while acc < BUDGET:
        t += rng.expovariate(1 / 900)
        if rng.random() < 0.03:
            doc = sysp[0] + L.new(rng.randint(60, 140))
            reqs.append((t, doc + L.new(1), outlen(rng, 6.0), trim(rng)))
            acc += len(doc) + 1
            if rng.random() < 0.3:
                tt = t + rng.uniform(30_000, 120_000)
                reqs.append((tt, doc + L.new(1), outlen(rng), trim(rng)))
                acc += len(doc) + 1
            continue
        conv = sysp[rng.randrange(2)]
        tt = t
        for _ in range(rng.randint(1, 8)):
            conv = conv + L.new(rng.randint(1, 2))
            reqs.append((tt, conv + L.new(1), outlen(rng, 5.0), trim(rng)))
            acc += len(conv) + 1
            conv = conv + L.new(1)  # the answer becomes part of the next turn
            tt += rng.uniform(10_000, 90_000)
    return reqs


SHAPES = {
    f.__name__: f
    for f in (tot_branch, code_edit, fewshot_cls, diurnal_tenants, mapreduce, drift_retrieval, retry_spec, chat_hugedoc)
}


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: python benchmarks/more_shapes.py OUTDIR")
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for name, fn in SHAPES.items():
        for seed in (1, 2):
            rng = random.Random(f"{name}-{seed}")
            reqs = fn(rng, Labels())
            st = emit(os.path.join(out, f"{name}_s{seed}.jsonl"), reqs)
            print(f"{name}_s{seed}: {st}")


if __name__ == "__main__":
    main()
