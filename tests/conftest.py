"""Shared fixtures: the real Hydra configs, shrunk to run in seconds on a CPU."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import ModuleType

import pytest
from omegaconf import DictConfig

from volseg.data.cases import case_problems
from volseg.data.synthetic import generate_synthetic_dataset
from volseg.utils.config import compose_run_config
from volseg.utils.errors import raise_problems

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"


def load_benchmark(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` imported as a module (the folder is not a package)."""
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


os.environ.setdefault("PROJECT_ROOT", str(REPO))

# a small copy of the embedded dataset: 6 volumes of 16x48x48, generated once per session
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


def foreground_mean_dice(metrics: dict, background: str = "background") -> float:
    """The mean of the per-class ``val/dice_<class>`` values in ``metrics`` without background:
    what ``val/dice_mean`` must be (the validation's own average, recomputed here)."""
    skip = {"val/dice_mean", "val/dice_mean_best", f"val/dice_{background}"}
    per_class = [
        float(v) for k, v in metrics.items() if k.startswith("val/dice_") and k not in skip
    ]
    assert per_class, sorted(metrics)
    return sum(per_class) / len(per_class)


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
        # no estimate of the planned step (tests of it set estimate.plan_step=true)
        "estimate.plan_step=false",
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
