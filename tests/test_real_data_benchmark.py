"""benchmarks/real_data.py: both sides in one precision, best and final validation, classes at 0."""

from __future__ import annotations

import csv

import pytest

from tests.conftest import load_benchmark
from volseg.data.synthetic import generate_synthetic_dataset


def test_final_validation_is_the_last_validation_row(tmp_path):
    bench = load_benchmark("real_data")
    path = tmp_path / "metrics.csv"
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, ["step", "train/loss", "val/dice_mean", "val/dice_a"])
        writer.writeheader()
        writer.writerow({"step": 1, "val/dice_mean": 0.5, "val/dice_a": 0.5})
        writer.writerow({"step": 2, "train/loss": 1.0})  # a training row between validations
        writer.writerow({"step": 3, "val/dice_mean": 0.25, "val/dice_a": 0.0})
        writer.writerow({"step": 4, "train/loss": 0.9})
    final, per_class = bench.final_validation(path, ["a"])
    assert final == 0.25 and per_class == {"a": 0.0}
    assert bench.zero_classes({"a": 0.0, "b": 0.3, "c": 0.0}) == 2


@pytest.mark.parametrize("precision", ["32", "bf16-mixed"])
def test_the_monai_loop_runs_in_the_asked_precision_and_reports_best_and_final(
    tmp_path, monkeypatch, precision
):
    import torch

    bench = load_benchmark("real_data")
    monkeypatch.setattr(bench, "PATCH_ZYX", (16, 32, 32))
    root = generate_synthetic_dataset(
        tmp_path / "d", num_volumes=3, num_val=1, shape=(16, 32, 32), seed=0
    )
    autocast_dtypes = []
    real_autocast = torch.autocast

    def spy(*args, **kwargs):
        autocast_dtypes.append(kwargs.get("dtype"))
        return real_autocast(*args, **kwargs)

    monkeypatch.setattr(torch, "autocast", spy)
    row = bench.run_monai(
        root, budget_s=2, threads=1, precision=precision, samples_per_volume=3, val_every_s=0.5
    )
    assert row["precision"] == precision
    # bf16: every training and validation step under bfloat16 autocast; 32: none
    assert bool(autocast_dtypes) == (precision == "bf16-mixed")
    assert set(autocast_dtypes) <= {torch.bfloat16}
    assert row["validations"] >= 2  # validated during training, not only at the end
    assert row["dice_mean"] >= row["final_dice_mean"]  # best over the validations
    assert row["method"] == "MONAI loop as its tutorials (3 patches/volume)"
    assert row["zero_classes"] == bench.zero_classes(row["per_class"])
    table = bench.table([row])
    assert "at 0 (best)" in table and "final val Dice" in table and precision in table
