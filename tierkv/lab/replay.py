"""Trace-replay lab: ``tierkv replay TRACE ...`` -- compare cache policies on a Mooncake-format trace.

Trace format: JSON lines with ``timestamp`` (ms), ``input_length``, ``output_length`` and ``hash_ids``
(chained prefix-block ids of ``--trace-block-tokens`` tokens each, 512 by default), optionally ``shape`` (a
string: the workload shape that generated the request, as :mod:`tierkv.lab.synth` writes it); other fields are
ignored.
``--block-tokens`` must be a multiple of the trace's block size: ``k`` trace blocks are merged into one,
identified by the id of its last trace block (valid because the ids are chained).

Method: for every (policy, capacity) the cache replays the *whole* trace in timestamp order; metrics count
only requests at or after the split time ``t0 + split * (t_end - t0)`` (the first part warms the cache and
is the only part used for tuning). Capacity is a fraction of the number of distinct blocks of the trace.

Metrics per (policy, capacity), over the measured requests:

* ``block_hit_rate`` -- resident blocks / block accesses.
* ``prefix_hit_rate`` -- blocks in each request's leading run of resident blocks / block accesses.
* ``prefill_tokens_saved`` -- tokens of those leading runs (capped at the prompt length).
* ``modeled_ttft_s`` -- mean time to first token: misses prefill at ``--prefill-rate`` tokens/s; each
  reused block is fetched from its tier at ``latency + bytes / bandwidth`` (``--kv-bytes-per-token``).
  Without ``--tiers`` hits are served from DRAM.
* ``accesses_per_s`` -- block accesses of the whole replay / wall-clock seconds of that replay
  (``accesses_per_cpu_s``: the same per CPU second of the process, robust to a loaded machine).

``--tiers hbm=1%,dram=5%,nvme=25%`` models an inclusive hierarchy: the policy is replayed at the cumulative
capacities (1%, 6%, 31%) and a reused block is attributed to the smallest tier whose cumulative cache
holds it in the request's leading run (exact for stack policies such as LRU; an approximation otherwise).
Those rows carry ``tiers`` and ``hits_per_tier``.

Answer lengths (strictly causal): when the trace has ``output_length``, a request's completion is modelled at
``arrival + input_length / 10,000 tok/s + output_length x 0.03 s``
(:func:`~tierkv.scheduler._response.completion_time`); a policy with a ``respond(index, t_done,
output_tokens)`` method (the ``lab-tierkv`` prototype) is told the answer length only then, before the first request
that arrives at or after ``t_done`` -- never earlier.

``--until F`` replays only the requests before ``t0 + F * (t_end - t0)`` (the split then applies to that
part): ``--until 0.4 --split 0.5`` evaluates on the tuning part alone (warm on the first 20% of the trace,
measure on 20%-40%), the only view a configuration may be tuned on. Capacities stay fractions of the
*whole* trace's distinct blocks, so the cache sizes are the same as in the full replay.

``--calibration`` (adds ``lab-tierkv`` when not named) records, at every block access of the ``lab-tierkv`` replays,
the reuse probability the library's :class:`~tierkv.scheduler.ReusePredictor` gives the block's cell, and
prints per capacity a reliability table over the measured part (predicted P(reuse within the predictor's
horizon, 300 s) in deciles: count, mean predicted, observed frequency) with the Brier score
(:mod:`tierkv.lab.calibration`). Two outcomes: ``reuse`` -- the block is accessed again within the
horizon; ``training label`` -- again within the horizon *and* OPTgen credits that access (what an optimal
cache of this size would have hit: what the lab's predictor is trained on). Accesses whose horizon passes the
end of the (``--until``) trace unresolved are censored (left out, counted). With ``--json`` the document gets
``calibration``: one entry per (capacity, outcome).

Per shape: when the trace's requests carry ``shape``, every row also carries ``per_shape``: per shape, the
``prefix_hit_rate``, ``block_hit_rate``, ``requests`` and ``accesses`` of that shape's measured requests (rows
without ``shape`` in such a trace count as shape ``-``); the rates are ratios of counts, so the overall rates
are the per-shape ones weighted by ``accesses``. When the trace has two shapes or more, a table of the
per-shape prefix hit rates (shape x capacity, one column per policy) is printed after the main one. A trace
without ``shape`` gives the same output as before.

When ``lru`` and ``belady`` are both replayed, every row also carries ``gap_closed``: the fraction of the
LRU -> Belady prefix-hit-rate gap the policy closes at that capacity, ``(p - p_lru) / (p_belady - p_lru)``.

``--ablations`` adds the lab's research prototype ``lab-tierkv`` with one component off each (see
:class:`~tierkv.lab.policies.TierKVOptions`): ``lab-tierkv-no-predictor``, ``-no-prefix-tree``,
``-no-fanout``, ``-no-bypass``, ``-no-size``, ``-no-decay``, ``-no-optgen``, ``-no-quick-step``, ``-no-shape``,
``-no-response`` (answer-length class), ``-no-completion`` (recency from completion), ``-no-response-signal``
(both), ``lab-tierkv-fixed-tau`` (``tau`` fixed at its start value instead of adapted by shadow caches),
and the renewal-process policy ``lab-tierkv-session`` (:class:`~tierkv.lab.policies.SessionPolicy`, the library's session shadow)
with ``lab-tierkv-session-no-hazard``, ``-no-classes``, ``-no-density``, ``-no-prefix-tree``, ``-no-bypass``,
``-no-tail`` (see :class:`~tierkv.lab.policies.SessionOptions`). Any ablation name is also accepted by
``--policies``.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from tierkv.scheduler._response import completion_time

from .calibration import calibrate, format_calibration, reuse_outcomes
from .policies import (
    ArcPolicy,
    BeladyPolicy,
    LfuPolicy,
    LruPolicy,
    Policy,
    S3FifoPolicy,
    SessionOptions,
    SessionPolicy,
    TierKVOptions,
    TierKVPolicy,
    TinyLfuPolicy,
    next_use_index,
)
from .policies.library import LibraryPolicy

__all__ = [
    "ABLATIONS",
    "CLASSICAL",
    "POLICIES",
    "Trace",
    "add_gap_closed",
    "load_trace",
    "main",
    "make_policy",
    "replay",
    "truncate",
]

#: ``tierkv`` is the shipped library itself (:class:`~tierkv.lab.policies.library.LibraryPolicy`: a real
#: TierKV with its default policy); ``tierkv-predictive`` the library with ``scheduler.policy =
#: "predictive"``; ``lab-tierkv`` the lab's research prototype (OPTgen labels, bypass, quick-step,
#: x4 shared prefixes), which the library does not run.
POLICIES: tuple[str, ...] = ("lru", "lfu", "arc", "s3fifo", "tinylfu", "belady", "tierkv", "lab-tierkv")
#: policies run only when named
EXTRA_POLICIES: tuple[str, ...] = ("tierkv-predictive", "tierkv-adaptive", "tierkv-lru", "tinylfu-reset", "s3fifo-2")
#: the classical baselines a shipped policy is held to (the best of them per row): LRU, ARC, S3-FIFO and
#: W-TinyLFU, the last two also in a common variant each (``s3fifo-2``, ``tinylfu-reset``)
CLASSICAL: tuple[str, ...] = ("lru", "arc", "s3fifo", "s3fifo-2", "tinylfu", "tinylfu-reset")
ABLATIONS: dict[str, SessionOptions | TierKVOptions] = {
    "lab-tierkv-no-predictor": TierKVOptions(predictor=False),
    "lab-tierkv-no-prefix-tree": TierKVOptions(prefix_tree=False),
    "lab-tierkv-no-fanout": TierKVOptions(fanout=False),
    "lab-tierkv-no-bypass": TierKVOptions(bypass=False),
    "lab-tierkv-no-size": TierKVOptions(size=False),
    "lab-tierkv-no-decay": TierKVOptions(decay=False),
    "lab-tierkv-no-optgen": TierKVOptions(optgen=False),
    "lab-tierkv-no-quick-step": TierKVOptions(quick_step=0.0),
    "lab-tierkv-no-shape": TierKVOptions(shape=False),
    "lab-tierkv-no-response": TierKVOptions(response=False),
    "lab-tierkv-no-completion": TierKVOptions(completion=False),
    "lab-tierkv-no-response-signal": TierKVOptions(response=False, completion=False),
    "lab-tierkv-fixed-tau": TierKVOptions(shadow_taus=()),
    # the renewal-process policy (SessionPolicy, the library's session shadow) and its ablations
    "lab-tierkv-session": SessionOptions(),
    "lab-tierkv-session-no-hazard": SessionOptions(hazard=False),
    "lab-tierkv-session-no-classes": SessionOptions(classes=False),
    "lab-tierkv-session-no-density": SessionOptions(density=False),
    "lab-tierkv-session-no-prefix-tree": SessionOptions(prefix_tree=False),
    "lab-tierkv-session-no-bypass": SessionOptions(bypass=False),
    "lab-tierkv-session-no-tail": SessionOptions(tail=False),
}
# (latency s, bandwidth bytes/s): HBM local; DRAM over PCIe 5 x16; NVMe Gen4 SSD.
_TIER_COST: dict[str, tuple[float, float]] = {
    "hbm": (0.0, 2.0e12),
    "dram": (5e-6, 50e9),
    "cxl": (2e-6, 60e9),
    "nvme": (100e-6, 7e9),
    "rdma": (10e-6, 25e9),
    "pfs": (1e-3, 5e9),
}


@dataclass(frozen=True, slots=True)
class Trace:
    """A loaded trace: per request (time s, input tokens, block ids, tail block partial?, output tokens).

    ``output_lengths`` is empty when the trace has no ``output_length`` field: then no completion is ever
    delivered to a policy. ``shapes`` (per request, the workload shape; ``-`` where a row has none) is empty
    when no request carries ``shape``.
    """

    path: str
    times: list[float]
    input_lengths: list[int]
    blocks: list[list[int]]
    tail_partial: list[bool]
    block_tokens: int
    output_lengths: list[int] = field(default_factory=list)
    shapes: list[str] = field(default_factory=list)

    @property
    def accesses(self) -> int:
        return sum(len(b) for b in self.blocks)

    @property
    def distinct(self) -> int:
        return len({b for r in self.blocks for b in r})


def load_trace(path: str | Path, block_tokens: int = 512, trace_block_tokens: int = 512) -> Trace:
    """Read a Mooncake JSON-lines trace; raise ``ValueError`` on a malformed line or block size."""
    if block_tokens < trace_block_tokens or block_tokens % trace_block_tokens:
        raise ValueError(f"--block-tokens {block_tokens} must be a multiple of the trace's {trace_block_tokens}")
    k = block_tokens // trace_block_tokens
    rows: list[tuple[float, int, list[int], int, str | None, bool]] = []
    has_output = True
    has_shape = False
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                t = float(rec["timestamp"]) / 1000.0
                n_in = int(rec["input_length"])
                ids = [int(x) for x in rec["hash_ids"]]
                n_out = rec.get("output_length")
                if n_out is None:
                    has_output = False
                n_out = int(n_out) if n_out is not None else 0
                shape = rec.get("shape")
                if shape is not None and not isinstance(shape, str):
                    raise TypeError(f"shape {shape!r} is not a string")
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{lineno}: not a Mooncake trace record ({exc})") from exc
            # the last block is partial when the tokens its ids cover end inside a block: a trace whose
            # ids cover every prompt token (a Mooncake trace: ceil(input / block) ids) ends in a partial
            # block when the input does; one of whole blocks only (floor) ends in a whole one
            partial = min(n_in, len(ids) * trace_block_tokens) % block_tokens != 0
            if k > 1 and ids:
                ids = [ids[min(len(ids) - 1, (j + 1) * k - 1)] for j in range(math.ceil(len(ids) / k))]
            has_shape = has_shape or shape is not None
            rows.append((t, n_in, ids, n_out, shape, partial))
    rows.sort(key=lambda r: r[0])
    return Trace(
        path=str(path),
        times=[r[0] for r in rows],
        input_lengths=[r[1] for r in rows],
        blocks=[r[2] for r in rows],
        tail_partial=[r[5] for r in rows],
        block_tokens=block_tokens,
        output_lengths=[r[3] for r in rows] if has_output else [],
        shapes=[r[4] if r[4] is not None else "-" for r in rows] if has_shape else [],
    )


def make_policy(name: str, capacity: int, trace: Trace, next_uses: list[list[int]] | None = None) -> Policy:
    """Build a policy by name (``POLICIES`` or an ``ABLATIONS`` key); ``ValueError`` if unknown."""
    simple: dict[str, Callable[[int], Policy]] = {
        "lru": LruPolicy,
        "lfu": LfuPolicy,
        "arc": ArcPolicy,
        "s3fifo": S3FifoPolicy,
        "tinylfu": TinyLfuPolicy,
        "tinylfu-reset": lambda c: TinyLfuPolicy(c, restart=True),
        "s3fifo-2": lambda c: S3FifoPolicy(c, move_at=2),
        "lab-tierkv": TierKVPolicy,
        "tierkv": LibraryPolicy,
        "tierkv-predictive": lambda c: LibraryPolicy(c, policy="predictive", name="tierkv-predictive"),
        "tierkv-adaptive": lambda c: LibraryPolicy(c, policy="adaptive", name="tierkv-adaptive"),
        "tierkv-lru": lambda c: LibraryPolicy(c, policy="lru", name="tierkv-lru"),
    }
    if name in simple:
        return simple[name](capacity)
    if name == "belady":
        return BeladyPolicy(capacity, next_uses if next_uses is not None else next_use_index(trace.blocks))
    if name in ABLATIONS:
        opts = ABLATIONS[name]
        if isinstance(opts, TierKVOptions):
            return TierKVPolicy(capacity, opts, name=name)
        return SessionPolicy(capacity, opts, name=name)
    raise ValueError(f"unknown policy {name!r}; known: {', '.join((*POLICIES, *EXTRA_POLICIES, *ABLATIONS))}")


class _Progress:
    def __init__(self, total: int, out: TextIO | None) -> None:
        self.total = max(1, total)
        self.done = 0
        self.out = out
        self.last = -1

    def step(self, n: int, label: str) -> None:
        self.done += n
        if self.out is None:
            return
        pct = int(100 * self.done / self.total)
        if pct != self.last:
            self.last = pct
            bar = "#" * (pct // 4) + "." * (25 - pct // 4)
            self.out.write(f"\r[{bar}] {pct:3d}% {label:<28}")
            self.out.flush()

    def close(self) -> None:
        if self.out is not None:
            self.out.write("\n")
            self.out.flush()


def replay(
    trace: Trace,
    policy: Policy,
    split_time: float,
    progress: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Replay the whole trace through ``policy``; return raw counts for requests at/after ``split_time``.

    Returns ``leads`` and ``hits`` (per measured request: leading hits, resident blocks), ``measured`` (their
    request indices), ``block_hits``, ``accesses`` (measured), ``seconds``, ``cpu_seconds`` and
    ``total_accesses`` (whole replay).
    """
    req = policy.request
    times, blocks, tails = trace.times, trace.blocks, trace.tail_partial
    respond: Callable[[int, float, int], None] | None = getattr(policy, "respond", None)
    outs = trace.output_lengths
    if not outs:
        respond = None
    done: list[tuple[float, int]] = []  # (modelled completion time, request index), a min-heap
    push, pop = heapq.heappush, heapq.heappop
    ins = trace.input_lengths
    leads: list[int] = []
    hit_counts: list[int] = []
    measured_idx: list[int] = []
    bh = 0
    acc = 0
    step = 500
    t0 = time.perf_counter()
    c0 = time.process_time()
    for i in range(len(blocks)):
        ids = blocks[i]
        now = times[i]
        if respond is not None:
            # strictly causal: a request's answer length exists only once it has completed
            while done and done[0][0] <= now:
                t_done, k = pop(done)
                respond(k, t_done, outs[k])
            push(done, (completion_time(now, ins[i], outs[i]), i))
        lead, hits = req(ids, now, tails[i])
        if times[i] >= split_time:
            leads.append(lead)
            hit_counts.append(hits)
            measured_idx.append(i)
            bh += hits
            acc += len(ids)
        if progress is not None and i % step == step - 1:
            progress(step)
    secs = time.perf_counter() - t0
    cpu = time.process_time() - c0
    if progress is not None:
        progress(len(blocks) % step)
    return {
        "leads": leads,
        "hits": hit_counts,
        "measured": measured_idx,
        "block_hits": bh,
        "accesses": acc,
        "seconds": secs,
        "cpu_seconds": cpu,
        "total_accesses": trace.accesses,
    }


def truncate(trace: Trace, until: float) -> Trace:
    """The requests of ``trace`` before ``t0 + until * (t_end - t0)`` (at least one)."""
    t_end = trace.times[0] + until * (trace.times[-1] - trace.times[0])
    n = max(1, sum(1 for t in trace.times if t < t_end))
    return Trace(
        trace.path,
        trace.times[:n],
        trace.input_lengths[:n],
        trace.blocks[:n],
        trace.tail_partial[:n],
        trace.block_tokens,
        trace.output_lengths[:n],
        trace.shapes[:n],
    )


def add_gap_closed(results: list[dict[str, Any]]) -> None:
    """Add ``gap_closed`` to every row (in place) when LRU and Belady rows exist at its capacity."""
    ref: dict[tuple[float, bool], dict[str, float]] = {}
    for r in results:
        if r["policy"] in ("lru", "belady"):
            ref.setdefault((r["capacity_fraction"], "tiers" in r), {})[r["policy"]] = r["prefix_hit_rate"]
    for r in results:
        d = ref.get((r["capacity_fraction"], "tiers" in r), {})
        if "lru" in d and "belady" in d and d["belady"] > d["lru"]:
            r["gap_closed"] = (r["prefix_hit_rate"] - d["lru"]) / (d["belady"] - d["lru"])


def _parse_fractions(text: str, flag: str) -> list[float]:
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        v = float(part[:-1]) / 100.0 if part.endswith("%") else float(part)
        if not 0.0 < v <= 1.0:
            raise ValueError(f"{flag}: {part!r} is not a fraction in (0, 1] or a percentage in (0%, 100%]")
        out.append(v)
    if not out:
        raise ValueError(f"{flag}: empty")
    return out


def _parse_tiers(text: str) -> list[tuple[str, float]]:
    tiers = []
    for part in text.split(","):
        name, _, frac = part.partition("=")
        name = name.strip()
        if name not in _TIER_COST or not frac:
            raise ValueError(f"--tiers: {part!r}; expected NAME=FRACTION with NAME in {', '.join(_TIER_COST)}")
        tiers.append((name, _parse_fractions(frac, "--tiers")[0]))
    return tiers


def _metrics(
    trace: Trace,
    raw: dict[str, Any],
    per_tier_leads: list[list[int]] | None,
    tier_names: list[str],
    prefill_rate: float,
    bytes_per_token: int,
) -> dict[str, Any]:
    bt = trace.block_tokens
    acc = raw["accesses"] or 1
    saved = 0
    ttft = 0.0
    tier_hits = [0] * len(tier_names)
    block_bytes = bt * bytes_per_token
    for k, i in enumerate(raw["measured"]):
        n_in = trace.input_lengths[i]
        if per_tier_leads is None:
            lead = raw["leads"][k]
            lat, bw = _TIER_COST["dram"]
            fetch = lead * (lat + block_bytes / bw)
        else:
            lead = per_tier_leads[-1][k]
            fetch = 0.0
            prev = 0
            for t, name in enumerate(tier_names):
                cum = max(prev, per_tier_leads[t][k])
                n = cum - prev
                tier_hits[t] += n
                lat, bw = _TIER_COST[name]
                fetch += n * (lat + block_bytes / bw)
                prev = cum
        tok = min(lead * bt, n_in)
        saved += tok
        ttft += (n_in - tok) / prefill_rate + fetch
    n_req = max(1, len(raw["measured"]))
    out: dict[str, Any] = {
        "block_hit_rate": raw["block_hits"] / acc,
        "prefix_hit_rate": sum(per_tier_leads[-1] if per_tier_leads else raw["leads"]) / acc,
        "prefill_tokens_saved": saved,
        "modeled_ttft_s": ttft / n_req,
        "accesses_per_s": raw["total_accesses"] / raw["seconds"] if raw["seconds"] > 0 else float("inf"),
        "accesses_per_cpu_s": raw["total_accesses"] / raw["cpu_seconds"] if raw["cpu_seconds"] > 0 else float("inf"),
        "measured_requests": len(raw["measured"]),
        "measured_accesses": raw["accesses"],
    }
    if per_tier_leads is not None:
        out["hits_per_tier"] = dict(zip(tier_names, tier_hits, strict=True))
    if trace.shapes:
        out["per_shape"] = _per_shape(trace, raw, per_tier_leads[-1] if per_tier_leads else raw["leads"])
    return out


def _per_shape(trace: Trace, raw: dict[str, Any], leads: list[int]) -> dict[str, dict[str, Any]]:
    """Per shape (in order of first measured request): prefix and block hit rates, requests, accesses."""
    counts: dict[str, list[int]] = {}  # shape -> [leading hits, resident blocks, requests, accesses]
    for k, i in enumerate(raw["measured"]):
        c = counts.setdefault(trace.shapes[i], [0, 0, 0, 0])
        c[0] += leads[k]
        c[1] += raw["hits"][k]
        c[2] += 1
        c[3] += len(trace.blocks[i])
    return {
        shape: {
            "prefix_hit_rate": lead / (acc or 1),
            "block_hit_rate": hits / (acc or 1),
            "requests": n,
            "accesses": acc,
        }
        for shape, (lead, hits, n, acc) in counts.items()
    }


def _calibrations(
    trace: Trace, split_time: float, probes: dict[float, tuple[list[float], list[bool]]], horizon: float
) -> list[dict[str, Any]]:
    """Per probed capacity and outcome (``reuse``, ``training label``): the calibration over the measured part."""
    first = next((i for i, t in enumerate(trace.times) if t >= split_time), len(trace.times))
    skip = sum(len(b) for b in trace.blocks[:first])
    plain = [o for row in reuse_outcomes(trace.times, trace.blocks, horizon)[first:] for o in row]
    out: list[dict[str, Any]] = []
    for f, (ps, credit) in sorted(probes.items()):
        rows, k = [], 0
        for b in trace.blocks:
            rows.append(credit[k : k + len(b)])
            k += len(b)
        labelled = [o for row in reuse_outcomes(trace.times, trace.blocks, horizon, rows)[first:] for o in row]
        measured = ps[skip:]
        for outcome, obs in (("reuse", plain), ("training label", labelled)):
            pairs = [(p, o) for p, o in zip(measured, obs, strict=True) if o is not None]
            if not pairs:
                continue
            out.append(
                {
                    "policy": "lab-tierkv",
                    "capacity_fraction": f,
                    "outcome": outcome,
                    "horizon_s": horizon,
                    "censored": len(obs) - len(pairs),
                    "table": calibrate([p for p, _ in pairs], [o for _, o in pairs]),
                }
            )
    return out


def _plot(results: list[dict[str, Any]], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    by_policy: dict[str, list[tuple[float, float]]] = {}
    for r in results:
        if "tiers" not in r:
            by_policy.setdefault(r["policy"], []).append((r["capacity_fraction"] * 100, r["prefix_hit_rate"]))
    for name, pts in by_policy.items():
        pts.sort()
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        if name.startswith("lab-tierkv-"):  # ablations: thin grey, labelled at their last point
            ax.plot(xs, ys, ":", color="0.6", lw=0.9)
            ax.annotate(name[7:], (xs[-1], ys[-1]), fontsize=6, color="0.4", xytext=(3, 0), textcoords="offset points")
        else:
            ax.plot(xs, ys, "-", marker="o", lw=2.6 if name == "tierkv" else 1.3, label=name)
    ax.set_xlabel("cache capacity (% of distinct blocks)")
    ax.set_ylabel("prefix hit rate (measured part)")
    ax.set_title(title, fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _table(results: list[dict[str, Any]], out: TextIO) -> None:
    out.write(
        f"{'policy':<30}{'capacity':>9}{'blocks':>8}{'block hit':>10}{'prefix hit':>11}{'gap closed':>11}"
        f"{'TTFT s':>8}{'acc/s':>10}\n"
    )
    for r in results:
        cap = f"{r['capacity_fraction'] * 100:.3g}%"
        gap = f"{r['gap_closed'] * 100:.1f}%" if "gap_closed" in r else "-"
        out.write(
            f"{r['policy']:<30}{cap:>9}{r['capacity_blocks']:>8}{r['block_hit_rate']:>10.4f}"
            f"{r['prefix_hit_rate']:>11.4f}{gap:>11}{r['modeled_ttft_s']:>8.3f}{r['accesses_per_s']:>10.0f}\n"
        )


def _shape_table(results: list[dict[str, Any]], out: TextIO) -> None:
    """Per (shape, capacity): measured requests and accesses, and each policy's prefix hit rate (rows
    without tiers); writes nothing unless the rows carry two shapes or more."""
    rows = [r for r in results if "tiers" not in r and "per_shape" in r]
    shapes: list[str] = []
    for r in rows:
        shapes += [s for s in r["per_shape"] if s not in shapes]
    if len(shapes) < 2:
        return
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    caps = sorted({r["capacity_fraction"] for r in rows})
    by = {(r["policy"], r["capacity_fraction"]): r["per_shape"] for r in rows}
    widths = [max(10, len(p) + 2) for p in policies]
    out.write("\nper shape: prefix hit rate of the measured requests of each shape\n")
    out.write(
        f"{'shape':<16}{'capacity':>9}{'requests':>10}{'accesses':>11}"
        + "".join(f"{p:>{w}}" for p, w in zip(policies, widths, strict=True))
        + "\n"
    )
    for shape in shapes:
        for f in caps:
            cells = [by.get((p, f), {}).get(shape) for p in policies]
            first = next((c for c in cells if c is not None), None)
            if first is None:
                continue
            out.write(
                f"{shape:<16}{f'{f * 100:.3g}%':>9}{first['requests']:>10}{first['accesses']:>11}"
                + "".join(
                    f"{c['prefix_hit_rate']:>{w}.4f}" if c is not None else f"{'-':>{w}}"
                    for c, w in zip(cells, widths, strict=True)
                )
                + "\n"
            )


def main(argv: list[str]) -> int:
    """``tierkv replay`` entry point; returns 0 on success, 2 on a usage or input error."""
    ap = argparse.ArgumentParser(
        prog="tierkv replay", description="Replay a Mooncake-format trace against cache policies."
    )
    ap.add_argument("trace")
    ap.add_argument("--block-tokens", type=int, default=512)
    ap.add_argument("--trace-block-tokens", type=int, default=512)
    ap.add_argument("--capacity", default="1%,5%,10%")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--ablations", action="store_true", help="also run lab-tierkv with each component off")
    ap.add_argument("--split", type=float, default=0.4)
    ap.add_argument("--until", type=float, default=1.0, help="replay only the first fraction of the trace (time)")
    ap.add_argument("--tiers", default=None, help="e.g. hbm=1%%,dram=5%%,nvme=25%%")
    ap.add_argument("--prefill-rate", type=float, default=10_000.0, help="tokens/s of prefill (default 10000)")
    ap.add_argument("--kv-bytes-per-token", type=int, default=131_072, help="default: Llama-3-8B FP16")
    ap.add_argument("--json", dest="json_out", default=None)
    ap.add_argument("--plot", default=None)
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument(
        "--calibration", action="store_true", help="reliability table and Brier score of lab-tierkv's predictor"
    )
    try:
        args = ap.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code) if isinstance(exc.code, int) else 2
    try:
        if not 0.0 <= args.split < 1.0:
            raise ValueError(f"--split {args.split} must be in [0, 1)")
        if not 0.0 < args.until <= 1.0:
            raise ValueError(f"--until {args.until} must be in (0, 1]")
        if args.prefill_rate <= 0 or args.kv_bytes_per_token <= 0:
            raise ValueError("--prefill-rate and --kv-bytes-per-token must be > 0")
        fractions = _parse_fractions(args.capacity, "--capacity")
        names = [p.strip() for p in args.policies.split(",") if p.strip()]
        if args.ablations:
            names += [a for a in ABLATIONS if a not in names]
        if args.calibration and "lab-tierkv" not in names:
            names.append("lab-tierkv")
        for n in names:
            if n not in POLICIES and n not in EXTRA_POLICIES and n not in ABLATIONS:
                raise ValueError(f"unknown policy {n!r}; known: {', '.join((*POLICIES, *EXTRA_POLICIES, *ABLATIONS))}")
        tiers = _parse_tiers(args.tiers) if args.tiers else []
        trace = load_trace(args.trace, args.block_tokens, args.trace_block_tokens)
    except (ValueError, OSError) as exc:
        print(f"tierkv replay: {exc}", file=sys.stderr)
        return 2
    if not trace.blocks:
        print("tierkv replay: the trace has no requests", file=sys.stderr)
        return 2
    distinct = trace.distinct
    if args.until < 1.0:
        trace = truncate(trace, args.until)
    t_first, t_last = trace.times[0], trace.times[-1]
    split_time = t_first + args.split * (t_last - t_first) if args.split > 0 else -math.inf
    next_uses = next_use_index(trace.blocks) if "belady" in names else None
    cum: list[float] = []
    for _, f in tiers:
        cum.append(min(1.0, (cum[-1] if cum else 0.0) + f))
    runs = len(names) * len(set(fractions) | set(cum))
    prog = _Progress(runs * len(trace.blocks), None if args.no_progress else sys.stderr)
    results: list[dict[str, Any]] = []
    probes: dict[float, tuple[list[float], list[bool]]] = {}
    for name in names:
        cache_runs: dict[float, dict[str, Any]] = {}
        for f in [*fractions, *[c for c in cum if c not in fractions]]:
            cap = max(1, round(f * distinct))
            pol = make_policy(name, cap, trace, next_uses)
            if args.calibration and name == "lab-tierkv" and f in fractions and isinstance(pol, TierKVPolicy):
                pol.probe = probes[f] = ([], [])
            label = f"{name} @ {f * 100:.3g}%"

            def tick(n: int, lab: str = label) -> None:
                prog.step(n, lab)

            try:
                cache_runs[f] = replay(trace, pol, split_time, tick)
            finally:
                close = getattr(pol, "close", None)
                if close is not None:
                    close()  # the library policy runs an event-loop thread
        for f in fractions:
            row: dict[str, Any] = {
                "policy": name,
                "capacity_fraction": f,
                "capacity_blocks": max(1, round(f * distinct)),
            }
            row.update(_metrics(trace, cache_runs[f], None, [], args.prefill_rate, args.kv_bytes_per_token))
            results.append(row)
        if tiers:
            raws = [cache_runs[c] for c in cum]
            row = {
                "policy": name,
                "capacity_fraction": cum[-1],
                "capacity_blocks": max(1, round(cum[-1] * distinct)),
                "tiers": {n: f for n, f in tiers},
            }
            m = _metrics(
                trace,
                raws[-1],
                [r["leads"] for r in raws],
                [n for n, _ in tiers],
                args.prefill_rate,
                args.kv_bytes_per_token,
            )
            m["accesses_per_s"] = sum(r["total_accesses"] for r in raws) / sum(r["seconds"] for r in raws)
            row.update(m)
            results.append(row)
    prog.close()
    add_gap_closed(results)
    doc = {
        "trace": trace.path,
        "block_tokens": trace.block_tokens,
        "split": args.split,
        "until": args.until,
        "requests": len(trace.blocks),
        "accesses": trace.accesses,
        "distinct_blocks": distinct,
        "results": results,
    }
    _table(results, sys.stdout)
    _shape_table(results, sys.stdout)
    if args.calibration:
        cals = _calibrations(trace, split_time, probes, TierKVOptions().predictor_config.horizon_s)
        doc["calibration"] = cals
        for c in cals:
            title = (
                f"\ncalibration of lab-tierkv's reuse predictor @ {c['capacity_fraction'] * 100:.3g}%, outcome: "
                f"{c['outcome']} within {c['horizon_s']:.0f} s ({c['censored']} censored accesses left out)"
            )
            sys.stdout.write(format_calibration(c["table"], title))
            c["table"] = c["table"].to_dict()
    try:
        if args.json_out:
            Path(args.json_out).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
        if args.plot:
            _plot(results, args.plot, f"{Path(trace.path).name}: prefix hit rate, split {args.split}")
    except OSError as exc:
        print(f"tierkv replay: cannot write output: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main(sys.argv[1:]))
