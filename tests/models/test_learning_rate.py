"""``model.optimizer.lr=auto``: the rule, and the rate the plan sets in the run's config."""

from __future__ import annotations

import pytest

from tests.conftest import compose_config, planned_config
from volseg.models.learning_rate import lr_for_classes, resolve_learning_rate

RULE = {"few_classes": 4, "lr_few": 0.003, "many_classes": 32, "lr_many": 0.02}


@pytest.mark.parametrize(
    ("classes", "expected"),
    [
        (1, 0.003),
        (4, 0.003),
        (32, 0.02),
        (83, 0.02),
        # 16 is two thirds of the way from 4 to 32 in log scale
        (16, 0.003 * (0.02 / 0.003) ** (2 / 3)),
    ],
)
def test_few_and_many_classes_get_their_rates_and_log_linear_between(classes, expected):
    assert lr_for_classes(classes, RULE) == pytest.approx(expected, rel=1e-9)


def test_an_auto_rate_is_planned_and_the_rule_leaves_the_optimizer(tmp_path):
    """The optimizer must build, so in the planned config ``lr`` is a number and
    ``lr_by_classes`` is no argument of it; the rule's rate is read, the config left as it was."""
    overrides = ["num_classes=60", "model.optimizer.lr=auto"]
    cfg = compose_config("train", tmp_path, overrides)
    rate = resolve_learning_rate(cfg)
    assert rate.value == 0.02  # 59 foreground classes: lr_many
    assert "59 foreground classes" in rate.why
    assert cfg.model.optimizer.lr == "auto" and "lr_by_classes" in cfg.model.optimizer
    planned = planned_config("train", tmp_path, overrides)
    assert planned.model.optimizer.lr == rate.value
    assert "lr_by_classes" not in planned.model.optimizer
