"""Writes the run's ``summary.json`` at the end of fitting, or when it stops on an error or a
signal (``status``: ``completed``, ``interrupted`` or ``failed``)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint

from volseg.utils.signals import TrainingInterrupted, resume_command


def predicted_and_measured(pl_module: LightningModule, measured: float) -> dict[str, Any]:
    """``predicted_seconds`` (the run plan's ``duration``; ``None`` where it was not predicted,
    and ``not_predicted`` says why) and ``measured_seconds`` of this fit."""
    duration = (getattr(pl_module, "run_plan", None) or {}).get("duration") or {}
    found: dict[str, Any] = {"predicted_seconds": duration.get("seconds")}
    if found["predicted_seconds"] is None:
        found["not_predicted"] = duration.get("not_predicted", "no run plan")
    else:
        found["predicted_timed"] = duration.get("timed")
    found["measured_seconds"] = round(measured, 2)
    return found


class RunSummary(Callback):
    """``summary.json``: ``status``, best ``val/dice_mean``, per-class Dice at that epoch, best
    checkpoint, parameter count, steps, epochs and wall time (seconds) of this fit, with the run
    plan's predicted time beside it (``predicted_seconds``, ``measured_seconds``). A run stopped
    by a signal (``status: interrupted``) adds the ``resume`` command; one stopped by an error
    (``status: failed``) the ``error``.
    """

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self._start = 0.0

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._start = time.perf_counter()

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.write(trainer, pl_module, {"status": "completed"})

    def on_exception(
        self, trainer: Trainer, pl_module: LightningModule, exception: BaseException
    ) -> None:
        if isinstance(exception, TrainingInterrupted):
            status = {"status": "interrupted", "error": str(exception)}
            if exception.checkpoint:
                status["resume"] = resume_command(exception.checkpoint)
        elif isinstance(exception, KeyboardInterrupt):  # a second Ctrl-C: at once, no save
            status = {"status": "interrupted", "error": "stopped at once by Ctrl-C, not saved"}
        else:
            status = {"status": "failed", "error": f"{type(exception).__name__}: {exception}"}
        self.write(trainer, pl_module, status)

    def write(self, trainer: Trainer, pl_module: LightningModule, status: dict) -> None:
        """``summary.json`` with ``status`` (its first keys) and what this fit reached."""
        if not trainer.is_global_zero:
            return
        checkpoints = [c for c in trainer.callbacks if isinstance(c, ModelCheckpoint)]
        best = next((c.best_model_path for c in checkpoints if c.monitor), None)
        last = next((c.best_model_path for c in checkpoints if c.filename == "last"), None)
        best_dice = getattr(pl_module, "best_dice", None)
        wall = time.perf_counter() - self._start
        summary = {
            **status,
            "best_val_dice_mean": best_dice if best_dice not in (None, float("-inf")) else None,
            "best_val_dice_per_class": getattr(pl_module, "best_dice_per_class", {}),
            "best_checkpoint": best,
            "last_checkpoint": last,
            "parameters": sum(p.numel() for p in pl_module.parameters()),
            "global_step": trainer.global_step,
            "epochs": trainer.current_epoch,
            "wall_time_s": round(wall, 2),
            # the plan's predicted time of this fit beside the measured one (plan.yaml's duration)
            **predicted_and_measured(pl_module, wall),
            "precision": str(trainer.precision),
            # requested, device and why (trainer.precision=auto is resolved by the device)
            "precision_choice": getattr(pl_module, "precision_choice", None),
        }
        for callback in trainer.callbacks:  # sections from other callbacks (e.g. memory)
            key = getattr(callback, "summary_key", None)
            if key is not None:
                summary[key] = callback.summary()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(summary, indent=2))
