"""benchmarks/cuda_results.py: the grids a GPU run measures are valid configs before it runs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.conftest import REPO, load_benchmark, planned_config
from volseg.models.build import build_model

cuda_results = load_benchmark("cuda_results")


def test_recorded_grid_is_every_recorded_config():
    recorded = dict(cuda_results.recorded_grid())
    path = REPO / "benchmarks" / "results" / "cuda" / "2026-11-30_nvidia-h200.json"
    for run in json.loads(path.read_text())["runs"]:
        assert recorded[run["name"].removeprefix("train.py: ")] == run["overrides"]


@pytest.mark.parametrize(
    "name, overrides", cuda_results.HELD_OUT, ids=[n for n, _ in cuda_results.HELD_OUT]
)
def test_held_out_config_composes_and_builds(name, overrides, tmp_path: Path):
    """A typo in a held-out override would cost a GPU run: each composes and its module builds
    (levers validated) as train.py builds it."""
    cfg = planned_config("train", tmp_path, [*overrides, "trainer=gpu"])
    module = build_model(cfg)
    # the network is the one the overrides describe: its levels and its classes
    assert len(module.net.downs) == len(cfg.model.net.widths) - 1
    assert module.net.head.out_channels == cfg.num_classes
    named = re.search(r"(\d+) classes", name)
    assert cfg.num_classes == (int(named.group(1)) if named else 5)  # as the run's name says


def test_step_seconds_skips_the_first_step(tmp_path: Path):
    metrics = tmp_path / "metrics.csv"
    metrics.write_text("step,time/step_s,mem/x\n0,9.0,\n1,,1\n1,2.0,\n2,4.0,\n")
    assert cuda_results.step_seconds(metrics) == 3.0
