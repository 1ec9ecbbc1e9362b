"""``model.optimizer.lr`` in the run plan (the rule: :mod:`volseg.models.learning_rate`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig

from volseg.models.learning_rate import LearningRate, learning_rate, resolve_learning_rate
from volseg.plan.run_plan import Decision


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
    """Plan ``cfg.model.optimizer.lr`` in place; ``None`` without one."""
    rate = resolve_learning_rate(cfg)
    return None if rate is None else _decision(rate)
