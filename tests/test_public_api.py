"""The public surface: ``tierkv`` is the user API, ``tierkv.backend`` + ``tierkv.errors`` the
plugin-author API, and the backends, the conformance suite and the example third-party
backend are written against the latter alone."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import tierkv
import tierkv.backend
import tierkv.errors

ROOT = Path(__file__).resolve().parents[1]
#: what a backend (built-in or third-party) and the conformance suite may import from tierkv
PLUGIN_API = {"tierkv.backend", "tierkv.errors"}
PLUGIN_TREES = [
    ROOT / "tierkv_backends",
    ROOT / "conformance" / "tierkv_conformance",
    ROOT / "examples" / "redis_backend" / "tierkv_redis",
]


def tierkv_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import of a tierkv module in ``path`` (also inside functions)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "tierkv"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "tierkv":  # from tierkv import X: X may be a module or a name of the user API
                found += [(node.lineno, f"tierkv.{a.name}") for a in node.names]
            elif node.module.split(".")[0] == "tierkv":
                found.append((node.lineno, node.module))
    return found


@pytest.mark.parametrize("tree", PLUGIN_TREES, ids=lambda p: str(p.relative_to(ROOT)))
def test_backends_and_the_suite_import_only_the_plugin_api(tree: Path) -> None:
    bad = [
        f"{path.relative_to(ROOT)}:{line}: {module}"
        for path in sorted(tree.rglob("*.py"))
        for line, module in tierkv_imports(path)
        if module not in PLUGIN_API
    ]
    assert not bad, "imports outside tierkv.backend / tierkv.errors:\n" + "\n".join(bad)


#: what a backend imports from tierkv.backend and a user never needs: not in the tierkv namespace
PLUGIN_ONLY = {
    "API_VERSION",
    "MAX_TAG_BYTES",
    "Allocation",
    "Availability",
    "Backend",
    "BackendStats",
    "BlockInfo",
    "Buffer",
    "Capabilities",
    "SupportsContentHash",
    "SupportsDeviceIO",
    "SupportsScan",
    "SupportsTagLookup",
    "as_byte_view",
    "check_allocation",
    "into_view",
    "validate_key",
}
#: the rest of what a backend needs from tierkv.backend (the namespace test says nothing of these)
PLUGIN_REST = {
    "CertificationProfile",
    "OpenContext",
    "RawMeasurement",
    "Reservation",
    "ReservationLedger",
    "SupportsRawReference",
    "TierKind",
    "config_path",
    "load_backend_class",
    "opt_bool",
    "opt_choice",
    "opt_float",
    "opt_int",
    "opt_path",
    "opt_size",
    "opt_str",
    "os_error",
    "parse_size",
    "reject_unknown",
    "run_blocking",
    "tag_tenant",
}


def test_the_plugin_api_has_every_name_a_backend_needs() -> None:
    needed = PLUGIN_ONLY | PLUGIN_REST
    assert needed <= set(tierkv.backend.__all__)
    assert all(hasattr(tierkv.backend, n) for n in tierkv.backend.__all__)
    for name in tierkv.backend.__all__:  # documented where a plugin author imports it from
        obj = getattr(tierkv.backend, name)
        if isinstance(obj, type) or (callable(obj) and hasattr(obj, "__code__")):
            assert obj.__module__ == "tierkv.backend", f"tierkv.backend.{name} says it lives in {obj.__module__}"
    assert set(tierkv.errors.__all__) == {
        n for n, v in vars(tierkv.errors).items() if isinstance(v, type) and issubclass(v, tierkv.errors.TierKVError)
    }


def test_the_tierkv_namespace_is_the_user_api() -> None:
    assert not PLUGIN_ONLY & set(tierkv.__all__)
    assert not [n for n in PLUGIN_ONLY if hasattr(tierkv, n)]
    for name in ("TierKV", "Config", "TierConfig", "TenantQuota", "ModelSpec", "Scope", "GetResult", "PutResult"):
        assert name in tierkv.__all__
    assert set(tierkv.errors.__all__) <= set(tierkv.__all__)  # users catch every error from tierkv
    for name in tierkv.__all__:
        obj = getattr(tierkv, name)
        if isinstance(obj, type):
            assert obj.__module__ == "tierkv", f"tierkv.{name}.__module__ is {obj.__module__}"
    assert tierkv.ConfigError is tierkv.errors.ConfigError


def test_the_version_is_in_one_place() -> None:
    import importlib.metadata
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "tierkv.__version__"}
    assert importlib.metadata.version("tierkv") == tierkv.__version__
