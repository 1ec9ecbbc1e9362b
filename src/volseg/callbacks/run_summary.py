"""Writes the run's ``summary.json`` at the end of fitting."""

from __future__ import annotations

import json
import time
from pathlib import Path

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint


class RunSummary(Callback):
    """``summary.json``: best ``val/dice_mean``, per-class Dice at that epoch, best checkpoint,
    parameter count, steps, epochs and wall time (seconds) of this fit.
    """

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self._start = 0.0

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._start = time.perf_counter()

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        checkpoints = [c for c in trainer.callbacks if isinstance(c, ModelCheckpoint)]
        best = next((c.best_model_path for c in checkpoints if c.monitor), None)
        last = next((c.best_model_path for c in checkpoints if c.filename == "last"), None)
        best_dice = getattr(pl_module, "best_dice", None)
        summary = {
            "best_val_dice_mean": best_dice if best_dice not in (None, float("-inf")) else None,
            "best_val_dice_per_class": getattr(pl_module, "best_dice_per_class", {}),
            "best_checkpoint": best,
            "last_checkpoint": last,
            "parameters": sum(p.numel() for p in pl_module.parameters()),
            "global_step": trainer.global_step,
            "epochs": trainer.current_epoch,
            "wall_time_s": round(time.perf_counter() - self._start, 2),
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
