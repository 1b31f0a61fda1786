"""``tierkv certify`` grades by the suite's rule for the tier kind; a backend cannot set its own bar."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from tierkv_conformance._certify import grade, render_markdown
from tierkv_conformance._rules import PASS_RULES, PassRule, pass_rule

from tierkv.backend import Backend, Capabilities, CertificationProfile, TierKind
from tierkv.backend import load_backend_class as load

OK = {"passed": 10, "failed": 0, "skipped": 0, "pytest_exit_code": 0}


def rows(ratio: float, *, gbps: float = 1.0, sizes: tuple[int, ...] = (16384, 262144, 2097152)) -> list[dict[str, Any]]:
    return [{"block_bytes": s, "op": op, "ratio": ratio, "gbps": gbps} for s in sizes for op in ("write", "read")]


def test_capabilities_hold_no_grading_fields() -> None:
    names = {f.name for f in dataclasses.fields(Capabilities)}
    assert not {n for n in names if "envelope" in n or "threshold" in n}, names
    assert not {f.name for f in dataclasses.fields(CertificationProfile)} & {"threshold", "min_ratio"}


def test_every_tier_kind_has_a_rule() -> None:
    assert set(PASS_RULES) == set(TierKind)
    for kind, rule in PASS_RULES.items():
        assert 0.0 < rule.min_ratio <= 1.0, kind
        assert (rule.small_block_bytes == 0) == (rule.small_block_us == 0.0), kind
    assert pass_rule("remote") is PASS_RULES[TierKind.REMOTE]


def test_a_remote_tier_at_half_its_raw_client_is_not_certified() -> None:
    # the Redis example once declared a threshold of 0.25 and was CERTIFIED at 0.53x raw
    verdict, reasons = grade(OK, False, rows(0.53), pass_rule(TierKind.REMOTE))
    assert verdict == "FAILED"
    assert any("below threshold 0.8" in r for r in reasons)
    assert grade(OK, False, rows(0.85), pass_rule(TierKind.REMOTE))[0] == "CERTIFIED"


def test_the_small_block_bound_is_the_kinds() -> None:
    dram, nvme = pass_rule(TierKind.DRAM), pass_rule(TierKind.NVME)
    slow_small = [*rows(0.9, sizes=(262144,)), {"block_bytes": 16384, "op": "write", "ratio": 0.1, "gbps": 0.5}]
    # 16 KiB at 0.5 GB/s is 32.8 us per block: over dram's 20 us, within nvme's 100 us
    assert grade(OK, False, slow_small, dram)[0] == "FAILED"
    assert grade(OK, False, slow_small, nvme)[0] == "CERTIFIED"
    # a kind without a small-block bound grades every row by its ratio
    assert grade(OK, False, slow_small, pass_rule(TierKind.PFS))[0] == "FAILED"


def test_built_in_backends_cannot_declare_a_bar() -> None:
    for name in ("dram", "cxl", "hbm", "nvme", "pfs", "rdma"):
        try:
            cls = load(name)
        except Exception as exc:  # an optional extra is missing here
            pytest.skip(f"{name}: {exc}")
        assert issubclass(cls, Backend)
        assert isinstance(cls.certification, CertificationProfile)
    assert load("nvme").certification.options_for_block is not None  # slots sized to the block
    assert load("dram").certification.options_for_block is None


def test_the_certificate_names_the_suite_as_the_source_of_its_rule() -> None:
    rule = PassRule(0.8, small_block_bytes=65536, small_block_us=20.0)
    cert = {
        "backend": "x",
        "verdict": "CERTIFIED",
        "distribution": "d",
        "backend_version": "1",
        "tierkv_version": "0",
        "api_version": 1,
        "emulated": False,
        "io_path": "memcpy",
        "tests": {"passed": 1, "failed": 0, "skipped": 0, "failures": [], "skip_reasons": {}},
        "pass_rule": {"source": "the suite's rule for tier kind 'dram' (tierkv_conformance PASS_RULES)"}
        | {"text": rule.describe()},
        "created": "now",
        "duration_s": 1,
        "verdict_reasons": [],
        "envelope": [],
        "hardware": {
            "cpu": {},
            "memory": {},
            "filesystem": {},
            "numa": {"nodes": [], "cpuless_nodes": []},
            "gpu": {},
            "gds": {"status": "absent"},
            "cxl": {"present": False},
            "devdax": {"devices": [], "dev_nodes": []},
            "rdma": {"present": False},
        },
    }
    md = render_markdown(cert)
    assert "pass rule (the suite's rule for tier kind 'dram'" in md
    assert "every envelope ratio >= 0.8 for blocks >= 64 KiB, and <= 20 us per block (batched) below" in md
