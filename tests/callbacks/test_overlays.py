"""Validation overlays and memory charts: PNGs in the run dir, W&B (offline) and TensorBoard."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.conftest import compose_config, tiny_train_overrides
from tests.wandb_offline import history_keys, read_records, run_record
from volseg.callbacks.overlays import (
    VolumeSlices,
    class_colours,
    informative_slices,
    render_overlay,
)
from volseg.tasks.train import train
from volseg.utils.entry import close_wandb


def test_informative_slices_take_the_most_foreground_of_each_part_of_the_depth():
    label = np.zeros((12, 4, 4), dtype=np.int64)
    label[2, :2] = 1  # 8 voxels
    label[3, :1] = 2  # 4 voxels
    label[9] = 3  # 16 voxels
    assert informative_slices(label, 2) == [2, 9]
    assert informative_slices(label, 3) == [2, 4, 9]  # a part without foreground: its first
    assert informative_slices(label[:2], 5) == [0, 1]  # never more slices than the depth


def test_overlay_picture_shows_the_class_colours_where_the_masks_are():
    label = np.zeros((1, 32, 32), dtype=np.int64)
    label[0, 8:24, 8:24] = 2
    volume = VolumeSlices("case", [0], np.zeros((1, 32, 32)), label, np.zeros_like(label))
    rgb = render_overlay(volume, ["background", "a", "b"])
    assert rgb.dtype == np.uint8 and rgb.ndim == 3 and rgb.shape[2] == 3
    # on a black image, class b's colour (half-tinted) appears only in the ground-truth panel
    tint = np.round(0.5 * class_colours(3)[2] * 255)
    hits = np.argwhere(np.all(np.abs(rgb.astype(float) - tint) <= 2, axis=-1))
    assert len(hits) > 100
    width = rgb.shape[1]
    assert width / 3 < hits[:, 1].min() and hits[:, 1].max() < 2 * width / 3


@pytest.mark.slow
def test_overlays_and_memory_charts_reach_png_wandb_and_tensorboard(
    small_dataset, tmp_path, monkeypatch
):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_dir"))
    run_dir = tmp_path / "run"
    overrides = [
        *tiny_train_overrides(small_dataset),
        "logger=[csv,tensorboard,wandb]",
        "memory.trace_step=1",
        "callbacks.validation_overlays.every_n_epochs=2",
    ]
    try:
        train(compose_config("train", run_dir, overrides))
    finally:
        close_wandb()

    # PNGs in the run dir, whatever the loggers: the 2 validation volumes, at epoch 1 (of 0, 1)
    pngs = sorted(p.name for p in (run_dir / "overlays").glob("*.png"))
    assert pngs == ["epoch_001_case_004.png", "epoch_001_case_005.png"]
    assert (run_dir / "csv" / "metrics.csv").is_file()

    # W&B: scalars, overlays with masks (2 volumes x 3 slices) and both memory charts
    (wandb_file,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    records = read_records(wandb_file)
    keys = history_keys(records)
    assert {"val/dice_mean", "val/dice_mean_best", "train/loss"} <= keys
    assert {"mem/peak_allocated_mib", "mem/peak_fwd_mib", "mem/reserved_mib"} <= keys
    assert {"val/overlays/all_masks", "mem/timeline/path", "mem/layers/path"} <= keys
    assert run_record(records).project == "volseg"
    media = wandb_file.parent / "files" / "media" / "images"
    assert len(list((media / "val").glob("overlays_*.png"))) == 6
    assert len(list((media / "mask" / "val").glob("overlays_*.mask.png"))) == 12  # gt + pred
    assert len(list((media / "mem").glob("timeline_*.png"))) == 1
    assert len(list((media / "mem").glob("layers_*.png"))) == 1

    # TensorBoard: the same overlays and charts as image summaries
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"images": 0})
    events.Reload()
    images = set(events.Tags()["images"])
    assert images == {
        "val/overlays/case_004",
        "val/overlays/case_005",
        "mem/timeline",
        "mem/layers",
    }
    assert "val/dice_mean" in events.Tags()["scalars"]
    (overlay,) = events.Images("val/overlays/case_004")
    assert overlay.step == 4 and overlay.width > 300 and overlay.height > 300
    assert Path(run_dir / "memory_timeline.png").is_file()


def test_overlays_at_every_validation_that_runs_and_train_loss_in_a_short_epoch(
    small_dataset, tmp_path
):
    """One epoch with check_val_every_n_epoch=2: the validation budget still validates at its
    end (epoch index 0, even); overlays are drawn there. 2 batches an epoch against
    log_every_n_steps=10: train/loss is logged all the same."""
    overrides = [
        *tiny_train_overrides(small_dataset),
        "trainer.max_epochs=1",
        "trainer.check_val_every_n_epoch=2",
        "trainer.log_every_n_steps=10",
    ]
    run_dir = tmp_path / "run"
    train(compose_config("train", run_dir, overrides))
    pngs = sorted(p.name for p in (run_dir / "overlays").glob("*.png"))
    assert pngs == ["epoch_000_case_004.png", "epoch_000_case_005.png"]
    metrics = (run_dir / "csv" / "metrics.csv").read_text().splitlines()
    column = metrics[0].split(",").index("train/loss")
    assert any(row.split(",")[column] for row in metrics[1:])
