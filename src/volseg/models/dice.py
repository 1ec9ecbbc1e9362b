"""The validation Dice rule: a class absent from a case's label is left out of its mean."""

from __future__ import annotations

import torch
from monai.metrics import compute_dice
from monai.networks.utils import one_hot


def case_dice(pred: torch.Tensor, label: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Dice ``(B, K)`` float64 of ``(B, 1, D, H, W)`` class indices; NaN: class not in label."""
    return compute_dice(
        one_hot(pred, num_classes),
        one_hot(label.long(), num_classes),
        include_background=True,
        ignore_empty=True,
    ).double()


def class_means(sums: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Per-class Dice ``(K,)`` from score sums and case counts ``(K,)``; 0 for no case."""
    return torch.where(counts > 0, sums / counts.clamp(min=1), torch.zeros_like(sums))
