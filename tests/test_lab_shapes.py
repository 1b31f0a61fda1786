"""The synthetic generator's workload shapes (rag, agent_tools, bursty, mixture, longdoc, sysprompt) and the replay's
per-shape view."""

from __future__ import annotations

import hashlib
import json
import statistics
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import pytest

from tierkv.lab import synth
from tierkv.lab.replay import load_trace, main
from tierkv.lab.synth import SHAPES, synthetic_requests, write_synthetic

NEW = ("rag", "agent_tools", "bursty", "mixture", "longdoc", "sysprompt")
SUB = {"mixture": {"chat", "agent", "noise", "rag", "agent_tools", "bursty"}, "mixed": {"chat", "agent"}}


def ids_of(rows: Sequence[dict[str, Any]]) -> list[list[int]]:
    return [list(r["hash_ids"]) for r in rows]


def seen_leads(reqs: list[list[int]]) -> list[int]:
    """Per request, the length of its leading run of blocks seen in an earlier request."""
    seen: set[int] = set()
    out = []
    for r in reqs:
        lead = 0
        while lead < len(r) and r[lead] in seen:
            lead += 1
        out.append(lead)
        seen.update(r)
    return out


def stack_distances(reqs: list[list[int]]) -> list[int]:
    """LRU stack distance of every reuse, in access order (:func:`tierkv.lab.synth.stack_distances`)."""
    return [d for r in synth.stack_distances(reqs) for d in r]


def test_stack_distance_helper() -> None:
    assert stack_distances([[1, 2, 3], [1], [3], [3]]) == [2, 1, 0]


@pytest.mark.parametrize("shape", NEW)
def test_new_shapes_deterministic_and_seeded(shape: str) -> None:
    a = synthetic_requests(shape, seed=3, sessions=200)
    assert a == synthetic_requests(shape, seed=3, sessions=200)
    b = synthetic_requests(shape, seed=4, sessions=200)
    assert ids_of(a) != ids_of(b) and [r["timestamp"] for r in a] != [r["timestamp"] for r in b]
    assert [r["timestamp"] for r in a] == sorted(r["timestamp"] for r in a)  # type: ignore[type-var]


@pytest.mark.parametrize("shape", SHAPES)
def test_rows_name_their_shape_and_ids_are_chained(shape: str) -> None:
    rows = synthetic_requests(shape, seed=5, sessions=150)
    shapes = {r["shape"] for r in rows}
    assert shapes == SUB.get(shape, {shape})
    parent: dict[int, tuple[int, int | None]] = {}  # id -> (position, parent id)
    for r in rows:
        ids = list(r["hash_ids"])  # type: ignore[call-overload]
        assert len(ids) == -(-int(r["input_length"]) // 512)  # type: ignore[call-overload]
        for p, b in enumerate(ids):
            got = (p, ids[p - 1] if p else None)
            assert parent.setdefault(b, got) == got, (shape, b)  # one id = one prefix


#: sha256 (first 16 hex digits) of ``json.dumps(synthetic_requests(shape, 7, 200))`` as the first version of
#: the generator wrote it (before ``shape`` existed): results files depend on these traces
FIRST_VERSION = {
    "chat": "35de23b7a7f9fdff",
    "agent": "3613ae0a3b24ec27",
    "mixed": "e8dd8754816615e8",
    "noise": "a5da3c40ec092a95",
}


@pytest.mark.parametrize("shape", sorted(FIRST_VERSION))
def test_existing_shapes_unchanged_but_for_the_shape_field(shape: str) -> None:
    rows = synthetic_requests(shape, seed=7, sessions=200)
    for r in rows:
        del r["shape"]
    assert hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16] == FIRST_VERSION[shape]


def test_rag_reuses_documents_at_long_distances_and_drifts() -> None:
    rows = synthetic_requests("rag", seed=3, sessions=1800)
    reqs = ids_of(rows)
    assert all(len(r) >= 10 for r in reqs)  # system prompt + a document of 8-40 blocks + the question
    dist = stack_distances(reqs)
    assert statistics.median(dist) >= 4 * statistics.median(len(r) for r in reqs)
    # the document of a request: its second block (the first after the shared system prompt); the phases:
    # sixths of the trace (sessions arrive at a steady rate)
    n = len(reqs)

    def docs(lo: float, hi: float) -> list[int]:
        return [r[1] for r in reqs[int(lo * n / 6) : int(hi * n / 6)]]

    assert 30 <= len(Counter(docs(0, 6))) <= 40  # a corpus of a few dozen documents
    same, later = [], []
    for k in range(5):
        top = {d for d, _ in Counter(docs(k, k + 0.5)).most_common(5)}
        rest_of_phase, next_phase = docs(k + 0.5, k + 1), docs(k + 1.5, k + 2)
        same.append(sum(d in top for d in rest_of_phase) / len(rest_of_phase))
        later.append(sum(d in top for d in next_phase) / len(next_phase))
    # a phase's top documents keep their popularity within the phase and lose it in the next one
    assert sum(same) / 5 >= 2 * sum(later) / 5 and sum(later) / 5 <= 0.25, (same, later)


def fork_nodes(reqs: list[list[int]], min_pos: int) -> int:
    """Blocks at ``min_pos`` or deeper with two children that both continue (not a request's last block)."""
    cont: dict[int, set[int]] = defaultdict(set)
    for r in reqs:
        for p in range(min_pos, len(r) - 2):
            cont[r[p]].add(r[p + 1])
    return sum(1 for v in cont.values() if len(v) >= 2)


def test_agent_tools_forks_and_heavy_tailed_tool_outputs() -> None:
    sessions = 100
    reqs = ids_of(synthetic_requests("agent_tools", seed=3, sessions=sessions))
    # deeper than the shared system + tools prefixes (at most 8 blocks), two continuing branches share a
    # block only inside one session: a fork (a linear session only ever replaces its partial tail)
    assert fork_nodes(reqs, 8) >= 0.2 * sessions
    assert fork_nodes(ids_of(synthetic_requests("chat", seed=3, sessions=sessions)), 8) == 0  # the check is sound
    # blocks a request brings that no earlier request had: mostly the action alone, sometimes a huge output
    new = sorted(len(r) - lead for r, lead in zip(reqs, seen_leads(reqs), strict=True))
    assert statistics.median(new) <= 2
    assert sum(1 for n in new if n >= 8) >= 0.01 * len(new) and new[-1] >= 24
    flat = ids_of(synthetic_requests("agent", seed=3, sessions=sessions))
    assert max(len(r) - lead for r, lead in zip(flat, seen_leads(flat), strict=True)) < new[-1]


def test_bursty_bursts_are_first_turns() -> None:
    rows = synthetic_requests("bursty", seed=3, sessions=1200)
    reqs = ids_of(rows)
    first = [lead <= 2 for lead in seen_leads(reqs)]  # nothing reused beyond the 2-block system prompt
    windows: dict[int, list[bool]] = defaultdict(list)
    for row, f in zip(rows, first, strict=True):
        windows[int(row["timestamp"]) // 10_000].append(f)  # type: ignore[call-overload]
    burst = [f for w in windows.values() if len(w) >= 50 for f in w]  # >= 5 requests/s over 10 s
    calm = [f for w in windows.values() if len(w) < 50 for f in w]
    assert len(burst) >= 0.2 * len(rows) and calm
    assert sum(burst) / len(burst) >= 0.75 and sum(calm) / len(calm) <= 0.3
    assert max(len(r) for r in reqs) >= 20  # long-lived sessions grow long contexts
    # no bursts in the chat shape (same window rule)
    chat = synthetic_requests("chat", seed=3, sessions=1200)
    per_window = Counter(int(r["timestamp"]) // 10_000 for r in chat)  # type: ignore[call-overload]
    assert max(per_window.values()) < 50


def test_mixture_interleaves_every_shape() -> None:
    rows = synthetic_requests("mixture", seed=3, sessions=1200)
    times = [int(r["timestamp"]) for r in rows]  # type: ignore[call-overload]
    mid = times[0] + (times[-1] - times[0]) / 2
    for half in (
        [r for r, t in zip(rows, times, strict=True) if t < mid],
        [r for r, t in zip(rows, times, strict=True) if t >= mid],
    ):
        assert {r["shape"] for r in half} == SUB["mixture"]  # all six run through the whole window
    # shapes do not share blocks: each draws its own prefixes
    owner: dict[int, str] = {}
    for r in rows:
        for b in r["hash_ids"]:  # type: ignore[union-attr]
            assert owner.setdefault(b, str(r["shape"])) == r["shape"]


def test_longdoc_phases_prompt_lengths_and_reuse_distances() -> None:
    rows = synthetic_requests("longdoc", seed=3, sessions=3000)
    reqs = ids_of(rows)
    times = [cast(int, r["timestamp"]) for r in rows]
    t40 = times[0] + 0.4 * (times[-1] - times[0])
    dist = stack_distances_per_request(reqs)
    seen: set[int] = set()
    reused = {False: [0, 0], True: [0, 0]}  # phase (after 40%?) -> [accesses of seen blocks, accesses]
    for r, t in zip(reqs, times, strict=True):
        c = reused[t >= t40]
        c[0] += sum(b in seen for b in r)
        c[1] += len(r)
        seen.update(r)
    before, after = reused[False][0] / reused[False][1], reused[True][0] / reused[True][1]
    assert before <= 0.12 and after >= 0.6, (before, after)  # little reuse, then a lot
    late = [i for i, t in enumerate(times) if t >= t40]
    assert 13_500 <= statistics.median(cast(int, rows[i]["input_length"]) for i in late) <= 15_500
    d = sorted(x for i in late for x in dist[i])
    assert len(d) >= 0.6 * sum(len(reqs[i]) for i in late)
    assert d[len(d) // 20] >= 4000 and d[-len(d) // 20] <= 14_000  # 5th and 95th percentiles, in blocks
    assert sum(4000 <= x <= 14_000 for x in d) >= 0.95 * len(d)
    # a reuse is a whole document (its questions are distinct): a request reuses all its blocks but the last or none
    leads = seen_leads(reqs)
    assert all(lead in (0, len(r) - 1) for r, lead in zip(reqs, leads, strict=True))
    asked = Counter(r[0] for r in reqs)  # the document of a request: its first block
    first = {r[0]: t for r, t in zip(reversed(reqs), reversed(times), strict=True)}
    assert max(n for doc, n in asked.items() if first[doc] < t40) <= 2  # one-offs (10% asked twice) first
    assert 6 <= max(asked.values()) <= 8 and statistics.median(n for doc, n in asked.items() if first[doc] >= t40) >= 3


def test_sysprompt_reuses_only_shared_prompts_with_skewed_popularity() -> None:
    rows = synthetic_requests("sysprompt", seed=3, sessions=6000)
    reqs = ids_of(rows)
    times = [cast(int, r["timestamp"]) for r in rows]
    assert len(reqs) == 6000 and 8.5 <= len(reqs) / ((times[-1] - times[0]) / 1000) <= 11.5  # ten per second
    uses = Counter(b for r in reqs for b in r)
    prompt_of = Counter(r[0] for r in reqs)  # a request's prompt: its first block
    leads = seen_leads(reqs)
    for r, lead in zip(reqs, leads, strict=True):
        n = len(r)
        while n and uses[r[n - 1]] == 1:
            n -= 1
        shared = r[:n]  # what another request also uses: the prompt, when it is asked again
        assert all(uses[b] > 1 for b in shared) and 3 <= len(r) <= 15
        if shared:  # a one-shot message of 1-3 blocks after a 2-12 block prompt
            assert 1 <= len(r) - n <= 3 and 2 <= n <= 12, r
        assert lead in (0, n)  # a reuse is the whole shared prompt, never the message
    # Zipf(0.9) over 2,000 prompts: the 20 most asked carry about a third of the requests, and most
    # prompts seen are asked once or twice (measured: 0.35; 900 of 1,349)
    top = sum(n for _, n in prompt_of.most_common(20)) / len(reqs)
    assert 0.25 <= top <= 0.45, top
    assert sum(1 for n in prompt_of.values() if n <= 2) >= 500


def stack_distances_per_request(reqs: list[list[int]]) -> list[list[int]]:
    """:func:`stack_distances`, grouped by the request that makes each reuse."""
    return synth.stack_distances(reqs)


def replay_json(tmp_path: Path, trace: Path, name: str, *extra: str) -> dict[str, Any]:
    out = tmp_path / f"{name}.json"
    args = [str(trace), "--capacity", "2%,10%", "--policies", "lru,belady,lab-tierkv", "--no-progress"]
    assert main([*args, *extra, "--json", str(out)]) == 0
    doc: dict[str, Any] = json.loads(out.read_text())
    return doc


def test_per_shape_metrics_add_up_and_vanish_without_shape(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "mix.jsonl"
    assert synth.main([str(path), "--shape", "mixture", "--seed", "3", "--sessions", "300"]) == 0
    capsys.readouterr()
    doc = replay_json(tmp_path, path, "mix", "--tiers", "hbm=2%,dram=8%")
    printed = capsys.readouterr().out
    assert "per shape: prefix hit rate" in printed
    rows = doc["results"]
    assert len(rows) == 3 * 3
    for r in rows:
        ps = r["per_shape"]
        assert set(ps) <= SUB["mixture"] and len(ps) >= 4
        acc = sum(v["accesses"] for v in ps.values())
        assert acc == r["measured_accesses"] and sum(v["requests"] for v in ps.values()) == r["measured_requests"]
        for key in ("prefix_hit_rate", "block_hit_rate"):
            assert sum(v[key] * v["accesses"] for v in ps.values()) / acc == pytest.approx(r[key], abs=1e-12)
        for v in ps.values():
            assert 0.0 <= v["prefix_hit_rate"] <= v["block_hit_rate"] <= 1.0
        assert f"\n{next(iter(ps)):<16}" in printed or "tiers" in r
    # the same trace without the field: no per-shape view, same figures otherwise
    plain = tmp_path / "plain.jsonl"
    with open(path) as src, open(plain, "w") as dst:
        for line in src:
            rec = json.loads(line)
            del rec["shape"]
            dst.write(json.dumps(rec) + "\n")
    doc2 = replay_json(tmp_path, plain, "plain", "--tiers", "hbm=2%,dram=8%")
    assert "per shape" not in capsys.readouterr().out
    timing = {"per_shape", "accesses_per_s", "accesses_per_cpu_s"}
    assert all("per_shape" not in r for r in doc2["results"])
    assert [{k: v for k, v in r.items() if k not in timing} for r in rows] == [
        {k: v for k, v in r.items() if k not in timing} for r in doc2["results"]
    ]


def test_single_shape_trace_has_per_shape_rows_but_no_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "rag.jsonl"
    write_synthetic(path, "rag", seed=3, sessions=150)
    doc = replay_json(tmp_path, path, "rag")
    assert "per shape" not in capsys.readouterr().out
    for r in doc["results"]:
        assert set(r["per_shape"]) == {"rag"}
        assert r["per_shape"]["rag"]["prefix_hit_rate"] == pytest.approx(r["prefix_hit_rate"])


def test_loader_shapes(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    recs = [
        {"timestamp": 2, "input_length": 512, "output_length": 5, "hash_ids": [0], "shape": "b"},
        {"timestamp": 1, "input_length": 512, "output_length": 5, "hash_ids": [1]},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert load_trace(path).shapes == ["-", "b"]  # sorted by time; a row without shape counts as "-"
    recs[0]["shape"] = 3
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    with pytest.raises(ValueError, match="shape"):
        load_trace(path)
    del recs[0]["shape"]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert load_trace(path).shapes == []
