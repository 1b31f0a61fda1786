from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierkv.lab.policies import (
    ArcPolicy,
    BeladyPolicy,
    LfuPolicy,
    LruPolicy,
    OptGen,
    S3FifoPolicy,
    TierKVOptions,
    TierKVPolicy,
    TinyLfuPolicy,
    next_use_index,
)
from tierkv.lab.replay import (
    ABLATIONS,
    POLICIES,
    add_gap_closed,
    load_trace,
    main,
    make_policy,
    replay,
    truncate,
)
from tierkv.lab.synth import SHAPES, synthetic_requests, write_synthetic

DATA = Path(__file__).parent / "data" / "traces"
SLICE = DATA / "mooncake_conversation_slice300.jsonl"


def run(policy: object, reqs: Sequence[Sequence[int]]) -> list[tuple[int, int]]:
    return [policy.request(r, float(i), False) for i, r in enumerate(reqs)]  # type: ignore[attr-defined]


def singles(seq: Sequence[int]) -> list[list[int]]:
    return [[b] for b in seq]


SEQ = [1, 2, 3, 1, 4, 1, 2, 5, 1, 2, 3, 4]


def test_lru_known_hits() -> None:
    # capacity 2: hits only on the 1 at index 5 (1,4 resident after [1,4])... computed by hand
    out = run(LruPolicy(2), singles([1, 2, 1, 3, 2, 1]))
    assert [h for _, h in out] == [0, 0, 1, 0, 0, 0]
    out = run(LruPolicy(3), singles([1, 2, 1, 3, 2, 1]))
    assert [h for _, h in out] == [0, 0, 1, 0, 1, 1]


def test_belady_optimal_on_known_sequence() -> None:
    # textbook: capacity 3 -> MIN has 5 misses on 12 refs of the classic string below
    seq = [7, 0, 1, 2, 0, 3, 0, 4, 2, 3, 0, 3]
    reqs = singles(seq)
    hits = sum(h for _, h in run(BeladyPolicy(3, next_use_index(reqs)), reqs))
    assert hits == 12 - 6  # 4 compulsory misses (7,0,1,2) + 2 more (3, 4); bypass keeps the rest


def brute_force_opt(seq: list[int], cap: int) -> int:
    """Max hits with bypass allowed, by exhaustive search over eviction choices (tiny inputs)."""
    best = 0

    def go(i: int, cache: frozenset[int], hits: int) -> None:
        nonlocal best
        if i == len(seq):
            best = max(best, hits)
            return
        b = seq[i]
        if b in cache:
            go(i + 1, cache, hits + 1)
            return
        go(i + 1, cache, hits)  # bypass
        if len(cache) < cap:
            go(i + 1, cache | {b}, hits)
        else:
            for v in cache:
                go(i + 1, (cache - {v}) | {b}, hits)

    go(0, frozenset(), 0)
    return best


@settings(deadline=None, max_examples=40)
@given(st.lists(st.integers(0, 4), min_size=1, max_size=9), st.integers(1, 3))
def test_belady_matches_brute_force(seq: list[int], cap: int) -> None:
    reqs = singles(seq)
    hits = sum(h for _, h in run(BeladyPolicy(cap, next_use_index(reqs)), reqs))
    assert hits == brute_force_opt(seq, cap)


@settings(deadline=None, max_examples=30)
@given(st.lists(st.lists(st.integers(0, 30), min_size=1, max_size=6), min_size=1, max_size=40), st.integers(1, 12))
def test_every_policy_is_sane_and_belady_bounds_block_hits(reqs: list[list[int]], cap: int) -> None:
    bel = sum(h for _, h in run(BeladyPolicy(cap, next_use_index(reqs)), reqs))
    for pol in (
        LruPolicy(cap),
        LfuPolicy(cap),
        ArcPolicy(cap),
        S3FifoPolicy(cap),
        S3FifoPolicy(cap, move_at=2),
        TinyLfuPolicy(cap),
        TinyLfuPolicy(cap, restart=True),
        TierKVPolicy(cap),
    ):
        out = run(pol, reqs)
        for (lead, hits), r in zip(out, reqs, strict=True):
            assert 0 <= lead <= hits <= len(r)
        if len(set(b for r in reqs for b in r)) == sum(len(r) for r in reqs):
            assert sum(h for _, h in out) == 0
        assert sum(h for _, h in out) <= bel or not all(len(set(r)) == len(r) for r in reqs)


def test_policies_never_exceed_capacity() -> None:
    rnd = random.Random(1)
    reqs = [[rnd.randrange(200) for _ in range(rnd.randrange(1, 8))] for _ in range(500)]
    for cap in (1, 5, 37):
        for pol in (
            LruPolicy(cap),
            LfuPolicy(cap),
            S3FifoPolicy(cap),
            S3FifoPolicy(cap, move_at=2),
            TierKVPolicy(cap),
            BeladyPolicy(cap, next_use_index(reqs)),
        ):
            run(pol, reqs)
            assert len(pol.cache if hasattr(pol, "cache") else pol.freq) <= cap  # type: ignore[union-attr]
        arc = ArcPolicy(cap)
        run(arc, reqs)
        assert len(arc.t1) + len(arc.t2) <= cap
        for restart in (False, True):
            tl = TinyLfuPolicy(cap, restart=restart)
            run(tl, reqs)
            assert len(tl.win) + len(tl.prob) + len(tl.prot) <= cap


def test_tinylfu_variants_differ_only_in_the_count_a_reset_leaves() -> None:
    """``tinylfu`` halves the count of accesses at a reset (the paper, Caffeine): the next reset comes
    after half a window; ``tinylfu-reset`` restarts it from zero: after a whole one."""
    for restart, resets in ((False, [10, 15, 20, 25]), (True, [10, 20])):
        tl = TinyLfuPolicy(1, restart=restart)  # a window of 10 accesses
        assert tl.name == ("tinylfu-reset" if restart else "tinylfu")
        seen = []
        for i in range(25):
            tl.request([7], float(i), False)
            seen.append(tl.seen)
            if i == 9:
                assert tl.counts == {7: 5}  # both halve the counts alike
        assert [i + 1 for i in range(1, 25) if seen[i] < seen[i - 1]] == resets
        assert make_policy(tl.name, 1, load_trace(SLICE)).name == tl.name  # type: ignore[attr-defined]


def test_s3fifo_2_needs_two_accesses_in_the_small_fifo_to_reach_the_main_one() -> None:
    for move_at in (1, 2):
        s3 = S3FifoPolicy(10, move_at=move_at)  # a small FIFO of 1
        run(s3, singles([1, 1, 2]))  # 1 accessed once more in the small FIFO, then pushed out by 2
        assert (1 in s3.main) == (move_at == 1)
        assert (1 in s3.ghost) == (move_at == 2)
        s3 = S3FifoPolicy(10, move_at=move_at)
        run(s3, singles([1, 1, 1, 2]))  # accessed twice more: both move it to the main FIFO
        assert 1 in s3.main and 1 not in s3.ghost
    with pytest.raises(ValueError, match="move_at"):
        S3FifoPolicy(10, move_at=4)
    assert make_policy("s3fifo-2", 10, load_trace(SLICE)).name == "s3fifo-2"  # type: ignore[attr-defined]


def test_prefix_hits_count_only_the_leading_run() -> None:
    lru = LruPolicy(10)
    lru.request([1, 2, 3], 0.0, False)
    lru.cache.pop(1)
    assert lru.request([1, 2, 3], 1.0, False) == (0, 2)


def test_lfu_keeps_frequent() -> None:
    out = run(LfuPolicy(2), singles([1, 1, 1, 2, 3, 1]))
    assert out[-1][1] == 1


def test_tierkv_keeps_shared_prefix() -> None:
    # block 0 is a shared system prompt, every other request is unique: tierkv must keep hitting block 0
    reqs = [[0, 1000 + 10 * i, 1001 + 10 * i, 1002 + 10 * i] for i in range(300)]
    out = run(TierKVPolicy(4), reqs)
    assert sum(lead for lead, _ in out[100:]) >= 190


def test_optgen_matches_belady_on_unit_requests() -> None:
    rnd = random.Random(3)
    seq = [rnd.randrange(20) for _ in range(400)]
    reqs = singles(seq)
    g = OptGen(5, window=10_000)
    labels = sum(sum(g.label(r)) for r in reqs)
    bel = sum(h for _, h in run(BeladyPolicy(5, next_use_index(reqs)), reqs))
    assert labels == bel


def test_ablation_options() -> None:
    assert set(ABLATIONS) >= {"lab-tierkv-no-predictor", "lab-tierkv-no-prefix-tree", "lab-tierkv-no-bypass"}
    assert not TierKVOptions(predictor=False).predictor


@pytest.mark.slow  # ~20 s on two cores
def test_load_trace_and_replay_slice() -> None:
    tr = load_trace(SLICE)
    assert len(tr.blocks) == 300 and tr.accesses == sum(len(b) for b in tr.blocks)
    tr2 = load_trace(SLICE, block_tokens=1024)
    assert tr2.accesses < tr.accesses
    for name in (*POLICIES, *ABLATIONS):
        pol = make_policy(name, 50, tr)
        raw = replay(tr, pol, split_time=tr.times[120])
        assert raw["accesses"] > 0 and 0 <= raw["block_hits"] <= raw["accesses"]
    with pytest.raises(ValueError):
        load_trace(SLICE, block_tokens=100)
    with pytest.raises(ValueError):
        make_policy("nope", 1, tr)


def test_a_last_block_is_partial_only_where_the_ids_cover_the_prompt(tmp_path: Path) -> None:
    """``tail_partial``: a prompt that ends inside a block, in a trace whose ids cover every token
    (ceil(input / block) ids, a Mooncake trace) -- not in one of whole blocks only (floor, as
    ``tierkv.lab.sharegpt_trace`` writes); with blocks of several trace blocks, where the covered tokens
    end inside a replay block."""
    rows = [  # (input tokens, ids)
        (1100, [1, 2, 3]),  # ceil: 3 ids for 1,100 tokens, the last one partial
        (1100, [1, 2]),  # floor: 2 whole blocks, the 76 tokens past them have no id
        (1024, [1, 2]),  # whole
        (1536, [1, 2, 4]),  # whole at 512; at 1024 the third id is half a block
    ]
    path = tmp_path / "t.jsonl"
    path.write_text(
        "".join(
            json.dumps({"timestamp": i, "input_length": n, "output_length": 1, "hash_ids": ids}) + "\n"
            for i, (n, ids) in enumerate(rows)
        )
    )
    assert load_trace(path).tail_partial == [True, False, False, False]
    assert load_trace(path, block_tokens=1024).tail_partial == [True, False, False, True]


@pytest.mark.slow  # ~45 s on two cores
def test_cli_json_and_plot(tmp_path: Path) -> None:
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    rc = main(
        [str(SLICE), "--capacity", "5%,20%", "--policies", "lru,belady,tierkv", "--tiers", "hbm=5%,dram=20%",
         "--json", str(out), "--plot", str(png), "--no-progress"]
    )  # fmt: skip
    assert rc == 0
    doc = json.loads(out.read_text())
    assert {"trace", "block_tokens", "split", "results"} <= set(doc)
    assert doc["block_tokens"] == 512 and doc["split"] == 0.4
    rows = doc["results"]
    assert len(rows) == 3 * 3
    keys = {"policy", "capacity_fraction", "capacity_blocks", "block_hit_rate", "prefix_hit_rate",
            "prefill_tokens_saved", "modeled_ttft_s", "accesses_per_s"}  # fmt: skip
    for r in rows:
        assert keys <= set(r)
        assert 0.0 <= r["prefix_hit_rate"] <= r["block_hit_rate"] <= 1.0
        assert r["modeled_ttft_s"] > 0 and r["accesses_per_s"] > 0
    tier_rows = [r for r in rows if "tiers" in r]
    assert len(tier_rows) == 3 and set(tier_rows[0]["hits_per_tier"]) == {"hbm", "dram"}
    bel = {r["capacity_fraction"]: r for r in rows if r["policy"] == "belady" and "tiers" not in r}
    lru = {r["capacity_fraction"]: r for r in rows if r["policy"] == "lru" and "tiers" not in r}
    for f in bel:
        assert bel[f]["block_hit_rate"] >= lru[f]["block_hit_rate"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow  # ~20 s on two cores
def test_tierkv_command_runs_the_lab_replay(tmp_path: Path) -> None:
    """``python -m tierkv replay`` reaches the lab through the CLI's lazy import, same figures as ``main``."""
    import subprocess
    import sys

    out, direct = tmp_path / "cli.json", tmp_path / "direct.json"
    args = [str(SLICE), "--capacity", "10%", "--policies", "lru,tierkv", "--no-progress"]
    proc = subprocess.run(
        [sys.executable, "-m", "tierkv", "replay", *args, "--json", str(out)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert main([*args, "--json", str(direct)]) == 0

    def rates(path: Path) -> list[tuple[str, float, float]]:
        rows = json.loads(path.read_text())["results"]
        return [(r["policy"], r["block_hit_rate"], r["prefix_hit_rate"]) for r in rows]

    assert rates(out) == rates(direct) and len(rates(out)) == 2


def test_cli_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "missing.jsonl"), "--no-progress"]) == 2
    assert main([str(SLICE), "--policies", "nope", "--no-progress"]) == 2
    assert main([str(SLICE), "--capacity", "150%", "--no-progress"]) == 2
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 1}\n')
    assert main([str(bad), "--no-progress"]) == 2
    assert "tierkv replay" in capsys.readouterr().err


def test_until_truncates_and_gap_closed(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    rc = main(
        [str(SLICE), "--capacity", "5%", "--policies", "lru,belady,tierkv", "--until", "0.5", "--split", "0.5",
         "--json", str(out), "--no-progress"]
    )  # fmt: skip
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["until"] == 0.5
    full = load_trace(SLICE)
    rows = {r["policy"]: r for r in doc["results"]}
    assert rows["lru"]["gap_closed"] == 0.0 and rows["belady"]["gap_closed"] == 1.0
    # same capacity in blocks as the full replay, fewer requests measured
    assert rows["lru"]["capacity_blocks"] == round(0.05 * full.distinct)
    assert rows["lru"]["measured_accesses"] < full.accesses // 2
    assert main([str(SLICE), "--until", "0", "--no-progress"]) == 2


def test_truncate_keeps_a_prefix_of_requests() -> None:
    tr = load_trace(SLICE)
    half = truncate(tr, 0.5)
    assert 0 < len(half.blocks) < len(tr.blocks)
    assert half.blocks == tr.blocks[: len(half.blocks)]
    assert max(half.times) < tr.times[0] + 0.5 * (tr.times[-1] - tr.times[0])
    assert len(truncate(tr, 1e-9).blocks) >= 1


def test_add_gap_closed_only_with_both_references() -> None:
    rows = [
        {"policy": "lru", "capacity_fraction": 0.1, "prefix_hit_rate": 0.2},
        {"policy": "belady", "capacity_fraction": 0.1, "prefix_hit_rate": 0.4},
        {"policy": "tierkv", "capacity_fraction": 0.1, "prefix_hit_rate": 0.3},
        {"policy": "tierkv", "capacity_fraction": 0.2, "prefix_hit_rate": 0.3},
    ]
    add_gap_closed(rows)  # type: ignore[arg-type]
    assert rows[2]["gap_closed"] == pytest.approx(0.5)
    assert "gap_closed" not in rows[3]


@pytest.mark.parametrize("shape", SHAPES)
def test_synthetic_traces_are_valid_mooncake(tmp_path: Path, shape: str) -> None:
    path = tmp_path / f"{shape}.jsonl"
    n = write_synthetic(path, shape, seed=3, sessions=120)
    tr = load_trace(path)
    assert len(tr.blocks) == n >= 120  # longdoc: one request per session
    assert tr.times == sorted(tr.times)
    for ids, n_in in zip(tr.blocks, tr.input_lengths, strict=True):
        assert len(ids) == -(-n_in // 512)
    seen: set[int] = set()
    new_order: list[int] = []
    for ids in tr.blocks:
        lead = 0
        for b in ids:
            if b not in seen:
                break
            lead += 1
        assert all(b not in seen for b in ids[lead:])  # chained: repeats only in the leading run
        for b in ids:
            if b not in seen:
                seen.add(b)
                new_order.append(b)
    assert new_order == list(range(len(new_order)))  # dense ids in order of first appearance
    assert synthetic_requests(shape, seed=3, sessions=120) == synthetic_requests(shape, seed=3, sessions=120)
    with pytest.raises(ValueError):
        synthetic_requests("nope")


def test_lab_tierkv_above_lru_on_synthetic_chat() -> None:
    tr_rows = synthetic_requests("chat", seed=5, sessions=1500)
    reqs = [r["hash_ids"] for r in tr_rows]
    times = [r["timestamp"] / 1000 for r in tr_rows]
    tails = [r["input_length"] % 512 != 0 for r in tr_rows]  # type: ignore[operator]
    distinct = len({b for r in reqs for b in r})  # type: ignore[union-attr]
    split = times[int(0.4 * len(times))]
    for frac in (0.01, 0.05):
        cap = max(8, round(frac * distinct))
        scores = {}
        for pol in (LruPolicy(cap), TierKVPolicy(cap)):
            lead = acc = 0
            for t, r, tail in zip(times, reqs, tails, strict=True):
                lo, _ = pol.request(r, t, tail)  # type: ignore[arg-type]
                if t >= split:
                    lead += lo
                    acc += len(r)  # type: ignore[arg-type]
            scores[pol.name] = lead / acc
        assert scores["lab-tierkv"] >= scores["lru"], (frac, scores)
