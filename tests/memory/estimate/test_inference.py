"""Whole-volume inference's memory: the estimate's parts, and against a real validation."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from monai.data.utils import dense_patch_slices
from monai.inferers.utils import _get_scan_interval

from tests.conftest import (
    SMALL_SHAPE,
    compose_config,
    planned_config,
    tiny_train_overrides,
)
from tests.estimates import estimate_validation
from tests.memory.real_validation import validation_rises
from volseg.data.synthetic import generate_synthetic_dataset
from volseg.memory.estimate.inference_pass import estimate_prediction, stitching_bytes, window_count
from volseg.plan import make_plan
from volseg.tasks.estimate_memory import run_estimate

SMALL = ["model.net.widths=[8,16,32]", "data.patch_size=[16,32,32]", "trainer.precision=32"]


def _cfg(tmp_path: Path, overrides: list[str]):
    return planned_config("train", tmp_path, [*SMALL, *overrides])


def test_window_count_is_monais():
    shape, roi = [40, 100, 70], [16, 32, 32]
    interval = _get_scan_interval(shape, roi, 3, (0.25,) * 3)
    assert window_count(shape, roi, 0.25) == len(dense_patch_slices(shape, roi, interval))
    # a volume smaller than the window is padded to it: one window
    assert window_count([8, 20, 20], roi, 0.25) == 1


@pytest.mark.slow
def test_host_stitching_takes_the_volume_buffers_off_the_gpu(tmp_path):
    shape = [32, 128, 128]
    on_gpu = estimate_validation(_cfg(tmp_path, ["memory.plan_device=cuda"]), shape)
    on_host = estimate_validation(
        _cfg(tmp_path, ["memory.plan_device=cuda", "model.inferer.device=cpu"]), shape
    )
    assert (on_gpu.stitch, on_host.stitch) == ("device", "host")
    buffers = stitching_bytes(shape, [16, 32, 32], 5)
    assert on_gpu.stitching == on_host.host_stitching == buffers
    # the stitched logits, count map, and the float32 logits, argmax, loss and Dice after them
    assert on_gpu.peak_allocated - on_host.peak_allocated > buffers
    # the same training state is resident in both
    assert on_gpu.resident == on_host.resident > 0


@pytest.mark.slow
def test_validation_grows_with_the_volume_and_prediction_holds_no_training_state(tmp_path):
    cfg = _cfg(tmp_path, ["memory.plan_device=cpu"])
    small = estimate_validation(cfg, [32, 64, 64])
    large = estimate_validation(cfg, [32, 128, 128])
    voxels = math.prod([32, 128, 128]) - math.prod([32, 64, 64])
    # at least the stitched logits and count map (K + 1 float32 per voxel) of the extra voxels
    assert large.peak_allocated - small.peak_allocated >= (5 + 1) * 4 * voxels
    assert small.resident == large.resident  # params, grads, optimizer state
    predicted = estimate_prediction(cfg, [32, 128, 128])
    assert predicted.resident < large.resident / 3  # parameters only, no grads or AdamW state
    flipped = estimate_prediction(cfg, [32, 128, 128], flip_axes=[0, 1])
    assert flipped.flips == 4 and flipped.peak_allocated >= predicted.peak_allocated


@pytest.mark.slow
def test_estimate_matches_a_real_cpu_validation(tmp_path):
    """A real ``python train.py`` run (fresh process, freed tensors returned to the system at
    once) validates 2 volumes of 32x96x96; the monitor's rise over the validation's start against
    the estimate's rise above the resident training state (10%, the estimator's accuracy)."""
    shape = [32, 96, 96]
    data = generate_synthetic_dataset(tmp_path / "data", num_volumes=4, num_val=2, shape=shape)
    run_dir = tmp_path / "run"
    overrides = [
        f"data.root={data}",
        "data.num_workers=0",
        "trainer.accelerator=cpu",
        "trainer.max_epochs=1",
        "trainer.limit_train_batches=2",
        "trainer.check_val_every_n_epoch=1",
        "logger=csv",
        "extras.print_config=false",
        "callbacks.rich_progress_bar=null",
        "callbacks.model_summary=null",
        "memory.plan_step=false",
    ]
    rises = validation_rises(overrides, run_dir)
    assert len(rises) == 1  # one validation; the sanity check is not logged
    measured = rises[0]
    est = estimate_validation(planned_config("train", tmp_path / "est", overrides), shape)
    assert measured * 2**20 == pytest.approx(est.peak_growth, rel=0.10)


@pytest.mark.slow
def test_estimate_memory_json_and_plan_carry_validation(small_dataset, tmp_path):
    out = tmp_path / "estimate.json"
    cfg = compose_config(
        "estimate_memory",
        tmp_path / "run",
        [*tiny_train_overrides(small_dataset), f"memory.json_out={out}"],
    )
    result = run_estimate(cfg)
    saved = json.loads(out.read_text())
    for phase in ("validation", "prediction"):
        assert saved[phase]["peak_allocated"] == result[phase]["peak_allocated"] > 0
        assert saved[phase]["peak_reserved"] >= saved[phase]["peak_allocated"]
    # the dataset's largest validation case, unless memory.val_shape says otherwise
    assert saved["validation"]["volume_shape"] == SMALL_SHAPE
    planned = make_plan(compose_config("train", tmp_path / "plan", [
        *tiny_train_overrides(small_dataset), "memory.val_shape=[16,64,64]"
    ]))  # fmt: skip
    assert planned.to_dict()["validation"]["volume_shape"] == [16, 64, 64]
    assert planned.to_dict()["validation"]["peak_allocated"] > 0


@pytest.mark.slow
def test_the_reserved_peak_follows_memory_allocator(tmp_path):
    shape = [32, 128, 128]
    cuda = ["memory.plan_device=cuda"]
    default = estimate_validation(_cfg(tmp_path, cuda), shape)
    expandable = estimate_validation(
        _cfg(tmp_path, [*cuda, "memory.allocator.expandable_segments=true"]), shape
    )
    assert expandable.peak_allocated == default.peak_allocated  # the same tensors
    # expandable segments map 2 MiB (small pool) and 20 MiB (large pool) pages
    assert expandable.peak_reserved != default.peak_reserved
    assert expandable.peak_reserved % (2 * 2**20) == 0
    assert expandable.allocator.expandable_segments and not default.allocator.expandable_segments
