"""benchmarks/archive/real_data.py: both sides in one precision, best and final validation,
classes at 0."""

from __future__ import annotations

import csv
import time

import pytest

from tests.conftest import load_benchmark
from volseg.data.synthetic import generate_synthetic_dataset


def test_final_validation_is_the_last_validation_row(tmp_path):
    bench = load_benchmark("real_data")
    path = tmp_path / "run" / "csv" / "metrics.csv"
    path.parent.mkdir(parents=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, ["step", "train/loss", "val/dice_mean", "val/dice_a"])
        writer.writeheader()
        writer.writerow({"step": 1, "val/dice_mean": 0.5, "val/dice_a": 0.5})
        writer.writerow({"step": 2, "train/loss": 1.0})  # a training row between validations
        writer.writerow({"step": 3, "val/dice_mean": 0.25, "val/dice_a": 0.0})
        writer.writerow({"step": 4, "train/loss": 0.9})
    rows = load_benchmark("harness").read(tmp_path / "run", 0.0).rows
    final, per_class = load_benchmark("archive.mni152_runs").final_validation(rows, ["a"])
    assert final == 0.25 and per_class == {"a": 0.0}
    assert bench.zero_classes({"a": 0.0, "b": 0.3, "c": 0.0}) == 2


class SteppedClock:
    """``time`` for a benchmark whose loop is bounded in seconds: ``perf_counter`` advances
    ``tick`` seconds a call, so the loop takes the same steps on a fast CPU and on one that
    emulates bfloat16."""

    def __init__(self, tick: float) -> None:
        self.now, self.tick = 0.0, tick

    def perf_counter(self) -> float:
        self.now += self.tick
        return self.now

    def __getattr__(self, name: str):
        return getattr(time, name)


@pytest.fixture
def bench(monkeypatch):
    """benchmarks/archive/real_data.py on a :class:`SteppedClock` (a quarter second a reading)."""
    module = load_benchmark("real_data")
    monkeypatch.setattr(module, "time", SteppedClock(0.25))
    return module


# bfloat16 autocast is emulated where the CPU has no AVX512_BF16 or AMX: minutes, not seconds
@pytest.mark.parametrize("precision", ["32", pytest.param("bf16-mixed", marks=pytest.mark.slow)])
def test_the_monai_loop_runs_in_the_asked_precision_and_reports_best_and_final(
    tmp_path, monkeypatch, precision, bench
):
    import torch

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


def test_the_monai_loop_with_volsegs_recipe_uses_its_rate_schedule_loss_and_patches(
    tmp_path, monkeypatch, bench
):
    """``--sides monai_volseg``: volseg's learning rate decays over the budget (cosine), its loss
    weights and patches per step replace the tutorial's, and validations count in the budget."""
    import monai.losses
    import torch

    monkeypatch.setattr(bench, "PATCH_ZYX", (16, 32, 32))
    root = generate_synthetic_dataset(
        tmp_path / "d", num_volumes=3, num_val=1, shape=(16, 32, 32), seed=0
    )
    losses, lrs, batches = [], [], []
    real_loss, real_adamw = monai.losses.DiceCELoss, torch.optim.AdamW

    def loss_spy(**kwargs):
        losses.append(kwargs)
        return real_loss(**kwargs)

    class AdamWSpy(real_adamw):
        def step(self, closure=None):
            lrs.append(self.param_groups[0]["lr"])
            return super().step(closure)

    import monai.networks.nets as nets  # run_monai imports BasicUNet from here when it runs

    class NetSpy(nets.BasicUNet):
        def forward(self, x):
            if self.training:
                batches.append(x.shape[0])
            return super().forward(x)

    monkeypatch.setattr(monai.losses, "DiceCELoss", loss_spy)
    monkeypatch.setattr(torch.optim, "AdamW", AdamWSpy)
    monkeypatch.setattr(nets, "BasicUNet", NetSpy)
    recipe = {
        "batch_size": 3,
        "samples_per_volume": 2,
        "lr": 0.02,
        "weight_decay": 1e-4,
        "lambda_ce": 0.25,
        "lambda_dice": 1.0,
        "include_background": False,
        "intensity_scale": 0.1,
        "intensity_shift": 0.1,
        "augment_prob": 0.5,
    }
    row = bench.run_monai(root, budget_s=3, threads=1, val_every_s=1.0, recipe=recipe)
    assert row["method"] == "MONAI loop, volseg's recipe" and row["recipe"] == recipe
    assert losses == [
        {
            "to_onehot_y": True,
            "softmax": True,
            "include_background": False,
            "lambda_dice": 1.0,
            "lambda_ce": 0.25,
        }
    ]
    assert lrs[0] == pytest.approx(0.02, rel=0.05) and len(lrs) >= 3
    assert all(a >= b for a, b in zip(lrs, lrs[1:], strict=False))  # decays over the budget
    assert lrs[-1] < 0.02 * 0.5  # past half the budget: below half the rate
    assert set(batches) <= {1, 2, 3} and batches[0] == 3  # 3 patches a step, one per draw
    # the budget holds the validations: training stopped at the first step past 3 s of both
    assert row["validations"] >= 2 and 3 <= row["trained_s"] < 4  # a step: 2-4 readings
    assert 0 < row["validating_s_in_budget"] < row["trained_s"]


def test_real_data_refuses_nnunet_in_another_precision_or_uninstalled_and_a_volseg_row_out(
    monkeypatch, capsys
):
    bench = load_benchmark("real_data")
    for argv in (
        ["--precision", "bf16-mixed"],  # nnU-Net is a default side and trains in 32 on a CPU
        ["--sides", "volseg", "--row-out", "row.json"],
    ):
        with pytest.raises(SystemExit) as stop:
            bench.main(argv)
        assert stop.value.code == 2
    monkeypatch.setattr(bench.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(SystemExit) as stop:
        bench.main([])
    assert stop.value.code == 2
    assert 'pip install -e ".[nnunet]"' in capsys.readouterr().err


def test_nnunet_plans_are_held_to_volsegs_patch_batch_widths_and_pooling():
    """nnU-Net's 3d_fullres plan (its own plans file for data=mni152) rewritten to volseg's
    compute; nnU-Net's convolutions per stage kept."""
    import json

    from tests.conftest import REPO

    bench = load_benchmark("nnunet_recipe")
    plans = json.loads((REPO / "benchmarks/results/nnunet/mni152/nnUNetPlans.json").read_text())
    compute = {
        "patch_size": [32, 64, 64],
        "batch_size": 2,
        "widths": [16, 16, 32, 64, 128],
        "pooling": [[2, 2, 2], [2, 2, 2], [2, 2, 2], [1, 2, 2]],
    }
    config = bench.equal_compute(plans, compute)["configurations"]["3d_fullres"]
    kwargs = config["architecture"]["arch_kwargs"]
    assert config["patch_size"] == [32, 64, 64] and config["batch_size"] == 2
    assert kwargs["n_stages"] == 5 and kwargs["features_per_stage"] == [16, 16, 32, 64, 128]
    assert kwargs["strides"] == [[1, 1, 1], [2, 2, 2], [2, 2, 2], [2, 2, 2], [1, 2, 2]]
    assert kwargs["kernel_sizes"] == [[3, 3, 3]] * 5
    assert kwargs["n_conv_per_stage"] == [2] * 5 and kwargs["n_conv_per_stage_decoder"] == [2] * 4
    assert config["normalization_schemes"] == ["ZScoreNormalization"]  # nnU-Net's, kept


def test_the_predicted_label_histogram_counts_each_class_over_the_cases():
    import torch

    runs = load_benchmark("archive.mni152_runs")
    preds = [torch.tensor([[0, 0, 2], [2, 0, 0]]), torch.tensor([[[0]], [[2]]])]
    assert runs.label_histogram(preds, ["background", "a", "b"]) == {
        "background": 5,
        "a": 0,  # a class never predicted is counted, as 0
        "b": 3,
    }
    with pytest.raises(ValueError, match="3 classes"):
        runs.label_histogram([torch.tensor([0, 3])], ["background", "a", "b"])


def test_nnunets_score_gives_volsegs_dice_and_the_predicted_voxels(tmp_path):
    """Saved predictions scored: Dice per class by volseg's rule, and the predicted voxels per
    class (a prediction of background only shows as every voxel on background)."""
    import nibabel as nib
    import numpy as np

    bench = load_benchmark("nnunet_recipe")
    (tmp_path / "labels").mkdir()
    (tmp_path / "pred").mkdir()
    label = np.zeros((4, 4, 4), np.uint8)
    label[:2, :2, :2] = 1
    nib.save(nib.Nifti1Image(label, np.eye(4)), tmp_path / "labels" / "case.nii.gz")
    background = np.zeros_like(label)
    nib.save(nib.Nifti1Image(background, np.eye(4)), tmp_path / "pred" / "case.nii.gz")
    per_class, voxels = bench.score(tmp_path / "pred", tmp_path, ["case.nii.gz"], ["bg", "a"])
    assert per_class["a"] == 0.0 and voxels == {"bg": 64, "a": 0}
    nib.save(nib.Nifti1Image(label, np.eye(4)), tmp_path / "pred" / "case.nii.gz")
    per_class, voxels = bench.score(tmp_path / "pred", tmp_path, ["case.nii.gz"], ["bg", "a"])
    assert per_class["a"] == 1.0 and voxels == {"bg": 56, "a": 8}


def test_nnunets_training_log_is_copied_beside_the_results_file_and_named_in_its_row(tmp_path):
    bench = load_benchmark("real_data")
    results_io = load_benchmark("results_io")
    log = tmp_path / "work" / "training_log_2026_12_03_10_00_00.txt"
    log.parent.mkdir()
    log.write_text("2026-12-03 10:00:00: Epoch 0\n")
    rows = [
        {"side": "nnunet_own_plan", "seed": 2, "training_log": str(log)},
        {"side": "volseg", "seed": 2},
    ]
    results_file = tmp_path / "out" / "2026-12-03_real_data.json"
    assert bench.keep_logs(rows, results_file)
    copy = tmp_path / "out" / "nnunet_logs" / "2026-12-03_real_data_nnunet_own_plan_seed2.txt"
    assert rows[0]["training_log"] == str(copy.resolve())
    assert copy.read_text() == log.read_text()
    assert "training_log" not in rows[1]
    assert not bench.keep_logs(rows[1:], results_file)  # no log: nothing copied
    # a results file in the repository's results: its logs under results/nnunet/logs
    committed = results_io.RESULTS / "cpu" / "2026-12-03_real_data-2.json"
    assert bench.log_path(committed, "nnunet", 1) == (
        results_io.RESULTS / "nnunet" / "logs" / "2026-12-03_real_data-2_nnunet_seed1.txt"
    )


def test_the_own_plan_side_is_accepted_and_runs_nnunets_own_plan(tmp_path, monkeypatch):
    import argparse
    import json

    from tests.conftest import REPO

    bench = load_benchmark("real_data")
    with pytest.raises(SystemExit) as stop:  # a known side: refused for its precision only
        bench.main(["--sides", "nnunet_own_plan", "--precision", "bf16-mixed"])
    assert stop.value.code == 2
    started = []
    monkeypatch.setattr(bench.subprocess, "Popen", lambda cmd, **kw: started.append(cmd))
    monkeypatch.setattr(bench, "ROWS", tmp_path)
    args = argparse.Namespace(
        parallel=True, data="mni152", budget=30, nnunet_work=tmp_path, overrides=[]
    )
    for side in ("nnunet", "nnunet_own_plan", "nnunet_nomirror"):
        bench.Job(side, 1, args, "32")
    assert [("--own-plan" in c, "--no-mirroring" in c) for c in started] == [
        (False, False),
        (True, False),
        (False, True),
    ]
    # the row names the plan it trained: nnU-Net's own for mni152, or the one held to volseg's
    recipe = load_benchmark("nnunet_recipe")
    plans = json.loads((REPO / "benchmarks/results/nnunet/mni152/nnUNetPlans.json").read_text())
    own = recipe.plan_record(plans)
    compute = {
        "patch_size": [32, 64, 64],
        "batch_size": 2,
        "widths": [16, 16, 32, 64, 128],
        "pooling": [[2, 2, 2], [2, 2, 2], [2, 2, 2], [1, 2, 2]],
    }
    held = recipe.plan_record(recipe.equal_compute(plans, compute))
    record = {"volseg_compute": compute, **held, "nnunet_own": own}
    used = recipe.plan_used(record, own_plan=True)
    assert used["plan_source"] == "nnunet_own"
    assert used["plan"]["patch_size"] == [96, 96, 80] and used["plan"]["batch_size"] == 2
    assert used["plan"]["features_per_stage"] == [32, 64, 128, 256, 320]
    used = recipe.plan_used(record, own_plan=False)
    assert used["plan_source"] == "volseg_compute" and used["plan"]["patch_size"] == [32, 64, 64]
    assert used["plan"]["volseg_compute"] == compute and "nnunet_own" not in used["plan"]


@pytest.mark.slow  # a tiny training run, then python eval.py in a process of its own
def test_volsegs_predicted_voxels_come_from_eval_of_its_final_weights(small_dataset, tmp_path):
    import json

    import nibabel as nib
    import numpy as np

    from tests.conftest import compose_config, tiny_train_overrides
    from volseg.tasks.train import train

    runs = load_benchmark("archive.mni152_runs")
    run_dir = tmp_path / "run"
    train(compose_config("train", run_dir, tiny_train_overrides(small_dataset)))
    voxels = runs.volseg_predicted_voxels(run_dir, small_dataset)
    classes = json.loads((small_dataset / "classes.json").read_text())
    names = json.loads((small_dataset / "splits.json").read_text())["val"]
    assert list(voxels) == classes
    # every voxel of the validation cases is predicted as one class
    sizes = [np.asarray(nib.load(small_dataset / "images" / n).dataobj).size for n in names]
    assert sum(voxels.values()) == sum(sizes)
    assert sorted(p.name for p in (run_dir / "eval" / "predictions").iterdir()) == sorted(names)
