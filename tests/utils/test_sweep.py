"""Hydra multirun: a failing job is recorded and the sweep goes on."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO
from tests.wandb_offline import read_records, run_record


def _multirun(data_root: Path, sweep_dir: Path, *overrides: str, env=None) -> None:
    """`python train.py -m ...` with a 2-step, 4-8 channel job per choice; must exit 0."""
    result = subprocess.run(
        [
            sys.executable,
            "train.py",
            "-m",
            *overrides,
            "model.net.widths=[4,8]",
            f"data.root={data_root}",
            "trainer.max_epochs=1",
            "trainer.check_val_every_n_epoch=1",
            "trainer.limit_train_batches=2",
            "trainer.limit_val_batches=1",
            f"hydra.sweep.dir={sweep_dir}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]


def test_multirun_records_every_job_and_survives_a_failure(small_dataset, tmp_path):
    sweep_dir = tmp_path / "sweep"
    _multirun(small_dataset, sweep_dir, "data.patch_size=[16,32,32],[999,999,999]")
    with open(sweep_dir / "sweep_summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["job"] for r in rows] == ["0", "1"]
    ok, failed = rows
    assert ok["status"] == "ok" and 0 <= float(ok["best_val_dice_mean"]) <= 1
    assert float(ok["peak_allocated_mib"]) > 0
    assert failed["status"] == "failed"
    assert "UserInputError" in failed["error"] and "is larger than the volume" in failed["error"]
    assert (sweep_dir / "0" / "summary.json").is_file() and (sweep_dir / "1").is_dir()


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
