"""Every config group composes and builds; the documented overrides work without `+`."""

from __future__ import annotations

import json
from pathlib import Path

import hydra
import pytest
from omegaconf import OmegaConf

from tests.conftest import CONFIGS, compose_config, tiny_train_overrides
from volseg.tasks.train import train
from volseg.utils.entry import close_wandb
from volseg.utils.instantiate import instantiate_group
from volseg.utils.precision import resolve_precision


def _choices(group: str) -> list[str]:
    return sorted(p.stem for p in (CONFIGS / group).glob("*.yaml"))


@pytest.mark.parametrize("trainer", _choices("trainer"))
def test_trainer_configs_compose(tmp_path, trainer):
    cfg = compose_config("train", tmp_path, [f"trainer={trainer}"])
    assert cfg.trainer._target_ == "lightning.pytorch.trainer.Trainer"
    OmegaConf.to_container(cfg.trainer, resolve=True)


def test_cpu_trainer_and_callbacks_build(tmp_path):
    cfg = compose_config("train", tmp_path, ["trainer=cpu"])
    callbacks = instantiate_group(cfg.callbacks, "callbacks")
    names = {type(c).__name__ for c in callbacks}
    assert {"ModelCheckpoint", "EarlyStopping", "RichProgressBar", "ModelSummary"} <= names
    cfg.trainer.precision = resolve_precision(
        cfg.trainer.precision, "cpu"
    ).precision  # no `auto` in Lightning
    trainer = hydra.utils.instantiate(cfg.trainer, callbacks=callbacks, logger=False)
    assert trainer.max_epochs == cfg.trainer.max_epochs


@pytest.mark.parametrize("debug", ["fdr", "limit", "overfit"])
def test_debug_configs_compose(tmp_path, debug):
    cfg = compose_config("train", tmp_path, [f"debug={debug}"])
    assert cfg.trainer.accelerator == "cpu" and not cfg.get("logger")


def test_documented_overrides_apply_without_plus(tmp_path):
    overrides = [
        "model=unet_large",
        "model.net.widths=[16,32,64]",
        "model.net.decoder_widths=[16,16]",
        "trainer.precision=bf16-true",
        "trainer.max_epochs=3",
        "trainer.max_time=00:00:05:00",
        "data.batch_size=4",
        "data.patch_size=[16,48,64]",
        f"data.root={tmp_path}",
        "num_classes=3",
        "in_channels=1",
        "seed=3",
        "ckpt_path=some.ckpt",
        "logger=tensorboard",
        "experiment=example",
    ]
    cfg = compose_config("train", tmp_path, overrides)
    assert cfg.trainer.max_time == "00:00:05:00"
    assert cfg.data.patch_size == [16, 48, 64] and cfg.model.inferer.roi_size == [16, 48, 64]
    assert cfg.model.net.num_classes == 3 == cfg.data.num_classes


@pytest.mark.parametrize("logger", ["tensorboard", "wandb"])
def test_other_loggers_record_the_run(small_dataset, tmp_path, monkeypatch, logger):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    overrides = [*tiny_train_overrides(small_dataset), f"logger={logger}", "trainer.max_epochs=1"]
    cfg = compose_config("train", tmp_path / "run", overrides)
    assert [type(lg).__name__ for lg in instantiate_group(cfg.logger, "logger")]
    try:
        train(cfg)
    finally:
        # an unfinished W&B run would be reused by the next test's logger (as in a multirun)
        close_wandb()
    run_dir = Path(cfg.paths.output_dir)
    if logger == "tensorboard":
        assert list((run_dir / "tensorboard").rglob("events.out.tfevents.*"))
    else:
        assert list(run_dir.rglob("run-*.wandb"))


@pytest.mark.slow
def test_deepspeed_without_the_package_is_one_clear_error(tmp_path):
    import importlib.util
    import subprocess
    import sys

    if importlib.util.find_spec("deepspeed") is not None:
        pytest.skip("deepspeed is installed here")

    from tests.conftest import REPO

    result = subprocess.run(
        [sys.executable, "train.py", "trainer=deepspeed", f"hydra.run.dir={tmp_path}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "needs the deepspeed package" in result.stderr
    assert 'pip install -e ".[deepspeed]"' in result.stderr
    assert "Traceback" not in result.stderr


def test_fsdp_config_builds_its_strategy(tmp_path):
    from lightning.pytorch.strategies import FSDPStrategy

    cfg = compose_config("train", tmp_path, ["trainer=fsdp"])
    assert isinstance(hydra.utils.instantiate(cfg.trainer.strategy), FSDPStrategy)


@pytest.mark.parametrize("accelerator", ["cpu", "gpu"])
def test_fsdp_without_a_cuda_gpu_is_one_clear_error_before_any_work(tmp_path, accelerator):
    """Lightning runs FSDP on CUDA only: on CPU processes it stops before the data are read."""
    import torch

    from volseg.tasks.train import train
    from volseg.utils.errors import UserInputError

    if accelerator == "gpu" and torch.cuda.is_available():
        pytest.skip("a CUDA GPU is here: trainer=fsdp runs")
    overrides = ["trainer=fsdp", f"trainer.accelerator={accelerator}", "data.root=/nonexistent"]
    cfg = compose_config("train", tmp_path, overrides)
    with pytest.raises(UserInputError, match=r"FSDPStrategy: shards the model across CUDA GPUs"):
        train(cfg)  # before the missing data.root is noticed


# Lightning Trainer arguments its users type without `+` (declared in trainer/default.yaml)
TRAINER_OVERRIDES = {
    "max_steps": "1",
    "val_check_interval": "1",
    "fast_dev_run": "true",
    "limit_test_batches": "1",
    "benchmark": "false",
    "profiler": "simple",
    "enable_progress_bar": "false",
}


@pytest.mark.parametrize("key", list(TRAINER_OVERRIDES))
def test_lightning_trainer_arguments_are_plain_overrides(tmp_path, key):
    value = TRAINER_OVERRIDES[key]
    cfg = compose_config("train", tmp_path, ["trainer=cpu", f"trainer.{key}={value}"])
    assert str(cfg.trainer[key]).lower() == value
    cfg.trainer.precision = resolve_precision(cfg.trainer.precision, "cpu").precision
    hydra.utils.instantiate(cfg.trainer, logger=False)


@pytest.mark.parametrize(
    "overrides",
    [
        [f"trainer.{k}={v}" for k, v in TRAINER_OVERRIDES.items() if k != "fast_dev_run"],
        ["trainer.fast_dev_run=true"],
    ],
    ids=["max_steps_and_others", "fast_dev_run"],
)
def test_trainer_overrides_train_one_step(small_dataset, tmp_path, overrides):
    cfg = compose_config("train", tmp_path, [*tiny_train_overrides(small_dataset), *overrides])
    metrics = train(cfg)
    assert "train/loss" in metrics
    if "trainer.max_steps=1" in overrides:
        assert json.loads((tmp_path / "summary.json").read_text())["global_step"] == 1
