"""The ``tierkv`` command.

Each subcommand lives in the module that owns it and exposes
``main(argv: list[str]) -> int``; this dispatcher imports it only when used,
so ``tierkv backends`` never imports torch or a device library.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import sys
from collections.abc import Callable, Sequence

__all__ = ["main"]

#: subcommand -> (module, one-line help)
_SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "backends": ("tierkv._cli", "list installed backends and whether they can run here"),
    "demo": ("tierkv._demo", "the main job: real SmolLM2 KV stored in DRAM+PFS, TTFT with and without tierkv"),
    "certify": ("tierkv_conformance._certify", "run the conformance suite on a backend and write a certificate"),
    "replay": ("tierkv.scheduler._replay", "replay a Mooncake-format trace against cache policies"),
    "codec-eval": ("tierkv.codecs._eval", "measure codec levels on real SmolLM2 KV"),
    "stats": ("tierkv._statsview", "render the per-tier table of a configuration (persistent tiers warm-started)"),
}


def _backends_main(argv: list[str]) -> int:
    from ._registry import backend_listing

    p = argparse.ArgumentParser(prog="tierkv backends", description=_SUBCOMMANDS["backends"][1])
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = p.parse_args(argv)
    rows = backend_listing()
    if args.json:
        print(json.dumps([dataclasses.asdict(r) for r in rows], indent=2))
        return 0
    w = max((len(r.name) for r in rows), default=4)
    d = max((len(f"{r.distribution} {r.version}") for r in rows), default=12)
    print(f"{'NAME':<{w}}  {'DISTRIBUTION':<{d}}  USABLE  REASON")
    for r in rows:
        why = r.reason + (f" (hint: {r.hint})" if r.hint and r.hint not in r.reason else "")
        print(f"{r.name:<{w}}  {r.distribution + ' ' + r.version:<{d}}  {'yes' if r.usable else 'no':<6}  {why}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print("usage: tierkv SUBCOMMAND [ARGS...]\n\nsubcommands:")
        for name, (_, helptext) in _SUBCOMMANDS.items():
            print(f"  {name:<11} {helptext}")
        return 0 if args else 2
    if args[0] in ("-V", "--version"):
        from . import __version__

        print(f"tierkv {__version__}")
        return 0
    sub, rest = args[0], args[1:]
    if sub not in _SUBCOMMANDS:
        print(f"tierkv: unknown subcommand {sub!r}; see 'tierkv --help'", file=sys.stderr)
        return 2
    if sub == "backends":
        return _backends_main(rest)
    module = importlib.import_module(_SUBCOMMANDS[sub][0])
    entry: Callable[[list[str]], int] = module.main
    return int(entry(rest))


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
