"""Writes predicted label volumes next to the run, in the input's format and geometry."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer

from volseg.data.io import label_dtype, read_geometry, write_volume
from volseg.data.orientation import oriented_geometry, to_input_orientation
from volseg.data.transforms import labels_to_shape

log = logging.getLogger(__name__)


class ValidationPredictionWriter(Callback):
    """After each validation batch, write ``outputs["pred"]`` (``(B, D, H, W)`` class indices)
    as ``output_dir/<case name>`` in the input's format, geometry and grid (brought back from
    ``data.spacing`` and from ``orientation``, the ``data.orientation`` it was loaded in). Each
    rank writes the cases it validated.
    """

    def __init__(self, output_dir: str | Path, orientation: str | None = None) -> None:
        self.output_dir = Path(output_dir)
        self.orientation = orientation

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
        for pred, source, name in zip(
            outputs["pred"].cpu(), batch["image_path"], batch["name"], strict=True
        ):
            geometry = read_geometry(source)
            shape = list(oriented_geometry(geometry, self.orientation)["shape_zyx"])[-3:]
            if list(pred.shape) != shape:
                pred = labels_to_shape(pred, pl_module.num_classes, shape)
            pred = to_input_orientation(
                pred, geometry["affine"], self.orientation, geometry["format"]
            )
            target = self.output_dir / name
            array = pred.numpy().astype(label_dtype(pl_module.num_classes))
            write_volume(target, array, affine=geometry["affine"])
            log.info("Rank %d wrote %s", trainer.global_rank, target)
