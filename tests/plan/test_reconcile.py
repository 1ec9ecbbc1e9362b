"""Options that contradict each other: reconciled before anything is built."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import compose_config, tiny_train_overrides
from volseg.plan.reconcile import reconcile_callbacks
from volseg.tasks.train import train


def test_progress_bar_off_trains_without_the_progress_bar_callback(small_dataset, tmp_path):
    overrides = [
        o for o in tiny_train_overrides(small_dataset) if not o.startswith("callbacks.rich")
    ]
    overrides += [
        "trainer.enable_progress_bar=false",
        "trainer.max_epochs=1",
        "trainer.limit_train_batches=1",
        "trainer.limit_val_batches=1",
    ]
    cfg = compose_config("train", tmp_path, overrides)
    assert "rich_progress_bar" in cfg.callbacks  # composed, and left out when built
    train(cfg)
    summary = json.loads((Path(cfg.paths.output_dir) / "summary.json").read_text())
    assert summary["global_step"] == 1


def test_memory_options_without_the_monitor_say_so_once(tmp_path, caplog):
    cfg = compose_config("train", tmp_path, ["callbacks=none", "memory.trace_step=5"])
    with caplog.at_level("WARNING", logger="volseg.plan.reconcile"):
        dropped, notes = reconcile_callbacks(cfg.get("callbacks"), cfg.trainer, cfg.memory)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert dropped == [] and len(warnings) == 1 and warnings == notes
    assert warnings[0].startswith("memory.trace_step=5: no memory monitor")
    # with the monitor among the callbacks, the same option is read: nothing to say
    cfg = compose_config("train", tmp_path, ["memory.trace_step=5"])
    assert reconcile_callbacks(cfg.callbacks, cfg.trainer, cfg.memory) == ([], [])
