"""Shared fixtures: the real Hydra configs, shrunk to run in seconds on a CPU."""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from lightning.pytorch import Callback
from omegaconf import DictConfig

from volseg.data.cases import case_problems
from volseg.data.synthetic import generate_synthetic_dataset
from volseg.utils.config import compose_run_config
from volseg.utils.errors import raise_problems

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"


def load_benchmark(name: str) -> ModuleType:
    """The module of ``python -m benchmarks <name>``, or a shared module of the package
    (``results_io``, ``harness``, ...)."""
    from benchmarks.runner import BENCHMARKS

    entry = BENCHMARKS.get(name)
    return importlib.import_module(entry.module if entry else f"benchmarks.{name}")


os.environ.setdefault("PROJECT_ROOT", str(REPO))

# the benchmarks' tests: a 2-level U-Net of 16-32 channels on a small embedded dataset
TINY = [
    "model.net.widths=[16,32]",
    "model.net.pooling=null",
    "data.batch_size=1",
    "data.patch_size=[16,32,32]",
    "data.synthetic.num_volumes=3",
    "data.synthetic.num_val=1",
    "data.synthetic.shape=[16,48,48]",
    "trainer.precision=32",
]

# a small copy of the embedded dataset: 6 volumes of 16x48x48, generated once per session
#: docs/networks.md's ``model/net=custom`` override of nnU-Net's PlainConvUNet (deep
#: supervision on), at small widths
PLAIN_CONV_UNET_CUSTOM = [
    "model/net=custom",
    "model.net._target_=dynamic_network_architectures.architectures.unet.PlainConvUNet",
    "+model.net.n_stages=3",
    "+model.net.features_per_stage=[4,8,16]",
    "+model.net.conv_op._target_=hydra.utils.get_class",
    "+model.net.conv_op.path=torch.nn.Conv3d",
    "+model.net.kernel_sizes=3",
    "+model.net.strides=[1,2,2]",
    "+model.net.n_conv_per_stage=2",
    "+model.net.n_conv_per_stage_decoder=2",
    "+model.net.norm_op._target_=hydra.utils.get_class",
    "+model.net.norm_op.path=torch.nn.InstanceNorm3d",
    "+model.net.nonlin._target_=hydra.utils.get_class",
    "+model.net.nonlin.path=torch.nn.LeakyReLU",
    "+model.net.deep_supervision=true",
]
SMALL_SHAPE = [16, 48, 48]
SMALL_PATCH = [16, 32, 32]


@pytest.fixture(scope="session")
def small_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("data") / "synthetic"
    return generate_synthetic_dataset(root, num_volumes=6, num_val=2, shape=SMALL_SHAPE, seed=1)


def compose_config(
    config_name: str, output_dir: Path, overrides: list[str] | None = None
) -> DictConfig:
    """Compose ``configs/<config_name>.yaml`` as the entry point would, with the run dir set."""
    return compose_run_config(CONFIGS, config_name, overrides or [], output_dir)


def planned_config(
    config_name: str, output_dir: Path, overrides: list[str] | None = None
) -> DictConfig:
    """:func:`compose_config`, then planned (every ``auto`` resolved, as the entry points do
    before they build anything): for tests that build a model or datamodule themselves."""
    from volseg.plan import make_plan

    cfg = compose_config(config_name, output_dir, overrides)
    return make_plan(cfg, estimate_step=False).run_config()


class ValidationPredictions(Callback):
    """Saves the class indices each validation case was scored on, ``(D, H, W)``, as
    ``out_dir/<case name>.npy`` (each validation overwrites them: the last one's remain, those
    of the run's final ``val/*`` metrics). Added to a train run by
    :func:`save_validation_predictions`."""

    def __init__(self, out_dir: str) -> None:
        self.out_dir = Path(out_dir)

    def on_validation_batch_end(
        self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0
    ) -> None:
        if trainer.sanity_checking or not outputs:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        for pred, name in zip(outputs["pred"].cpu().numpy(), batch["name"], strict=True):
            np.save(self.out_dir / f"{name}.npy", pred)


def save_validation_predictions(out_dir: Path) -> list[str]:
    """Train overrides that add :class:`ValidationPredictions` writing into ``out_dir``."""
    key = "+callbacks.validation_predictions"
    return [f"{key}._target_=tests.conftest.ValidationPredictions", f"{key}.out_dir={out_dir}"]


def counted_dice(predictions: Path, labels: dict[str, np.ndarray], num_classes: int) -> list[float]:
    """Per-class Dice of the saved predictions (:class:`ValidationPredictions`) against
    ``labels`` (case name -> ``(D, H, W)`` class indices, read from the label files), counted
    with numpy: 2|P∩L| / (|P| + |L|) per case and class, a class absent from a case's label left
    out of that class's mean over cases, 0 for a class in no case's label (the module's
    definition, ``SegmentationModule.accumulate_validation``, without its code)."""
    assert sorted(p.name for p in predictions.glob("*.npy")) == sorted(f"{n}.npy" for n in labels)
    scores: list[list[float]] = [[] for _ in range(num_classes)]
    for name, label in labels.items():
        pred = np.load(predictions / f"{name}.npy")
        assert pred.shape == label.shape, (name, pred.shape, label.shape)
        for k in range(num_classes):
            in_label, in_pred = label == k, pred == k
            if in_label.any():
                overlap = np.logical_and(in_pred, in_label).sum()
                scores[k].append(2 * overlap / (in_pred.sum() + in_label.sum()))
    return [float(np.mean(s)) if s else 0.0 for s in scores]


def assert_logged_dice(metrics: dict, class_names: list[str], dice: list[float]) -> None:
    """``val/dice_<class>`` is ``dice`` (:func:`counted_dice`) for every class, and
    ``val/dice_mean`` their mean without the background (the first class)."""
    logged = {name: float(metrics[f"val/dice_{name}"]) for name in class_names}
    assert logged == pytest.approx(dict(zip(class_names, dice, strict=True)), abs=1e-6)
    assert float(metrics["val/dice_mean"]) == pytest.approx(np.mean(dice[1:]), abs=1e-6)


def tiny_train_overrides(data_root: Path) -> list[str]:
    """A 2-epoch run on the small dataset with a 3-level, 4-16 channel U-Net."""
    return [
        f"data.root={data_root}",
        f"data.patch_size={SMALL_PATCH}",
        "data.samples_per_volume=1",
        "model.net.widths=[4,8,16]",
        # halving every axis at every level (unet_tiny plans its pooling from the patch)
        "model.net.pooling=null",
        "model.inferer.sw_batch_size=1",
        "trainer.max_epochs=2",
        "trainer.check_val_every_n_epoch=1",
        "trainer.log_every_n_steps=1",
        "trainer.accelerator=cpu",
        "logger=csv",
        "extras.print_config=false",
        "callbacks.rich_progress_bar=null",
        "callbacks.model_summary=null",
        # no estimate of the planned step (tests of it set memory.plan_step=true)
        "memory.plan_step=false",
    ]


@pytest.fixture
def train_cfg(small_dataset: Path, tmp_path: Path) -> DictConfig:
    return compose_config("train", tmp_path / "run", tiny_train_overrides(small_dataset))


def check_cases(
    cases: list, num_classes: int, patch_size: list[int], in_channels: int | None = 1
) -> None:
    """What the datamodule's check raises for ``cases``: one UserInputError listing every
    problem (``case_problems`` is the check; the datamodule adds its own layout's)."""
    problems = case_problems(
        cases, num_classes, patch_size, in_channels, f"num_classes={num_classes}"
    )
    raise_problems(problems, "the dataset")
