"""``model.optimizer.lr=auto`` in the run plan: the rate from the foreground class count
(the rule, ``model.optimizer.lr_by_classes``, is :mod:`volseg.models.learning_rate`'s), recorded
as a :class:`~volseg.plan.run_plan.Decision`: ``configured`` for a number, ``planned`` from the
rule."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig

from volseg.models.learning_rate import (
    RULE_FIELDS,
    RULE_KEY,
    LearningRate,
    learning_rate,
    lr_for_classes,
    resolve_learning_rate,
)
from volseg.plan.run_plan import Decision

__all__ = ["RULE_FIELDS", "RULE_KEY", "apply_learning_rate", "lr_for_classes", "plan_learning_rate"]


def _decision(rate: LearningRate) -> Decision:
    if rate.why:
        return Decision(rate.value, "planned", rate.why)
    return Decision(rate.value, "configured")


def plan_learning_rate(
    lr: Any, rule: Mapping[str, Any] | None, num_classes: int, include_background: bool
) -> Decision:
    """``model.optimizer.lr`` as a decision (:func:`volseg.models.learning_rate.learning_rate`)."""
    return _decision(learning_rate(lr, rule, num_classes, include_background))


def apply_learning_rate(cfg: DictConfig) -> Decision | None:
    """Plan ``cfg.model.optimizer.lr`` in place and take the rule out of the optimizer's
    arguments (:func:`volseg.models.learning_rate.resolve_learning_rate`); ``None`` when ``cfg``
    has no optimizer with a learning rate."""
    rate = resolve_learning_rate(cfg)
    return None if rate is None else _decision(rate)
