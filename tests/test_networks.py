"""Every shipped network, and a user's own module from a file, trains from one override, is
estimated and is planned under a budget with the levers its adapter offers."""

from __future__ import annotations

import csv
import math
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from tests.conftest import compose_config
from tests.estimates import estimate, plan_of
from volseg.data.io import read_array
from volseg.data.synthetic import generate_synthetic_dataset
from volseg.memory.estimate.margins import planned_total
from volseg.memory.fit.step_fit import fit_step
from volseg.plan import make_plan
from volseg.tasks.evaluate import evaluate
from volseg.tasks.predict import predict
from volseg.tasks.train import train

#: a user's U-Net as the widely copied parts write it (constructor: n_channels, n_classes)
USER_UNET = """
import torch
from torch import nn


class DoubleConv(nn.Sequential):
    def __init__(self, cin, cout):
        super().__init__(
            nn.Conv3d(cin, cout, 3, padding=1), nn.BatchNorm3d(cout), nn.ReLU(inplace=True),
            nn.Conv3d(cout, cout, 3, padding=1), nn.BatchNorm3d(cout), nn.ReLU(inplace=True),
        )


class Up(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.up = nn.Upsample(scale_factor=2, mode="trilinear", align_corners=True)
        self.conv = DoubleConv(cin, cout)

    def forward(self, x, skip):
        return self.conv(torch.cat([skip, self.up(x)], dim=1))


class UNet(nn.Module):
    def __init__(self, n_channels, n_classes, base=4):
        super().__init__()
        self.inc = DoubleConv(n_channels, base)
        self.down1 = nn.Sequential(nn.MaxPool3d(2), DoubleConv(base, 2 * base))
        self.down2 = nn.Sequential(nn.MaxPool3d(2), DoubleConv(2 * base, 2 * base))
        self.up1 = Up(4 * base, base)
        self.up2 = Up(2 * base, base)
        self.outc = nn.Conv3d(base, n_classes, 1)

    def forward(self, x):
        x1 = self.inc(x)
        x2 = self.down1(x1)
        return self.outc(self.up2(self.up1(self.down2(x2), x2), x1))
"""


@pytest.fixture(scope="module")
def cubes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3 volumes of 32x64x64 (SwinUNETR needs sides divisible by 32), one for validation."""
    root = tmp_path_factory.mktemp("cubes") / "synthetic"
    return generate_synthetic_dataset(root, num_volumes=3, num_val=1, shape=[32, 64, 64], seed=3)


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """``users_unet.UNet`` importable from a file in a temporary folder (a name no other test's
    module has: a module imported earlier in the process would be taken instead)."""
    (tmp_path / "users_unet.py").write_text(textwrap.dedent(USER_UNET))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "users_unet", raising=False)
    return "users_unet.UNet"


def two_steps(root: Path, patch: str = "[32,32,32]") -> list[str]:
    return [
        f"data.root={root}",
        f"data.patch_size={patch}",
        "data.samples_per_volume=1",
        "data.batch_size=2",
        "model.inferer.sw_batch_size=1",
        "trainer.max_steps=2",
        "trainer.log_every_n_steps=1",
        "trainer.accelerator=cpu",
        "trainer.precision=32",
        "logger=csv",
        "extras.print_config=false",
        "callbacks.rich_progress_bar=null",
        "callbacks.model_summary=null",
        "memory.plan_step=false",
    ]


def _trained(run_dir: Path, metrics: dict) -> dict:
    """The run's plan, once it trained two optimizer steps on finite losses and validated."""
    assert math.isfinite(metrics["train/loss"])
    with open(run_dir / "csv" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert sorted(int(r["step"]) for r in rows if r.get("train/loss")) == [0, 1]
    assert any(r.get("val/dice_mean") for r in rows)
    return yaml.safe_load((run_dir / "plan.yaml").read_text())


@pytest.mark.slow
@pytest.mark.parametrize(
    ("net", "target", "patch"),
    [
        ("segresnet", "monai.networks.nets.SegResNet", "[32,32,32]"),
        # its deepest level is the patch / 32, and instance norm in training needs > 1 voxel
        ("swin_unetr", "monai.networks.nets.SwinUNETR", "[32,64,64]"),
        ("basic_unet", "monai.networks.nets.BasicUNet", "[32,32,32]"),
    ],
)
def test_each_shipped_network_trains_from_one_override(cubes, tmp_path, net, target, patch):
    run_dir = tmp_path / "run"
    overrides = [*two_steps(cubes, patch), f"model/net={net}"]
    metrics = train(compose_config("train", run_dir, overrides))
    planned = _trained(run_dir, metrics)
    assert planned["config"]["model"]["net"]["_target_"] == target


@pytest.mark.slow
def test_a_users_module_from_a_file_trains_is_estimated_and_planned(cubes, tmp_path, user_module):
    overrides = [*two_steps(cubes), "model/net=custom", f"model.net._target_={user_module}"]
    run_dir = tmp_path / "run"
    planned = _trained(run_dir, train(compose_config("train", run_dir, overrides)))
    net = planned["config"]["model"]["net"]
    assert net["n_channels"] == 1 and net["n_classes"] == 5  # by the constructor's names
    assert "in_channels" not in net and "num_classes" not in net
    assert planned["decisions"]["model.divisible_by"]["value"] == [4, 4, 4]  # two 2x poolings

    # planned for a GPU (estimated on fake tensors: none needed), at a patch whose activations
    # outweigh the caching allocator's segment rounding
    overrides = [*two_steps(cubes, "[32,64,64]"), *overrides[-2:], "memory.plan_device=cuda"]
    cfg = make_plan(compose_config("train", tmp_path / "est", overrides), estimate_step=False)
    cfg = cfg.run_config()
    est = estimate(cfg)
    assert est.num_parameters > 0 and est.step_peak_growth > 0
    with_all = estimate(cfg, activation_checkpointing="all")
    assert with_all.peak_allocated < 0.6 * est.peak_allocated  # every block checkpointed
    # a budget the configured step fits only with checkpointing: the search tries the generic
    # adapter's choices (none, selective, all), not UNet3D's, the first that fits taken
    # (as the planner counts a step: with the CUDA margin)
    budget = (planned_total(with_all) + planned_total(est)) // 2
    assert with_all.fits(budget) and not est.fits(budget)
    answer = fit_step(plan_of(cfg), budget)
    assert not answer.fits_as_configured
    selective = estimate(cfg, activation_checkpointing="selective")
    expected = "selective" if selective.fits(budget) else "all"
    tried = list(answer.largest_batch_by_checkpointing)
    assert tried == ["none", "selective", "all"][: tried.index(expected) + 1]
    assert answer.activation_checkpointing == expected and answer.batch_size >= 2
    assert answer.estimate["process_total"] <= budget


@pytest.mark.slow
def test_a_deep_supervision_checkpoint_evaluates_and_predicts_full_resolution(cubes, tmp_path):
    run_dir = tmp_path / "run"
    # DynUNet trains from its one override too (the shipped networks' test leaves it to this one)
    metrics = train(compose_config("train", run_dir, [*two_steps(cubes), "model/net=dynunet"]))
    trained_dice = metrics["val/dice_mean"]
    planned = _trained(run_dir, metrics)
    assert planned["config"]["model"]["net"]["_target_"] == "monai.networks.nets.DynUNet"
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    metrics = evaluate(
        compose_config(
            "eval", tmp_path / "eval", [f"ckpt_path={ckpt}", "extras.print_config=false"]
        )
    )
    # the checkpoint's weights on the same validation volume: the score its run logged last, up
    # to a few voxels whose argmax flips with the order the windows are summed in (1e-4 here)
    assert metrics["val/dice_mean"] == pytest.approx(trained_dice, abs=2e-3)
    source = sorted((cubes / "images").glob("*.nii.gz"))[0]
    out = tmp_path / "pred"
    overrides = [f"ckpt_path={ckpt}", f"input={source}", f"output={out}"]
    predict(compose_config("predict", tmp_path / "pred_run", overrides))
    (written,) = [p for p in out.iterdir() if "prob" not in p.name]
    assert read_array(written).shape == read_array(source).shape  # one label volume, full size


#: other projects' U-Nets (the networks extra), by their shipped configs
FOREIGN = {
    "plain_conv_unet": "dynamic_network_architectures.architectures.unet.PlainConvUNet",
    "residual_encoder_unet": "dynamic_network_architectures.architectures.unet.ResidualEncoderUNet",
    "pytorch3dunet_unet3d": "pytorch3dunet.unet3d.model.UNet3D",
    "pytorch3dunet_residual_unet3d": "pytorch3dunet.unet3d.model.ResidualUNet3D",
}


#: narrower than the shipped configs, for the tests' time
NARROW = {
    "plain_conv_unet": "model.net.features_per_stage=[4,8,16,32,64]",
    "residual_encoder_unet": "model.net.features_per_stage=[4,8,16,32,64]",
    "pytorch3dunet_unet3d": "model.net.f_maps=8",
    "pytorch3dunet_residual_unet3d": "model.net.f_maps=8",
}


@pytest.mark.slow
@pytest.mark.parametrize("net", FOREIGN)
def test_each_foreign_network_trains_from_one_override_checkpointed(cubes, tmp_path, net):
    """Two steps with every block checkpointed, validation on its full-resolution output."""
    pytest.importorskip(FOREIGN[net].split(".")[0])
    run_dir = tmp_path / "run"
    overrides = [*two_steps(cubes), f"model/net={net}", NARROW[net]]
    overrides.append("model.activation_checkpointing=all")
    planned = _trained(run_dir, train(compose_config("train", run_dir, overrides)))
    assert planned["config"]["model"]["net"]["_target_"] == FOREIGN[net]


@pytest.mark.slow
@pytest.mark.parametrize("net", ["plain_conv_unet", "pytorch3dunet_residual_unet3d"])
def test_a_foreign_network_is_planned_under_a_budget_below_its_step(cubes, tmp_path, net):
    """The checkpointing lever finds its blocks (nnU-Net's one level down), and the planner
    fits a budget between the step with and without it."""
    pytest.importorskip(FOREIGN[net].split(".")[0])
    overrides = [*two_steps(cubes, "[16,32,32]"), f"model/net={net}"]
    cfg = make_plan(compose_config("train", tmp_path, overrides), estimate_step=False)
    cfg = cfg.run_config()
    est = estimate(cfg)
    with_all = estimate(cfg, activation_checkpointing="all")
    assert with_all.step_peak_growth < 0.8 * est.step_peak_growth
    # (as the planner counts a step: with the CUDA margin)
    budget = (planned_total(with_all) + planned_total(est)) // 2
    assert with_all.fits(budget) and not est.fits(budget)
    answer = fit_step(plan_of(cfg), budget)
    assert not answer.fits_as_configured
    assert answer.estimate["process_total"] <= budget
