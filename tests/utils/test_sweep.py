"""Hydra multirun: a failing job is recorded and the sweep goes on."""

from __future__ import annotations

import csv
import subprocess
import sys

from tests.conftest import REPO


def test_multirun_records_every_job_and_survives_a_failure(small_dataset, tmp_path):
    sweep_dir = tmp_path / "sweep"
    result = subprocess.run(
        [
            sys.executable,
            "train.py",
            "-m",
            "data.patch_size=[16,32,32],[999,999,999]",
            "model.net.widths=[4,8]",
            f"data.root={small_dataset}",
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
    )
    assert result.returncode == 0, result.stderr[-3000:]
    with open(sweep_dir / "sweep_summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["job"] for r in rows] == ["0", "1"]
    ok, failed = rows
    assert ok["status"] == "ok" and 0 <= float(ok["best_val_dice_mean"]) <= 1
    assert float(ok["peak_allocated_mib"]) > 0
    assert failed["status"] == "failed"
    assert "UserInputError" in failed["error"] and "is larger than the volume" in failed["error"]
    assert (sweep_dir / "0" / "summary.json").is_file() and (sweep_dir / "1").is_dir()


def test_each_multirun_job_is_its_own_wandb_run(small_dataset, tmp_path):
    sweep_dir = tmp_path / "sweep"
    env = {**__import__("os").environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    result = subprocess.run(
        [
            sys.executable,
            "train.py",
            "-m",
            "seed=1,2",
            "logger=wandb",
            "model.net.widths=[4,8]",
            f"data.root={small_dataset}",
            "data.patch_size=[16,32,32]",
            "trainer.max_epochs=1",
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
    runs = sorted(p.parent.name for p in sweep_dir.rglob("run-*.wandb"))
    assert len(runs) == 2 and len(set(runs)) == 2, runs
    # one run in each job's own dir
    assert {p.relative_to(sweep_dir).parts[0] for p in sweep_dir.rglob("run-*.wandb")} == {"0", "1"}
