"""The default epoch bound gives way to ``trainer.max_time``."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import compose_config, tiny_train_overrides
from volseg.utils.resolvers import epochs_unless_timed


def test_epochs_unless_timed():
    assert epochs_unless_timed(12, None) == 12
    assert epochs_unless_timed("12", "null") == 12
    assert epochs_unless_timed(12, "00:00:05:00") == -1
    assert epochs_unless_timed(12, {"minutes": 5}) == -1


def test_a_time_budget_lifts_the_default_epochs_and_an_explicit_count_stays(tmp_path):
    plain = compose_config("train", tmp_path / "a", [])
    assert plain.trainer.max_epochs == 12
    timed = compose_config("train", tmp_path / "b", ["trainer.max_time=00:00:05:00"])
    assert timed.trainer.max_epochs == -1
    both = compose_config(
        "train", tmp_path / "c", ["trainer.max_time=00:00:05:00", "trainer.max_epochs=3"]
    )
    assert both.trainer.max_epochs == 3


def test_a_timed_run_trains_past_the_default_epochs(small_dataset, tmp_path):
    """On a small dataset (2 steps an epoch) a run with a time budget and a step bound
    is not stopped by the default 12 epochs."""
    from volseg.tasks.train import train

    overrides = [o for o in tiny_train_overrides(small_dataset) if "max_epochs" not in o]
    cfg = compose_config(
        "train",
        tmp_path / "run",
        [*overrides, "trainer.max_time=00:00:10:00", "trainer.max_steps=26"],
    )
    train(cfg)
    summary = json.loads((Path(cfg.paths.output_dir) / "summary.json").read_text())
    assert summary["global_step"] == 26
    assert summary["epochs"] == 13
