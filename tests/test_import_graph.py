"""The core's import graph: what the library may import, read from the source with ``ast``.

The *core* is every module under ``tierkv/`` except three packages that sit on top of it:

* ``tierkv.lab`` -- the research lab (replay, simulated policies, synthetic traces, codec evaluation);
* ``tierkv.demo`` -- the SmolLM2 demo, its model loader and prompts;
* ``tierkv.integrations`` -- glue to other libraries (``transformers``).

Rules:

1. No core module imports ``tierkv.lab``, ``tierkv.demo``, ``tierkv.integrations``, ``tierkv_backends`` or
   ``tierkv_conformance``: not at module level, not inside a function, not under ``TYPE_CHECKING`` and not
   through ``importlib.import_module("literal")`` / ``__import__("literal")``.
2. The command-line entry points ``tierkv._cli`` and ``tierkv.__main__`` are core modules too, with one
   exception: they may import those packages *inside a function* (the subcommand that needs them), never at
   module level, so ``import tierkv._cli`` stays as light as the library.
3. No core module imports a heavy device or plotting library (``torch``, ``transformers``, ``matplotlib``)
   at module level: the backend or integration that needs one imports it inside the function that uses it.
   Checked statically here, and at run time by importing ``tierkv`` (and its subpackages) in a fresh
   interpreter and reading ``sys.modules``.
4. ``tierkv.codecs`` and ``tierkv.scheduler`` have no import cycle among their modules (function-level
   imports included).

Every edge is ``(importing module, imported module, line, function_level)``; a failure names each offending
edge as ``path:line importer -> imported``.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tierkv"

OUTSIDE_CORE = ("tierkv.lab", "tierkv.demo", "tierkv.integrations")
FORBIDDEN = (*OUTSIDE_CORE, "tierkv_backends", "tierkv_conformance")
ENTRY_POINTS = frozenset({"tierkv._cli", "tierkv.__main__"})
HEAVY = ("torch", "transformers", "matplotlib", "vllm")
ACYCLIC = ("tierkv.codecs", "tierkv.scheduler")


@dataclass(frozen=True, slots=True)
class Edge:
    source: str
    target: str
    path: str
    line: int
    function_level: bool

    def __str__(self) -> str:
        where = "inside a function" if self.function_level else "at module level"
        return f"{self.path}:{self.line} {self.source} -> {self.target} ({where})"


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _within(name: str, prefixes: Iterable[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _resolve(package: str, level: int, module: str | None) -> str:
    """The absolute module of ``from <level dots><module> import ...`` written in ``package``."""
    if level == 0:
        return module or ""
    parts = package.split(".")
    if level - 1 > len(parts) - 1:
        raise ValueError(f"relative import beyond the top package in {package}")
    base = parts[: len(parts) - (level - 1)]
    return ".".join([*base, module] if module else base)


def edges_of_source(source: str, name: str, is_package: bool, path: str = "<string>") -> list[Edge]:
    """Every import of a module's source: ``import``, ``from ... import`` and literal dynamic imports."""
    package = name if is_package else name.rpartition(".")[0]
    out: list[Edge] = []

    def add(target: str, node: ast.AST, in_function: bool) -> None:
        out.append(Edge(name, target, path, getattr(node, "lineno", 0), in_function))

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            if isinstance(child, ast.Import):
                for alias in child.names:
                    add(alias.name, child, in_function)
            elif isinstance(child, ast.ImportFrom):
                base = _resolve(package, child.level, child.module)
                for alias in child.names:
                    # ``from pkg import sub`` may name a submodule: record both candidates
                    add(base, child, in_function)
                    if alias.name != "*":
                        add(f"{base}.{alias.name}", child, in_function)
            elif isinstance(child, ast.Call) and child.args:
                func = child.func
                dotted = (
                    f"{func.value.id}.{func.attr}"
                    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
                    else func.id
                    if isinstance(func, ast.Name)
                    else ""
                )
                arg = child.args[0]
                if dotted in ("importlib.import_module", "import_module", "__import__") and (
                    isinstance(arg, ast.Constant) and isinstance(arg.value, str)
                ):
                    text = arg.value
                    if text.startswith("."):
                        level = len(text) - len(text.lstrip("."))
                        text = _resolve(package, level, text.lstrip(".") or None)
                    add(text, child, in_function)
            visit(child, inner)

    visit(ast.parse(source, path), False)
    return out


def edges_of(path: Path) -> list[Edge]:
    return edges_of_source(
        path.read_text(encoding="utf-8"),
        module_name(path),
        path.name == "__init__.py",
        str(path.relative_to(ROOT)),
    )


def core_modules() -> Iterator[Path]:
    for path in sorted(PACKAGE.rglob("*.py")):
        if not _within(module_name(path), OUTSIDE_CORE):
            yield path


def _core_edges() -> list[Edge]:
    return [e for p in core_modules() for e in edges_of(p)]


# ----------------------------------------------------------------------------- the walker itself


def test_walker_sees_every_kind_of_import() -> None:
    src = textwrap.dedent(
        """
        import os, torch.nn
        from . import _config
        from .. import errors
        from ..lab.replay import main
        from typing import TYPE_CHECKING
        if TYPE_CHECKING:
            from tierkv.demo import run
        class C:
            import json
        def f():
            from tierkv_backends.dram import DramBackend
            importlib.import_module("tierkv.lab.synth")
            return lambda: __import__("matplotlib")
        async def g():
            from .._cli import main
        """
    )
    edges = edges_of_source(src, "tierkv.codecs._x", is_package=False)
    got = {(e.target, e.function_level) for e in edges}
    assert {
        ("os", False),
        ("torch.nn", False),
        ("tierkv.codecs._config", False),
        ("tierkv.errors", False),
        ("tierkv.lab.replay", False),
        ("tierkv.demo.run", False),  # TYPE_CHECKING counts: the layering is about dependencies
        ("json", False),  # a class body runs at import time
        ("tierkv_backends.dram", True),
        ("tierkv.lab.synth", True),
        ("matplotlib", True),
        ("tierkv._cli", True),
    } <= got
    # ``from . import x`` in a package's __init__ resolves against the package itself
    init = edges_of_source("from . import sub\nfrom .a import b\n", "tierkv.pkg", is_package=True)
    assert {e.target for e in init} >= {"tierkv.pkg.sub", "tierkv.pkg.a.b", "tierkv.pkg.a"}


def test_walker_covers_the_whole_package() -> None:
    names = {module_name(p) for p in core_modules()}
    assert {"tierkv", "tierkv._cli", "tierkv.__main__", "tierkv.codecs._cachegen", "tierkv.scheduler"} <= names
    assert not any(_within(n, OUTSIDE_CORE) for n in names)
    # the CLI's subcommands are seen (function level), so the entry-point rule below is not vacuous
    cli = {e.target for e in edges_of(PACKAGE / "_cli.py") if e.function_level}
    assert {"tierkv.lab.replay", "tierkv.lab.codec_eval", "tierkv.demo.run", "tierkv_conformance._certify"} <= cli


# ----------------------------------------------------------------------------- the rules


def test_core_never_imports_lab_demo_integrations_backends_or_conformance() -> None:
    bad = [
        e for e in _core_edges() if _within(e.target, FORBIDDEN) and not (e.source in ENTRY_POINTS and e.function_level)
    ]
    assert not bad, "the core imports what sits on top of it:\n" + "\n".join(map(str, bad))


def test_core_imports_heavy_libraries_only_inside_functions() -> None:
    bad = [e for e in _core_edges() if _within(e.target, HEAVY) and not e.function_level]
    assert not bad, "heavy library imported at module level:\n" + "\n".join(map(str, bad))


def _cycles(nodes: set[str], graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(nodes):
        if v not in index:
            connect(v)
    return found


def test_cycle_finder_finds_a_function_level_cycle() -> None:
    assert _cycles({"a", "b", "c"}, {"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert _cycles({"a", "b"}, {"a": {"b"}}) == []


@pytest.mark.parametrize("package", ACYCLIC)
def test_subpackage_has_no_import_cycle(package: str) -> None:
    paths = [p for p in core_modules() if _within(module_name(p), [package]) and p.name != "__init__.py"]
    nodes = {module_name(p) for p in paths}
    graph: dict[str, set[str]] = {}
    lines: dict[tuple[str, str], Edge] = {}
    for p in paths:
        for e in edges_of(p):
            if e.target in nodes and e.target != e.source:
                graph.setdefault(e.source, set()).add(e.target)
                lines.setdefault((e.source, e.target), e)
    cycles = _cycles(nodes, graph)
    detail = [str(e) for (s, t), e in sorted(lines.items()) for c in cycles if s in c and t in c]
    assert not cycles, f"import cycles in {package}: {cycles}\n" + "\n".join(detail)


_PROBE = """
import json, sys
import {modules}
heavy = sorted(m for m in sys.modules if m.split(".")[0] in {heavy!r})
upper = sorted(m for m in sys.modules if m.startswith({upper!r}))
print(json.dumps({{"heavy": heavy, "upper": upper}}))
"""


def _probe(modules: str) -> dict[str, list[str]]:
    code = _PROBE.format(modules=modules, heavy=HEAVY, upper=(*[p + "." for p in FORBIDDEN], *FORBIDDEN))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    result: dict[str, list[str]] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_importing_tierkv_imports_no_heavy_library_and_nothing_above_the_core() -> None:
    got = _probe("tierkv, tierkv.codecs, tierkv.scheduler, tierkv._cli")
    assert got == {"heavy": [], "upper": []}


def test_lab_demo_and_integrations_import_their_heavy_libraries_lazily() -> None:
    got = _probe(
        "tierkv.lab.replay, tierkv.lab.codec_eval, tierkv.demo.run, tierkv.demo.vllm_engine, tierkv.integrations.transformers"
    )
    assert got["heavy"] == []
