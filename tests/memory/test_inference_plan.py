"""Validation fitted to ``memory.budget``: the planner's levers, the refusal, and a real CPU run
that validates with what was planned."""

from __future__ import annotations

import math

import pytest
import yaml

from tests.conftest import compose_config, planned_config, tiny_train_overrides
from tests.memory.real_validation import validation_rises
from volseg.data.synthetic import generate_synthetic_dataset
from volseg.memory.estimator import estimate
from volseg.memory.inference import estimate_prediction, estimate_validation
from volseg.memory.inference_plan import plan_stitching
from volseg.plan import make_plan
from volseg.utils.errors import BudgetExceeded
from volseg.utils.units import MIB

# a network small enough that the whole volume's buffers, not the windows, decide the peak
SMALL = [
    "model.net.widths=[4,8,16]",
    "model.net.pooling=null",
    "data.patch_size=[16,64,64]",
    "trainer.precision=32",
    "model.inferer.sw_batch_size=4",
    "estimate.val_shape=[32,192,192]",
    "estimate.plan_step=false",
]


@pytest.mark.slow
def test_a_budget_over_device_stitching_plans_host_stitching(tmp_path):
    """A CUDA run whose step fits 640 MiB but whose validation stitched on the GPU does not,
    with any number of windows at once: planned with host stitching, recorded as a Decision."""
    overrides = [*SMALL, "memory.plan_device=cuda"]
    budget = 640 * MIB
    configured = planned_config("train", tmp_path / "est", overrides)
    assert estimate(configured).fits(budget)
    shape = [32, 192, 192]
    for sw in (4, 1):  # the window count at once does not help: the whole-volume steps decide
        with_sw = planned_config(
            "train", tmp_path / "est", [*overrides, f"model.inferer.sw_batch_size={sw}"]
        )
        assert not estimate_validation(with_sw, shape).fits(budget)

    plan = make_plan(
        compose_config("train", tmp_path / "run", [*overrides, "memory.budget=640MiB"]),
        estimate_step=False,
    )
    stitched = plan.decisions["model.inferer.device"]
    assert (stitched.value, stitched.source) == ("cpu", "planned")
    assert "host memory" in stitched.why and "over 640 MiB" in stitched.why
    # the most windows at once that fit, kept as configured
    assert plan.decisions["model.inferer.sw_batch_size"].value == 4
    assert plan.run_config().model.inferer.device == "cpu"
    assert plan.validation["stitch"] == "host"
    assert plan.validation["within_budget"] <= budget
    assert "model.inferer.device" in plan.to_dict()["decisions"]


@pytest.mark.slow
def test_a_budget_no_validation_fits_is_one_line(small_dataset, tmp_path):
    """On a CPU the whole volume's steps after the windows are over the budget whatever the
    windows: train.py stops before any work, in one line naming memory.budget."""
    from volseg.tasks.train import train

    overrides = [
        *tiny_train_overrides(small_dataset),
        "trainer.precision=32",
        "model.inferer.sw_batch_size=4",
        "estimate.val_shape=[32,192,192]",
    ]
    cfg = compose_config("train", tmp_path / "run", [*overrides, "memory.budget=60MiB"])
    assert estimate(planned_config("train", tmp_path / "est", overrides)).fits(60 * MIB)
    with pytest.raises(BudgetExceeded) as err:
        train(cfg)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("memory.budget=60MiB: the estimated validation of one 32x192x192")
    assert "tried model.inferer.sw_batch_size=" in message
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.slow
def test_a_planned_cpu_run_validates_with_fewer_windows_within_its_budget(tmp_path):
    """A real ``python train.py memory.budget=B`` run on the CPU, in the precision this CPU
    plans for, whose configured 8 windows at a time would not validate within ``B``: the plan
    sets fewer, the run validates with them, and the monitor's validation rise above its start,
    on top of the estimated resident state, stays under the budget. ``B`` comes from this CPU's
    estimates: the step and one window at a time fit it, eight windows do not."""
    shape = [32, 128, 128]
    data = generate_synthetic_dataset(tmp_path / "data", num_volumes=3, num_val=1, shape=shape)
    run_dir = tmp_path / "run"
    overrides = [
        f"data.root={data}",
        "data.num_workers=0",
        "data.batch_size=1",
        "data.patch_size=[32,64,64]",
        "model.net.widths=[8,16,32]",
        "model.inferer.sw_batch_size=8",
        "trainer.accelerator=cpu",
        "trainer.max_epochs=1",
        "trainer.limit_train_batches=2",
        "trainer.num_sanity_val_steps=0",
        "logger=csv",
        "extras.print_config=false",
        "callbacks.rich_progress_bar=null",
        "callbacks.model_summary=null",
        "estimate.plan_step=false",
    ]
    planned = planned_config("train", tmp_path / "est", overrides)
    configured = estimate_validation(planned, shape)
    one_window = estimate_validation(
        planned_config("train", tmp_path / "est", [*overrides, "model.inferer.sw_batch_size=1"]),
        shape,
    )
    needs = max(estimate(planned).process_total, one_window.process_total)
    budget_mib = math.ceil(needs * 1.05 / MIB)
    budget = budget_mib * MIB
    assert not configured.fits(budget)

    rises = validation_rises([*overrides, f"memory.budget={budget_mib}MiB"], run_dir)
    plan = yaml.safe_load((run_dir / "plan.yaml").read_text())
    decision = plan["decisions"]["model.inferer.sw_batch_size"]
    assert decision["source"] == "planned" and 1 <= decision["value"] < 8
    # the run's own hyperparameters: the module was built with it
    hparams = yaml.safe_load((run_dir / "csv" / "hparams.yaml").read_text())
    assert hparams["model"]["inferer"]["sw_batch_size"] == decision["value"]

    assert len(rises) == 1
    rise = rises[0]
    # counted as the budget counts it: the training state's tensors, and what validation adds
    assert configured.resident + rise * MIB <= budget
    # the configured windows would not have: the rise the estimate gives them is over it
    assert configured.resident + configured.peak_growth > budget


def test_predict_stitches_on_the_gpu_the_volumes_that_fit_there(tmp_path):
    """predict.py's plan per volume shape on a GPU (fake tensors): the shapes whose device
    stitching fits the limit are stitched there, the larger ones on the host."""
    cfg = planned_config("train", tmp_path / "est", [*SMALL, "memory.plan_device=cuda"])
    small, large = (32, 64, 64), (32, 192, 192)
    made: dict[tuple, object] = {}

    def estimator(cfg, shape, stitch, flip_axes, precision):  # the plan's, remembered
        key = (tuple(shape), stitch)
        if key not in made:
            made[key] = estimate_prediction(cfg, shape, stitch, flip_axes, precision)
        return made[key]

    on_gpu = {s: estimator(cfg, s, "device", (), "32-true") for s in (small, large)}
    host = estimator(cfg, large, "host", (), "32-true")
    limit = (on_gpu[small].process_total + on_gpu[large].process_total) // 2
    assert on_gpu[small].fits(limit) and not on_gpu[large].fits(limit) and host.fits(limit)

    plan = plan_stitching(cfg, [large, small, small], "cuda", limit, "test", estimator=estimator)
    assert plan.stitch == {small: "device", large: "host"}
    assert plan.estimates[large].stitch == "host"
    assert any("32x192x192: stitched on the host" in line for line in plan.lines())
    # no limit known on a GPU: nothing planned, stitch=auto decides at run time
    assert plan_stitching(cfg, [small], "cuda", None, "", estimator=estimator).stitch == {}
