"""Every estimate and plan prints the margin it is planned with: its figures, what they are added
to and where they come from, even where its share is 0 (a fixed 2.6 MiB is still a margin):
``estimate_memory.py``, ``plan.py``, ``train.py``'s log, and ``plan.yaml``."""

from __future__ import annotations

import logging
from collections import OrderedDict
from unittest import mock

import pytest
import yaml

from tests.conftest import compose_config, tiny_train_overrides
from volseg.memory.estimate import engine
from volseg.memory.estimate import margins as residuals
from volseg.plan.report import margin_line

#: what an Ice Lake Xeon got before it had runs: a fixed part and no share
SOURCE = "no in-sample estimator run on AVX-512 (test)"
LINE = f"margin: +2.6 MiB + 0.0% of the step's growth, the CPU margin of its kind: {SOURCE}"


@pytest.fixture
def fixed_only():
    """This CPU's margin: 2.6 MiB and no share (a fresh engine cache, so no earlier answer with
    another margin is reused)."""
    margin = residuals.Margin(0.0, SOURCE, 2.6)
    with (
        mock.patch.object(residuals, "cpu_margin", lambda kind: margin),
        mock.patch.object(engine, "_runs", OrderedDict()),
    ):
        yield margin


def _overrides(data) -> list[str]:
    return [*tiny_train_overrides(data), "trainer.accelerator=cpu", "memory.levers=false"]


def test_margin_line_gives_both_parts_to_their_step():
    cuda = {"device": "cuda", "margin": 0.141, "margin_fixed_mib": 30.8, "margin_source": "x"}
    assert margin_line(cuda) == (
        "margin: +30.8 MiB + 14.1% of the reserved peak, the margin of its kind of step: x"
    )
    cpu = {"device": "cpu", "margin": 0.0, "margin_fixed_mib": 0.1, "margin_source": "y"}
    assert margin_line(cpu) == (
        "margin: +0.1 MiB + 0.0% of the step's growth, the CPU margin of its kind: y"
    )


def test_estimate_memory_prints_the_margin_line(fixed_only, small_dataset, tmp_path, capsys):
    from volseg.tasks.estimate_memory import run_estimate

    result = run_estimate(compose_config("estimate_memory", tmp_path, _overrides(small_dataset)))
    printed = capsys.readouterr().out
    assert f"  {LINE}" in printed.splitlines()
    assert "planned (+2.6 MiB + 0.0% of growth)" in printed
    assert result["estimate"]["margin_fixed_mib"] == 2.6


def test_plan_py_prints_the_margin_line_and_plan_yaml_keeps_its_figures(
    fixed_only, small_dataset, tmp_path, capsys
):
    from volseg.tasks.plan import plan_command

    written = plan_command(compose_config("plan", tmp_path, _overrides(small_dataset)))
    assert f"  {LINE}" in capsys.readouterr().out.splitlines()
    saved = yaml.safe_load((tmp_path / "plan.yaml").read_text())["estimate"]
    assert (saved["margin"], saved["margin_fixed_mib"]) == (0.0, 2.6)
    assert saved["margin_source"] == SOURCE == written["estimate"]["margin_source"]


def test_a_budget_names_a_margin_with_no_share(fixed_only, small_dataset, tmp_path):
    """The planned keys' why gives the figures (before, a zero share left the margin unsaid)."""
    from volseg.plan import make_plan

    overrides = [*_overrides(small_dataset), "memory.budget=4GiB"]
    planned = make_plan(compose_config("train", tmp_path, overrides))
    why = planned.decisions["data.batch_size"].why
    assert why.endswith("with a margin of +2.6 MiB + 0.0% (estimate.margin_source)")


def test_train_py_logs_the_margin_line(fixed_only, small_dataset, tmp_path, caplog):
    """On the console, not only in train.log and plan.yaml (the data only checked: fast)."""
    from volseg.tasks.train import train

    caplog.set_level(logging.INFO, logger="volseg.tasks.train")
    overrides = [*_overrides(small_dataset), "data.check_only=true", "memory.plan_step=true"]
    assert train(compose_config("train", tmp_path, overrides)) == {}
    logged = [r.getMessage() for r in caplog.records if r.name == "volseg.tasks.train"]
    assert LINE in logged
