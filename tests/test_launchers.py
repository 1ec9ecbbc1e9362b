"""Launchers: joblib runs a sweep's jobs in parallel processes; SLURM's config makes sbatch jobs."""

from __future__ import annotations

import csv
import os
import stat

import hydra
import pytest
import submitit

from tests.conftest import compose_config
from tests.utils.test_sweep import _multirun


@pytest.mark.slow
def test_joblib_runs_two_jobs_in_parallel_processes_with_one_summary(small_dataset, tmp_path):
    sweep_dir = tmp_path / "sweep"
    result = _multirun(
        small_dataset,
        sweep_dir,
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        "seed=1,2",
        "data.patch_size=[16,32,32]",
        "callbacks.validation_overlays=null",
    )
    assert "Joblib.Parallel(n_jobs=2" in result.stdout + result.stderr
    with open(sweep_dir / "sweep_summary.csv") as f:
        rows = sorted(csv.DictReader(f), key=lambda r: r["job"])
    assert [(r["job"], r["status"], r["overrides"].split()[0]) for r in rows] == [
        ("0", "ok", "seed=1"),
        ("1", "ok", "seed=2"),
    ]
    assert all((sweep_dir / job / "summary.json").is_file() for job in ("0", "1"))


def test_slurm_launcher_config_makes_the_sbatch_script(tmp_path, monkeypatch):
    """The plugin's own launch path up to submission: parameters and the sbatch script."""
    cfg = compose_config(
        "train",
        tmp_path / "run",
        [
            "hydra/launcher=slurm",
            "trainer=ddp",
            "trainer.num_nodes=2",
            "hydra.launcher.partition=gpu",
            "hydra.launcher.timeout_min=30",
            "hydra.launcher.setup=[module load cuda]",
            f"hydra.sweep.dir={tmp_path / 'sweep'}",
        ],
    )
    launcher_cfg = cfg.hydra.launcher
    assert launcher_cfg._target_.endswith("hydra_submitit_launcher.submitit_launcher.SlurmLauncher")
    # DDP over SLURM: one task per GPU, as many nodes as the trainer
    resources = (launcher_cfg.nodes, launcher_cfg.tasks_per_node, launcher_cfg.gpus_per_node)
    assert resources == (2, 4, 4)
    assert (launcher_cfg.cpus_per_task, launcher_cfg.mem_gb) == (8, 64)

    # submitit wants srun on the PATH to build a SLURM executor; submission itself is captured
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "srun").write_text("#!/bin/sh\nexit 1\n")
    (fake_bin / "srun").chmod(stat.S_IRWXU)
    monkeypatch.setenv("PATH", f"{fake_bin}{os.pathsep}{os.environ['PATH']}")
    scripts = []

    def capture(self, fn, *args):
        inner = self._executor
        scripts.append(inner._make_submission_file_text(inner._submitit_command_str, "uid"))
        return []

    monkeypatch.setattr(submitit.AutoExecutor, "map_array", capture)
    launcher = hydra.utils.instantiate(launcher_cfg)
    launcher.setup(hydra_context=None, task_function=None, config=cfg)
    launcher.launch([["seed=1"], ["seed=2"]], initial_job_idx=0)
    (script,) = scripts
    for line in [
        "#SBATCH --partition=gpu",
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=4",
        "#SBATCH --gpus-per-node=4",
        "#SBATCH --cpus-per-task=8",
        "#SBATCH --mem=64GB",
        "#SBATCH --time=30",
        "module load cuda",
    ]:
        assert line in script, (line, script)
