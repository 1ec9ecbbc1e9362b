"""``data.batch_size=auto``: the largest batch that fits ``memory.budget``, from estimates; the
planner keeps that batch as configured and does not keep one more. A plan whose effective batch
differs from the configured one says so, and a planned batch of one with BatchNorm is warned of."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import open_dict

from tests.conftest import compose_config, tiny_train_overrides
from volseg.memory.estimate.engine import estimate
from volseg.plan import make_plan
from volseg.plan.make import _batch_notes
from volseg.plan.run_plan import Decision
from volseg.utils.errors import UserInputError


def _overrides(data: Path, *more: str) -> list[str]:
    return [*tiny_train_overrides(data), "trainer.precision=32", *more]


@pytest.mark.slow  # ~80 s on 2 cores: a dozen estimates
def test_auto_is_a_batch_the_planner_keeps_and_one_more_it_does_not(small_dataset, tmp_path):
    cfg = compose_config("train", tmp_path, _overrides(small_dataset, "data.batch_size=1"))
    planned = make_plan(cfg, estimate_step=False).run_config()
    # a budget between what batches 2 and 3 need, as the planner counts them (a CPU: the
    # process total plus the margin on the step's growth)
    two, three = (estimate(planned, batch_size=b) for b in (2, 3))
    budget = (two.total_within(10**15) + three.total_within(10**15)) // 2
    assert two.fits(budget) and not three.fits(budget)

    def plan(batch: str):
        overrides = _overrides(small_dataset, f"data.batch_size={batch}", f"memory.budget={budget}")
        return make_plan(compose_config("train", tmp_path, overrides), fit_budget=True)

    auto = plan("auto")
    assert auto.value("data.batch_size") == 2
    assert auto.decisions["data.batch_size"].source == "planned"
    rows = {r["batch_size"]: r["fits"] for r in auto.estimate["batch_size_auto"]["rows"]}
    assert rows[2] and not rows[3]  # the table that decided it, in plan.yaml's estimate
    assert "data.batch_size=auto against memory.budget=" in auto.format()

    kept = plan("2")
    assert kept.decisions["data.batch_size"].source == "configured"
    assert kept.value("trainer.accumulate_grad_batches") == 1
    one_more = plan("3")
    assert (
        one_more.decisions["data.batch_size"].source,
        one_more.decisions["trainer.accumulate_grad_batches"].source,
    ) != ("configured", "configured")


def test_auto_without_a_budget_on_a_cpu_is_one_line(small_dataset, tmp_path):
    cfg = compose_config("train", tmp_path, _overrides(small_dataset, "data.batch_size=auto"))
    with pytest.raises(UserInputError, match=r"^data.batch_size=auto fills a memory budget: set"):
        make_plan(cfg)


def test_a_changed_effective_batch_is_said_and_one_sample_with_batch_norm_warned(tmp_path):
    cfg = compose_config("train", tmp_path, ["model=unet_small", "data.batch_size=1"])
    with open_dict(cfg):
        cfg.trainer.accumulate_grad_batches = 2
    notes = _batch_notes(cfg, (4, 1), {"data.batch_size": Decision(1, "planned")})
    assert notes[0].startswith("effective batch 2 (data.batch_size=1 x ")
    assert "not the configured 4" in notes[0]
    assert "with BatchNorm" in notes[1]
    same = _batch_notes(cfg, (2, 1), {"data.batch_size": Decision(1, "configured")})
    assert same == []
    cfg = compose_config("train", tmp_path, ["model=unet_small_gn", "data.batch_size=1"])
    assert _batch_notes(cfg, (1, 1), {"data.batch_size": Decision(1, "planned")}) == []
