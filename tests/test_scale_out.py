"""Several processes (CPU processes standing in for GPUs, as a user types it:
``trainer.accelerator=cpu trainer.devices=N trainer.strategy=ddp_fork``): every training patch
once per epoch, every validation case scored and written once, nothing hangs."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, SMALL_PATCH, compose_config, tiny_train_overrides
from volseg.tasks.evaluate import evaluate
from volseg.tasks.train import train

# 4 training volumes x 4 patches, batch 2: 8 optimizer steps per epoch on one process
PATCHES, BATCH = 16, 2
# a hung collective would wait forever: every run gets this long
TIMEOUT_S = 240
TEST_TIMEOUT_S = 900  # a whole test, its in-process runs included


def run_entry(args: list[str], timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess:
    """``python <args>`` in its own process group; the whole group (the forked ranks too) is
    killed when it runs past ``timeout`` and the test fails there, not in a hang."""
    proc = subprocess.Popen(
        [sys.executable, *args],
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{args[0]} {' '.join(args[1:3])}... hung past {timeout} s:\n{err[-3000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def processes(n: int) -> list[str]:
    """N CPU processes as a user types them (one: no strategy; a fork of the test process could
    inherit a lock held by one of its threads)."""
    if n == 1:
        return ["trainer.accelerator=cpu", "trainer.devices=1"]
    return ["trainer.accelerator=cpu", f"trainer.devices={n}", "trainer.strategy=ddp_fork"]


@pytest.fixture(autouse=True)
def alarm():
    """Fails an in-process run that hangs instead of waiting forever."""

    def hung(signum, frame):
        raise TimeoutError(f"no result after {TEST_TIMEOUT_S} s")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(TEST_TIMEOUT_S)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def train_args(data: Path, run_dir: Path) -> list[str]:
    """One epoch of training only: the steps are the count under test."""
    return [
        f"data.root={data}",
        f"data.patch_size={SMALL_PATCH}",
        f"data.samples_per_volume={PATCHES // 4}",
        f"data.batch_size={BATCH}",
        "model.net.widths=[4,8]",
        "trainer.max_epochs=1",
        "trainer.limit_val_batches=0",
        "trainer.num_sanity_val_steps=0",
        "extras.print_config=false",
        "callbacks.rich_progress_bar=null",
        "callbacks.model_summary=null",
        "memory.plan_step=false",
        f"hydra.run.dir={run_dir}",
    ]


@pytest.mark.slow
def test_every_patch_once_per_epoch_on_1_2_and_3_processes(small_dataset, tmp_path):
    """The default trainer config with trainer.devices=N: 2 processes take half the steps of
    one (Lightning's sampler sharding volseg's again gave a quarter)."""
    cfg = compose_config(
        "train", tmp_path / "one", [*train_args(small_dataset, tmp_path / "one"), *processes(1)]
    )
    train(cfg)
    steps = {1: json.loads((tmp_path / "one" / "summary.json").read_text())["global_step"]}
    assert steps[1] == PATCHES // BATCH
    for n in (2, 3):
        run_dir = tmp_path / f"ranks{n}"
        result = run_entry(["train.py", *train_args(small_dataset, run_dir), *processes(n)])
        assert result.returncode == 0, result.stderr[-3000:]
        steps[n] = json.loads((run_dir / "summary.json").read_text())["global_step"]
        log = (run_dir / "train.log").read_text()
        per_rank = re.search(r"Memory per rank, .* MiB: (.*)", log)
        assert per_rank and per_rank.group(1).count("rank ") == n, log[-2000:]
    # each rank's share of the 16 patches, padded to equal shares: 8, 4 and 6 patches
    assert steps == {1: 8, 2: 4, 3: 3}
    assert abs(steps[2] - steps[1] / 2) <= 1


@pytest.fixture(scope="module")
def three_val_cases(small_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = tmp_path_factory.mktemp("three_val") / "data"
    shutil.copytree(small_dataset, data)
    names = sorted(p.name for p in (data / "images").iterdir())
    (data / "splits.json").write_text(json.dumps({"train": names[:3], "val": names[3:]}))
    return data


@pytest.mark.slow
def test_eval_scores_and_writes_each_case_once_on_2_and_5_processes(three_val_cases, tmp_path):
    """3 validation cases: on 2 processes the shares are uneven (2 and 1), on 5 two ranks have
    none and must still join the reductions (a rank with no batch raised, one skipping the
    gather would hang)."""
    train_dir = tmp_path / "train"
    overrides = [*tiny_train_overrides(three_val_cases), "trainer.max_epochs=1"]
    train(compose_config("train", train_dir, overrides))
    ckpt = train_dir / "checkpoints" / "last.ckpt"
    one = evaluate(compose_config("eval", tmp_path / "eval1", [f"ckpt_path={ckpt}"]))
    names = sorted(p.name for p in (three_val_cases / "images").iterdir())[3:]
    assert 0.0 < one["val/dice_mean"] < 1.0  # a trained, imperfect model: the scores differ
    for n in (2, 5):
        run_dir = tmp_path / f"eval{n}"
        args = ["eval.py", f"ckpt_path={ckpt}", "extras.print_config=false", *processes(n)]
        result = run_entry([*args, f"hydra.run.dir={run_dir}"])
        assert result.returncode == 0, result.stderr[-3000:]
        summary = json.loads((run_dir / "eval_summary.json").read_text())
        assert summary["metrics"].keys() == one.keys()
        for key, value in one.items():
            assert abs(summary["metrics"][key] - value) <= 1e-5, (n, key)
        assert sorted(Path(p).name for p in summary["predictions"]) == names
        log = (run_dir / "eval.log").read_text()
        wrote = re.findall(r"Rank (\d+) wrote .*/(case_\d+\.nii\.gz)", log)
        assert sorted(name for _, name in wrote) == names, (n, wrote)  # each once
        assert len({rank for rank, _ in wrote}) == min(n, 3)  # spread over the ranks
