"""benchmarks/online_headroom.py: the chat shape's sessions are reconstructed exactly from the trace, and
the session-law policies keep a prefix cache of their capacity."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tierkv.lab.replay import load_trace, replay
from tierkv.lab.synth import CHAT_MAX_TURNS, write_synthetic

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

bench: Any = importlib.import_module("online_headroom")


def _write(path: Path, rows: list[tuple[float, int, list[int]]]) -> None:
    path.write_text(
        "".join(
            json.dumps({"timestamp": t, "input_length": n, "output_length": 100, "hash_ids": ids}) + "\n"
            for t, n, ids in rows
        )
    )


def test_chat_sessions_are_reconstructed_by_the_whole_blocks_a_turn_extends(tmp_path: Path) -> None:
    """Two sessions on a shared first block, interleaved: a turn extends its session's previous whole
    blocks (its partial tail replaced); a turn with no whole block past the shared one cannot be told
    from a new session."""
    path = tmp_path / "t.jsonl"
    _write(
        path,
        [
            (0, 1100, [0, 1, 2]),  # session 1: whole blocks 0, 1 (2 is a partial tail)
            (1, 1100, [0, 3, 4]),  # session 2
            (2, 2100, [0, 1, 5, 6, 7]),  # session 1, turn 2: extends 0, 1
            (3, 1600, [0, 3, 8, 9]),  # session 2, turn 2
            (4, 600, [0, 10]),  # session 3: only the shared block whole
            (5, 1200, [0, 11, 12]),  # its next turn: looks new (session 4)
            (6, 2600, [0, 1, 5, 6, 13, 14]),  # session 1, turn 3
        ],
    )
    sids, turns, cont = bench.chat_sessions(load_trace(path))
    assert sids == [1, 2, 1, 2, 3, 4, 1]
    assert turns == [1, 1, 2, 2, 1, 1, 3]
    assert cont == [True, True, True, False, False, False, False]


def test_generated_chat_sessions_are_reconstructed(tmp_path: Path) -> None:
    """200 generated sessions come back as 200, plus one per turn that followed a turn with no whole block
    of its own; each numbered turn after turn from 1 (at most the shape's cap), and exactly the turns
    followed by another are marked continued."""
    path = tmp_path / "chat.jsonl"
    n = write_synthetic(path, "chat", seed=5, sessions=200)
    tr = load_trace(path)
    sids, turns, cont = bench.chat_sessions(tr)
    short = sum(1 for i in range(n) if len(bench._whole(tr, i)) <= 1)
    assert len(sids) == n and 200 <= max(sids) <= 200 + short and set(sids) == set(range(1, max(sids) + 1))
    last: dict[int, int] = {}
    for i, (s, t) in enumerate(zip(sids, turns, strict=True)):
        assert t == (turns[last[s]] + 1 if s in last else 1)
        assert 1 <= t <= CHAT_MAX_TURNS
        if s in last:
            assert cont[last[s]]
        last[s] = i
    assert sum(cont) == n - max(sids) and not any(cont[i] for i in last.values())


def test_the_session_law_policies_hold_a_prefix_cache_of_their_capacity(tmp_path: Path) -> None:
    """Replayed request by request, neither policy holds more blocks than its capacity, every session's held
    blocks are a prefix of its latest prompt, and a request's leading hits are counted before it changes
    anything (its first request hits nothing)."""
    path = tmp_path / "chat.jsonl"
    write_synthetic(path, "chat", seed=6, sessions=300)
    tr = load_trace(path)
    cap = max(4, round(0.05 * tr.distinct))
    for coin in (False, True):
        pol = bench.SessionLawPolicy(cap, tr, coin=coin)
        for i, ids in enumerate(tr.blocks):
            lead, hits = pol.request(ids, tr.times[i], tr.tail_partial[i])
            assert 0 <= lead <= hits <= len(ids)
            if i == 0:
                assert (lead, hits) == (0, 0)
            assert len(pol.held) <= cap
            run = pol.sess[pol.sids[i]][4]
            whole = bench._whole(tr, i)
            assert run == whole[1 : 1 + len(run)]
        assert sum(replay(tr, bench.SessionLawPolicy(cap, tr, coin=coin), 0.0)["leads"]) > 0


@pytest.mark.parametrize("seed", [1, 2, 5])
def test_bursty_sessions_get_the_law_of_their_phase(tmp_path: Path, seed: int) -> None:
    """On ``bursty`` a session whose first turn came in a burst gets the burst's law (at most 4 turns):
    both kinds occur, and few sessions with more turns than a burst's are taken for one (the kind is
    estimated from the density of first turns: one starting at a burst's edge can be)."""
    from tierkv.lab.synth import BURSTY_BURST

    path = tmp_path / "bursty.jsonl"
    write_synthetic(path, "bursty", seed=seed, sessions=600)
    tr = load_trace(path)
    sids, turns, _ = bench.chat_sessions(tr, bench.SHARED["bursty"])
    laws = bench.session_laws(tr, "bursty", sids, turns)
    most: dict[int, int] = {}
    for s, t in zip(sids, turns, strict=True):
        most[s] = max(most.get(s, 0), t)
    assert set(laws) == set(most)
    burst = [s for s, law in laws.items() if law is bench.BURST]
    long = [s for s in most if most[s] > BURSTY_BURST[0]]  # calm sessions, certainly
    assert burst and len(burst) < len(laws) and long
    wrong = sum(1 for s in long if laws[s] is bench.BURST)
    assert wrong <= 0.10 * len(long), (wrong, len(long))  # (1-7% on seeds 1-12)
