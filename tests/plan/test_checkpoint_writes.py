"""``async_checkpoint``: auto resolved once, in the plan, from the strategy of the real configs."""

from __future__ import annotations

import pytest

from tests.conftest import compose_config
from volseg.plan import make_plan
from volseg.plan.reconcile import plan_async_checkpoint
from volseg.utils.errors import UserInputError


def test_auto_is_planned_true_on_one_process_and_false_is_kept(tmp_path):
    cfg = compose_config("train", tmp_path, ["trainer.accelerator=cpu"])
    plan = make_plan(cfg, estimate_step=False)
    assert cfg.async_checkpoint == "auto"
    decision = plan.decisions["async_checkpoint"]
    assert (decision.value, decision.source) == (True, "planned")
    assert plan.run_config().async_checkpoint is True
    cfg = compose_config("train", tmp_path, ["trainer.accelerator=cpu", "async_checkpoint=false"])
    decision = make_plan(cfg, estimate_step=False).decisions["async_checkpoint"]
    assert (decision.value, decision.source) == (False, "configured")


@pytest.mark.parametrize(
    ("trainer", "expected"), [("ddp_sim", True), ("deepspeed", False), ("fsdp", False)]
)
def test_auto_follows_whether_the_strategy_saves_through_checkpoint_io(tmp_path, trainer, expected):
    strategy = compose_config("train", tmp_path, [f"trainer={trainer}"]).trainer.strategy
    assert plan_async_checkpoint("auto", strategy).value is expected


def test_true_with_a_strategy_that_writes_itself_and_a_bad_value_are_named(tmp_path):
    strategy = compose_config("train", tmp_path, ["trainer=deepspeed"]).trainer.strategy
    with pytest.raises(UserInputError, match=r"async_checkpoint=true: trainer.strategy=Deep"):
        plan_async_checkpoint(True, strategy)
    with pytest.raises(UserInputError, match=r"async_checkpoint=sometimes: expected auto"):
        plan_async_checkpoint("sometimes", "auto")
