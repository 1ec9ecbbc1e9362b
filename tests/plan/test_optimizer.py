"""``model.optimizer.lr=auto`` in the run plan: the rate as a decision (the rule itself:
tests/models/test_learning_rate.py)."""

from __future__ import annotations

import pytest

from tests.conftest import compose_config
from volseg.models.learning_rate import learning_rate
from volseg.plan import make_plan
from volseg.utils.errors import UserInputError

RULE = {"few_classes": 4, "lr_few": 0.003, "many_classes": 32, "lr_many": 0.02}


def test_background_counts_when_the_loss_includes_it():
    without = learning_rate("auto", RULE, num_classes=33, include_background=False)
    with_bg = learning_rate("auto", RULE, num_classes=32, include_background=True)
    assert without.value == with_bg.value == 0.02
    assert "32 foreground classes" in without.why


def test_a_configured_rate_is_kept_and_the_rule_leaves_the_optimizer(tmp_path):
    plan = make_plan(
        compose_config("train", tmp_path, ["num_classes=60", "model.optimizer.lr=0.001"]), False
    )
    decision = plan.decisions["model.optimizer.lr"]
    assert (decision.value, decision.source) == (0.001, "configured")
    optimizer = plan.run_config().model.optimizer
    assert optimizer.lr == 0.001 and "lr_by_classes" not in optimizer


@pytest.mark.parametrize(
    ("lr", "rule", "named"),
    [
        ("auto", None, "model.optimizer.lr_by_classes"),
        ("auto", {**RULE, "lr_many": -1}, "model.optimizer.lr_by_classes.lr_many"),
        ("auto", {**RULE, "many_classes": 2}, "many_classes=2"),
        ("auto", {"lr_few": 0.003}, "missing few_classes"),
        ("fast", RULE, "model.optimizer.lr=fast"),
        (0, RULE, "model.optimizer.lr=0"),
    ],
)
def test_bad_values_name_their_key(lr, rule, named):
    with pytest.raises(UserInputError, match=named.replace(".", r"\.")):
        learning_rate(lr, rule, num_classes=10, include_background=False)
