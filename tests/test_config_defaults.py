"""One source for every default: a value a user can set has its default in the YAML. Composes
every shipped entry config and fails where a volseg constructor's default disagrees with the
value the YAML gives its argument, where a reader of the config writes a key's default again
(``cfg.get(key, value)`` for a key the YAML declares), or where a constructor argument the YAML
sets is never read."""

from __future__ import annotations

import ast
import inspect
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from hydra.utils import get_method
from omegaconf import DictConfig, OmegaConf

from tests.conftest import REPO, compose_config
from volseg.utils.config import renamed_key

ENTRY_CONFIGS = ("train", "eval", "predict", "plan", "estimate_memory")
SRC = REPO / "src" / "volseg"
#: the packages that read the composed config (their ``.get(key, value)`` are config fallbacks)
READERS = ("memory", "plan", "tasks")
#: drifts not fixed yet, each with why (an entry fixed must leave this list)
NOT_YET: dict[str, str] = {}


def _constructor(target: object) -> object:
    """The function a ``_target_`` is called through: a class's first ``__init__``."""
    if inspect.isclass(target):
        return next(c.__init__ for c in target.__mro__ if "__init__" in vars(c))
    return target


def _own(target: object) -> bool:
    """Whether volseg defines the constructor (a library's inherited defaults are its own)."""
    return getattr(_constructor(target), "__module__", "").startswith("volseg.")


def _targets(cfg: DictConfig, path: str = "") -> Iterator[tuple[str, DictConfig]]:
    """Each config node with a volseg ``_target_``, with its dotted path."""
    if cfg._is_none() or cfg._is_missing():
        return
    if str(cfg.get("_target_", "")).startswith("volseg."):
        yield path, cfg
    for key in cfg:
        node = cfg._get_node(key)
        if isinstance(node, DictConfig):
            yield from _targets(node, f"{path}.{key}" if path else str(key))


def _leaves(cfg: DictConfig, path: str = "") -> Iterator[tuple[str, object]]:
    """Every scalar the config declares, ``(dotted key, value)``."""
    if cfg._is_none() or cfg._is_missing():
        return
    for key in cfg:
        node = cfg._get_node(key)
        dotted = f"{path}.{key}" if path else str(key)
        if isinstance(node, DictConfig):
            yield from _leaves(node, dotted)
        elif not OmegaConf.is_list(node) and not OmegaConf.is_missing(cfg, key):
            try:
                yield dotted, OmegaConf.select(cfg, str(key))
            except Exception:  # an interpolation of something the test does not set
                continue


@pytest.fixture(scope="module")
def composed(tmp_path_factory) -> dict[str, DictConfig]:
    out = tmp_path_factory.mktemp("defaults")
    return {name: compose_config(name, out / name) for name in ENTRY_CONFIGS}


def _plain(value: object) -> object:
    if OmegaConf.is_config(value):
        value = OmegaConf.to_container(value, resolve=True)
    return list(value) if isinstance(value, tuple) else value


def test_constructor_defaults_agree_with_the_yaml(composed):
    drift = {}
    for name, cfg in composed.items():
        for path, node in _targets(cfg):
            target = get_method(node._target_)
            if not _own(target):
                continue
            params = inspect.signature(target).parameters
            for key in node:
                param = params.get(str(key))
                if param is None or param.default in (inspect.Parameter.empty, None):
                    continue  # no default: the YAML's is the only one
                value = _plain(OmegaConf.select(node, str(key)))
                if _plain(param.default) != value:
                    drift[f"{path}.{key}"] = (
                        f"{name}: {value!r}, {node._target_} says {param.default!r}"
                    )
    assert sorted(drift) == sorted(NOT_YET), drift


#: arguments the YAML sets that a constructor takes and does not read, each with why
UNREAD_NOT_YET: dict[str, str] = {}


def _names_read(target: object) -> set[str]:
    """The names a constructor's (or a function's) body reads, its docstring aside."""
    if inspect.isclass(target):  # the constructor that takes the arguments: the first defined
        target = next(c.__init__ for c in target.__mro__ if "__init__" in vars(c))
    if not inspect.isfunction(target):  # a builtin constructor (a dataclass without fields)
        return set()
    tree = ast.parse(textwrap.dedent(inspect.getsource(target))).body[0]
    return {n.id for statement in tree.body for n in ast.walk(statement) if isinstance(n, ast.Name)}


def test_constructor_arguments_the_yaml_sets_are_read(composed):
    unread = set()
    for cfg in composed.values():
        for path, node in _targets(cfg):
            target = get_method(node._target_)
            params, read = inspect.signature(target).parameters, _names_read(target)
            for key in node:
                if str(key) in params and str(key) not in read:
                    unread.add(f"{path}.{key}")
    assert sorted(unread) == sorted(UNREAD_NOT_YET)


def _fallbacks() -> Iterator[tuple[str, str, object]]:
    """``(file:line, key, value)`` of each ``x.get("key", constant)`` in the package."""
    for path in sorted(p for package in READERS for p in (SRC / package).rglob("*.py")):
        for call in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Attribute)
                and call.func.attr == "get"
                and len(call.args) == 2
                and isinstance(call.args[0], ast.Constant)
                and isinstance(call.args[1], ast.Constant)
                and isinstance(call.args[0].value, str)
            ):
                where = f"{path.relative_to(REPO)}:{call.lineno}"
                yield where, call.args[0].value, call.args[1].value


def test_a_key_the_yaml_declares_has_no_python_fallback(composed):
    """Each default is written once: a key every entry config declares (under its name, in one
    place) is read as it is, with no ``.get(key, value)`` that writes its default a second time
    (one that agrees today drifts the day the YAML changes)."""
    declared: dict[str, set[str]] = {}
    for cfg in composed.values():
        for dotted, _ in _leaves(cfg):
            declared.setdefault(dotted.rsplit(".", 1)[-1], set()).add(dotted)
    second = [
        f"{where}: {key} falls back to {value!r}"
        for where, key, value in _fallbacks()
        if len(declared.get(key, ())) == 1
    ]
    assert second == []


#: reader parameters named like a YAML key that are not that key, each with what it is
NOT_THE_KEY = {
    "_importance_map.device": "where MONAI's importance map is made, not model.inferer.device",
    "estimate_prediction.stitch": "device or host, the estimate's; stitch=auto is planned above it",
    "_SavedOnHost.__init__.pin_memory": "offload's host copies in the trace, not data.pin_memory",
    "LayerTrace.write.top": "the monitor's logged blocks; memory.top is estimate_memory.py's",
    "Planner.__init__.checkpoint_loss": "candidates with the loss checkpointed too, not the key",
}


def _parameter_defaults() -> Iterator[tuple[str, str, object]]:
    """``(function.parameter, where, value)`` of each constant parameter default in the
    readers."""
    for path in sorted(p for package in READERS for p in (SRC / package).rglob("*.py")):
        tree = ast.parse(path.read_text())
        owners = {
            id(f): f"{c.name}.{f.name}"
            for c in ast.walk(tree)
            if isinstance(c, ast.ClassDef)
            for f in c.body
            if isinstance(f, ast.FunctionDef)
        }
        for f in ast.walk(tree):
            if not isinstance(f, ast.FunctionDef):
                continue
            args = f.args.args[len(f.args.args) - len(f.args.defaults) :] + f.args.kwonlyargs
            for arg, default in zip(args, f.args.defaults + f.args.kw_defaults, strict=True):
                if isinstance(default, ast.Constant) and default.value is not None:
                    name = f"{owners.get(id(f), f.name)}.{arg.arg}"
                    yield name, f"{path.relative_to(REPO)}:{f.lineno}", default.value


def test_a_reader_parameter_does_not_default_a_key_the_yaml_declares(composed):
    """``def f(top=10)`` beside the YAML's ``memory.top: 10`` is the default written twice: the
    caller passes the config's value."""
    declared: dict[str, set[str]] = {}
    for cfg in composed.values():
        for dotted, _ in _leaves(cfg):
            declared.setdefault(dotted.rsplit(".", 1)[-1], set()).add(dotted)
    second = {
        name: f"{where}: defaults to {value!r}"
        for name, where, value in _parameter_defaults()
        if len(declared.get(name.rsplit(".", 1)[-1], ())) == 1
    }
    assert sorted(set(second) - set(NOT_THE_KEY)) == [], second
    assert sorted(set(NOT_THE_KEY) - set(second)) == []  # an entry fixed leaves the list


def test_a_second_writing_of_a_default_is_found():
    """The check above reads the package's source: a fallback added to a reader is found."""
    module = SRC / "plan" / "_a_second_default.py"
    module.write_text(
        'def budget(cfg, max_batch_size=256):\n    return cfg.memory.get("max_batch_size", 256)\n'
    )
    try:
        found = [(key, value) for _, key, value in _fallbacks()]
        defaults = [(name, value) for name, _, value in _parameter_defaults()]
    finally:
        module.unlink()
    assert ("max_batch_size", 256) in found
    assert ("budget.max_batch_size", 256) in defaults


def test_an_estimate_key_names_its_memory_key():
    """``estimate.*`` joined ``memory.*``: an old key is refused in one line with its new name
    (the entry points exit 2 on it, before composing)."""
    assert renamed_key(["data.batch_size=2", "estimate.gpu=H200"]) == (
        "estimate.gpu=H200: estimate.gpu is gone; use memory.gpu"
    )
    assert renamed_key(["memory.gpu=H200", "memory.json_out=x.json"]) is None
    composed = compose_config("train", Path(tempfile.mkdtemp()))
    assert "estimate" not in composed and composed.memory.cuda_context_mib == "auto"
