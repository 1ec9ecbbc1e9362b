"""The validation Dice rule (volseg.models.dice) against counts made by hand."""

from __future__ import annotations

import math

import torch

from volseg.models.dice import case_dice, class_means


def test_case_dice_counts_overlap_per_class_and_leaves_absent_classes_out():
    # one case of 8 voxels, 3 classes; class 2 is absent from the label but predicted once
    label = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1]).reshape(1, 1, 2, 2, 2)
    pred = torch.tensor([0, 0, 0, 1, 1, 1, 0, 2]).reshape(1, 1, 2, 2, 2)
    dice = case_dice(pred, label, num_classes=3)
    assert dice.shape == (1, 3) and dice.dtype == torch.float64
    # class 0: pred {0,1,2,6}, label {0,1,2,3}: overlap 3 -> 2*3/(4+4)
    assert math.isclose(dice[0, 0].item(), 6 / 8, rel_tol=1e-6)
    # class 1: pred {3,4,5}, label {4,5,6,7}: overlap 2 -> 2*2/(3+4)
    assert math.isclose(dice[0, 1].item(), 4 / 7, rel_tol=1e-6)  # float32 inside
    assert math.isnan(dice[0, 2].item())  # absent from the label: not scored


def test_class_means_divides_by_the_cases_that_hold_a_class():
    sums = torch.tensor([1.5, 0.5, 0.25, 0.0], dtype=torch.float64)
    counts = torch.tensor([2.0, 1.0, 1.0, 0.0], dtype=torch.float64)
    assert class_means(sums, counts).tolist() == [0.75, 0.5, 0.25, 0.0]  # 0 for a class in no case
