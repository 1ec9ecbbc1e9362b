"""kill -9 in the middle of an epoch, resume from last.ckpt: the weights of an uninterrupted run."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO, SMALL_PATCH
from volseg.callbacks.last_checkpoint import LastCheckpoint

# 4 training volumes x 4 patches, batch 2: 8 steps per epoch, 2 epochs
STEPS_PER_EPOCH, EPOCHS = 8, 2
KILL_AFTER_STEP = 5  # within the first epoch


def _command(data_root: Path, run_dir: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "train.py",
        f"data.root={data_root}",
        f"data.patch_size={SMALL_PATCH}",
        "data.samples_per_volume=4",
        "model.net.widths=[4,8,16]",
        "model.inferer.sw_batch_size=1",
        f"trainer.max_epochs={EPOCHS}",
        "trainer.check_val_every_n_epoch=1",
        "trainer.accelerator=cpu",
        "seed=7",
        "extras.print_config=false",
        "callbacks.rich_progress_bar=null",
        "callbacks.model_summary=null",
        "callbacks.validation_overlays=null",
        "callbacks.early_stopping=null",
        "callbacks.last_checkpoint.save_every_n_steps=1",
        "callbacks.last_checkpoint.save_every_minutes=null",
        f"hydra.run.dir={run_dir}",
        *extra,
    ]


def _load(run_dir: Path) -> dict:
    return torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)


@pytest.mark.slow
def test_sigkill_mid_epoch_then_resume_equals_an_uninterrupted_run(small_dataset, tmp_path):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    full = subprocess.run(
        _command(small_dataset, tmp_path / "full"),
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert full.returncode == 0, full.stderr[-3000:]

    # the same run, killed as soon as its log says last.ckpt holds step KILL_AFTER_STEP
    killed = subprocess.Popen(
        _command(small_dataset, tmp_path / "killed"),
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    saved = re.compile(r"Saved .*last\.ckpt: step (\d+), epoch (\d+)")
    for line in killed.stdout:
        found = saved.search(line)
        if found and int(found.group(1)) >= KILL_AFTER_STEP:
            os.killpg(killed.pid, signal.SIGKILL)
            break
    killed.wait(timeout=60)
    killed.stdout.close()
    assert killed.returncode == -signal.SIGKILL, "the run ended before the kill"
    part = _load(tmp_path / "killed")
    step = part["global_step"]
    assert KILL_AFTER_STEP <= step < STEPS_PER_EPOCH * EPOCHS
    # whatever the kill interrupted, last.ckpt is whole (a partial write stays in last.ckpt.tmp)
    assert part["epoch"] == step // STEPS_PER_EPOCH

    last = tmp_path / "killed" / "checkpoints" / "last.ckpt"
    resumed = subprocess.run(
        _command(small_dataset, tmp_path / "resumed", f"ckpt_path={last}"),
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "not resumable" not in resumed.stdout + resumed.stderr  # Lightning's warning

    a, b = _load(tmp_path / "full"), _load(tmp_path / "resumed")
    assert a["global_step"] == b["global_step"] == STEPS_PER_EPOCH * EPOCHS
    assert a["epoch"] == b["epoch"]
    for key, value in a["state_dict"].items():
        assert torch.equal(value, b["state_dict"][key]), key
    sa, sb = a["optimizer_states"][0]["state"], b["optimizer_states"][0]["state"]
    for k in sa:
        assert torch.equal(sa[k]["exp_avg"], sb[k]["exp_avg"]), k
        assert torch.equal(sa[k]["exp_avg_sq"], sb[k]["exp_avg_sq"]), k
    assert a["lr_schedulers"][0]["last_epoch"] == b["lr_schedulers"][0]["last_epoch"]


def test_bad_save_interval_is_named():
    with pytest.raises(ValueError, match=r"callbacks.last_checkpoint.save_every_n_steps=0"):
        LastCheckpoint(dirpath="x", filename="last", save_every_n_steps=0)


def test_epoch_end_saves_keep_within_their_share_of_training_time(
    small_dataset, tmp_path, monkeypatch
):
    """Epochs of ~0.1 s and a write of 0.3 s: at most 2% of training goes to last.ckpt, so after
    the first epoch's save the epoch ends skip it; the end of training saves the final state."""
    import time

    from lightning.pytorch.callbacks import ModelCheckpoint

    from tests.conftest import compose_config, tiny_train_overrides
    from volseg.tasks.train import train

    writes: list[int] = []
    save = ModelCheckpoint._save_checkpoint

    def slow_save(self, trainer, filepath):
        if isinstance(self, LastCheckpoint):
            time.sleep(0.3)  # a large checkpoint on a slow disk
            writes.append(trainer.global_step)
        save(self, trainer, filepath)

    monkeypatch.setattr(ModelCheckpoint, "_save_checkpoint", slow_save)
    cfg = compose_config(
        "train",
        tmp_path / "run",
        [
            *tiny_train_overrides(small_dataset),
            "trainer.max_epochs=4",
            "trainer.check_val_every_n_epoch=4",
            "callbacks.validation_overlays=null",
            "callbacks.early_stopping=null",
            "callbacks.last_checkpoint.max_time_share=0.02",
        ],
    )
    train(cfg)
    steps = _load(tmp_path / "run")["global_step"]
    assert steps == 4 * 2  # 4 training volumes, batch 2: the final state
    assert writes == [2, steps]  # the first epoch's end, then the end of training
