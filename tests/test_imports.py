"""Imports point one way: utils <- models <- memory <- tasks; nothing imports a task module."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).parents[1] / "src" / "volseg"
# the packages each package must not import
FORBIDDEN = {
    "utils": {"data", "models", "memory", "callbacks", "tasks"},
    "models": {"data", "memory", "callbacks", "tasks"},
    "data": {"memory", "callbacks", "tasks"},
    "memory": {"data", "callbacks", "tasks"},
    "callbacks": {"tasks"},
}


def _imported_packages(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        found |= {n.split(".")[1] for n in names if n.startswith("volseg.") and n.count(".")}
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_a_package_imports_only_the_layers_below_it(package):
    wrong = {
        f"{path.relative_to(SRC)} imports volseg.{name}"
        for path in (SRC / package).rglob("*.py")
        for name in _imported_packages(path) & FORBIDDEN[package]
    }
    assert not wrong, sorted(wrong)
