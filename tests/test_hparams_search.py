"""hparams_search=optuna: the composed study, and a 2-trial sweep that survives a failing trial."""

from __future__ import annotations

import csv
import subprocess
import sys

import pytest
import yaml
from hydra_plugins.hydra_optuna_sweeper._impl import create_params_from_overrides
from optuna.distributions import CategoricalDistribution, LogUniformDistribution

from tests.conftest import REPO, compose_config


def test_optuna_search_space_composes_and_parses(tmp_path):
    cfg = compose_config("train", tmp_path, ["hparams_search=optuna"])
    sweeper = cfg.hydra.sweeper
    assert sweeper._target_.endswith("OptunaSweeper")
    assert sweeper.direction == "maximize" and cfg.optimized_metric == "val/dice_mean_best"
    assert sweeper.max_failure_rate == 1.0  # failed trials never stop the study
    assert sweeper.sampler._target_ == "optuna.samplers.TPESampler" and sweeper.sampler.seed == 1234
    assert str(cfg.hydra.mode) == "RunMode.MULTIRUN"
    space, fixed = create_params_from_overrides([f"{k}={v}" for k, v in sweeper.params.items()])
    assert not fixed
    assert isinstance(space["model.optimizer.lr"], LogUniformDistribution)
    assert space["data.batch_size"].choices == (1, 2, 4)
    widths = space["model.net.widths"]
    assert isinstance(widths, CategoricalDistribution) and "[16,32,64,128]" in widths.choices
    # every patch size fits every depth: divisible by 2^(levels - 1)
    for patch in space["data.patch_size"].choices:
        for choice in widths.choices:
            levels = len(yaml.safe_load(choice))
            assert all(s % 2 ** (levels - 1) == 0 for s in yaml.safe_load(patch)), (patch, choice)


def test_optuna_sweep_records_every_trial_and_survives_a_failing_one(small_dataset, tmp_path):
    """2 trials over 2 patch sizes: the first is larger than the volumes and fails, the second
    trains. (Optuna's seeded sampler picks them in this order; the GridSampler is not used: with
    hydra-optuna-sweeper 1.2/1.3 a failing last grid trial crashes the sweeper.)"""
    sweep_dir = tmp_path / "sweep"
    params = (
        "hydra.sweeper.params={model.optimizer.lr:'choice(0.003)',"
        "model.net.widths:'choice([4,8])',data.batch_size:'choice(2)',"
        "data.patch_size:'choice([16,32,32],[999,999,999])'}"
    )
    result = subprocess.run(
        [
            sys.executable,
            "train.py",
            "hparams_search=optuna",
            "hydra.sweeper.n_trials=2",
            "hydra.sweeper.sampler.seed=14",
            params,
            f"data.root={small_dataset}",
            "trainer.max_epochs=1",
            "trainer.check_val_every_n_epoch=1",
            "trainer.limit_train_batches=2",
            "trainer.limit_val_batches=1",
            "callbacks.validation_overlays=null",
            f"hydra.sweep.dir={sweep_dir}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1, result.stderr[-3000:]  # a trial failed
    assert "error: 1 of 2 job(s) failed (job 0)" in result.stderr
    with open(sweep_dir / "sweep_summary.csv") as f:
        rows = {r["status"]: r for r in csv.DictReader(f)}
    assert set(rows) == {"ok", "failed"}
    assert (rows["failed"]["job"], rows["ok"]["job"]) == ("0", "1")  # went on after the failure
    assert "data.patch_size=[16,32,32]" in rows["ok"]["overrides"]
    assert "data.patch_size=[999,999,999]" in rows["failed"]["overrides"]
    assert "is larger than the volume" in rows["failed"]["error"]
    results = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    assert results["best_params"]["data.patch_size"] == "[16,32,32]"
    assert results["best_value"] == pytest.approx(float(rows["ok"]["best_val_dice_mean"]), abs=1e-4)
