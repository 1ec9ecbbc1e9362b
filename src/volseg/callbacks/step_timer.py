"""Seconds per optimizer step, with the device synchronized (for benchmarks, not on by default)."""

from __future__ import annotations

import time
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer


def _sync(module: LightningModule) -> None:
    if module.device.type == "cuda":
        torch.cuda.synchronize(module.device)


class StepTimer(Callback):
    """Logs ``time/step_s``: wall seconds of each training batch (forward, backward and, on the
    batch that ends an accumulation, the update), the device synchronized on both ends so that
    queued CUDA work is counted in its own step. The synchronization costs a little: add it for
    measurements only (``+callbacks.step_timer._target_=volseg.callbacks.step_timer.StepTimer``).
    """

    def __init__(self) -> None:
        self._began = 0.0

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int
    ) -> None:
        _sync(pl_module)
        self._began = time.perf_counter()

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        _sync(pl_module)
        pl_module.log("time/step_s", time.perf_counter() - self._began, on_step=True)
