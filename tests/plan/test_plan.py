"""The run plan: every ``auto`` resolved once, with its source, the same in every entry point."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import yaml

from tests.conftest import compose_config, tiny_train_overrides
from tests.estimates import estimate
from volseg.data.io import read_array, read_geometry, write_volume
from volseg.memory.estimate.margins import planned_total
from volseg.plan import make_plan
from volseg.tasks.estimate_memory import run_estimate
from volseg.tasks.evaluate import evaluate
from volseg.tasks.plan import plan_command
from volseg.tasks.predict import predict
from volseg.tasks.train import train
from volseg.utils.errors import BudgetExceeded, UserInputError
from volseg.utils.units import MIB

CPU = ["trainer.accelerator=cpu"]


def _plan(tmp_path: Path, overrides: list[str], **kwargs):
    kwargs.setdefault("estimate_step", False)
    return make_plan(compose_config("train", tmp_path, overrides), **kwargs)


def test_auto_precision_is_planned_for_the_device_an_explicit_one_configured(tmp_path):
    plan = _plan(tmp_path, CPU)
    decision = plan.decisions["trainer.precision"]
    assert decision.source == "planned" and decision.value in ("bf16-mixed", "32")
    assert "bf16" in decision.why  # says whether this CPU runs bf16 natively
    assert plan.run_config().trainer.precision == decision.value
    explicit = _plan(tmp_path, [*CPU, "trainer.precision=32"]).decisions["trainer.precision"]
    assert (explicit.value, explicit.source) == ("32", "configured")
    assert plan.decisions["device"].value == "cpu"


def test_auto_pooling_is_planned_and_null_is_configured(tmp_path):
    plan = _plan(tmp_path, [*CPU, "data.patch_size=[8,64,64]"])  # unet_tiny: pooling auto
    decision = plan.decisions["model.net.pooling"]
    # z 8 -> 4 and kept; y and x halved at every one of the 4 poolings
    assert decision.value == [[2, 2, 2], [1, 2, 2], [1, 2, 2], [1, 2, 2]]
    assert decision.source == "planned" and "bottleneck [4, 4, 4]" in decision.why
    assert plan.run_config().model.net.pooling == decision.value
    fixed = _plan(tmp_path, [*CPU, "model.net.pooling=null"]).decisions["model.net.pooling"]
    assert (fixed.value, fixed.source) == ([[2, 2, 2]] * 4, "configured")
    with pytest.raises(UserInputError, match=r"data.patch_size=\[8, 64, 64\] is too thin"):
        _plan(tmp_path, [*CPU, "data.patch_size=[8,64,64]", "model.net.pooling=null"])


@pytest.mark.parametrize(
    ("pooling", "patch", "levels", "bottleneck"),
    [
        ("auto", [32, 64, 64], 5, [4, 4, 4]),  # z stops at 4, y and x pooled once more
        ("null", [32, 64, 64], 4, [4, 8, 8]),  # all axes together: the thinnest decides
        ("auto", [26, 150, 320], 7, [6, 4, 5]),
    ],
)
def test_auto_depth_is_planned_until_the_bottleneck_is_a_few_voxels(
    tmp_path, pooling, patch, levels, bottleneck
):
    overrides = [*CPU, "model.net.widths=[4,8,16]", f"model.net.pooling={pooling}"]
    overrides += ["model.net.depth=auto", f"data.patch_size=[{','.join(map(str, patch))}]"]
    plan = _plan(tmp_path, overrides)
    assert plan.decisions["model.net.depth"].value == levels
    assert plan.decisions["model.net.depth"].source == "planned"
    widths = plan.value("model.net.widths")
    assert len(widths) == levels and widths[:4] == [4, 8, 16, 32]
    factors = plan.value("model.net.pooling")
    pooled = [patch[a] // 2 ** sum(k[a] == 2 for k in factors) for a in range(3)]
    assert pooled == bottleneck
    net = plan.run_config().model.net  # what UNet3D is built with: explicit values only
    assert net.depth == levels and net.pooling == factors


def test_auto_loader_options_are_planned_for_the_device(tmp_path):
    plan = _plan(tmp_path, CPU)
    assert plan.decisions["data.num_workers"].value == 0  # a CPU step uses every core
    assert plan.decisions["data.num_workers"].source == "planned"
    assert plan.decisions["data.pin_memory"].value is False
    given = _plan(tmp_path, [*CPU, "data.num_workers=2"])
    assert given.decisions["data.num_workers"].value == 2
    assert given.decisions["data.num_workers"].source == "configured"
    assert given.decisions["data.persistent_workers"].value is True  # auto: workers persist


def test_classes_and_channels_come_from_dataset_json(tmp_path, small_dataset):
    root = _msd(small_dataset, tmp_path / "msd", num_classes=3)
    plan = _plan(tmp_path / "run", [*CPU, "data=msd", f"data.root={root}"])
    assert plan.decisions["num_classes"].value == 3
    assert plan.decisions["num_classes"].source == "the data"
    assert "dataset.json" in plan.decisions["num_classes"].why
    cfg = plan.run_config()
    assert cfg.model.net.num_classes == 3 and cfg.data.num_classes == 3


def test_the_estimate_of_the_planned_step_is_in_the_plan(tmp_path):
    plan = _plan(tmp_path, [*CPU, "model.net.widths=[4,8,16]"], estimate_step=True)
    est = estimate(plan.run_config())
    assert plan.estimate["device"] == "cpu"
    assert plan.estimate["peak_allocated"] == est.peak_allocated > 0
    assert plan.estimate["flops_per_step"] > 0


@pytest.mark.slow
def test_a_budget_is_checked_or_fitted_by_the_planner(tmp_path):
    small = [*CPU, "model.net.widths=[4,8,16]", "data.patch_size=[16,32,32]"]
    small += ["trainer.precision=32", "data.batch_size=8", "memory.max_batch_size=8"]
    small += ["memory.val_shape=[16,32,32]"]
    configured = _plan(tmp_path, small, estimate_step=True)
    needed = planned_total(configured.estimate)  # as the planner counts it: the CPU margin in
    # 60% of the step, or what validating one window needs where that is more (on CPUs whose
    # batch-1 convolutions take the larger scratch: AVX2 only)
    budget_bytes = max(0.6 * needed, configured.validation["process_total"])
    assert budget_bytes < needed
    budget = f"memory.budget={math.ceil(budget_bytes / MIB)}MiB"
    with pytest.raises(BudgetExceeded, match="memory.budget="):
        _plan(tmp_path, [*small, budget])
    plan = _plan(tmp_path, [*small, budget], fit_budget=True)  # what plan.py does
    batch, steps = plan.value("data.batch_size"), plan.value("trainer.accumulate_grad_batches")
    assert plan.decisions["data.batch_size"].source == "planned"
    assert batch < 8 and batch * steps == 8  # micro-batches: the same samples per step
    assert plan.estimate["process_total"] <= math.ceil(budget_bytes / MIB) * MIB


def _msd(source: Path, root: Path, num_classes: int = 5) -> Path:
    """The small folder dataset as a one-channel MSD layout (dataset.json, imagesTr, labelsTr)."""
    names = sorted(p.name for p in (source / "images").glob("*.nii.gz"))
    for name in names:
        case_id = name.removesuffix(".nii.gz")
        affine = read_geometry(source / "images" / name)["affine"]
        label = read_array(source / "labels" / name).clip(0, num_classes - 1)
        write_volume(
            root / "imagesTr" / f"{case_id}_0000.nii.gz",
            read_array(source / "images" / name),
            affine=affine,
        )
        write_volume(root / "labelsTr" / name, label.astype("uint8"), affine=affine)
    labels = {f"class_{k}" if k else "background": k for k in range(num_classes)}
    dataset = {
        "channel_names": {"0": "raw"},
        "labels": labels,
        "numTraining": len(names),
        "file_ending": ".nii.gz",
    }
    (root / "dataset.json").write_text(json.dumps(dataset))
    shutil.copy(source / "splits.json", root / "splits.json")
    return root


def _values(decisions: dict) -> dict:
    return {k: d["value"] for k, d in decisions.items()}


@pytest.mark.slow
def test_the_same_command_gives_the_same_plan_in_every_entry_point(small_dataset, tmp_path):
    overrides = [*tiny_train_overrides(small_dataset), "data.patch_size=auto"]
    overrides += ["data.patch_voxels=16384", "trainer.max_epochs=1"]
    train(compose_config("train", tmp_path / "train", overrides))
    trained_plan = yaml.safe_load((tmp_path / "train" / "plan.yaml").read_text())
    trained = trained_plan["decisions"]
    assert trained["data.patch_size"]["source"] == "planned"
    assert trained_plan["estimate"] == {}  # memory.plan_step=false: the step is not estimated

    estimated = run_estimate(compose_config("estimate_memory", tmp_path / "est", overrides))
    assert _values(estimated["run_plan"]) == _values(trained)
    assert {k: d["source"] for k, d in estimated["run_plan"].items()} == {
        k: d["source"] for k, d in trained.items()
    }

    ckpt = tmp_path / "train" / "checkpoints" / "last.ckpt"
    evaluate(compose_config("eval", tmp_path / "eval", [f"ckpt_path={ckpt}"]))
    out = tmp_path / "pred"
    args = [f"ckpt_path={ckpt}", f"input={small_dataset / 'images'}", f"output={out}"]
    predict(compose_config("predict", tmp_path / "predict", args))
    for folder in ("eval", "predict"):
        planned = yaml.safe_load((tmp_path / folder / "plan.yaml").read_text())["decisions"]
        shared = set(planned) & set(trained) - {"trainer.precision"}  # predict.yaml: 32-true
        assert {"data.patch_size", "model.net.pooling", "num_classes"} <= shared
        assert {k: planned[k]["value"] for k in shared} == {k: trained[k]["value"] for k in shared}
        # what the training run planned, eval and predict take from its plan
        assert planned["data.patch_size"]["source"] == "the training run's plan"


def test_estimate_memory_plans_an_auto_patch(small_dataset, tmp_path, capsys):
    overrides = [*tiny_train_overrides(small_dataset), "data.patch_size=auto"]
    result = run_estimate(compose_config("estimate_memory", tmp_path, overrides))
    patch = result["run_plan"]["data.patch_size"]["value"]
    assert result["estimate"]["patch_size"] == patch and len(patch) == 3
    assert "activations by module" in capsys.readouterr().out


@pytest.mark.slow
def test_eval_applies_a_group_override_as_train_does(small_dataset, tmp_path):
    train(
        compose_config(
            "train",
            tmp_path / "train",
            [*tiny_train_overrides(small_dataset), "trainer.max_epochs=1"],
        )
    )
    ckpt = tmp_path / "train" / "checkpoints" / "last.ckpt"
    msd = _msd(small_dataset, tmp_path / "msd")
    # as in train.py, data=msd brings its own defaults (patch [32, 64, 64]): the small cases need
    args = [f"ckpt_path={ckpt}", "data=msd", f"data.root={msd}", "data.patch_size=[16,32,32]"]
    metrics = evaluate(compose_config("eval", tmp_path / "eval", args))
    summary = json.loads((tmp_path / "eval" / "eval_summary.json").read_text())
    assert summary["data_root"] == str(msd) and "val/dice_mean" in metrics
    plan = yaml.safe_load((tmp_path / "eval" / "plan.yaml").read_text())
    assert plan["config"]["data"]["_target_"] == "volseg.data.msd.MSDDataModule"
    # the trained network's classes: an override that would change them stops, naming it
    with pytest.raises(UserInputError, match=r"^num_classes=3: eval.py takes num_classes"):
        evaluate(compose_config("eval", tmp_path / "eval2", [f"ckpt_path={ckpt}", "num_classes=3"]))


@pytest.mark.slow
def test_plan_py_on_the_embedded_data_and_train_from_the_plan(small_dataset, tmp_path, capsys):
    overrides = [
        *tiny_train_overrides(small_dataset),
        "data.patch_size=auto",
        "data.patch_voxels=16384",
    ]
    overrides += ["trainer.max_epochs=1"]
    written = plan_command(compose_config("plan", tmp_path / "plan", overrides))
    printed = capsys.readouterr().out
    assert (
        "Dataset fingerprint: 6 cases" in printed
        and "median shape [D, H, W] [16, 48, 48]" in printed
    )
    assert "data.patch_size = [16, 32, 32]  [planned]" in printed
    path = tmp_path / "plan" / "plan.yaml"
    assert yaml.safe_load(path.read_text())["decisions"] == written["decisions"]
    assert written["fingerprint"]["cases"] == 6 and written["estimate"]["flops_per_step"] > 0

    # train.py plan=PATH trains the planned run: the same decisions, the same result as the
    # same command given to train.py directly
    # (train.py estimates the planned step as plan.py does: the same figures in its plan.yaml)
    direct = train(
        compose_config("train", tmp_path / "direct", [*overrides, "memory.plan_step=true"])
    )
    trained = yaml.safe_load((tmp_path / "direct" / "plan.yaml").read_text())["estimate"]
    assert trained == written["estimate"] and trained["peak_allocated"] > 0
    # its predicted time beside the measured one; the steps predicted are the steps it ran
    summary = json.loads((tmp_path / "direct" / "summary.json").read_text())
    predicted = yaml.safe_load((tmp_path / "direct" / "plan.yaml").read_text())["duration"]
    assert summary["predicted_seconds"] == predicted["seconds"] > 0
    assert summary["measured_seconds"] > 0 and summary["predicted_timed"] == "replayed"
    assert predicted["optimizer_steps"] == summary["global_step"]
    from_plan = train(compose_config("train", tmp_path / "run", [f"plan={path}"]))
    replayed = yaml.safe_load((tmp_path / "run" / "plan.yaml").read_text())["decisions"]
    assert _values(replayed) == _values(written["decisions"])
    assert replayed["data.patch_size"]["source"] == f"plan file {path}"
    assert from_plan["val/dice_mean"] == pytest.approx(direct["val/dice_mean"])
    # a group choice cannot be laid over a plan: one line naming it
    with pytest.raises(UserInputError, match="^data=msd: with plan="):
        train(compose_config("train", tmp_path / "run2", [f"plan={path}", "data=msd"]))


def test_plan_py_on_an_msd_layout(small_dataset, tmp_path, capsys):
    root = _msd(small_dataset, tmp_path / "msd", num_classes=3)
    args = [
        *CPU,
        "data=msd",
        f"data.root={root}",
        "model.net.widths=[4,8,16]",
        "data.patch_size=auto",
    ]
    written = plan_command(compose_config("plan", tmp_path / "plan", args))
    decisions = written["decisions"]
    assert decisions["num_classes"]["value"] == 3 and decisions["in_channels"]["value"] == 1
    assert decisions["data.patch_size"]["source"] == "planned"
    assert written["config"]["num_classes"] == 3  # the network follows ${num_classes}
    assert "Dataset fingerprint: 6 cases" in capsys.readouterr().out
