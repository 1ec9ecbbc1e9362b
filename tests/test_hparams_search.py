"""hparams_search=optuna: the composed study, a 2-trial sweep that survives a failing trial, and
a stored study that resumes after a kill."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time

import optuna
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


@pytest.mark.slow
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
            "estimate.plan_step=false",
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


def _sweep_command(log_dir, storage: str, n_trials: int) -> list[str]:
    """A stored study of ``n_trials`` 1-step trials on the small dataset (every trial trains)."""
    params = (
        "hydra.sweeper.params={model.optimizer.lr:'choice(0.003)',"
        "model.net.widths:'choice([4,8])',data.batch_size:'choice(2)',"
        "data.patch_size:'choice([16,32,32])'}"
    )
    return [
        sys.executable,
        "train.py",
        "hparams_search=optuna",
        f"hydra.sweeper.storage={storage}",
        "hydra.sweeper.study_name=resume_me",
        f"hydra.sweeper.n_trials={n_trials}",
        params,
        f"paths.log_dir={log_dir}",
        "trainer.max_epochs=1",
        "trainer.check_val_every_n_epoch=1",
        "trainer.limit_train_batches=1",
        "trainer.limit_val_batches=1",
        "callbacks.validation_overlays=null",
        "estimate.plan_step=false",
    ]


def _rows(sweep_dir) -> list[dict[str, str]]:
    path = sweep_dir / "sweep_summary.csv"
    if not path.is_file():
        return []
    with open(path) as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_killed_optuna_sweep_resumes_with_the_trials_it_had_left(small_dataset, tmp_path):
    """SIGKILL after 2 of 4 trials; the same command again runs the 2 left, in the same sweep dir
    (one sweep_summary.csv, every trial once), with job numbers that go on."""
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    command = [*_sweep_command(tmp_path / "logs", storage, 4), f"data.root={small_dataset}"]
    sweeps = tmp_path / "logs" / "train" / "multiruns"
    first = subprocess.Popen(
        command,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and first.poll() is None:
        dirs = list(sweeps.glob("*")) if sweeps.is_dir() else []
        if dirs and len(_rows(dirs[0])) >= 2:
            os.killpg(first.pid, signal.SIGKILL)
            break
        time.sleep(0.2)
    first.wait(timeout=30)
    assert first.returncode == -signal.SIGKILL, "the sweep ended before the kill"
    (sweep_dir,) = sweeps.glob("*")
    done = _rows(sweep_dir)
    assert len(done) == 2

    again = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert list(sweeps.glob("*")) == [sweep_dir]  # the first run's dir, no second one
    rows = _rows(sweep_dir)
    assert rows[:2] == done and len(rows) == 4  # only the 2 trials left ran
    assert all(r["status"] == "ok" for r in rows)
    jobs = [int(r["job"]) for r in rows]
    assert len(set(jobs)) == 4 and min(jobs[2:]) > max(jobs[:2])  # numbers go on
    assert all((sweep_dir / str(j) / "summary.json").is_file() for j in jobs)
    study = optuna.load_study(study_name="resume_me", storage=storage)
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(complete) == 4
    assert not [t for t in study.trials if t.state == optuna.trial.TrialState.RUNNING]

    # started once more: nothing left to run
    third = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert third.returncode == 0, third.stderr[-3000:]
    assert len(_rows(sweep_dir)) == 4
