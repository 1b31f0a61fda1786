"""How much of the LRU -> Belady gap one piece of the future is worth on the ``chat`` and ``bursty`` shapes.

Belady knows every future access. On ``chat`` (``tierkv/lab/synth.py``) one draw decides much of what that
buys: after each turn a coin (``CHAT_P_CONTINUE`` = 0.6; on ``bursty`` 0.88 for a calm phase's session,
0.1 for a burst's) decides whether the session has another turn. The generator draws it after the turn,
independent of everything a cache observes (the prompt, its length, the turn number short of the cap, the
gaps, the output length), so no online policy can know it. This script replays, beside LRU, Belady and
the lab's session policy (or the shipped library):

* ``model`` -- a policy *given* the shape's session law (not learned: the continuation probability, the
  turn cap, the gap's lognormal law and dead time; on ``bursty`` each session's kind, *estimated* from the
  density of first turns around its own, :func:`session_laws`, about 2% wrong) and each turn's output
  length at the request (the library learns it only when the response completes): per session the hit
  density ``P(next turn | no turn for age a) / E[time to it | it comes, age a]`` (all of a session's
  blocks hit together, so the density is per block as well), the lowest-density sessions evicted first
  (their blocks leaf first, so what stays is a prefix), a new session's blocks not stored while every
  resident session is denser, and the shared first blocks (the system prompt) always held;
* ``coin`` -- the same ranking, also told each turn's coin (whether the session has a next turn; not
  when).

``coin - model`` is what knowing the coin is worth to this ranking. Both are heuristics (LHD's hit
density), so neither is a bound: a better online ranking may exist, and the learned session policy beats
``model`` on some rows. What the table shows is how much of the gap closes once the one unobservable draw
is known, not the most an online policy can close. Sessions are reconstructed from the trace (a turn's
whole blocks extend the previous turn's whole blocks: :func:`chat_sessions`); the script is for these
linear-session shapes only.

Run: ``python benchmarks/online_headroom.py [--shapes chat,bursty] [--seeds 7,11,13] [--sessions 1500]
[--dir /tmp/tierkv-lab-traces] [--library]`` (``--library`` adds the shipped library, ``tierkv-adaptive``:
minutes; without it the lab's ``lab-tierkv-session``, the session ranking the library's session mode
follows).
"""

from __future__ import annotations

import argparse
import bisect
import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tierkv.lab.policies import next_use_index
from tierkv.lab.replay import Trace, load_trace, make_policy, replay
from tierkv.lab.synth import (
    BURSTY_BURST,
    BURSTY_CALM,
    BURSTY_GAP_SIGMA,
    CHAT_DEAD_PER_OUT_TOKEN_S,
    CHAT_DEAD_S,
    CHAT_GAP_MEDIAN_S,
    CHAT_GAP_SIGMA,
    CHAT_MAX_TURNS,
    CHAT_P_CONTINUE,
    write_synthetic,
)


def _phi(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


@dataclass(frozen=True, slots=True)
class Law:
    """One kind of session of a shape: at most ``max_turns`` turns, each followed by another with
    probability ``p_cont``, after ``CHAT_DEAD_S + CHAT_DEAD_PER_OUT_TOKEN_S x output tokens`` plus a
    lognormal of median ``median_s`` and ``sigma``."""

    max_turns: int
    p_cont: float
    sigma: float
    median_s: float = CHAT_GAP_MEDIAN_S

    def density(self, age: float, dead: float, turn: int, p_cont: float) -> float:
        """Expected hits per block-second of a session held from ``age`` seconds after its turn ``turn``
        (1-based) until its next turn: ``P(next | none by age) / E[gap - age | gap > age, next]``, the gap
        being ``dead`` plus the lognormal; 0 after the last turn or with ``p_cont`` 0."""
        if turn >= self.max_turns or p_cont <= 0.0:
            return 0.0
        mu, sg = math.log(self.median_s), self.sigma
        mean = math.exp(mu + sg * sg / 2)
        if age <= dead:
            surv, rest = 1.0, dead - age + mean
        else:
            lx = math.log(age - dead)
            surv = _phi((mu - lx) / sg)
            if surv < 1e-12:
                return 0.0
            rest = mean * _phi((mu + sg * sg - lx) / sg) / surv - (age - dead)
        p = p_cont * surv / (p_cont * surv + 1.0 - p_cont)
        return p / max(rest, 1e-9)


CHAT = Law(CHAT_MAX_TURNS, CHAT_P_CONTINUE, CHAT_GAP_SIGMA)
CALM = Law(BURSTY_CALM[0], BURSTY_CALM[1], BURSTY_GAP_SIGMA)
BURST = Law(BURSTY_BURST[0], BURSTY_BURST[1], BURSTY_GAP_SIGMA)
#: per shape: the blocks of the shared system prompt every prompt starts with
SHARED = {"chat": 1, "bursty": 2}


def session_laws(tr: Trace, shape: str, sids: Sequence[int], turns: Sequence[int]) -> dict[int, Law]:
    """Each session's law. On ``bursty`` a session is a burst's when its first turn has at least 3 other
    first turns within a second (bursts bring ``BURSTY_BURST_RATE`` per second, calm phases 0.25): read
    from the whole trace, an advantage over a policy that must tell a burst as it comes, but an estimate
    (about 2% of sessions wrong: a calm session starting by a burst's edge, a continuation that
    :func:`chat_sessions` splits off landing in a burst)."""
    if shape == "chat":
        return dict.fromkeys(sids, CHAT)
    firsts = [tr.times[i] for i in range(len(sids)) if turns[i] == 1]
    out: dict[int, Law] = {}
    for i, s in enumerate(sids):
        if turns[i] == 1:
            t = tr.times[i]
            near = bisect.bisect_right(firsts, t + 1.0) - bisect.bisect_left(firsts, t - 1.0) - 1
            out[s] = BURST if near >= 3 else CALM
    return out


def _whole(tr: Trace, i: int) -> list[int]:
    ids = tr.blocks[i]
    return list(ids[:-1]) if tr.tail_partial[i] else list(ids)


def chat_sessions(tr: Trace, shared: int = 1) -> tuple[list[int], list[int], list[bool]]:
    """Per request: its session (numbered from 1 in order of first turn), its turn (1-based) and whether
    a later request continues the session. A request continues the session whose previous turn's whole
    blocks its own whole blocks extend (the deepest such block, chained ids being unique per prefix). A
    turn whose only whole blocks are the ``shared`` first ones (the system prompt) leaves nothing to
    extend: its next turn counts as a new session (such a turn holds no block of its own, so a cache
    loses nothing)."""
    owner: dict[int, int] = {}  # the last whole block of a session's latest turn -> session
    last: dict[int, int] = {}  # session -> its latest request
    sids: list[int] = []
    turns: list[int] = []
    cont = [False] * len(tr.blocks)
    for i in range(len(tr.blocks)):
        whole = _whole(tr, i)
        sid = next((owner.pop(b) for b in reversed(whole) if b in owner), 0)
        if sid:
            cont[last[sid]] = True
            turn = turns[last[sid]] + 1
        else:
            sid, turn = len(last) + 1, 1
        last[sid] = i
        sids.append(sid)
        turns.append(turn)
        if len(whole) > shared:
            owner[whole[-1]] = sid
    return sids, turns, cont


class SessionLawPolicy:
    """The ``model`` policy (``coin``: told each turn's coin too), see the module docstring. Replays
    ``trace``'s requests in order (it reads their output lengths and sessions by position)."""

    def __init__(self, capacity: int, trace: Trace, *, shape: str = "chat", coin: bool = False) -> None:
        self.name = "coin" if coin else "model"
        self.shared = SHARED[shape]
        if capacity <= self.shared:
            raise ValueError(f"capacity {capacity} must exceed the {self.shared} shared blocks")
        self.cap = capacity
        self.tr = trace
        self.sids, self.turns, self.cont = chat_sessions(trace, self.shared)
        self.laws = session_laws(trace, shape, self.sids, self.turns)
        self.coin = coin
        self.i = 0
        self.held: dict[int, int] = {}  # block -> its session (0: a shared first block, always held)
        # session -> (time of its latest turn, that gap's dead time, turn, P(next), its held blocks root first)
        self.sess: dict[int, tuple[float, float, int, float, list[int]]] = {}

    def request(self, ids: Sequence[int], now: float, tail_partial: bool) -> tuple[int, int]:
        held = self.held
        flags = [b in held for b in ids]
        lead = next((k for k, f in enumerate(flags) if not f), len(flags))
        i = self.i
        self.i += 1
        whole = _whole(self.tr, i)
        sid, turn = self.sids[i], self.turns[i]
        dead = CHAT_DEAD_S + CHAT_DEAD_PER_OUT_TOKEN_S * self.tr.output_lengths[i]
        p = (1.0 if self.cont[i] else 0.0) if self.coin else self.laws[sid].p_cont
        old = self.sess.pop(sid, None)
        sh = self.shared
        for b in whole[:sh]:
            held.setdefault(b, 0)
        want = [b for b in whole[sh:] if b not in held]
        if len(held) + len(want) > self.cap:
            laws = self.laws
            mine_new = laws[sid].density(0.0, dead, turn, p)
            heap = [(laws[s].density(now - t, d, k, q), s) for s, (t, d, k, q, bl) in self.sess.items() if bl]
            heapq.heapify(heap)
            while heap and len(held) + len(want) > self.cap and heap[0][0] < mine_new:
                _, s = heapq.heappop(heap)
                bl = self.sess[s][4]
                while bl and len(held) + len(want) > self.cap:
                    del held[bl.pop()]  # leaf first: what stays is a prefix
            want = want[: max(0, self.cap - len(held))]
        for b in want:
            held[b] = sid
        run: list[int] = []  # the session's held blocks: its prompt's, root first, while contiguous
        for b in whole[sh:]:
            if held.get(b) != sid:
                break  # (not held, or another session's: a branching trace, not these shapes)
            run.append(b)
        for b in whole[sh + len(run) :]:
            if held.get(b) == sid:
                del held[b]  # past a gap: unreachable
        if old is not None and len(old[4]) > len(run):
            kept = set(run)
            for b in old[4]:
                if held.get(b) == sid and b not in kept:
                    del held[b]  # (held before, not in this turn's run: listed nowhere else)
        self.sess[sid] = (now, dead, turn, p, run)
        return lead, sum(flags)


def _rate(tr: Trace, pol: object, split: float) -> float:
    try:
        raw = replay(tr, pol, split_time=split)  # type: ignore[arg-type]
    finally:
        close = getattr(pol, "close", None)
        if close is not None:
            close()
    return float(sum(raw["leads"]) / max(1, raw["accesses"]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="chat,bursty")
    ap.add_argument("--seeds", default="7,11,13")
    ap.add_argument("--sessions", type=int, default=1500, help="as benchmarks/lab_table.py's (both shapes)")
    ap.add_argument("--dir", default="/tmp/tierkv-lab-traces")
    ap.add_argument("--library", action="store_true", help="add the shipped library (tierkv-adaptive)")
    args = ap.parse_args()
    d = Path(args.dir)
    d.mkdir(parents=True, exist_ok=True)
    ours = "tierkv-adaptive" if args.library else "lab-tierkv-session"
    cols = ("lru", "belady", ours, "model", "coin")
    print(f"{'trace':<18}{'cap':>5}" + "".join(f"{c:>20}" for c in cols) + "   gap closed: ours / model / coin")
    for shape in args.shapes.split(","):
        for seed in args.seeds.split(","):
            path = d / f"{shape}-{seed}.jsonl"
            if not path.exists():
                write_synthetic(path, shape, seed=int(seed), sessions=args.sessions)
            tr = load_trace(path)
            split = tr.times[0] + 0.4 * (tr.times[-1] - tr.times[0])
            nu = next_use_index(tr.blocks)
            for frac in (0.01, 0.05, 0.10):
                cap = max(1, round(frac * tr.distinct))
                r = {c: _rate(tr, make_policy(c, cap, tr, nu), split) for c in cols[:3]}
                r["model"] = _rate(tr, SessionLawPolicy(cap, tr, shape=shape), split)
                r["coin"] = _rate(tr, SessionLawPolicy(cap, tr, shape=shape, coin=True), split)
                span = r["belady"] - r["lru"]
                gaps = [(r[c] - r["lru"]) / span if span > 0 else float("nan") for c in (ours, "model", "coin")]
                print(
                    f"{shape + ' s' + seed:<18}{round(frac * 100):>4}%"
                    + "".join(f"{r[c]:>20.4f}" for c in cols)
                    + "   "
                    + " / ".join(f"{g:.0%}" for g in gaps),
                    flush=True,
                )


if __name__ == "__main__":
    main()
