"""The calibration math of the replay lab (tierkv.lab.calibration) and ``tierkv replay --calibration``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tierkv.errors import InputError
from tierkv.lab.calibration import Calibration, calibrate, format_calibration, reuse_outcomes
from tierkv.lab.replay import main

SLICE = Path(__file__).parent / "data" / "traces" / "mooncake_conversation_slice300.jsonl"


def test_known_deciles_and_brier() -> None:
    preds = [0.05, 0.15, 0.15, 0.95, 1.0, 0.5]
    outs = [False, True, False, True, True, False]
    cal = calibrate(preds, outs)
    assert isinstance(cal, Calibration) and cal.count == 6 and len(cal.bins) == 10
    counts = [b.count for b in cal.bins]
    assert counts == [1, 2, 0, 0, 0, 1, 0, 0, 0, 2]  # 1.0 falls in the last (closed) bin
    b1 = cal.bins[1]
    assert (b1.lower, b1.upper) == (0.1, 0.2)
    assert b1.mean_predicted == pytest.approx(0.15) and b1.observed == 0.5
    assert cal.bins[9].mean_predicted == pytest.approx(0.975) and cal.bins[9].observed == 1.0
    assert cal.bins[2].mean_predicted is None and cal.bins[2].observed is None
    sq = [0.05**2, 0.85**2, 0.15**2, 0.05**2, 0.0, 0.25]
    assert cal.brier == pytest.approx(sum(sq) / 6)
    assert cal.base_rate == pytest.approx(0.5) and cal.mean_predicted == pytest.approx(sum(preds) / 6)
    # ECE: sum_b (n_b / n) |mean_p_b - obs_b| = (0.05 + 2 * 0.35 + 0.5 + 2 * 0.025) / 6
    assert cal.ece == pytest.approx((0.05 + 0.7 + 0.5 + 0.05) / 6)


def test_constant_half_on_half_outcomes_is_a_quarter() -> None:
    cal = calibrate([0.5] * 100, [k % 2 == 0 for k in range(100)])
    assert cal.brier == pytest.approx(0.25)
    assert cal.ece == pytest.approx(0.0)  # calibrated, just uninformative
    assert cal.skill == pytest.approx(0.0)  # no better than the base rate
    assert [b.count for b in cal.bins] == [0] * 5 + [100] + [0] * 4


def test_perfect_predictor_scores_zero() -> None:
    outs = [True, False, True, True, False]
    cal = calibrate([1.0 if o else 0.0 for o in outs], outs)
    assert cal.brier == 0.0 and cal.ece == 0.0 and cal.skill == 1.0
    assert calibrate([0.3], [True]).skill is None  # one outcome: no reference
    assert cal.bins[0].observed == 0.0 and cal.bins[-1].observed == 1.0


def test_bins_parameter_and_json() -> None:
    cal = calibrate([0.2, 0.7], [False, True], bins=2)
    assert [(b.lower, b.upper, b.count) for b in cal.bins] == [(0.0, 0.5, 1), (0.5, 1.0, 1)]
    d = json.loads(json.dumps(cal.to_dict()))
    assert d["brier"] == pytest.approx((0.04 + 0.09) / 2) and len(d["bins"]) == 2
    text = format_calibration(cal, "t")
    assert text.startswith("t\n") and "Brier=0.0650" in text


@pytest.mark.parametrize(
    ("preds", "outs", "bins"),
    [
        ([0.5], [True, False], 10),  # lengths differ
        ([], [], 10),  # nothing to score
        ([1.5], [True], 10),  # not a probability
        ([-0.1], [True], 10),
        ([math.nan], [True], 10),
        ([0.5], [True], 0),  # bins < 1
        ([0.5], [True], True),
    ],
)
def test_bad_input_is_a_typed_error(preds: list[float], outs: list[bool], bins: int) -> None:
    with pytest.raises(InputError):
        calibrate(preds, outs, bins=bins)


def test_reuse_outcomes_resolution() -> None:
    times = [0.0, 0.0, 1.0, 5.0, 20.0]
    blocks = [[1, 2], [1], [2], [3], [1]]
    got = reuse_outcomes(times, blocks, horizon=10.0)
    # block 1 at t=0: a second access at t=0 does not count, the next one (t=20) is too far -> False
    # block 2 at t=0: reused at t=1 -> True; block 3 at t=5: never again but 5+10 <= 20 -> False
    # block 2 at t=1: horizon ends at 11 <= 20 -> False; block 1 at t=20: censored (trace ends) -> None
    assert got == [[False, True], [False], [False], [False], [None]]
    assert reuse_outcomes(times, blocks, horizon=20.0)[0] == [True, True]
    # with credit, an uncredited access is not a reuse
    credit = [[True, True], [True], [False], [True], [True]]
    assert reuse_outcomes(times, blocks, 10.0, credit)[0] == [False, False]
    assert reuse_outcomes([], [], 1.0) == []


def test_reuse_outcomes_bad_input() -> None:
    with pytest.raises(InputError):
        reuse_outcomes([0.0], [[1], [2]], 1.0)
    with pytest.raises(InputError):
        reuse_outcomes([1.0, 0.0], [[1], [2]], 1.0)  # unsorted
    with pytest.raises(InputError):
        reuse_outcomes([0.0], [[1]], -1.0)
    with pytest.raises(InputError):
        reuse_outcomes([0.0], [[1]], 1.0, credit=[[True, False]])


def test_cli_calibration_table_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.json"
    rc = main([str(SLICE), "--policies", "lru", "--capacity", "10%", "--calibration", "--json", str(out),
               "--no-progress"])  # fmt: skip
    assert rc == 0
    text = capsys.readouterr().out
    assert "calibration of lab-tierkv's reuse predictor @ 10%" in text and "Brier=" in text
    doc = json.loads(out.read_text())
    assert {r["policy"] for r in doc["results"]} == {"lru", "lab-tierkv"}  # added for the calibration
    cals = doc["calibration"]
    assert [c["outcome"] for c in cals] == ["reuse", "training label"]
    for c in cals:
        t = c["table"]
        assert sum(b["count"] for b in t["bins"]) == t["count"] > 0 and 0.0 <= t["brier"] <= 1.0
        assert c["censored"] >= 0 and c["horizon_s"] == 300.0
    assert main([str(SLICE), "--policies", "lru", "--no-progress", "--json", str(out)]) == 0
    assert "calibration" not in json.loads(out.read_text())  # only when asked
