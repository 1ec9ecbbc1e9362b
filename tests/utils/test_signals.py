"""Ctrl-C and SIGTERM sent to a real ``train.py``: last.ckpt at a step boundary, summary.json
marked interrupted, the resume command, exit 130/143, and a resume equal to an uninterrupted
run."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Callback

from tests.conftest import REPO, SMALL_PATCH

MARK = "+callbacks.step_marker"


class StepMarker(Callback):
    """Writes the optimizer step reached after each training batch to ``path`` and then waits
    ``seconds`` (so a signal lands while training, not after it)."""

    def __init__(self, path: str, seconds: float) -> None:
        self.path = Path(path)
        self.seconds = seconds

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.path.write_text(str(trainer.global_step))
        time.sleep(self.seconds)


def _args(data: Path, run_dir: Path) -> list[str]:
    """A 2-epoch run of a 2-level, 4-8 channel U-Net on the small dataset: 4 steps an epoch."""
    return [
        f"data.root={data}",
        f"data.patch_size={SMALL_PATCH}".replace(" ", ""),
        "data.samples_per_volume=2",
        "model.net.widths=[4,8]",
        "model.net.pooling=null",
        "model.inferer.sw_batch_size=1",
        "trainer.max_epochs=2",
        "trainer.check_val_every_n_epoch=1",
        "trainer.limit_val_batches=1",
        "trainer.accelerator=cpu",
        "trainer.precision=32",
        "seed=3",
        "callbacks.rich_progress_bar=null",
        "callbacks.model_summary=null",
        "callbacks.early_stopping=null",
        "callbacks.validation_overlays=null",
        "memory.plan_step=false",
        f"hydra.run.dir={run_dir}",
    ]


def _start(args: list[str]) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "train.py", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )


def _interrupt_at(args: list[str], marker: Path, step: int, signum: int) -> tuple:
    """Start train.py, send ``signum`` to its process group (as a terminal's Ctrl-C reaches
    the loader workers too) once it has trained ``step`` steps; ``(exit code, stderr)``."""
    proc = _start(args)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if marker.is_file() and marker.read_text() and int(marker.read_text()) >= step:
            os.killpg(proc.pid, signum)
            break
        time.sleep(0.05)
    _, err = proc.communicate(timeout=240)
    return proc.returncode, err


@pytest.fixture(scope="module")
def uninterrupted(small_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The last.ckpt of the same run, not interrupted."""
    full = tmp_path_factory.mktemp("full")
    result = subprocess.run(
        [sys.executable, "train.py", *_args(small_dataset, full)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return torch.load(full / "checkpoints" / "last.ckpt", weights_only=True)


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_saves_last_ckpt_and_the_resume_equals_an_uninterrupted_run(
    small_dataset, tmp_path, signum, uninterrupted
):
    marker = tmp_path / "step"
    slow = [f"{MARK}._target_=tests.utils.test_signals.StepMarker", f"{MARK}.path={marker}"]
    part = tmp_path / "part"
    code, err = _interrupt_at(
        [*_args(small_dataset, part), *slow, f"{MARK}.seconds=0.5"], marker, 2, signum
    )
    assert code == 128 + signum, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    last = part / "checkpoints" / "last.ckpt"
    saved = torch.load(last, weights_only=True)
    # the next optimizer-step boundary after the signal: inside the first epoch (4 steps)
    assert 2 <= saved["global_step"] < 4, saved["global_step"]
    summary = json.loads((part / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    assert summary["global_step"] == saved["global_step"]
    # the resume command is the last line on stderr, and it resumes
    resume = err.strip().splitlines()[-1]
    assert resume.startswith("resume with: python train.py ") and resume.endswith(
        f"ckpt_path={last}"
    ), err[-2000:]
    words = shlex.split(resume.removeprefix("resume with: "))
    assert words[:2] == ["python", "train.py"]
    resumed = tmp_path / "resumed"
    again = [w for w in words[2:] if not w.startswith(("hydra.run.dir=", MARK))]
    result = subprocess.run(
        [sys.executable, "train.py", *again, f"hydra.run.dir={resumed}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    a = uninterrupted
    b = torch.load(resumed / "checkpoints" / "last.ckpt", weights_only=True)
    assert a["global_step"] == b["global_step"] == 8
    for key, value in a["state_dict"].items():
        assert torch.equal(value, b["state_dict"][key]), key


def test_the_first_signal_is_recorded_and_a_second_ctrl_c_stops_at_once():
    from volseg.utils.signals import StopRequest

    before = signal.getsignal(signal.SIGINT)
    stop = StopRequest()
    stop.install()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.signum == signal.SIGTERM  # recorded: the loop stops at its next step
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    finally:
        stop.restore()
    assert signal.getsignal(signal.SIGINT) is before


def test_a_forked_loader_worker_ignores_the_signal():
    from volseg.utils.signals import StopRequest

    stop = StopRequest()
    stop.install()
    try:
        pid = os.fork()
        if pid == 0:  # the worker: a terminal's Ctrl-C reaches it too
            os.kill(os.getpid(), signal.SIGINT)
            os._exit(0 if stop.signum is None else 1)
        _, status = os.waitpid(pid, 0)
    finally:
        stop.restore()
    assert os.waitstatus_to_exitcode(status) == 0
    assert stop.signum is None  # the main process was not asked to stop


def test_sigterm_before_training_stops_like_ctrl_c():
    from volseg.utils.signals import TrainingInterrupted, raise_on

    restore = raise_on()
    try:
        with pytest.raises(TrainingInterrupted) as raised:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)  # the handler runs at the next bytecode
    finally:
        restore()
    assert raised.value.exit_code == 143 and raised.value.checkpoint is None
    assert str(raised.value) == "stopped by SIGTERM before training: nothing to save"


def test_the_resume_command_keeps_the_overrides_and_replaces_ckpt_path(monkeypatch, tmp_path):
    from hydra.core.global_hydra import GlobalHydra

    from volseg.utils.signals import resume_command

    GlobalHydra.instance().clear()
    monkeypatch.setattr("hydra.core.hydra_config.HydraConfig.initialized", lambda: False)
    argv = ["train.py", "model=unet_small", "data.patch_size=[16,32,32]", "ckpt_path=old.ckpt"]
    monkeypatch.setattr(sys, "argv", argv)
    ckpt = tmp_path / "last.ckpt"
    assert resume_command(str(ckpt)) == (
        f"python train.py model=unet_small 'data.patch_size=[16,32,32]' ckpt_path={ckpt}"
    )
