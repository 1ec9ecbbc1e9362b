"""The planner's answers fit (a real step stays under the budget) and one step more does not."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import OrderedDict

import pytest
from omegaconf import DictConfig

from tests.conftest import REPO, planned_config
from tests.estimates import estimate, plan_of
from tests.memory.real_step import real_step_peak
from volseg.memory import Candidate
from volseg.memory.estimate.margins import planned_total
from volseg.memory.fit.step_fit import Planner, StepFit, fit_step, patch_divisor
from volseg.utils.units import MIB

SMALL = [
    "model.net.widths=[8,16,32]",
    "data.batch_size=2",
    "data.patch_size=[16,32,32]",
    "trainer.precision=32",
    "memory.plan_device=cpu",
]


#: a budget SMALL's batch 2 fits, with room for a larger batch whatever the kind of CPU's margin
#: (AVX2's +172% of the step's growth: batch 2 51 MiB, batch 3 77, batch 4 102)
BUDGET = 96 * MIB


@pytest.fixture(scope="module")
def small_within_budget(tmp_path_factory: pytest.TempPathFactory) -> tuple[DictConfig, StepFit]:
    """SMALL (batch 2, which fits) and the planner's batch search for :data:`BUDGET`, read by
    the tests below."""
    cfg = planned_config("train", tmp_path_factory.mktemp("small"), SMALL)
    return cfg, fit_step(plan_of(cfg), BUDGET)


@pytest.mark.slow
def test_planned_batch_fits_and_one_more_does_not(small_within_budget):
    cfg, answer = small_within_budget
    budget = BUDGET
    n = answer.batch_size
    assert n is not None and n > 2 and answer.candidate == Candidate(batch_size=n)
    assert planned_total(answer.estimate) <= budget
    assert planned_total(answer.next_step_estimate) > budget
    # a real step at the planned batch stays under the budget
    assert sum(real_step_peak(cfg, n).values()) <= budget


@pytest.fixture(scope="module")
def batch_8_between_no_and_all_checkpointing(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[DictConfig, int, StepFit]:
    """SMALL at batch 8, a budget halfway between its estimate without checkpointing (does not
    fit) and with every level checkpointed (fits), and the planner's answer for it (one search,
    read by the tests below)."""
    cfg = planned_config("train", tmp_path_factory.mktemp("batch8"), [*SMALL, "data.batch_size=8"])
    without = estimate(cfg)
    with_all = estimate(cfg, activation_checkpointing="all")
    budget = (planned_total(without) + planned_total(with_all)) // 2
    return (
        cfg,
        budget,
        fit_step(
            plan_of(cfg, checkpointing_options=["none", "all"]),
            budget,
            as_configured=without,
        ),
    )


@pytest.mark.slow
def test_planner_turns_to_checkpointing_when_the_batch_does_not_fit(
    batch_8_between_no_and_all_checkpointing,
):
    cfg, budget, answer = batch_8_between_no_and_all_checkpointing
    assert not answer.fits_as_configured
    assert answer.batch_size >= 8
    assert answer.candidate.activation_checkpointing is not None
    assert answer.largest_batch_by_checkpointing["none"] < 8


def test_patch_divisor_is_per_axis(tmp_path):
    five = "model.net.widths=[4,8,16,32,64]"
    null = "model.net.pooling=null"
    cfg = planned_config("train", tmp_path, [five, "data.patch_size=[26,150,320]", null])
    assert patch_divisor(cfg) == [16, 16, 16]
    cfg = planned_config(
        "train", tmp_path, [five, "data.patch_size=[26,150,320]", "model.net.pooling=auto"]
    )
    assert patch_divisor(cfg) == [4, 16, 16]  # z: 26 -> 13 -> 6, then kept


def test_patch_divisor_follows_explicit_poolings(tmp_path):
    anisotropic = ["data.patch_size=[8,16,32]", "model.net.pooling=[[1,2,2],[2,2,2]]"]
    cfg = planned_config("train", tmp_path, [*SMALL, *anisotropic])
    assert patch_divisor(cfg) == [2, 4, 4]


@pytest.mark.slow
def test_estimate_memory_cli_writes_json(tmp_path):
    out = tmp_path / "estimate.json"
    result = subprocess.run(
        [
            sys.executable,
            "estimate_memory.py",
            *SMALL,
            "memory.budget=60MiB",
            "memory.val_shape=[16,32,32]",
            f"memory.json_out={out}",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "activations by module" in result.stdout
    # batch 2 fits 60 MiB: plan.py's plan keeps it, and the report says so
    assert "Planned for memory.budget=60MiB:\n  the configured run fits" in result.stdout
    data = json.loads(out.read_text())
    assert data["schema_version"] == 1
    keys = {
        "params",
        "grads",
        "optimizer_state",
        "activations",
        "temporaries",
        "peak_allocated",
        "peak_reserved",
        "cuda_context",
        "process_total",
        "modules",
    }
    assert keys <= set(data["estimate"])
    assert all(isinstance(data["estimate"][k], int) for k in keys - {"modules"})
    assert data["estimate"]["modules"]["net.inc"] > 0
    # the report is of plan.py's plan, checked against the budget
    assert "fits memory.budget=60MiB" in data["run_plan"]["data.batch_size"]["why"]
    assert data["estimate"]["batch_size"] == data["run_plan"]["data.batch_size"]["value"] == 2


@pytest.mark.slow
@pytest.mark.parametrize(
    "bad, named",
    [
        (["memory.budget=lots"], "memory.budget=lots"),
        (["data.patch_size=[2,32,32]", "model.net.pooling=null"], "[2, 32, 32] is too thin"),
    ],
)
def test_estimate_memory_cli_bad_input_is_one_clear_error(tmp_path, bad, named):
    result = subprocess.run(
        [sys.executable, "estimate_memory.py", *SMALL, *bad, f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2
    assert named in result.stderr and "Traceback" not in result.stderr


def test_planner_offers_micro_batches_that_add_up_to_the_batch(
    batch_8_between_no_and_all_checkpointing,
):
    cfg, budget, answer = batch_8_between_no_and_all_checkpointing
    micro = answer.micro_batching
    b, k = micro["batch_size"], micro["accumulate_grad_batches"]
    assert b * k == 8 and b < 8
    assert micro["candidate"] == Candidate(batch_size=b, accumulate_grad_batches=k)
    assert micro["estimate"]["accumulate_grad_batches"] == k
    assert micro["total_within_budget"] is not None and micro["total_within_budget"] <= budget
    # the largest: the next divisor of 8 (twice the micro-batch, half the accumulation) does not fit
    assert not estimate(cfg, batch_size=2 * b, accumulate_grad_batches=k // 2).fits(budget)
    # time from FLOPs: micro-batches do the configured step's work, checkpointing recomputes
    assert micro["flops_per_sample"] == pytest.approx(1.0, abs=0.01)
    # what the step's answer changes ends with its checkpointing (nothing after it)
    last = answer.candidate
    assert last.activation_checkpointing is not None
    assert last.net_sizes == () and last.checkpoint_loss is None
    assert answer.flops_per_sample > 1.05  # checkpointed levels run their forward twice


def test_planner_offers_no_micro_batches_when_the_batch_fits(small_within_budget):
    answer = small_within_budget[1]
    assert answer.fits_as_configured
    assert answer.micro_batching is None and answer.flops_per_sample is None


@pytest.mark.slow
def test_cuda_plan_keeps_the_recorded_margin_and_says_so(tmp_path):
    """On CUDA the planner adds the estimate's shortfall on recorded GPU runs to the reserved
    peak: the planned batch fits budget with it, one more does not."""
    cuda = [o for o in SMALL if o != "memory.plan_device=cpu"] + ["memory.plan_device=cuda"]
    cfg = planned_config("train", tmp_path, [*cuda, "memory.cuda_context_mib=0"])
    budget = 60 * MIB
    answer = fit_step(plan_of(cfg), budget)
    est, more = answer.estimate, answer.next_step_estimate
    assert est["margin"] > 0 and "depth 3" in est["margin_source"]

    # the margin: fixed MiB plus a share of the reserved peak (cuda_context_mib=0)
    def planned(e):
        return e["peak_reserved"] * (1 + e["margin"]) + e["margin_fixed_mib"] * MIB

    assert planned(est) <= budget < planned(more)
    # without the margin the next batch would have been planned
    assert answer.batch_size < plan_without_margin(cfg, budget)


def plan_without_margin(cfg: DictConfig, budget: int) -> int:
    from unittest import mock

    from volseg.memory.estimate import engine
    from volseg.memory.estimate import margins as residuals

    # the engine keeps its answers, margin included: without a fresh cache the margin would stay
    with (
        mock.patch.object(residuals, "OTHER", residuals.Margin(0.0, "none")),
        mock.patch.object(engine, "_runs", OrderedDict()),
    ):
        return fit_step(plan_of(cfg), budget).batch_size


@pytest.mark.slow
def test_a_batch_of_one_over_the_budget_does_not_end_the_batch_search(tmp_path):
    """On a CPU a float32 batch of one of thin layers runs torch's native convolutions (a column
    buffer 27x the input) instead of oneDNN's and can take more than a batch of two: a budget
    that batch 1 misses and batch 2 fits gets batch 2, not "nothing fits"."""
    cfg = planned_config("train", tmp_path, SMALL)
    one, two, three = (estimate(cfg, batch_size=n) for n in (1, 2, 3))
    assert one.process_total > three.process_total > two.process_total  # the premise
    assert planned_total(one) > planned_total(three) > planned_total(two)
    budget = (planned_total(two) + planned_total(three)) // 2
    n, est = Planner(plan_of(cfg), budget).largest_batch("none")
    assert n == 2 and est.process_total == two.process_total
    answer = fit_step(plan_of(cfg, checkpointing_options=["none"]), budget)
    assert answer.batch_size == 2 and answer.fits_as_configured


@pytest.mark.slow
def test_the_planner_picks_selective_where_it_fits_and_all_would_otherwise_be_picked(tmp_path):
    """A budget that ``selective`` fits at the configured batch and ``none`` does not (nor the
    settings that recompute fewer convolutions than ``all`` does): ``selective`` is taken, tried
    before any setting that recomputes convolutions; without it, ``all`` is."""
    cfg = planned_config("train", tmp_path, SMALL)
    totals = {
        o: planned_total(estimate(cfg, activation_checkpointing=o))
        for o in ("none", "selective", "decoder", "all")
    }
    assert totals["all"] < totals["selective"] < totals["decoder"] < totals["none"]
    budget = (totals["selective"] + totals["decoder"]) // 2
    picked = fit_step(plan_of(cfg), budget)
    assert picked.activation_checkpointing == "selective" and picked.batch_size == 2
    assert picked.candidate.activation_checkpointing == "selective"
    without = fit_step(plan_of(cfg, checkpointing_options=["none", "all"]), budget)
    assert without.activation_checkpointing == "all" and without.batch_size == 2
