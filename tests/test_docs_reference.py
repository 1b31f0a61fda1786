"""docs/ holds reference pages: no run-by-run history, and every results file they cite exists.

Lab logs and measurement histories live in dated files under ``benchmarks/results/``; a page in ``docs/``
describes what the code does and points there. This test keeps both halves true.
"""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "docs").glob("*.md"))

#: phrases of a work log, not of a reference page
HISTORY = re.compile(
    r"\bprevious (run|session)s?\b|\bsession \d+\b|\bthis session\b|\bthe issue\b|\bissue \d+\b|\bclosing note",
    re.IGNORECASE,
)
CITED = re.compile(r"benchmarks/results/([\w.{},*-]+)")


def test_there_are_pages() -> None:
    assert {p.name for p in PAGES} >= {"scheduler.md", "tiers.md", "codecs.md", "rdma.md"}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_page_has_no_work_log_phrases(page: Path) -> None:
    hits = [
        f"{page.name}:{n}: {m.group(0)!r}"
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
        for m in HISTORY.finditer(line)
    ]
    assert not hits, "work-log phrases in a reference page (move the history to benchmarks/results/):\n" + "\n".join(
        hits
    )


def _expand(name: str) -> list[str]:
    """``a.{txt,json}`` -> ``["a.txt", "a.json"]`` (one brace group at a time)."""
    m = re.search(r"\{([^}]*)\}", name)
    if m is None:
        return [name]
    return [x for alt in m.group(1).split(",") for x in _expand(name[: m.start()] + alt + name[m.end() :])]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_cited_results_files_exist(page: Path) -> None:
    present = [f.name for f in (ROOT / "benchmarks" / "results").iterdir()]
    missing = [
        cited
        for m in CITED.finditer(page.read_text(encoding="utf-8"))
        if (cited := m.group(1).rstrip(".,"))
        for name in _expand(cited)
        if not fnmatch.filter(present, name)
    ]
    assert not missing, f"{page.name} cites results files that do not exist: {missing}"
