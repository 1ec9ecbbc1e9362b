"""data.patch_size=auto: the patch planned from the cases' shapes."""

from __future__ import annotations

import math

import pytest

from tests.conftest import SMALL_SHAPE, compose_config, tiny_train_overrides
from volseg.data.fingerprint import median_shape, plan_patch
from volseg.plan import make_plan


def test_median_shape_is_per_axis():
    assert median_shape([[10, 50, 60], [30, 40, 80], [20, 90, 70]]) == [20, 50, 70]


@pytest.mark.parametrize(
    ("median", "budget", "multiple"),
    [([32, 96, 96], 32 * 64 * 64, 8), ([79, 96, 84], 131072, 8), ([26, 150, 320], 200_000, 16)],
)
def test_plan_fits_the_budget_and_the_pooling(median, budget, multiple):
    patch = plan_patch(median, budget, multiple)
    assert math.prod(patch) <= budget
    assert all(p % multiple == 0 for p in patch)
    # no side beyond the median shape rounded up to the multiple
    assert all(p <= multiple * math.ceil(m / multiple) for p, m in zip(patch, median, strict=True))
    # and no side could grow by one multiple without leaving the budget: the budget is used
    for axis in range(3):
        grown = list(patch)
        grown[axis] += multiple
        if grown[axis] <= multiple * math.ceil(median[axis] / multiple):
            assert math.prod(grown) > budget


def test_plan_shrinks_the_longest_sides_and_keeps_thin_axes():
    # the embedded dataset's 32 x 96 x 96 stacks: in-plane sides give way, z is kept whole
    assert plan_patch([32, 96, 96], 32 * 64 * 64, 8) == [32, 64, 64]
    assert plan_patch([26, 150, 320], 32 * 96 * 96, 16)[0] == 32
    # a dataset within the budget is taken whole, padded to the multiple
    assert plan_patch([20, 30, 30], 10**6, 8) == [24, 32, 32]


def test_auto_is_resolved_from_the_data_before_interpolation(small_dataset, tmp_path):
    overrides = [*tiny_train_overrides(small_dataset), "data.patch_size=auto"]
    overrides += ["data.patch_voxels=16384"]
    plan = make_plan(compose_config("train", tmp_path, overrides), estimate_step=False)
    patch = plan.value("data.patch_size")
    # 16 x 48 x 48 cases, 3-level U-Net (multiple 4), 16384 voxels: 16 x 32 x 32
    assert patch == plan_patch(SMALL_SHAPE, 16384, 4) == [16, 32, 32]
    assert plan.decisions["data.patch_size"].source == "planned"
    assert "median case shape [16, 48, 48]" in plan.decisions["data.patch_size"].why
    cfg = plan.run_config()
    assert list(cfg.model.net.patch_size) == list(cfg.model.inferer.roi_size) == patch


def test_an_explicit_patch_wins(small_dataset, tmp_path):
    cfg = compose_config("train", tmp_path, tiny_train_overrides(small_dataset))
    plan = make_plan(cfg, estimate_step=False)
    assert plan.value("data.patch_size") == [16, 32, 32]
    assert plan.decisions["data.patch_size"].source == "configured"
