"""Hydra multirun: a failing job is recorded and the sweep goes on."""

from __future__ import annotations

import csv
import json
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, compose_config
from tests.wandb_offline import read_records, run_record
from volseg.utils.entry import run_task
from volseg.utils.errors import BudgetExceeded
from volseg.utils.sweep import COLUMNS, JobStopped, objective, record_job


def _multirun(
    data_root: Path,
    sweep_dir: Path,
    *overrides: str,
    env=None,
    widths: str | None = "[4,8]",
    exit_code: int = 0,
) -> subprocess.CompletedProcess:
    """`python train.py -m ...` with a 2-step job per choice (a 4-8 channel network unless
    ``widths`` is None); must exit with ``exit_code`` (0: no job failed)."""
    result = subprocess.run(
        [
            sys.executable,
            "train.py",
            "-m",
            *overrides,
            *([f"model.net.widths={widths}"] if widths else []),
            f"data.root={data_root}",
            "trainer.max_epochs=1",
            "trainer.check_val_every_n_epoch=1",
            "trainer.limit_train_batches=2",
            "trainer.limit_val_batches=1",
            "memory.plan_step=false",
            f"hydra.sweep.dir={sweep_dir}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert result.returncode == exit_code, result.stderr[-3000:]
    return result


@pytest.mark.slow
def test_multirun_records_every_job_and_survives_a_failure(small_dataset, tmp_path):
    sweep_dir = tmp_path / "sweep"
    result = _multirun(
        small_dataset, sweep_dir, "data.patch_size=[16,32,32],[999,999,999]", exit_code=1
    )
    # the sweep went on, and said at its end which job failed
    assert "2 job(s), 1 ok, 0 pruned, 1 failed" in result.stdout
    assert "error: 1 of 2 job(s) failed (job 1)" in result.stderr
    with open(sweep_dir / "sweep_summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["job"] for r in rows] == ["0", "1"]
    ok, failed = rows
    job_summary = json.loads((sweep_dir / "0" / "summary.json").read_text())
    assert ok["status"] == "ok"
    assert float(ok["best_val_dice_mean"]) == pytest.approx(
        job_summary["best_val_dice_mean"], abs=1e-4
    )
    assert float(ok["peak_allocated_mib"]) > 0
    assert failed["status"] == "failed"
    assert "UserInputError" in failed["error"] and "is larger than the volume" in failed["error"]
    assert (sweep_dir / "0" / "summary.json").is_file() and (sweep_dir / "1").is_dir()


@pytest.mark.slow
def test_each_multirun_job_is_its_own_wandb_run_grouped_by_sweep(small_dataset, tmp_path):
    sweep_dir = tmp_path / "sweep"
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    _multirun(
        small_dataset, sweep_dir, "seed=1,2", "logger=wandb", "data.patch_size=[16,32,32]", env=env
    )
    runs = sorted(p.parent.name for p in sweep_dir.rglob("run-*.wandb"))
    assert len(runs) == 2 and len(set(runs)) == 2, runs
    # one run in each job's own dir
    assert {p.relative_to(sweep_dir).parts[0] for p in sweep_dir.rglob("run-*.wandb")} == {"0", "1"}
    groups = {run_record(read_records(p)).run_group for p in sweep_dir.rglob("run-*.wandb")}
    assert groups == {sweep_dir.name}


def _as_multirun_job(cfg, sweep_dir: Path, num: int):
    """Make the composed config's Hydra state that of job ``num`` of a multirun in ``sweep_dir``."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import OmegaConf, open_dict

    OmegaConf.set_readonly(cfg.hydra, False)  # HydraConfig.set_config made it read-only
    with open_dict(cfg):
        cfg.hydra.mode = RunMode.MULTIRUN
        cfg.hydra.sweep.dir = str(sweep_dir)
        cfg.hydra.job.num = num
        cfg.hydra.runtime.output_dir = str(sweep_dir / str(num))
        cfg.hydra.overrides.task = [f"seed={num}"]
    HydraConfig().set_config(cfg)


def _over_budget(cfg):
    raise BudgetExceeded("memory.budget=1GiB: estimated peak 3.2 GiB does not fit")


def test_a_pruned_job_is_recorded_as_pruned_and_tells_the_sweeper(tmp_path):
    cfg = compose_config("train", tmp_path / "0")
    _as_multirun_job(cfg, tmp_path, 0)
    assert run_task(_over_budget, cfg) == JobStopped(
        "pruned", "BudgetExceeded: memory.budget=1GiB: estimated peak 3.2 GiB does not fit"
    )
    with open(tmp_path / "sweep_summary.csv") as f:
        (row,) = list(csv.DictReader(f))
    assert row["status"] == "pruned" and row["overrides"] == "seed=0"
    assert row["error"] == "BudgetExceeded: memory.budget=1GiB: estimated peak 3.2 GiB does not fit"


def test_a_training_job_returns_the_optimized_metric_or_why_it_stopped():
    metrics = {"val/dice_mean_best": 0.8, "mem/peak_allocated_mib": 512.0}
    assert objective(metrics, "val/dice_mean_best") == 0.8
    # several objectives: a value per metric name, in order
    names = ["val/dice_mean_best", "mem/peak_allocated_mib"]
    assert objective(metrics, names) == [0.8, 512.0]
    assert objective(metrics, "val/dice_mean") is None  # not logged: the sweeper fails the trial
    stopped = JobStopped("pruned", "BudgetExceeded: does not fit")
    assert objective(stopped, "val/dice_mean_best") is stopped


def test_over_budget_in_a_single_run_is_a_user_error(tmp_path, capsys):
    cfg = compose_config("train", tmp_path)
    with pytest.raises(SystemExit) as stop:
        run_task(_over_budget, cfg)
    assert stop.value.code == 2
    assert "estimated peak 3.2 GiB does not fit" in capsys.readouterr().err


def _record_in_child(cfg, sweep_dir: Path, num: int) -> None:
    _as_multirun_job(cfg, sweep_dir, num)
    record_job({"val/dice_mean_best": num / 10}, None)


def test_parallel_jobs_append_one_row_each_under_one_header(tmp_path):
    """Jobs of a parallel launcher write the summary from separate processes at once."""
    cfg = compose_config("train", tmp_path / "job")
    context = multiprocessing.get_context("fork")
    children = [context.Process(target=_record_in_child, args=(cfg, tmp_path, n)) for n in range(8)]
    for child in children:
        child.start()
    for child in children:
        child.join(timeout=60)
        assert child.exitcode == 0
    lines = (tmp_path / "sweep_summary.csv").read_text().splitlines()
    assert lines[0] == ",".join(COLUMNS) and lines.count(lines[0]) == 1
    rows = list(csv.DictReader(lines))
    assert sorted(int(r["job"]) for r in rows) == list(range(8))
    assert {r["best_val_dice_mean"] for r in rows} == {f"{n / 10:.4f}" for n in range(8)}


@pytest.mark.slow
def test_memory_budget_prunes_a_job_before_it_trains(small_dataset, tmp_path):
    """memory.budget: the job whose estimated step does not fit is pruned, the other trains. The
    budget lies between the two steps as the planner counts them, with the margin of any kind of
    CPU (batch 1: 24 MiB bare, 64 with AVX2's +172% of its growth; batch 16: 77 MiB bare)."""
    sweep_dir = tmp_path / "sweep"
    _multirun(
        small_dataset,
        sweep_dir,
        "data.batch_size=1,16",
        "data.patch_size=[16,32,32]",
        "trainer.accelerator=cpu",
        "trainer.precision=32",
        "memory.budget=72MiB",
    )
    with open(sweep_dir / "sweep_summary.csv") as f:
        rows = {r["overrides"]: r for r in csv.DictReader(f)}
    fits = next(r for k, r in rows.items() if "data.batch_size=1" in k)
    over = next(r for k, r in rows.items() if "data.batch_size=16" in k)
    assert fits["status"] == "ok"  # and the sweep exits 0: a pruned job is no failure
    assert over["status"] == "pruned" and "memory.budget=72MiB" in over["error"]
    assert not list((sweep_dir / over["job"]).rglob("*.ckpt"))  # it never trained


@pytest.mark.slow
def test_every_experiment_runs_one_batch_as_lightning_hydra_template_tests_it(
    small_dataset, tmp_path
):
    """`python train.py -m "experiment=glob(*)" ++trainer.fast_dev_run=true logger=[]`."""
    sweep_dir = tmp_path / "sweep"
    _multirun(
        small_dataset,
        sweep_dir,
        "experiment=glob(*)",
        "++trainer.fast_dev_run=true",
        "logger=[]",
        "data.patch_size=[16,32,32]",
        widths=None,
    )
    experiments = sorted(p.stem for p in (REPO / "configs" / "experiment").glob("*.yaml"))
    with open(sweep_dir / "sweep_summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(experiments)
    assert all(r["status"] == "ok" for r in rows), [r["error"] for r in rows]


@pytest.mark.slow
def test_ddp_sim_sweep_runs_each_job_in_two_processes(small_dataset, tmp_path):
    """`python train.py -m trainer=ddp_sim seed=1,2`: one row per job, not per rank."""
    sweep_dir = tmp_path / "sweep"
    _multirun(small_dataset, sweep_dir, "trainer=ddp_sim", "seed=1,2", "data.patch_size=[16,32,32]")
    with open(sweep_dir / "sweep_summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["job"], r["status"]) for r in rows] == [("0", "ok"), ("1", "ok")]
    job_summary = json.loads((sweep_dir / "0" / "summary.json").read_text())
    assert float(rows[0]["best_val_dice_mean"]) == pytest.approx(
        job_summary["best_val_dice_mean"], abs=1e-4
    )
