"""ValidationBudget: validation cadence sized by its cost; the last epoch that fits validates."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from tests.conftest import compose_config, tiny_train_overrides
from volseg.callbacks.validation_budget import ValidationBudget
from volseg.tasks.train import train


class FakeTimer:
    """Stands in for Lightning's Timer (found by class name): its public ``time_remaining``."""

    def __init__(self, duration: float, elapsed: float) -> None:
        self.duration = duration
        self.elapsed = elapsed

    def time_remaining(self) -> float:
        return self.duration - self.elapsed


FakeTimer.__name__ = "Timer"


def _trainer(**kwargs):
    defaults = {"check_val_every_n_epoch": 2, "max_epochs": 100, "current_epoch": 0}
    defaults.update(sanity_checking=False, should_stop=False, callbacks=[])
    defaults.update(strategy=SimpleNamespace(broadcast=lambda obj: obj))  # one process
    return SimpleNamespace(**{**defaults, **kwargs})


def test_expensive_validation_runs_less_often(monkeypatch):
    callback = ValidationBudget(max_fraction=0.1)
    trainer = _trainer()
    callback.on_train_start(trainer, None)
    clock = iter([0.0, 10.0, 10.0, 16.0])  # a 10 s epoch, then a 6 s validation
    monkeypatch.setattr("time.perf_counter", lambda: next(clock))
    callback.on_train_epoch_start(trainer, None)
    callback.on_train_epoch_end(trainer, None)
    callback.on_validation_start(trainer, None)
    callback.on_validation_end(trainer, None)
    # 6 s / (0.1 * 10 s) = 6 epochs between validations
    assert trainer.check_val_every_n_epoch == 6
    assert not trainer.should_stop


def test_rank_zero_decides_the_cadence_for_every_rank(monkeypatch):
    """This rank timed a 6 s validation (every 6 epochs), rank 0 a cheap one: all follow rank 0,
    or the ranks would validate in different epochs and wait for each other forever."""
    callback = ValidationBudget(max_fraction=0.1)
    rank0 = iter([False, 2])  # rank 0's "final epoch?" and "validate every N epochs"
    trainer = _trainer(strategy=SimpleNamespace(broadcast=lambda obj: next(rank0)))
    callback.on_train_start(trainer, None)
    clock = iter([0.0, 10.0, 10.0, 16.0])
    monkeypatch.setattr("time.perf_counter", lambda: next(clock))
    callback.on_train_epoch_start(trainer, None)
    callback.on_train_epoch_end(trainer, None)
    callback.on_validation_start(trainer, None)
    callback.on_validation_end(trainer, None)
    assert trainer.check_val_every_n_epoch == 2


def test_cheap_validation_keeps_the_configured_cadence(monkeypatch):
    callback = ValidationBudget(max_fraction=0.1)
    trainer = _trainer()
    callback.on_train_start(trainer, None)
    clock = iter([0.0, 10.0, 10.0, 10.5])
    monkeypatch.setattr("time.perf_counter", lambda: next(clock))
    callback.on_train_epoch_start(trainer, None)
    callback.on_train_epoch_end(trainer, None)
    callback.on_validation_start(trainer, None)
    callback.on_validation_end(trainer, None)
    assert trainer.check_val_every_n_epoch == 2


def test_the_last_epoch_within_max_time_validates_and_stops(monkeypatch):
    callback = ValidationBudget(max_fraction=0.1)
    timer = FakeTimer(duration=100.0, elapsed=0.0)
    trainer = _trainer(callbacks=[timer], check_val_every_n_epoch=7)
    callback.on_train_start(trainer, None)
    callback._epoch_times = [10.0]
    callback.last_validation_s = 5.0
    monkeypatch.setattr("time.perf_counter", lambda: 0.0)
    timer.elapsed = 60.0  # 40 s left: room for one more epoch + validation (15 s) after this
    callback.on_train_epoch_start(trainer, None)
    assert trainer.check_val_every_n_epoch == 7
    timer.elapsed = 75.0  # 25 s left: this is the last epoch that fits with its validation
    callback.on_train_epoch_start(trainer, None)
    assert trainer.check_val_every_n_epoch == 1
    callback.on_validation_start(trainer, None)
    callback.on_validation_end(trainer, None)
    assert trainer.should_stop


def test_a_one_epoch_run_validates_its_epoch_whatever_the_cadence(small_dataset, tmp_path):
    overrides = [
        *tiny_train_overrides(small_dataset),
        "trainer.max_epochs=1",
        "trainer.check_val_every_n_epoch=2",
    ]
    cfg = compose_config("train", tmp_path, overrides)
    train(cfg)
    summary = json.loads((Path(cfg.paths.output_dir) / "summary.json").read_text())
    assert summary["best_val_dice_mean"] is not None
    assert summary["best_val_dice_mean"] >= 0.0
