"""The planner's levers past batch and checkpointing: loss checkpointing and a smaller patch when
nothing else fits, a refusal that names what it tried, and the resident state refused by itself.
Budgets come from this machine's estimates, never from typed bytes."""

from __future__ import annotations

import pytest
import torch
from omegaconf import DictConfig

from tests.conftest import compose_config, planned_config
from tests.estimates import estimate, plan_of
from volseg.memory.estimate.margins import planned_total
from volseg.memory.fit.search import shrunk_patches
from volseg.memory.fit.step_fit import Planner, fit_step
from volseg.plan import make_plan
from volseg.utils.errors import BudgetExceeded
from volseg.utils.instantiate import build

SMALL = [
    "model.net.widths=[4,8,16]",
    "data.batch_size=2",
    "data.patch_size=[16,32,32]",
    "trainer.precision=32",
    "trainer.accelerator=cpu",
    "memory.val_shape=[16,32,32]",
]
#: the generic choices, to keep the search short
OPTIONS = ["none", "all"]


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> DictConfig:
    return planned_config("train", tmp_path_factory.mktemp("levers"), SMALL)


def test_shrunk_patches_take_the_side_largest_relative_to_the_patch_first():
    # ties go to the larger side; no side below twice its divisor
    assert shrunk_patches([16, 32, 32], [4, 4, 4])[:4] == [
        [16, 28, 32],
        [16, 28, 28],
        [12, 28, 28],
        [12, 24, 28],
    ]
    assert shrunk_patches([8, 16, 16], [4, 8, 8]) == []
    # a side the network does not take stops shrinking; the others go on
    takes = lambda patch: patch[0] >= 12  # noqa: E731
    assert all(p[0] >= 12 for p in shrunk_patches([16, 32, 32], [4, 4, 4], takes))


def test_a_turned_plane_shrinks_as_one_square_side():
    # the embedded dataset turns the patch in its y-x plane: y and x go down together
    assert shrunk_patches([32, 64, 64], [16, 16, 16], tied=[[1, 2]]) == [
        [32, 48, 48],
        [32, 32, 32],
    ]
    # a tied side goes down by a multiple of both its axes' divisors
    assert shrunk_patches([16, 48, 48], [4, 8, 16], tied=[[1, 2]])[:2] == [
        [16, 32, 32],
        [12, 32, 32],
    ]
    every = shrunk_patches([16, 40, 40], [4, 8, 8], tied=[[1, 2]])
    assert every and all(p[1] == p[2] for p in every)


def test_the_planners_smaller_patches_keep_the_turned_plane_square(small):
    """The embedded dataset turns its patches in the y-x plane; a planned patch with y != x
    would stop train.py at start-up (``data.augment.rotate90_planes``)."""
    assert small.data.augment.rotate90_planes == [[1, 2]]  # the embedded dataset's default
    patches = Planner(plan_of(small), 1).smaller_patches([4, 4, 4])
    assert patches and all(p[1] == p[2] for p in patches)
    assert [16, 28, 28] in patches and [16, 28, 32] not in patches


def test_resident_state_over_the_budget_is_refused_with_its_bytes(small):
    net = build(small.model.net, "model.net")
    param_bytes = sum(p.numel() * p.element_size() for p in net.parameters())
    # float32 parameters, a gradient each and AdamW's two moments
    resident = 4 * param_bytes
    answer = fit_step(plan_of(small, checkpointing_options=OPTIONS), resident // 2)
    assert answer.candidate is None and answer.micro_batching is None
    assert answer.resident == pytest.approx(resident, rel=0.02)
    text = answer.refusal("X")
    assert "resident training state alone needs" in text
    assert f"{answer.resident / 2**20:,.1f} MiB" in text and "optimizer state" in text
    assert len(answer.tried) == 1  # nothing searched


@pytest.mark.slow
def test_refusal_names_every_lever_tried_with_the_least_it_needed(small):
    plan = plan_of(small, checkpointing_options=OPTIONS)
    resident = fit_step(plan, 1).resident
    budget = resident + 1024  # above what no lever lowers, below any step
    answer = fit_step(plan, budget)
    assert answer.candidate is None and answer.micro_batching is None
    text = answer.refusal("B")
    assert text.startswith("memory.budget=B: nothing fits")
    assert "activation_checkpointing none, all" in text
    # one estimate shows the loss checkpoint lowering nothing (it adds the logits it keeps):
    # no batch search with it
    assert "model.checkpoint_loss=true, not searched: it does not lower the step" in text
    assert "smaller patches at batch 2" in text and "down to 8x8x8" in text
    assert text.count("the least: ") == 3
    # each least is a real candidate's need, over the budget
    for part in text.split("the least: ")[1:]:
        assert float(part.split(" MiB")[0].replace(",", "")) * 2**20 > budget


@pytest.mark.slow
def test_a_smaller_patch_fits_where_no_batch_or_checkpointing_does(small, tmp_path):
    base = [
        estimate(small, batch_size=b, activation_checkpointing=o) for b in (1, 2) for o in OPTIONS
    ]
    # no batch or checkpointing at this patch, as the planner counts them (margin included)
    budget = min(planned_total(e) for e in base) - 1
    answer = fit_step(plan_of(small, checkpointing_options=OPTIONS), budget)
    assert answer.fallback == "a smaller patch"
    patch = answer.patch_size
    assert torch.Size(patch).numel() < 16 * 32 * 32 and answer.batch_size == 2
    settings = answer.candidate.settings()
    assert (settings["data.batch_size"], settings["data.patch_size"]) == (2, patch)
    assert answer.estimate["process_total"] <= budget
    assert planned_total(answer.next_step_estimate) > budget  # the next larger patch does not fit
    assert estimate(
        small, patch_size=patch, activation_checkpointing=answer.activation_checkpointing
    ).fits(budget)

    # plan.py's path: the patch is planned, with the lever that found it
    overrides = [*SMALL, f"memory.budget={budget}", "memory.checkpointing_options=[none,all]"]
    planned = make_plan(compose_config("train", tmp_path, overrides), fit_budget=True)
    decision = planned.decisions["data.patch_size"]
    assert decision.value == patch and decision.source == "planned"
    assert "a smaller patch" in decision.why
    with pytest.raises(BudgetExceeded, match="searches a batch, activation and loss"):
        make_plan(compose_config("train", tmp_path, overrides))  # train.py's path: refused
