"""The validation Dice rule: one score per case and class, a class absent from a case's label
left out of that class's mean. ``val/dice_*`` of a run and every benchmark that scores saved
predictions use this one rule."""

from __future__ import annotations

import torch
from monai.metrics import compute_dice
from monai.networks.utils import one_hot


def case_dice(pred: torch.Tensor, label: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Dice per case and class, ``(B, K)`` float64, of ``pred`` and ``label`` (``(B, 1, D, H,
    W)`` class indices); NaN where the class is absent from the case's label (a prediction of
    it there is not scored)."""
    return compute_dice(
        one_hot(pred, num_classes),
        one_hot(label.long(), num_classes),
        include_background=True,
        ignore_empty=True,
    ).double()


def class_means(sums: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Per-class Dice ``(K,)`` from the per-class sums of :func:`case_dice` scores and the
    number of cases that hold each class (both ``(K,)``); 0 for a class in no case."""
    return torch.where(counts > 0, sums / counts.clamp(min=1), torch.zeros_like(sums))


def mean_over_cases(per_case: torch.Tensor) -> torch.Tensor:
    """Per-class Dice ``(K,)`` from :func:`case_dice` rows ``(N, K)``: the mean over the cases
    that hold the class, 0 for a class in no case."""
    sums = per_case.nan_to_num(0.0).sum(dim=0)
    return class_means(sums, (~per_case.isnan()).sum(dim=0).double())
