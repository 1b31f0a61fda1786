"""``tierkv stats``: the per-tier table of a configuration, rendered in the terminal.

``tierkv stats --config FILE [--json]`` opens the configuration (persistent
tiers warm-start from disk, so their blocks and bytes show up), prints one row
per tier — tier, backend, kind, capacity, used, %, blocks, hits, misses, bytes
in/out, io path, emulated, healthy — then the miss reasons and the storage
cost per hour of the bytes in use (``[telemetry] cost_per_gb_hour``), and
exits. Volatile tiers of a fresh process are empty: the view shows what this
process sees, it does not attach to another one.

Telemetry is switched off for the view itself (no spans, no instruments).
Exit status: 0, or 2 for a bad configuration or a tier that fails to open
(the error goes to stderr).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import types
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio

from .errors import TierKVError

__all__ = ["main", "render", "snapshot"]


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


async def snapshot(config: str | Path) -> dict[str, Any]:
    """Open ``config`` with telemetry off, read the per-tier stats, close it.

    Returns ``{"tiers": [row...], "miss_reasons": {...}, "cost_per_hour_usd":
    {tier: $}, "total_cost_per_hour_usd": $}``. Raises ConfigError,
    PluginError, BackendError as :meth:`TierKV.open`.
    """
    from ._config import Config
    from ._engine import TierKV
    from ._telemetry import Telemetry

    cfg = await anyio.to_thread.run_sync(Config.load, config)
    quiet = {**cfg.telemetry, "enabled": False}
    pricing = Telemetry(quiet)  # validates the cost table, creates no instruments
    kv = await TierKV.open(dataclasses.replace(cfg, telemetry=types.MappingProxyType(quiet)))
    try:
        stats = kv.stats()
        misses = dict(kv.misses_by_reason)
    finally:
        await kv.aclose()
    rows = []
    cost: dict[str, float] = {}
    for s in stats.values():
        row = dataclasses.asdict(s)
        row["used_pct"] = 100.0 * s.used_bytes / s.capacity_bytes if s.capacity_bytes else 0.0
        rows.append(row)
        cost[s.name] = pricing.tier_cost_per_hour(s.name, s.kind, s.used_bytes)
    return {
        "tiers": rows,
        "miss_reasons": misses,
        "cost_per_hour_usd": cost,
        "total_cost_per_hour_usd": sum(cost.values()),
    }


_COLUMNS = (
    ("TIER", "name"),
    ("BACKEND", "backend"),
    ("KIND", "kind"),
    ("CAPACITY", "capacity_bytes"),
    ("USED", "used_bytes"),
    ("%", "used_pct"),
    ("BLOCKS", "blocks"),
    ("HITS", "hits"),
    ("MISSES", "misses"),
    ("IN", "bytes_in"),
    ("OUT", "bytes_out"),
    ("IO PATH", "io_path"),
    ("EMULATED", "emulated"),
    ("HEALTHY", "healthy"),
)


def _cell(field: str, v: Any) -> str:
    if field in ("capacity_bytes", "used_bytes", "bytes_in", "bytes_out"):
        return _size(float(v))
    if field == "used_pct":
        return f"{v:.1f}"
    if isinstance(v, bool):
        return "yes" if v else "no"
    return str(v)


def render(snap: Mapping[str, Any]) -> str:
    """The terminal text of a :func:`snapshot`."""
    header = [h for h, _ in _COLUMNS]
    body = [[_cell(f, row[f]) for _, f in _COLUMNS] for row in snap["tiers"]]
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in [header, *body]]
    misses: Mapping[str, int] = snap["miss_reasons"]
    lines.append("")
    if misses:
        lines.append("miss reasons: " + ", ".join(f"{k}={v}" for k, v in sorted(misses.items())))
    else:
        lines.append("miss reasons: none recorded by this process")
    cost: Mapping[str, float] = snap["cost_per_hour_usd"]
    parts = ", ".join(f"{k} ${v:.6f}" for k, v in cost.items())
    lines.append(f"storage cost per hour: ${snap['total_cost_per_hour_usd']:.6f} ({parts})")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tierkv stats", description="render the per-tier table of a configuration")
    p.add_argument("--config", required=True, help="TOML configuration file")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = p.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        snap = anyio.run(snapshot, args.config)
    except (TierKVError, OSError) as exc:
        print(f"tierkv stats: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(snap, indent=2) if args.json else render(snap))
    return 0
