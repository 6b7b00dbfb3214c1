"""pyproject.toml declares exactly the distributions the three packages import (issue 21 item 8)."""

from __future__ import annotations

import ast
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("lacuna_tasks", "lacuna_metrics", "lacuna_unlearn")

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    tomllib = pytest.importorskip("tomli")


def _imported_top_levels() -> dict[str, str]:
    """Top-level module -> one file importing it, over every import (module level or inside a function)."""
    found: dict[str, str] = {}
    files = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")] + [ROOT / "_lacuna_lmeval_hook.py"]
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0], str(path.relative_to(ROOT)))
    return found


def _normalise(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _declared() -> set[str]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    out = set()
    for dep in deps:
        name = dep.split(";")[0]
        for sep in "<>=!~[ ":
            name = name.split(sep)[0]
        out.add(_normalise(name))
    return out


def test_every_imported_distribution_is_declared_and_nothing_else() -> None:
    stdlib = set(sys.stdlib_module_names)
    ours = {*PACKAGES, "_lacuna_lmeval_hook"}
    dists = packages_distributions()
    needed: dict[str, str] = {}
    unknown = []
    for module, where in _imported_top_levels().items():
        if module in stdlib or module in ours or module == "__future__":
            continue
        if module not in dists:
            unknown.append(f"{module} ({where})")
            continue
        for dist in dists[module]:
            needed.setdefault(_normalise(dist), where)
    assert not unknown, f"imported but not installed: {unknown}"
    declared = _declared()
    missing = {d: w for d, w in needed.items() if d not in declared}
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"
    unused = declared - set(needed)
    assert not unused, f"declared in pyproject.toml but never imported: {sorted(unused)}"
