"""Entry-point discovery, validation and each error path, with fake dist-info dirs on sys.path."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tierkv import (
    PluginConflictError,
    PluginNotFoundError,
    PluginUnavailableError,
    PluginValidationError,
)
from tierkv import _registry as reg
from tierkv._cli import main as cli_main
from tierkv.backend import Backend

GOOD = """
from tierkv_backends.dram import DramBackend

class GoodBackend(DramBackend):
    pass
"""


def make_dist(root: Path, dist: str, entries: dict[str, str], modules: dict[str, str]) -> None:
    info = root / f"{dist}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    lines = "\n".join(f"{k} = {v}" for k, v in entries.items())
    (info / "entry_points.txt").write_text(f"[tierkv.backends]\n{lines}\n")
    for name, src in modules.items():
        (root / f"{name}.py").write_text(textwrap.dedent(src))


@pytest.fixture
def fake_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.syspath_prepend(str(tmp_path))
    reg.refresh()
    yield tmp_path
    for mod in [m for m in sys.modules if m.startswith("fakemod_")]:
        del sys.modules[mod]
    reg.refresh()


def test_builtins_listed_without_import() -> None:
    names = {p.name for p in reg.list_plugins(reg.BACKENDS_GROUP)}
    assert {"dram", "pfs", "nvme", "cxl", "hbm", "rdma"} <= names
    assert {p.distribution for p in reg.list_plugins(reg.BACKENDS_GROUP) if p.name == "dram"} == {"tierkv"}


def test_builtin_loads_and_validates() -> None:
    cls = reg.load_backend_class("dram")
    assert issubclass(cls, Backend)
    assert reg.load_backend_class("dram") is cls  # cached


def test_third_party_backend_is_found(fake_site: Path) -> None:
    make_dist(fake_site, "tierkv_good", {"goodone": "fakemod_good:GoodBackend"}, {"fakemod_good": GOOD})
    reg.refresh()
    info = [p for p in reg.list_plugins(reg.BACKENDS_GROUP) if p.name == "goodone"]
    assert info and info[0].distribution == "tierkv_good"
    assert "fakemod_good" not in sys.modules  # listing does not import
    cls = reg.load_backend_class("goodone")
    assert cls.__name__ == "GoodBackend"


def test_not_found() -> None:
    with pytest.raises(PluginNotFoundError, match="nosuch"):
        reg.load_backend_class("nosuch")


def test_conflict(fake_site: Path) -> None:
    make_dist(fake_site, "dist_a", {"twin": "fakemod_a:GoodBackend"}, {"fakemod_a": GOOD})
    make_dist(fake_site, "dist_b", {"twin": "fakemod_b:GoodBackend"}, {"fakemod_b": GOOD})
    reg.refresh()
    with pytest.raises(PluginConflictError, match=r"dist_a.*dist_b|dist_b.*dist_a"):
        reg.load_backend_class("twin")
    row = [r for r in reg.backend_listing() if r.name == "twin"]
    assert row and not row[0].usable and "conflict" in row[0].reason


def test_missing_dependency_is_unavailable(fake_site: Path) -> None:
    make_dist(fake_site, "dist_dep", {"needy": "fakemod_needy:B"}, {"fakemod_needy": "import not_a_real_module_xyz\n"})
    reg.refresh()
    with pytest.raises(PluginUnavailableError, match="not_a_real_module_xyz"):
        reg.load_backend_class("needy")


@pytest.mark.parametrize(
    ("src", "why"),
    [
        ("B = 42\n", "not a subclass"),
        ("class B:\n    pass\n", "not a subclass"),
        ("from tierkv.backend import Backend\nclass B(Backend):\n    pass\n", "abstract"),
        (GOOD + "\nclass B(GoodBackend):\n    api_version = 99\n", "api_version"),
        (GOOD + "\nclass B(GoodBackend):\n    def evict(self, key):\n        return True\n", "coroutine"),
        (GOOD + "\nclass B(GoodBackend):\n    async def stats(self):\n        return None\n", "plain method"),
        ("raise RuntimeError('boom at import')\n", "boom at import"),
        ("from tierkv.backend import Backend\n", "does not exist"),
    ],
)
def test_validation_errors(fake_site: Path, src: str, why: str) -> None:
    mod = f"fakemod_v{abs(hash(src)) % 10**8}"
    make_dist(fake_site, f"dist_{mod}", {"broken": f"{mod}:B"}, {mod: src})
    reg.refresh()
    with pytest.raises(PluginValidationError, match=why):
        reg.load_backend_class("broken")
    # the listing reports it as unusable instead of skipping it
    row = [r for r in reg.backend_listing() if r.name == "broken"]
    assert row and not row[0].usable


def test_cli_backends_lists_everything(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["backends"]) == 0
    out = capsys.readouterr().out
    for name in ("dram", "pfs", "nvme", "cxl", "hbm", "rdma"):
        assert name in out
    assert cli_main(["backends", "--json"]) == 0
    import json

    rows = json.loads(capsys.readouterr().out)
    dram = next(r for r in rows if r["name"] == "dram")
    assert dram["usable"] is True and dram["distribution"] == "tierkv"
