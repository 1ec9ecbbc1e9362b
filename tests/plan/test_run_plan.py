"""The plan is the one place a config is edited: :func:`volseg.plan.applied`, which
:meth:`RunPlan.run_config` applies a :class:`~volseg.memory.Candidate` with."""

from __future__ import annotations

import ast
from pathlib import Path

from omegaconf import OmegaConf

from tests.conftest import REPO
from volseg.memory import Candidate
from volseg.plan import RunPlan, applied

SRC = REPO / "src" / "volseg"


def _config_edits(path: Path) -> list[str]:
    """``function: call`` for each call in ``path`` that edits a config in place (``set_key``,
    ``OmegaConf.update``, ``open_dict``), by the function it is in."""
    found = []
    for function in ast.walk(ast.parse(path.read_text())):
        if not isinstance(function, ast.FunctionDef):
            continue
        for call in ast.walk(function):
            if not isinstance(call, ast.Call):
                continue
            name = getattr(call.func, "id", None) or getattr(call.func, "attr", None)
            owner = getattr(getattr(call.func, "value", None), "id", "")
            if name in ("set_key", "open_dict") or (owner == "OmegaConf" and name == "update"):
                found.append(f"{function.name}: {name}")
    return found


def test_only_the_plans_apply_function_edits_a_config():
    edits = {
        f"{path.relative_to(SRC)}:{edit}"
        for path in sorted(SRC.rglob("*.py"))
        for edit in _config_edits(path)
    }
    assert edits == {
        "plan/run_plan.py:applied: open_dict",  # a key taken out
        "plan/run_plan.py:applied: set_key",
        "utils/config.py:set_key: open_dict",  # its definition
        "utils/config.py:set_key: update",
        # composing, as an entry point does (tests, benchmarks): the run folder Hydra would set
        "utils/config.py:compose_run_config: open_dict",
    }


def test_an_edit_elsewhere_is_found(tmp_path):
    module = tmp_path / "module.py"
    module.write_text(
        "def plan(cfg):\n"
        "    set_key(cfg, 'data.batch_size', 2)\n"
        "    OmegaConf.update(cfg, 'a', 1)\n"
        "    with open_dict(cfg):\n"
        "        cfg.b = 2\n"
    )
    assert _config_edits(module) == ["plan: set_key", "plan: update", "plan: open_dict"]


def test_a_candidate_is_applied_to_a_copy_with_its_keys_and_nothing_else():
    config = OmegaConf.create(
        {"data": {"batch_size": 2, "patch_size": [16, 32, 32]}, "model": {"net": {"img": 1}}}
    )
    plan = RunPlan(config, {})
    candidate = Candidate(batch_size=4, patch_size=(8, 16, 16), net_sizes=(("img", [8, 16, 16]),))
    run = plan.run_config(candidate)
    assert OmegaConf.to_container(run) == {
        "data": {"batch_size": 4, "patch_size": [8, 16, 16]},
        "model": {"net": {"img": [8, 16, 16]}},
    }
    assert config.data.batch_size == 2 and config.model.net.img == 1  # the plan's is unchanged
    assert OmegaConf.to_container(plan.run_config()) == OmegaConf.to_container(config)


def test_applied_sets_and_removes_keys_on_a_copy():
    config = OmegaConf.create({"model": {"optimizer": {"lr": "auto", "lr_by_classes": {"a": 1}}}})
    out = applied(config, {"model.optimizer.lr": 0.01}, ["model.optimizer.lr_by_classes"])
    assert OmegaConf.to_container(out) == {"model": {"optimizer": {"lr": 0.01}}}
    assert config.model.optimizer.lr == "auto" and "lr_by_classes" in config.model.optimizer


def test_a_candidate_hashes_by_value_and_writes_plain_settings():
    a = Candidate(batch_size=2, activation_checkpointing=["encoder"], placement={"encoder": "cpu"})
    b = Candidate(
        batch_size=2.0, activation_checkpointing=("encoder",), placement={"encoder": "cpu"}
    )
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a.settings() == {
        "data.batch_size": 2,
        "model.activation_checkpointing": ["encoder"],
        "model.placement": {"encoder": "cpu"},
    }
    assert Candidate().settings() == {}
    parts = Candidate(activation_checkpointing={"encoder": "selective", "decoder": "full"})
    assert parts.settings() == {
        "model.activation_checkpointing": {"encoder": "selective", "decoder": "full"}
    }
