"""kill -9 in the middle of an epoch, resume from last.ckpt: the weights of an uninterrupted run."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tests.conftest import REPO, SMALL_PATCH
from volseg.callbacks.last_checkpoint import LastCheckpoint

EPOCHS = 2
# (extra overrides, optimizer steps per epoch, kill once last.ckpt holds this step)
RUNS = {
    # 4 training volumes x 4 patches, batch 2: 8 steps per epoch; a save after every step
    "one_process": ([], 8, 5),
    # 4 x 8 patches on 2 ranks, batch 2, 2 batches per optimizer step: 4 steps per epoch; a
    # time-based save due after every batch, which must wait for the step to end
    "two_processes": (
        [
            "trainer.devices=2",
            "trainer.strategy=ddp_fork",
            "trainer.accumulate_grad_batches=2",
            "data.samples_per_volume=8",
            "callbacks.last_checkpoint.save_every_n_steps=null",
            "callbacks.last_checkpoint.save_every_minutes=0.00001",
        ],
        4,
        2,
    ),
}
SAVED = re.compile(r"Saved .*last\.ckpt: step (\d+), epoch (\d+), batch (\d+) of the epoch")


def _command(data_root: Path, run_dir: Path, *extra: str) -> list[str]:
    args = [
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
        "memory.plan_step=false",
        f"hydra.run.dir={run_dir}",
        *extra,
    ]
    # an override in extra replaces the one above (Hydra takes each key once)
    last = {arg.split("=", 1)[0]: arg for arg in args}
    return [arg for arg in args if last[arg.split("=", 1)[0]] is arg]


def _load(run_dir: Path) -> dict:
    return torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)


@pytest.mark.slow
@pytest.mark.parametrize("run", RUNS)
def test_sigkill_mid_epoch_then_resume_equals_an_uninterrupted_run(small_dataset, tmp_path, run):
    extra, steps_per_epoch, kill_after_step = RUNS[run]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    full = subprocess.run(
        _command(small_dataset, tmp_path / "full", *extra),
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert full.returncode == 0, full.stderr[-3000:]
    saves = [tuple(map(int, m)) for m in SAVED.findall(full.stdout + full.stderr)]
    assert len(saves) >= steps_per_epoch * EPOCHS, saves[:5]
    accumulate = 2 if "trainer.accumulate_grad_batches=2" in extra else 1
    # only at optimizer-step boundaries: never between the batches of one step
    assert all(batch % accumulate == 0 for _, _, batch in saves), saves

    # the same run, killed as soon as its log says last.ckpt holds step kill_after_step
    killed = subprocess.Popen(
        _command(small_dataset, tmp_path / "killed", *extra),
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    for line in killed.stdout:
        found = SAVED.search(line)
        if found and int(found.group(1)) >= kill_after_step:
            os.killpg(killed.pid, signal.SIGKILL)
            break
    killed.wait(timeout=60)
    killed.stdout.close()
    assert killed.returncode == -signal.SIGKILL, "the run ended before the kill"
    part = _load(tmp_path / "killed")
    step = part["global_step"]
    assert kill_after_step <= step < steps_per_epoch * EPOCHS
    # whatever the kill interrupted, last.ckpt is whole (a partial write stays in last.ckpt.tmp)
    assert part["epoch"] == step // steps_per_epoch

    last = tmp_path / "killed" / "checkpoints" / "last.ckpt"
    resumed = subprocess.run(
        _command(small_dataset, tmp_path / "resumed", *extra, f"ckpt_path={last}"),
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "not resumable" not in resumed.stdout + resumed.stderr  # Lightning's warning

    a, b = _load(tmp_path / "full"), _load(tmp_path / "resumed")
    assert a["global_step"] == b["global_step"] == steps_per_epoch * EPOCHS
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
    """A write that takes 1000 s on the callback's clock: at most 2% of training may go to
    last.ckpt, so after the first epoch's save the epoch ends skip it (the 3 epochs left would
    need 50,000 s of training); the end of training saves the final state, as a second name of
    the best checkpoint the validation at the same step has just written."""
    import time
    from types import SimpleNamespace

    from lightning.pytorch.callbacks import ModelCheckpoint

    from tests.conftest import compose_config, tiny_train_overrides
    from volseg.callbacks import last_checkpoint
    from volseg.tasks.train import train

    offset = [0.0]  # seconds the slow writes add to the callback's clock
    clock = SimpleNamespace(monotonic=lambda: time.monotonic() + offset[0])
    monkeypatch.setattr(last_checkpoint, "time", clock)
    writes: list[int] = []
    save = ModelCheckpoint._save_checkpoint

    def slow_save(self, trainer, filepath):
        if isinstance(self, LastCheckpoint):
            offset[0] += 1000.0  # a large checkpoint on a slow disk, whatever the machine's load
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
    assert writes == [2]  # the first epoch's end; the end of training is a link, not a write
    checkpoints = tmp_path / "run" / "checkpoints"
    assert os.path.samefile(checkpoints / "last.ckpt", checkpoints / "epoch_003.ckpt")


def _trainer_at(batch: int, global_step: int) -> SimpleNamespace:
    """A trainer 8 batches into an epoch of 8, 2 batches per optimizer step, after ``batch``."""
    progress = SimpleNamespace(current=SimpleNamespace(ready=batch))
    return SimpleNamespace(
        global_step=global_step,
        accumulate_grad_batches=2,
        num_training_batches=8,
        fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace(batch_progress=progress)),
        strategy=SimpleNamespace(broadcast=lambda obj: obj),
    )


def test_a_time_based_save_waits_for_the_end_of_the_optimizer_step(tmp_path):
    """Step 3 ended at batch 6 while the time was not up; it is up at batch 7, between the two
    batches of step 4: a checkpoint there would lose batch 7's gradient on resume."""
    callback = LastCheckpoint(dirpath=tmp_path, filename="last", save_every_minutes=1e-9)
    callback._saved_step = 2
    assert not callback._due(_trainer_at(batch=7, global_step=3))
    assert callback._due(_trainer_at(batch=8, global_step=4))  # step 4 done: save now


def test_the_private_modelcheckpoint_names_it_relies_on_are_where_lightning_had_them(tmp_path):
    """What each of ``LIGHTNING_PRIVATE`` does for LastCheckpoint, as Lightning's ModelCheckpoint
    does it: where one moves, this says which of its saves breaks."""
    import inspect

    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.trainer.states import TrainerFn

    from volseg.callbacks.last_checkpoint import LIGHTNING_PRIVATE, last_save

    callback = ModelCheckpoint(dirpath=tmp_path, filename="best")
    for name in LIGHTNING_PRIVATE:
        assert hasattr(callback, name), f"ModelCheckpoint.{name}: LastCheckpoint's saves"
    signatures = {
        "_save_checkpoint": ["trainer", "filepath"],
        "_save_topk_checkpoint": ["trainer", "monitor_candidates"],
        "_monitor_candidates": ["trainer"],
        "_should_skip_saving_checkpoint": ["trainer"],
    }
    for name, params in signatures.items():
        got = list(inspect.signature(getattr(callback, name)).parameters)
        assert got == params, f"ModelCheckpoint.{name}{tuple(got)}: LastCheckpoint's saves"
    link = "the link to another callback's file of the same state (LastCheckpoint._same_state_file)"
    assert last_save(callback) == (0, ""), link
    saved: list[tuple[str, bool]] = []
    trainer = SimpleNamespace(
        global_step=3,
        current_epoch=0,
        callback_metrics={},
        is_global_zero=True,
        loggers=[],
        fast_dev_run=False,
        sanity_checking=False,
        state=SimpleNamespace(fn=TrainerFn.FITTING),
        strategy=SimpleNamespace(reduce_boolean_decision=lambda decision, all: decision),
        save_checkpoint=lambda path, weights_only: saved.append((path, weights_only)),
    )
    within = "a save within an epoch, at a signal and at the end of training (_save_now)"
    assert not callback._should_skip_saving_checkpoint(trainer), within
    candidates = callback._monitor_candidates(trainer)
    assert int(candidates["step"]) == 3, within
    callback._save_topk_checkpoint(trainer, candidates)  # monitor=None: one file, this one
    best = str(tmp_path / "best.ckpt")
    assert saved == [(best, False)] and callback.best_model_path == best, within
    assert last_save(callback) == (3, best), link  # what _save_checkpoint records
    assert callback._should_skip_saving_checkpoint(trainer), "a second save at the same step"
