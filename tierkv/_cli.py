"""The ``tierkv`` command.

Each subcommand lives in the module that owns it and exposes
``main(argv: list[str]) -> int``; this dispatcher imports it only when used
(inside the subcommand's function below), so ``tierkv backends`` never imports
torch or a device library. This module and ``__main__`` are the only ones of
the core allowed to import the lab (``tierkv.lab``), the demo (``tierkv.demo``)
and the conformance suite, and only inside functions (``tests/test_import_graph.py``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable, Sequence

__all__ = ["main"]


def _demo_main(argv: list[str]) -> int:
    from .demo.run import main as demo_main

    return demo_main(argv)


def _certify_main(argv: list[str]) -> int:
    from tierkv_conformance._certify import main as certify_main

    return int(certify_main(argv))


def _replay_main(argv: list[str]) -> int:
    from .lab.replay import main as replay_main

    return replay_main(argv)


def _codec_eval_main(argv: list[str]) -> int:
    from .lab.codec_eval import main as codec_eval_main

    return codec_eval_main(argv)


def _stats_main(argv: list[str]) -> int:
    from ._statsview import main as stats_main

    return int(stats_main(argv))


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


#: subcommand -> (entry point, one-line help)
_SUBCOMMANDS: dict[str, tuple[Callable[[list[str]], int], str]] = {
    "backends": (_backends_main, "list installed backends and whether they can run here"),
    "demo": (_demo_main, "the main job: real SmolLM2 KV in DRAM+PFS, TTFT with and without tierkv (--engine vllm)"),
    "certify": (_certify_main, "run the conformance suite on a backend and write a certificate"),
    "replay": (_replay_main, "replay a Mooncake-format trace against cache policies"),
    "codec-eval": (_codec_eval_main, "measure codec levels on real SmolLM2 KV"),
    "stats": (_stats_main, "render the per-tier table of a configuration (persistent tiers warm-started)"),
}


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
    entry = _SUBCOMMANDS[sub][0]
    return int(entry(rest))


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
