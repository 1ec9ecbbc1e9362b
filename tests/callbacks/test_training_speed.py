"""The training-speed callback: step time, data wait, FLOP rate and utilization of a run."""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
import yaml
from torch import nn
from torch.utils.data import DataLoader, Dataset

from tests.conftest import compose_config, tiny_train_overrides
from volseg.callbacks import training_speed
from volseg.callbacks.training_speed import TrainingSpeed, dense_peak_tflops
from volseg.tasks.train import train
from volseg.utils.errors import UserInputError
from volseg.utils.instantiate import build


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _trainer(step: int = 0) -> SimpleNamespace:
    return SimpleNamespace(
        global_step=step,
        world_size=2,
        is_global_zero=True,
        precision="bf16-mixed",
        strategy=SimpleNamespace(root_device=torch.device("cpu")),
    )


@pytest.fixture(autouse=True)
def idle_machine(monkeypatch):
    """This machine's load is whatever other work puts on it: the tests set it."""
    monkeypatch.setattr(training_speed, "machine_load", lambda: (0.5, 2))


def test_figures_count_steps_after_the_warmup_and_no_gap_between_epochs_or_validation(
    monkeypatch, caplog
):
    clock = _Clock()
    monkeypatch.setattr(training_speed.time, "perf_counter", clock)
    logged: dict[str, float] = {}
    module = SimpleNamespace(run_plan={"estimate": {"flops_per_step": 5e12}})
    speed = TrainingSpeed(warmup_steps=1, peak_tflops=4.0)
    trainer = _trainer()
    trainer.loggers = [SimpleNamespace(log_metrics=lambda metrics, step: logged.update(metrics))]
    speed.on_fit_start(trainer, module)
    speed.on_train_start(trainer, module)
    speed.on_train_epoch_start(trainer, module)
    batch = {"image": torch.zeros(3, 1, 2, 2, 2), "label": torch.zeros(3, 1, 2, 2, 2)}

    def run_batch(start: float, end: float, step_after: int) -> None:
        clock.now = start
        speed.on_train_batch_start(trainer, module, batch, 0)
        clock.now = end
        trainer.global_step = step_after
        speed.on_train_batch_end(trainer, module, None, batch, 0)

    # 2 micro-batches per optimizer step; the warm-up step is not counted
    run_batch(0.0, 5.0, 0)
    run_batch(6.0, 10.0, 1)
    # counted: 1.0 s of batches, 0.5 s waits before each (2.0 + 1.0)
    run_batch(10.5, 11.5, 1)
    run_batch(12.0, 13.0, 2)
    # a validation mid-epoch: the gap after it is not a wait
    speed.on_validation_start(trainer, module)
    run_batch(100.0, 101.5, 2)
    run_batch(102.0, 103.5, 3)  # 3.0 s of batches, 0.5 s wait
    speed.on_train_epoch_end(trainer, module)
    speed.on_train_epoch_start(trainer, module)
    run_batch(200.0, 200.5, 3)  # after the epoch's end: no wait
    run_batch(200.5, 201.0, 4)

    s = speed.summary()
    # 3 steps: 6.0 s of batches + 1.5 s of waits
    assert s["steps_measured"] == 3
    assert s["step_s"] == pytest.approx(2.5)
    assert s["data_wait_share"] == pytest.approx(0.2)
    # 6 counted batches of 3 samples on each of 2 processes in 7.5 s
    assert s["samples_per_s"] == pytest.approx(36 / 7.5)
    assert s["tflops_per_s"] == pytest.approx(2.0)
    assert s["mfu"] == pytest.approx(0.5)
    # the epoch's end logged what had been measured by then: 2 steps in 6.5 s
    assert logged["speed/step_s"] == pytest.approx(3.25)
    assert logged["speed/mfu"] == pytest.approx(5e12 / 3.25 / 4e12)
    # 20% of the step fetching batches, above the 10% default: the end of fit says so
    with caplog.at_level("INFO", logger="volseg.callbacks.training_speed"):
        speed.on_fit_end(trainer, module)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and warnings[0].startswith("The loader did not keep up: 20%")
    caplog.clear()
    speed.data_wait_warning = 0.25
    with caplog.at_level("INFO", logger="volseg.callbacks.training_speed"):
        speed.on_fit_end(trainer, module)
    assert [r.levelname for r in caplog.records] == ["INFO"]


def test_a_resumed_fit_warms_up_from_its_checkpoint_step(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(training_speed.time, "perf_counter", clock)
    module = SimpleNamespace(run_plan={})
    speed = TrainingSpeed(warmup_steps=2)
    trainer = _trainer(step=40)
    speed.on_fit_start(trainer, module)
    speed.on_train_start(trainer, module)
    for step in range(40, 45):
        clock.now += 1.0
        speed.on_train_batch_start(trainer, module, torch.zeros(2, 3), 0)
        clock.now += 1.0
        trainer.global_step = step + 1
        speed.on_train_batch_end(trainer, module, None, torch.zeros(2, 3), 0)
    s = speed.summary()
    assert s["steps_measured"] == 3  # steps 42, 43 and 44
    assert s["step_s"] == pytest.approx(2.0)
    # no FLOPs planned (memory.plan_step=false), no peak on a CPU
    assert s["tflops_per_s"] is None and s["mfu"] is None and s["peak_source"] == "cpu: no peak"


@pytest.mark.parametrize(
    ("name", "precision", "peak"),
    [
        ("NVIDIA H200", "16-mixed", 989.0),
        ("NVIDIA H100 80GB HBM3", "bf16-mixed", 989.0),
        ("NVIDIA H100 PCIe", "bf16-true", 756.0),
        ("NVIDIA A100-SXM4-80GB", "16-mixed", 312.0),
        ("NVIDIA A100-SXM4-80GB", "32", 156.0),  # TF32 convolutions
        ("NVIDIA L40S", "bf16-mixed", 362.0),
        ("NVIDIA H100 NVL", "16-mixed", None),  # not in the table
        ("NVIDIA A10", "16-mixed", None),  # not an A100
    ],
)
def test_dense_peak_of_known_gpus(name, precision, peak):
    assert dense_peak_tflops(name, precision) == peak


def test_float32_without_tf32_has_no_tensor_core_peak(monkeypatch):
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    assert dense_peak_tflops("NVIDIA H200", "32-true") is None
    assert dense_peak_tflops("NVIDIA H200", "bf16-mixed") == 989.0


class _Sleepy(Dataset):
    def __init__(self, n: int, seconds: float) -> None:
        self.n, self.seconds = n, seconds

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(self.seconds)
        return torch.ones(4)


class _Linear(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch).sum()

    def validation_step(self, batch, batch_idx):
        self.layer(batch)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_lightning_fetches_batches_where_the_wait_is_counted(tmp_path):
    """Lightning's loop fetches the next batch between one batch's end and the next's start:
    a loader sleeping 0.1 s per batch is measured as waits of at least that; the validation's
    slow batches (1.5 s) are not."""
    speed = TrainingSpeed(warmup_steps=2)
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=8,
        val_check_interval=4,
        limit_val_batches=1,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[speed],
        default_root_dir=tmp_path,
    )
    trainer.fit(
        _Linear(),
        train_dataloaders=DataLoader(_Sleepy(12, 0.1), batch_size=1),
        val_dataloaders=DataLoader(_Sleepy(1, 1.5), batch_size=1),
    )
    s = speed.summary()
    assert s["steps_measured"] == 6
    # 6 counted steps; the one right after the validation is fetched after a pause
    assert speed.wait_s >= 5 * 0.1
    assert speed.wait_s < 1.5
    assert s["samples_per_s"] == pytest.approx(6 / (speed.busy_s + speed.wait_s))


def test_train_py_reports_the_planned_steps_flops_rate(small_dataset, tmp_path, caplog):
    overrides = [
        *[o for o in tiny_train_overrides(small_dataset) if not o.startswith("memory.plan_step")],
        "callbacks.training_speed.warmup_steps=1",
    ]
    cfg = compose_config("train", tmp_path, overrides)
    with caplog.at_level("INFO", logger="volseg.callbacks.training_speed"):
        train(cfg)
    run_dir = Path(cfg.paths.output_dir)
    speed = json.loads((run_dir / "summary.json").read_text())["speed"]
    planned = yaml.safe_load((run_dir / "plan.yaml").read_text())["estimate"]["flops_per_step"]
    # 2 epochs of 2 steps, the first step warming up
    assert speed["steps_measured"] == 3
    assert speed["flops_per_step"] == planned > 0
    assert speed["tflops_per_s"] == pytest.approx(planned / speed["step_s"] / 1e12)
    assert speed["mfu"] is None and speed["peak_source"] == "cpu: no peak"
    # the loggers get the figures at each epoch's end: 1 step measured by the first, 3 by the last
    with open(run_dir / "csv" / "metrics.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("speed/step_s")]
    assert [int(r["step"]) for r in rows] == [2, 4]
    assert float(rows[-1]["speed/step_s"]) == pytest.approx(speed["step_s"])
    assert any(r.getMessage().startswith("Training speed over 3") for r in caplog.records)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("warmup_steps=-1", "must be 0 or more"),
        ("peak_tflops=0", "positive"),
        ("data_wait_warning=1.5", r"in \[0, 1\]"),
    ],
)
def test_a_bad_value_is_one_error_naming_its_key(tmp_path, value, says):
    cfg = compose_config("train", tmp_path, [f"callbacks.training_speed.{value}"])
    with pytest.raises(UserInputError, match=rf"^callbacks\.training_speed\.{value}: .*{says}"):
        build(cfg.callbacks.training_speed, "callbacks.training_speed")


def test_a_step_far_slower_than_the_recent_ones_is_warned_of_with_the_load(monkeypatch, caplog):
    clock = _Clock()
    monkeypatch.setattr(training_speed.time, "perf_counter", clock)
    monkeypatch.setattr(training_speed, "machine_load", lambda: (5.1, 2))
    module = SimpleNamespace(run_plan={})
    speed = TrainingSpeed(warmup_steps=0, slow_step_factor=5.0, recent_steps=4)
    trainer = _trainer()
    speed.on_fit_start(trainer, module)
    with caplog.at_level("WARNING", logger="volseg.callbacks.training_speed"):
        speed.on_train_start(trainer, module)  # load 5.1 > 2 cores
        for seconds in [0.24, 0.25, 0.23, 0.24, 2.32, 2.5, 0.24, 0.24, 0.24, 3.0]:
            speed.on_train_batch_start(trainer, module, torch.zeros(2, 3), 0)
            clock.now += seconds
            trainer.global_step += 1
            speed.on_train_batch_end(trainer, module, None, torch.zeros(2, 3), 0)
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0].startswith("The load average is 5.1 on 2 core(s)")
    # step 5 (2.32 s against a 0.24 s median); step 6 follows too soon to warn again; step 10
    # (3.0 s) four batches later
    assert [m.split(" took")[0] for m in messages[1:]] == ["Step 5", "Step 10"]
    assert "2.32 s, 9.7x the median 0.24 s of the 4 before it" in messages[1]
    assert "load average 5.1 on 2 core(s): other processes share the CPUs" in messages[1]
    # null: no warning, whatever the times
    caplog.clear()
    quiet = TrainingSpeed(warmup_steps=0, slow_step_factor=None, recent_steps=4)
    with caplog.at_level("WARNING", logger="volseg.callbacks.training_speed"):
        quiet.on_train_start(trainer, module)
        for seconds in [0.2, 0.2, 0.2, 0.2, 9.0]:
            quiet.on_train_batch_start(trainer, module, torch.zeros(2, 3), 0)
            clock.now += seconds
            trainer.global_step += 1
            quiet.on_train_batch_end(trainer, module, None, torch.zeros(2, 3), 0)
    assert not caplog.records
