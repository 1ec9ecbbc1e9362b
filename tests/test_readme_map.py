"""README's project map and config tables against the tree: every config group README and
docs/configs.md name is a folder of configs/, and the map's import arrows (``A → B``: A imports
B) are exactly the imports between the folders of src/volseg/ (none stated that is not there, none
there that is not stated)."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from itertools import takewhile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src" / "volseg"
GROUP_TABLE = "| group | choices |"
#: an arrow as the map writes it, in backticks: `memory → speed, models, utils` (folder names are
#: lowercase: the legend `A → B` is no arrow)
ARROW = re.compile(r"`([a-z_/]+) → ([a-z_/, ]+)`")


def _section(text: str, heading: str) -> str:
    """The text under ``## heading`` up to the next ``## `` heading."""
    return text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def _groups(text: str) -> list[str]:
    """The groups a doc's ``| group | choices |`` table names: each backticked name of a row's
    first cell (`experiment`, `hparams_search` names two)."""
    lines = text.splitlines()
    rows = takewhile(lambda line: line.startswith("|"), lines[lines.index(GROUP_TABLE) + 2 :])
    return [name for row in rows for name in re.findall(r"`([^`]+)`", row.split("|")[1])]


def _missing_groups(text: str) -> list[str]:
    return [g for g in _groups(text) if not (REPO / "configs" / g).is_dir()]


def _imports(parent: str) -> set[tuple[str, str]]:
    """(A, B) for each folder A of src/volseg/``parent`` with a module that imports from folder
    B beside it: ``from volseg.B...``, ``import volseg.B...`` or ``from volseg import B``, also
    inside a function. Folders are named from src/volseg/ (``memory/fit``)."""
    root = SRC / parent
    prefix = ".".join(["volseg", *Path(parent).parts])
    folders = {p.name for p in root.iterdir() if (p / "__init__.py").exists()}
    found = set()
    for folder in folders:
        for path in (root / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    modules = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    modules = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
                else:
                    continue
                for module in modules:
                    if module.startswith(prefix + "."):
                        target = module[len(prefix) + 1 :].split(".")[0]
                        if target in folders and target != folder:
                            found.add((str(Path(parent, folder)), str(Path(parent, target))))
    return found


def _arrow_problems(text: str) -> list[str]:
    """Each arrow the map states that no import makes, and each import between folders of
    src/volseg/ (or of a folder the map opens, ``memory/``) that the map does not state."""
    stated = {
        (source, target.strip())
        for source, targets in ARROW.findall(_section(text, "Project map"))
        for target in targets.split(",")
    }
    by_parent = defaultdict(set)
    for source, target in stated:
        by_parent[str(Path(source).parent)].add((source, target))
    problems = [] if "." in by_parent else ["no arrow between src/volseg/'s folders"]
    for parent, arrows in sorted(by_parent.items()):
        real = _imports("" if parent == "." else parent)
        problems += [f"{a} → {b}: stated, no such import" for a, b in sorted(arrows - real)]
        problems += [f"{a} → {b}: imported, not in the map" for a, b in sorted(real - arrows)]
    return problems


@pytest.mark.parametrize("doc", ["README.md", "docs/configs.md"])
def test_every_config_group_a_doc_names_is_a_folder_of_configs(doc):
    text = (REPO / doc).read_text()
    assert {"model/net", "memory", "hydra/launcher"} <= set(_groups(text))  # the table was read
    assert _missing_groups(text) == []


def test_a_group_that_is_gone_fails_the_check():
    text = (REPO / "README.md").read_text()
    doctored = text.replace("| `logger` |", "| `estimate` | `default` |\n| `logger` |", 1)
    assert _missing_groups(doctored) == ["estimate"]


def test_the_maps_import_arrows_are_the_imports_between_src_volsegs_folders():
    assert _arrow_problems((REPO / "README.md").read_text()) == []


def test_an_arrow_left_out_or_made_up_fails_the_check():
    text = (REPO / "README.md").read_text()
    assert _arrow_problems(text.replace("`speed → models, utils`", "`speed → data, utils`", 1)) == [
        "speed → data: stated, no such import",
        "speed → models: imported, not in the map",
    ]
