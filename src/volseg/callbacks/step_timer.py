"""Benchmark callbacks (not on by default): seconds per optimizer step with the device
synchronized, and one run at a time on a shared GPU."""

from __future__ import annotations

import fcntl
import time
from pathlib import Path
from typing import IO, Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer


def _sync(module: LightningModule) -> None:
    if module.device.type == "cuda":
        torch.cuda.synchronize(module.device)


class StepTimer(Callback):
    """Logs ``time/step_s``: wall seconds of each optimizer step (all its micro-batches and the
    update), the device synchronized on both ends so that queued CUDA work counts in its own
    step; for measurements
    (``+callbacks.step_timer._target_=volseg.callbacks.step_timer.StepTimer``).
    """

    def __init__(self) -> None:
        self._began: float | None = None
        self._step = -1

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._began is None:  # the first micro-batch of an optimizer step
            _sync(pl_module)
            self._began = time.perf_counter()
            self._step = trainer.global_step

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_step == self._step:  # accumulating: the step goes on
            return
        _sync(pl_module)
        seconds = time.perf_counter() - self._began
        self._began = None
        # logged where Lightning logs a step's metrics: after the micro-batch that ends it
        pl_module.log("time/step_s", seconds, on_step=True)


class GpuTurn(Callback):
    """Trains (and predicts) only while holding an exclusive ``flock`` on ``lock_file``, so
    benchmark runs started side by side train one at a time, their start-up overlapping
    another's training. The lock goes with the process if it dies.
    """

    def __init__(self, lock_file: str | Path) -> None:
        self.lock_file = Path(lock_file)
        self._held: IO[str] | None = None

    def _take(self, *_: Any) -> None:
        """Block until the lock is this process's (every hook that starts using the device)."""
        if self._held is None:
            self.lock_file.parent.mkdir(parents=True, exist_ok=True)
            held = self.lock_file.open("a")
            fcntl.flock(held.fileno(), fcntl.LOCK_EX)
            self._held = held

    def _give(self, *_: Any) -> None:
        """Release the lock (every hook that ends using the device, an exception too)."""
        held, self._held = self._held, None
        if held is not None:
            fcntl.flock(held.fileno(), fcntl.LOCK_UN)
            held.close()

    on_train_start = on_predict_start = _take
    on_train_end = on_predict_end = on_exception = _give
