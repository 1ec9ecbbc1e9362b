"""Validation fitted to ``memory.budget``: the planner's levers, the refusal, and a real CPU run
that validates with what was planned."""

from __future__ import annotations

import math

import pytest
import yaml

from tests.conftest import compose_config, load_benchmark, planned_config, tiny_train_overrides
from tests.estimates import estimate, estimate_validation
from tests.memory.real_validation import validation_rises
from volseg.data.synthetic import generate_synthetic_dataset
from volseg.memory import Candidate, estimate_run
from volseg.memory.estimate.inference_pass import InferenceEstimate, estimate_prediction
from volseg.memory.estimate.margins import planned_total
from volseg.memory.fit.inference_fit import fit_validation, plan_stitching
from volseg.memory.fit.search import shrunk_patches, windows_at_once
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
    "memory.val_shape=[32,192,192]",
    "memory.plan_step=false",
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
        "memory.val_shape=[32,192,192]",
    ]
    cfg = compose_config("train", tmp_path / "run", [*overrides, "memory.budget=60MiB"])
    assert estimate(planned_config("train", tmp_path / "est", overrides)).fits(60 * MIB)
    with pytest.raises(BudgetExceeded) as err:
        train(cfg)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("memory.budget=60MiB: the estimated validation of one 32x192x192")
    # the lever train.py tries, with the least it needed; plan.py's smaller windows named
    assert "tried fewer windows at once: model.inferer.sw_batch_size 1 to 3 at " in message
    assert "(the least: " in message and "also tries smaller windows" in message
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.slow
def test_a_planned_cpu_run_validates_with_fewer_windows_within_its_budget(tmp_path):
    """A real ``python train.py memory.budget=B`` run on the CPU, in the precision this CPU
    plans for, whose configured 16 windows at a time would not validate within ``B``: the plan
    sets fewer, the run validates with them, and the monitor's validation rise above its start,
    on top of the estimated resident state, stays under the budget. ``B`` comes from this CPU's
    estimates: the step (with its CPU margin) and one window at a time fit it, sixteen windows do
    not (on AVX2, whose margin is +172% of the step's growth: the step 454 MiB, 16 windows of
    this 32x192x192 volume 563)."""
    shape = [32, 192, 192]
    data = generate_synthetic_dataset(tmp_path / "data", num_volumes=3, num_val=1, shape=shape)
    run_dir = tmp_path / "run"
    overrides = [
        f"data.root={data}",
        "data.num_workers=0",
        "data.batch_size=1",
        "data.patch_size=[32,64,64]",
        "model.net.widths=[8,16,32]",
        "model.inferer.sw_batch_size=16",
        "trainer.accelerator=cpu",
        "trainer.max_epochs=1",
        "trainer.limit_train_batches=2",
        "trainer.num_sanity_val_steps=0",
        "logger=csv",
        "extras.print_config=false",
        "callbacks.rich_progress_bar=null",
        "callbacks.model_summary=null",
        "memory.plan_step=false",
    ]
    planned = planned_config("train", tmp_path / "est", overrides)
    configured = estimate_validation(planned, shape)
    one_window = estimate_validation(
        planned_config("train", tmp_path / "est", [*overrides, "model.inferer.sw_batch_size=1"]),
        shape,
    )
    # the step as the planner counts it (with this CPU kind's margin on its growth)
    needs = max(planned_total(estimate(planned)), one_window.process_total)
    budget_mib = math.ceil(needs * 1.05 / MIB)
    budget = budget_mib * MIB
    assert not configured.fits(budget)

    rises = validation_rises([*overrides, f"memory.budget={budget_mib}MiB"], run_dir)
    plan = yaml.safe_load((run_dir / "plan.yaml").read_text())
    decision = plan["decisions"]["model.inferer.sw_batch_size"]
    assert decision["source"] == "planned" and 1 <= decision["value"] < 16
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
    # between the two as the planner counts them (the margin on top of each)
    limit = (planned_total(on_gpu[small]) + planned_total(on_gpu[large])) // 2
    assert on_gpu[small].fits(limit) and not on_gpu[large].fits(limit) and host.fits(limit)

    shapes = [large, small, small]
    plan = plan_stitching(cfg, shapes, "cuda", limit, "test", (), "32-true", "auto", estimator)
    assert plan.stitch == {small: "device", large: "host"}
    assert plan.estimates[large].stitch == "host"
    assert any("32x192x192: stitched on the host" in line for line in plan.lines())
    # no limit known on a GPU: nothing planned, stitch=auto decides at run time
    unbounded = plan_stitching(cfg, [small], "cuda", None, "", (), "32-true", "auto", estimator)
    assert unbounded.stitch == {}


def test_window_counts_are_tried_halving_to_two_before_one():
    """The search order of validation's levers: window counts from the most down, halving, 2
    before 1 (on a CPU a float32 batch of one can need more than two); smaller windows one
    divisor off the side largest relative to the configured window, largest first."""
    assert windows_at_once(15) == [15, 7, 3, 2, 1]
    assert windows_at_once(8) == [8, 4, 2, 1]
    assert windows_at_once(2) == [2, 1]
    assert windows_at_once(1) == [1]
    assert shrunk_patches([16, 40, 48], [8, 8, 8]) == [
        [16, 40, 40],
        [16, 32, 40],
        [16, 32, 32],
        [16, 24, 32],
        [16, 24, 24],
        [16, 16, 24],
        [16, 16, 16],
    ]


# a CPU run whose windows, not the whole volume, decide validation's peak
WINDOWS = [
    "model.net.widths=[8,16,32]",
    "data.batch_size=1",
    "data.patch_size=[16,32,32]",
    "model.divisible_by=[4,4,4]",
    "trainer.precision=32",
    "trainer.accelerator=cpu",
    "model.inferer.sw_batch_size=2",
    "memory.val_shape=[16,64,64]",
]


@pytest.mark.slow
def test_validation_searches_window_count_then_size_largest_window_first(tmp_path):
    """Over the budget at the configured window with any count: the smaller windows below it
    (one divisor off one side at a time), the smallest first (does anything fit?), then from
    the largest down, each with the most windows at once up to the configured window batch's
    voxels; every window above the answer fits with none of the counts tried. Each setting is
    a candidate of the plan, asked of the engine."""
    plan = make_plan(compose_config("train", tmp_path, WINDOWS), estimate_step=False)
    shape = [16, 64, 64]
    asked: list[Candidate] = []

    def validation(candidate: Candidate) -> InferenceEstimate:
        asked.append(candidate)
        return estimate_run(plan, candidate, shape).validation

    cfg = plan.run_config()
    configured = estimate_run(plan, None, shape).validation
    roi0 = [16, 32, 32]
    one = estimate_run(plan, Candidate(sw_batch_size=1, roi_size=roi0), shape).validation
    budget = min(configured.process_total, one.process_total) - 1  # no count fits at roi0
    fit = fit_validation(cfg, budget, shape, configured, validation)

    windows = shrunk_patches(roi0, plan.value("model.divisible_by"))
    assert asked[0] == Candidate(sw_batch_size=1, roi_size=roi0)  # fewer windows at once
    assert asked[1].roi_size == tuple(windows[-1])  # the smallest window: does any fit?
    assert fit.estimate is not None and fit.estimate.fits(budget)
    settings = fit.candidate.settings()
    roi = settings["model.inferer.roi_size"]
    assert roi in windows and fit.estimate.roi_size == roi
    above = windows[: windows.index(roi)]
    after_smallest = [v.roi_size for v in asked[1:] if v.roi_size != tuple(windows[-1])]
    assert list(dict.fromkeys(after_smallest)) == [*map(tuple, above), tuple(roi)]
    voxels0 = 2 * math.prod(roi0)
    for window in above:  # none of the counts tried at a larger window fits
        cap = max(1, voxels0 // math.prod(window))
        for k in windows_at_once(cap):
            est = estimate_run(plan, Candidate(sw_batch_size=k, roi_size=window), shape)
            assert not est.validation.fits(budget)
    count = settings.get("model.inferer.sw_batch_size", 2)
    assert count * math.prod(roi) <= voxels0
    assert "the largest window below 16x32x32 that fits" in fit.reasons["model.inferer.roi_size"]

    # nothing fits: each lever tried, with the least it needed
    refused = fit_validation(cfg, configured.resident, shape, configured, validation)
    assert refused.estimate is None
    assert [t.split(":")[0] for t in refused.tried] == ["fewer windows at once", "smaller windows"]
    for text in refused.tried:
        least = float(text.split("the least: ")[1].split(" MiB")[0].replace(",", ""))
        assert least * MIB > configured.resident


@pytest.mark.slow
def test_a_users_unet_at_83_mib_plans_its_step_and_its_validation(tmp_path):
    """A user's own U-Net (the DoubleConv/Down/Up/OutConv one of the benchmarks' networks grid),
    float32, batch 2 of 16x64x64, ``python plan.py ... memory.budget=83MiB``: the step is
    planned (on an AVX2-only CPU a smaller patch with checkpointing), and the validation of the
    embedded dataset's 32x96x96 volumes, over the budget with the configured windows, gets the
    windows that fit; both within the budget, the plan's figures the engine's."""
    load_benchmark("grid").user_network(tmp_path)
    shape = [32, 96, 96]
    overrides = [
        "model/net=custom",
        "model.net._target_=my_unet.UNet",
        "data.batch_size=2",
        "data.patch_size=[16,64,64]",
        "trainer.precision=32",
        "trainer.accelerator=cpu",
        f"memory.val_shape=[{','.join(map(str, shape))}]",
        "memory.budget=83MiB",
    ]
    plan = make_plan(compose_config("train", tmp_path / "run", overrides), fit_budget=True)
    budget = 83 * MIB
    assert plan.estimate["process_total"] <= budget
    assert plan.validation["within_budget"] <= budget
    assert plan.validation["volume_shape"] == shape
    cfg = plan.run_config()
    assert (
        estimate_run(plan, None, shape).validation.process_total
        == (plan.validation["process_total"])
    )
    # the configured windows (2 of the planned patch) would not have fit: validation was planned
    patch = tuple(cfg.data.patch_size)
    as_configured = estimate_run(plan, Candidate(sw_batch_size=2, roi_size=patch), shape).validation
    planned = {
        key
        for key, decision in plan.decisions.items()
        if key.startswith("model.inferer.") and decision.source == "planned"
    }
    if not as_configured.fits(budget):
        assert planned, plan.format()
        roi = list(cfg.model.inferer.roi_size)
        assert math.prod(roi) <= math.prod(patch)
        assert all(r % d == 0 for r, d in zip(roi, cfg.model.divisible_by, strict=True))
