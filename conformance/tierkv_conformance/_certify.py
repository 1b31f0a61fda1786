"""``tierkv certify NAME [--config FILE] [--out DIR] [--quick] [--keep]``.

Runs the conformance suite against the installed backend NAME (an entry point
of ``tierkv.backends``, or ``package.module:Class``), measures its performance
envelope against a raw reference, detects the hardware, and writes
``DIR/certificate.json`` and ``DIR/certificate.md``.

Verdict:
  CERTIFIED        every test passed, the backend ran on its real hardware
                   (``stats().emulated`` is false) and its envelope meets the pass
                   rule of its tier kind (:data:`~tierkv_conformance._rules.PASS_RULES`,
                   the suite's: every ratio >= the kind's ``min_ratio``; where the
                   rule has a small-block bound, rows of smaller blocks graded by
                   their batched time per block instead);
  PASSED-EMULATED  every test passed, but the backend ran on a stand-in
                   (never CERTIFIED on emulation);
  FAILED           anything else (a failed test, a ratio below the rule or
                   missing, the backend could not be opened).
A backend cannot move its bar: it declares only what it is (tier kind, emulated).
Exit status: 0 unless FAILED (1); 2 for a usage or loading error.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import anyio

from tierkv.backend import API_VERSION, Backend
from tierkv.errors import TierKVError

from ._envelope import EnvelopeRow, measure_envelope, storage_dir
from ._hardware import detect_hardware
from ._loader import backend_distribution, load_backend_class
from ._rules import PassRule, pass_rule
from ._runner import TestOutcome, load_config, run_suite, substitute

__all__ = ["build_verdict", "grade", "main", "render_markdown"]

_SECRET_WORDS = ("password", "secret", "token", "credential", "key_file")


def _tierkv_version() -> str:
    try:
        return importlib.metadata.version("tierkv")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def _say(msg: str) -> None:
    print(f"[tierkv certify] {msg}", flush=True)


def _redact(options: Mapping[str, Any]) -> dict[str, Any]:
    return {k: ("***" if any(w in k.lower() for w in _SECRET_WORDS) else v) for k, v in options.items()}


def build_verdict(
    tests: Mapping[str, Any],
    emulated: bool,
    envelope: Sequence[Mapping[str, Any]],
    threshold: float,
    error: str = "",
    *,
    small_block_bytes: int = 0,
    small_block_us: float = 20.0,
) -> tuple[str, list[str]]:
    """The verdict and the reasons behind it (pure; see the module docstring).

    Rows of blocks smaller than ``small_block_bytes`` are graded by their
    batched time per block (<= ``small_block_us``), every other row by its
    ratio to the raw reference (>= ``threshold``)."""
    reasons: list[str] = []
    if error:
        reasons.append(error)
    if tests.get("failed", 0):
        reasons.append(f"{tests['failed']} test(s) failed")
    if tests.get("passed", 0) == 0:
        reasons.append("no test passed")
    if tests.get("pytest_exit_code", 0) not in (0, 1):
        reasons.append(f"pytest exited with code {tests.get('pytest_exit_code')}")
    if reasons:
        return "FAILED", reasons
    if emulated:
        return "PASSED-EMULATED", ["all tests passed on an emulated medium (stats().emulated is true)"]
    if not envelope:
        return "FAILED", ["no envelope rows were measured"]
    low: list[str] = []
    for r in envelope:
        size = int(r["block_bytes"])
        if size < small_block_bytes:
            gbps = float(r.get("gbps") or 0.0)
            us = size / (gbps * 1e9) * 1e6 if gbps > 0 else float("inf")
            if us > small_block_us:
                low.append(f"envelope {size} B {r['op']}: {us:.1f} us per block above {small_block_us} us")
        elif r.get("ratio") is None or float(r["ratio"]) < threshold:
            low.append(f"envelope {size} B {r['op']}: ratio {r.get('ratio')} below threshold {threshold}")
    if low:
        return "FAILED", low
    rule = PassRule(threshold, small_block_bytes, small_block_us if small_block_bytes else 0.0).describe()
    return "CERTIFIED", [f"all tests passed on real hardware; {rule}"]


def grade(
    tests: Mapping[str, Any], emulated: bool, envelope: Sequence[Mapping[str, Any]], rule: PassRule, error: str = ""
) -> tuple[str, list[str]]:
    """:func:`build_verdict` under ``rule`` (the pass rule of the backend's tier kind)."""
    return build_verdict(
        tests,
        emulated,
        envelope,
        rule.min_ratio,
        error,
        small_block_bytes=rule.small_block_bytes,
        small_block_us=rule.small_block_us,
    )


async def _envelope(
    cls: type[Backend], options: dict[str, Any], workdir: Path, quick: bool
) -> tuple[list[EnvelopeRow], dict[str, Any]]:
    b = await cls.open(options)
    try:
        caps = b.capabilities
        rows = await measure_envelope(b, options=options, workdir=workdir, quick=quick, progress=_say)
        s = b.stats()
        info = {
            "emulated": bool(s.emulated),
            "io_path": s.io_path,
            "tier_kind": caps.tier_kind.value,
            "capabilities": {k: (v.value if hasattr(v, "value") else v) for k, v in asdict(caps).items()},
            "capacity_bytes": s.capacity_bytes,
        }
        return rows, info
    finally:
        await b.aclose()


def render_markdown(cert: Mapping[str, Any]) -> str:
    t = cert["tests"]
    hw = cert["hardware"]
    lines = [
        f"# tierkv certificate: `{cert['backend']}` — **{cert['verdict']}**",
        "",
        f"- distribution: {cert['distribution'] or '?'} {cert['backend_version']}",
        f"- tierkv {cert['tierkv_version']}, backend API {cert['api_version']}",
        f"- emulated: {'yes' if cert['emulated'] else 'no'}; data path: {cert.get('io_path') or '?'}",
        f"- tests: {t['passed']} passed, {t['failed']} failed, {t['skipped']} skipped",
        f"- pass rule ({cert['pass_rule']['source']}): {cert['pass_rule']['text']}",
        f"- date: {cert['created']}; duration {cert['duration_s']} s",
        "",
        "## Verdict reasons",
        "",
        *[f"- {r}" for r in cert["verdict_reasons"]],
        "",
    ]
    if t["failures"]:
        lines += ["## Failed tests", "", *[f"- `{n}`: {t['failure_details'].get(n, '')}" for n in t["failures"]], ""]
    if t["skip_reasons"]:
        reasons: dict[str, list[str]] = {}
        for n, r in t["skip_reasons"].items():
            reasons.setdefault(r, []).append(n)
        lines += ["## Skipped (capability-gated)", "", *[f"- {r} ({len(ns)} tests)" for r, ns in reasons.items()], ""]
    lines += [
        "## Envelope",
        "",
        "Ratio: the median over repetitions of backend / raw measured back to back in each;"
        " range: the lowest and highest of those.",
        "",
        "| block | op | GB/s | p50 µs | p99 µs | raw GB/s | ratio | range | raw reference |",
        "|---:|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in cert["envelope"]:
        spread = f"{r['ratio_lo']}–{r['ratio_hi']}" if r.get("ratio_lo") is not None else "—"
        lines.append(
            f"| {r['block_bytes'] // 1024} KiB | {r['op']} | {r['gbps']} | {r['p50_us']} | {r['p99_us']} | "
            f"{r['raw_gbps']} | {r['ratio']} | {spread} | {r['raw_method']} |"
        )
    lines += ["", "## Hardware", ""]
    cpu, mem, fs = hw["cpu"], hw["memory"], hw["filesystem"]
    lines.append(f"- CPU: {cpu.get('model') or '?'} ({cpu.get('logical_cpus')} logical CPUs)")
    lines.append(f"- memory: {mem.get('total_bytes', 0) / 2**30:.1f} GiB")
    lines.append(
        f"- filesystem under {fs.get('path')}: {fs.get('fs_type', 'absent')} (mount {fs.get('mount_point', '?')})"
    )
    lines.append(f"- NUMA nodes: {len(hw['numa']['nodes'])}; CPU-less: {hw['numa']['cpuless_nodes'] or 'none'}")
    gpu = hw["gpu"]
    gpus = ", ".join(g.get("model", "?") for g in gpu.get("gpus", [])) or "absent"
    lines.append(f"- GPU: {gpus}{'; driver ' + gpu['driver'] if gpu.get('driver') else ''}")
    lines.append(f"- GDS: {hw['gds']['status']}")
    lines.append(f"- CXL: {'present ' + ', '.join(hw['cxl']['memdevs']) if hw['cxl']['present'] else 'absent'}")
    dax = hw["devdax"]
    lines.append(f"- devdax: {', '.join(d['name'] for d in dax['devices']) or ', '.join(dax['dev_nodes']) or 'absent'}")
    rdma = hw["rdma"]
    if rdma["present"]:
        for d in rdma["devices"]:
            for p in d["ports"]:
                lines.append(f"- RDMA: {d['name']} port {p['port']}: {p['state']}, {p['rate']}, {p['link_layer']}")
    else:
        lines.append("- RDMA: absent")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="tierkv certify", description="Certify a tierkv backend.")
    p.add_argument("name", help="backend entry-point name (tierkv.backends) or package.module:Class")
    p.add_argument("--config", type=Path, help="TOML file with the backend's options ([NAME] table or top level)")
    p.add_argument("--out", type=Path, default=Path("."), help="directory for certificate.json and certificate.md")
    p.add_argument("--quick", action="store_true", help="fewer iterations and a smaller envelope")
    p.add_argument("--keep", action="store_true", help="keep the temporary working directory")
    a = p.parse_args(argv)

    t_start = time.monotonic()
    try:
        cls = load_backend_class(a.name)
    except TierKVError as exc:
        print(f"tierkv certify: {exc}", file=sys.stderr)
        return 2
    config: dict[str, Any] | None = None
    if a.config is not None:
        try:
            config = load_config(a.config, a.name)
        except (OSError, ValueError) as exc:
            print(f"tierkv certify: cannot read {a.config}: {exc}", file=sys.stderr)
            return 2
    workdir = Path(tempfile.mkdtemp(prefix=f"tierkv-certify-{a.name.replace(':', '_')}-"))
    _say(f"backend {a.name!r} = {cls.__module__}.{cls.__qualname__}; workdir {workdir}")
    try:
        env_dir = workdir / "envelope"
        env_dir.mkdir()
        if config is None:
            env_options = dict(cls.default_options(env_dir))
            _say(f"no --config: using {cls.__name__}.default_options()")
        else:
            env_options = substitute(config, env_dir, "envelope")

        _say("running the conformance suite (asyncio and trio)...")
        counter = {"n": 0}

        def on_test(o: TestOutcome) -> None:
            counter["n"] += 1
            mark = {"passed": "ok", "failed": "FAIL", "skipped": "skip"}.get(o.outcome, o.outcome)
            extra = f" ({o.detail})" if o.outcome != "passed" and o.detail else ""
            _say(f"  {counter['n']:>3} {mark:<4} {o.name}{extra}")

        suite = run_suite(a.name, config, workdir / "suite", quick=a.quick, progress=on_test)
        tests = suite.as_dict()
        _say(f"tests: {tests['passed']} passed, {tests['failed']} failed, {tests['skipped']} skipped")

        error = ""
        rows: list[EnvelopeRow] = []
        info: dict[str, Any] = {}
        _say("measuring the envelope...")
        try:
            rows, info = anyio.run(_envelope, cls, env_options, env_dir, a.quick)
        except Exception as exc:
            error = f"envelope measurement failed: {type(exc).__name__}: {exc}"
            _say(error)

        hw_path = storage_dir(env_options, env_dir)
        hardware = detect_hardware(hw_path)
        dist, version = backend_distribution(cls, a.name)
        kind = str(info.get("tier_kind") or "other")  # unknown when the envelope could not run
        rule = pass_rule(kind)
        envelope = [asdict(r) for r in rows]
        for r in envelope:
            g = float(r.get("gbps") or 0.0)
            r["us_per_block"] = round(r["block_bytes"] / (g * 1e9) * 1e6, 2) if g > 0 else None
        emulated = bool(info.get("emulated", False))
        verdict, reasons = grade(tests, emulated, envelope, rule, error)
        cert: dict[str, Any] = {
            "backend": a.name,
            "backend_class": f"{cls.__module__}.{cls.__qualname__}",
            "distribution": dist,
            "backend_version": version,
            "tierkv_version": _tierkv_version(),
            "conformance_version": _tierkv_version(),  # the suite ships with tierkv
            "api_version": API_VERSION,
            "backend_api_version": cls.api_version,
            "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "duration_s": round(time.monotonic() - t_start, 1),
            "quick": a.quick,
            "options": _redact(env_options),
            "config_file": str(a.config) if a.config else None,
            "tier_kind": info.get("tier_kind"),
            "capabilities": info.get("capabilities"),
            "io_path": info.get("io_path", ""),
            "emulated": emulated,
            "hardware": hardware,
            "tests": tests,
            "pass_rule": {
                "source": f"the suite's rule for tier kind {kind!r} (tierkv_conformance PASS_RULES)",
                "min_ratio": rule.min_ratio,
                "small_block_bytes": rule.small_block_bytes,
                "small_block_us": rule.small_block_us,
                "text": rule.describe(),
            },
            "sized_instances": bool(cls.certification.options_for_block),
            "envelope": envelope,
            "verdict": verdict,
            "verdict_reasons": reasons,
        }
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "certificate.json").write_text(json.dumps(cert, indent=2, default=str) + "\n")
        (a.out / "certificate.md").write_text(render_markdown(cert))
        _say(f"verdict: {verdict} ({'; '.join(reasons)})")
        _say(f"wrote {a.out / 'certificate.json'} and {a.out / 'certificate.md'}")
        return 1 if verdict == "FAILED" else 0
    finally:
        if a.keep:
            _say(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
