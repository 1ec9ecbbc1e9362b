"""Writes predicted label volumes next to the run, in the input's format and geometry."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from lightning.pytorch import Callback, LightningModule, Trainer

from volseg.data.io import read_geometry, write_volume


class ValidationPredictionWriter(Callback):
    """After each validation batch, write ``outputs["pred"]`` (``(B, D, H, W)`` class indices)
    as ``output_dir/<input file name>`` with the input's format and affine/spacing.
    """

    def __init__(self, output_dir: str | Path) -> None:
        self.output_dir = Path(output_dir)
        self.written: list[Path] = []

    def on_validation_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: dict[str, Any],
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if trainer.sanity_checking or not outputs:
            return
        self.output_dir.mkdir(parents=True, exist_ok=True)
        preds = outputs["pred"].cpu().numpy().astype(np.uint8)
        for pred, source in zip(preds, batch["image_path"], strict=True):
            geometry = read_geometry(source)
            target = self.output_dir / Path(source).name
            self.written.append(write_volume(target, pred, affine=geometry["affine"]))
