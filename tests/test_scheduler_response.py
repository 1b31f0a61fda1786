"""Response-length signal: classes, completion model, per-class calibration, causal delivery in the replay."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import pytest

from tierkv.errors import ConfigError
from tierkv.lab.policies import TierKVOptions, TierKVPolicy
from tierkv.lab.replay import Trace, load_trace, replay, truncate
from tierkv.scheduler._response import (
    N_RESPONSE_CLASSES,
    ResponseModel,
    completion_time,
    response_class,
)

SLICE = Path(__file__).parent / "data" / "traces" / "mooncake_conversation_slice300.jsonl"


def test_response_classes_and_completion_time() -> None:
    assert [response_class(t) for t in (0, 7, 8, 31, 32, 127, 128, 511, 512, 10_000)] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    assert N_RESPONSE_CLASSES == 5
    assert completion_time(10.0, 5_000, 100) == pytest.approx(10.0 + 0.5 + 3.0)


def test_model_learns_calibration_ratio_relative_to_all_classes() -> None:
    m = ResponseModel(prior_strength=1.0, window=1 << 30)
    last: dict[int, float] = {}
    # class 0 (short answers): never continued; class 3: always; predictor expects 0.5 everywhere
    for i in range(200):
        m.observe(float(i), 2 * i, 0, 0.5)
        m.observe(float(i), 2 * i + 1, 3, 0.5)
        last[2 * i + 1] = i + 1.0  # reused one second after the answer
    assert m.adjustment(0) == 0.0  # nothing resolved yet: no future information
    assert m.advance(500.0, last.get, horizon=300.0) == 2 * 200
    assert m.adjustment(0) < -1.0 < 0.0 < m.adjustment(3)
    assert m.adjustment(-1) == 0.0 and m.adjustment(99) == 0.0
    assert all(abs(a) <= 3.0 for a in m.adjust)


def test_model_resolves_only_after_the_horizon() -> None:
    m = ResponseModel()
    m.observe(100.0, 1, 2, 0.3)
    assert m.advance(399.0, {1: 150.0}.get, 300.0) == 0 and m.pending == 1
    assert m.advance(400.0, {1: 150.0}.get, 300.0) == 1 and m.pending == 0


@pytest.mark.parametrize("kw", [{"prior_strength": 0.0}, {"prior_strength": math.nan}, {"window": 0}])
def test_model_rejects_bad_config(kw: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        ResponseModel(**kw)  # type: ignore[arg-type]


def test_policy_rekeys_only_blocks_the_request_still_owns() -> None:
    pol = TierKVPolicy(100)
    pol.request([1, 2, 3], 0.0, False)
    pol.request([1, 2, 4], 1.0, False)  # touches 1, 2 again: they now belong to request 1
    before = dict(pol.cache)
    pol.respond(0, 30.0, 500)  # 30 s of generation: recency of block 3 counts from then
    assert pol.cache[3] > before[3]
    assert pol.cache[1] == before[1] and pol.cache[2] == before[2]
    pol.respond(0, 31.0, 500)  # repeated: ignored
    pol.respond(7, 31.0, 500)  # unknown: ignored
    assert pol.cache[3] > before[3]


class _Spy(TierKVPolicy):
    __slots__ = ("log",)

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.log: list[tuple[str, int, float]] = []

    def request(self, ids: Sequence[int], now: float, tail_partial: bool) -> tuple[int, int]:
        self.log.append(("req", self.seq, now))
        return super().request(ids, now, tail_partial)

    def respond(self, index: int, t_done: float, output_tokens: int) -> None:
        self.log.append(("done", index, t_done))
        super().respond(index, t_done, output_tokens)


def test_replay_delivers_answers_strictly_after_completion() -> None:
    tr = load_trace(SLICE)
    assert len(tr.output_lengths) == len(tr.blocks)
    spy = _Spy(500)
    replay(tr, spy, split_time=0.0)
    arrival: dict[int, float] = {}
    delivered: list[float] = []  # completion times delivered since the last request
    for kind, i, t in spy.log:
        if kind == "req":
            # everything delivered before this request had completed by its arrival
            assert all(d <= t for d in delivered)
            delivered = []
            arrival[i] = t
        else:
            expected = completion_time(tr.times[i], tr.input_lengths[i], tr.output_lengths[i])
            assert t == pytest.approx(expected)
            assert i in arrival and t > arrival[i]  # never before the request itself
            delivered.append(t)
    assert any(k == "done" for k, _, _ in spy.log)
    assert truncate(tr, 0.5).output_lengths == tr.output_lengths[: len(truncate(tr, 0.5).blocks)]


def test_trace_without_output_lengths_delivers_nothing(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text('{"timestamp": 0, "input_length": 600, "hash_ids": [1, 2]}\n')
    tr = load_trace(p)
    assert tr.output_lengths == []
    spy = _Spy(10)
    replay(tr, spy, split_time=0.0)
    assert [k for k, _, _ in spy.log] == ["req"]
    assert isinstance(Trace(tr.path, tr.times, tr.input_lengths, tr.blocks, tr.tail_partial, 512), Trace)


def test_response_ablations_are_options() -> None:
    assert TierKVOptions().response and TierKVOptions().completion
    off = TierKVPolicy(10, TierKVOptions(response=False, completion=False))
    off.request([1, 2], 0.0, False)
    before = dict(off.cache)
    off.respond(0, 60.0, 3)
    assert off.cache == before
