"""Imports point one way: utils <- models <- speed <- memory <- plan <- tasks; data (utils only)
is read by plan and callbacks, callbacks use data and utils, and nothing imports a task module;
outside memory/, memory is entered by its public doors only.

Two checks against one table: no source file imports a package it may not use (also inside a
function: an import deferred is still a dependency), and importing every module of a package
loads no volseg package it may not use (what a chain of imports brings in, which reading one
file's imports does not show).
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).parents[1]
SRC = REPO / "src" / "volseg"
# the volseg packages each package may import and load, besides itself
MAY_USE = {
    "utils": set(),
    "models": {"utils"},
    "data": {"utils"},
    "speed": {"utils", "models"},
    "memory": {"utils", "models", "speed"},
    "plan": {"utils", "models", "memory", "speed", "data"},
    "callbacks": {"utils", "data"},
    "tasks": {"utils", "models", "memory", "speed", "data", "plan", "callbacks"},
}

# Imports every module of each package named in argv, each in a fork of one interpreter that has
# already imported the libraries volseg's modules import at their top (so each fork pays only for
# volseg's own modules: the whole run takes seconds, not one fresh interpreter's ~6 s a package),
# and prints {package: the volseg packages in sys.modules afterwards} as JSON.
LOADS = r"""
import ast, importlib, json, os, pkgutil, sys, traceback
from pathlib import Path

src, packages = Path(sys.argv[1]), sys.argv[2:]
for path in src.rglob("*.py"):
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module]
        else:
            continue
        for name in names:
            if name.split(".")[0] not in ("volseg", "__future__"):
                try:
                    importlib.import_module(name)
                except Exception:
                    pass  # the fork that needs it says why
assert not [m for m in sys.modules if m.split(".")[0] == "volseg"], "a library imported volseg"

loads = {}
for package in packages:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            root = importlib.import_module("volseg." + package)
            for module in pkgutil.walk_packages(root.__path__, root.__name__ + "."):
                importlib.import_module(module.name)
            found = sorted({m.split(".")[1] for m in sys.modules if m.startswith("volseg.")})
        except BaseException:
            found = traceback.format_exc()
        with os.fdopen(write, "w") as out:
            out.write(json.dumps(found))
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as got:
        loads[package] = json.loads(got.read())
    os.waitpid(pid, 0)
print(json.dumps(loads))
"""


@pytest.fixture(scope="module")
def loads() -> dict[str, list[str] | str]:
    """What importing each package loads, from this checkout's ``src`` (not an installed copy);
    one run for the module (pytest keeps a failed setup's error for each test, not a rerun)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC.parent), os.environ.get("PYTHONPATH", "")]),
    }
    result = subprocess.run(
        [sys.executable, "-c", LOADS, str(SRC), *MAY_USE],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


def _imported_packages(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module == "volseg":
            names = [f"volseg.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        found |= {n.split(".")[1] for n in names if n.startswith("volseg.")}
    return found


def test_the_table_names_every_package():
    packages = {p.name for p in SRC.iterdir() if (p / "__init__.py").is_file()}
    assert packages == set(MAY_USE)


@pytest.mark.parametrize("package", sorted(MAY_USE))
def test_a_package_imports_only_the_layers_below_it(package):
    wrong = {
        f"{path.relative_to(SRC)} imports volseg.{name}"
        for path in (SRC / package).rglob("*.py")
        for name in _imported_packages(path) - MAY_USE[package] - {package}
    }
    assert not wrong, sorted(wrong)


@pytest.mark.slow
@pytest.mark.parametrize("package", sorted(MAY_USE))
def test_importing_a_package_loads_only_the_layers_below_it(package, loads):
    loaded = loads[package]
    assert isinstance(loaded, list), f"importing volseg.{package} failed:\n{loaded}"
    assert set(loaded) - MAY_USE[package] - {package} == set(), (
        f"importing volseg.{package} loads {loaded}; it may use {sorted(MAY_USE[package])}"
    )


def _private_uses(path: Path) -> set[str]:
    """Another volseg module's private names that ``path`` imports (``from volseg.x import
    _name``) or reads off an imported module (``import volseg.x as x`` then ``x._name``)."""
    tree = ast.parse(path.read_text())
    modules: dict[str, str] = {}  # a local name -> the volseg module it is bound to
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("volseg"):
            for alias in node.names:
                if alias.name.startswith("_"):
                    found.add(f"{node.module}.{alias.name}")
                else:  # a submodule imported by name may be read from below
                    modules[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("volseg") and alias.asname:
                    modules[alias.asname] = alias.name
                parts = alias.name.split(".")
                if parts[0] == "volseg" and any(p.startswith("_") for p in parts[1:]):
                    found.add(alias.name)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            found.add(f"{modules[node.value.id]}.{node.attr}")
    return found


def test_no_module_imports_another_modules_private_names():
    """A name with a leading underscore is its module's own: another module that needs it
    needs a public, named helper (memory/ and plan/ above all, where one engine serves all)."""
    wrong = {
        f"{path.relative_to(SRC)} uses {name}"
        for path in SRC.rglob("*.py")
        for name in _private_uses(path)
    }
    assert not wrong, sorted(wrong)


def _module_name(path: Path, package: Path = SRC) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_modules(path: Path, known: set[str]) -> set[str]:
    """The modules of ``known`` that ``path`` imports, at module level or inside a function
    alike."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        found |= {n for n in names if n in known}
    return found


@pytest.mark.parametrize("package", [SRC, SRC.parents[1] / "benchmarks"], ids=lambda p: p.name)
def test_no_import_cycle_among_a_packages_modules(package):
    """Imports point one way between modules too: an import moved into a function to dodge a
    cycle (a wrapper in a module the engine is built on, importing the engine) still is one;
    in benchmarks/ too."""
    paths = {_module_name(path, package): path for path in package.rglob("*.py")}
    graph = {name: _imported_modules(path, set(paths)) - {name} for name, path in paths.items()}
    # a package's __init__ re-exporting its modules is not a cycle of theirs
    graph = {
        name: {n for n in edges if not name.startswith(n + ".")} for name, edges in graph.items()
    }
    cycles, done, stack = [], set(), []

    def visit(name: str) -> None:
        if name in stack:
            cycles.append(stack[stack.index(name) :] + [name])
            return
        if name in done:
            return
        stack.append(name)
        for other in sorted(graph[name]):
            visit(other)
        stack.pop()
        done.add(name)

    for name in sorted(graph):
        visit(name)
    assert not cycles, [" -> ".join(c) for c in cycles]


#: ``volseg.memory.<room>...``: a door past memory's public names
DEEP_MEMORY = re.compile(r"\bvolseg\.memory\.(estimate|fit|monitor)\b[\w.]*")


def _deep_memory_imports(path: Path) -> list[str]:
    """Each ``volseg.memory.<room>.<module>`` that ``path`` imports (a Python file, also inside a
    function) or names (a config's ``_target_``), as ``path:line: name``."""
    if path.suffix != ".py":
        lines = enumerate(path.read_text().splitlines(), 1)
        return [
            f"{path}:{n}: {m.group(0)}" for n, text in lines for m in DEEP_MEMORY.finditer(text)
        ]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module]
        else:
            continue
        found += [f"{path}:{node.lineno}: {name}" for name in names if DEEP_MEMORY.match(name)]
    return found


def test_outside_memory_its_names_come_from_its_public_doors():
    """Code outside memory/ (the package, the entry points, the configs) imports memory's names
    from ``volseg.memory``, never from a room: memory can move its insides without its callers
    knowing."""
    outside = [p for p in SRC.rglob("*.py") if "memory" not in p.relative_to(SRC).parts[:1]]
    outside += sorted(REPO.glob("*.py")) + sorted((REPO / "configs").rglob("*.yaml"))
    assert len(outside) > 60
    assert [hit for path in outside for hit in _deep_memory_imports(path)] == []


def test_a_deep_import_of_memory_is_found_at_the_top_in_a_function_and_in_a_config(tmp_path):
    module = tmp_path / "module.py"
    module.write_text(
        "from volseg.memory import estimate_run\n"
        "from volseg.memory.fit import step_fit\n"
        "def f():\n"
        "    from volseg.memory.fit.step_fit import Planner\n"
    )
    config = tmp_path / "config.yaml"
    config.write_text("_target_: volseg.memory.monitor.callback.MemoryMonitor\n")
    assert _deep_memory_imports(module) == [
        f"{module}:2: volseg.memory.fit",
        f"{module}:4: volseg.memory.fit.step_fit",
    ]
    hit = "volseg.memory.monitor.callback.MemoryMonitor"
    assert _deep_memory_imports(config) == [f"{config}:1: {hit}"]


def _shared_names(root: Path) -> dict[str, list[str]]:
    """File names that more than one module under ``root`` has (a package's ``__init__`` aside),
    with the modules."""
    by_name: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        if path.name != "__init__.py":
            by_name.setdefault(path.name, []).append(str(path.relative_to(root)))
    return {name: paths for name, paths in by_name.items() if len(paths) > 1}


def test_no_two_modules_share_a_file_name(tmp_path):
    """A name says which module it is: ``memory/fit/step_fit.py``, not a second ``step.py``."""
    assert _shared_names(SRC) == {}
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
        (tmp_path / folder / "step.py").write_text("")
    assert _shared_names(tmp_path) == {"step.py": ["a/step.py", "b/step.py"]}
