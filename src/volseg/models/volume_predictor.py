"""``VolumePredictor``: the LightningModule ``predict.py`` runs (and the estimator traces)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import lightning as L
import numpy as np
import torch
from monai.inferers import SlidingWindowInferer

from volseg.utils.errors import UserInputError

STITCH_CHOICES = ("auto", "host", "device")
# stitch=auto keeps a volume on the device while its buffers take at most this share of the free
# memory (the windows' activations need the rest)
DEVICE_STITCH_SHARE = 0.5


def flip_combinations(axes: Sequence[int]) -> list[tuple[int, ...]]:
    """Every subset of the spatial ``axes`` as dims of ``(B, C, D, H, W)``."""
    dims = sorted({int(a) + 2 for a in axes})
    if any(d not in (2, 3, 4) for d in dims):
        raise UserInputError(f"flip_axes={list(axes)}: spatial axes are 0 (D), 1 (H) and 2 (W)")
    return [c for n in range(len(dims) + 1) for c in itertools.combinations(dims, n)]


class VolumePredictor(L.LightningModule):
    """Class probabilities ``(B, K, D, H, W)`` of whole volumes ``(B, C, D, H, W)`` by sliding
    windows on this module's device, averaged over the mirrorings of ``flip_axes``. The volume is
    stitched on the host with ``stitch="host"``, or with ``"auto"`` where its buffers (``3K + 1``
    float32 a voxel) would take over half the device's free memory."""

    def __init__(
        self,
        model: torch.nn.Module,
        inferer: SlidingWindowInferer,
        num_classes: int,
        flip_axes: Sequence[int] = (),
        stitch: str = "auto",
        planned: Mapping[tuple[int, ...], str] | None = None,
    ) -> None:
        super().__init__()
        if stitch not in STITCH_CHOICES:
            raise UserInputError(f"stitch={stitch}: expected one of {', '.join(STITCH_CHOICES)}")
        self.model = model
        self.inferer = inferer
        self.num_classes = num_classes
        self.flips = flip_combinations(flip_axes)
        self.stitch = stitch
        # stitch=auto: (D, H, W) -> device | host, planned; a shape not in it is decided here
        self.planned = dict(planned or {})

    def stitch_device(self, spatial_shape: Sequence[int]) -> torch.device:
        """Where the whole volume's probabilities are accumulated."""
        if self.device.type != "cuda" or self.stitch == "device":
            return self.device
        if self.stitch == "host":
            return torch.device("cpu")
        planned = self.planned.get(tuple(int(v) for v in spatial_shape))
        if planned is not None:
            return self.device if planned == "device" else torch.device("cpu")
        free, _ = torch.cuda.mem_get_info(self.device)
        needed = int(np.prod(spatial_shape)) * (3 * self.num_classes + 1) * 4
        return self.device if needed <= DEVICE_STITCH_SHARE * free else torch.device("cpu")

    @torch.no_grad()
    def predict_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor | None:
        """Mean softmax over the flips ``(B, K, D, H, W)`` on the host; ``None``: padding."""
        if not torch.as_tensor(batch.get("counted", True), dtype=torch.bool).all():
            return None  # batch size 1: a padding volume, predicted by another rank
        target = self.stitch_device(batch["image"].shape[2:])
        image = batch["image"].to(target)
        self.inferer.sw_device = self.device
        probs: torch.Tensor | None = None
        for dims in self.flips:
            logits = self.inferer(image.flip(dims) if dims else image, self.model, device=target)
            p = torch.softmax(logits.float(), dim=1)
            p = p.flip(dims) if dims else p
            probs = p if probs is None else probs.add_(p)
        return probs.div_(len(self.flips)).cpu()
