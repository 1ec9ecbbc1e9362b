"""``model.optimizer.lr=auto``: the learning rate from the number of foreground classes, by the rule
``model.optimizer.lr_by_classes``: ``lr_few`` up to ``few_classes``, ``lr_many`` from
``many_classes``, log-linear between. Many-class tasks learn their regions one after another and
need a higher rate in a short budget (docs/benchmarks.md, "Learning")."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple

from omegaconf import DictConfig, OmegaConf

from volseg.utils.config import plain
from volseg.utils.errors import UserInputError

RULE_KEY = "model.optimizer.lr_by_classes"
RULE_FIELDS = ("few_classes", "lr_few", "many_classes", "lr_many")


class LearningRate(NamedTuple):
    """A resolved ``model.optimizer.lr``; ``why``: from what, empty for a configured number."""

    value: float
    why: str = ""


def _positive(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise UserInputError(f"{key}={value}: expected a number > 0")
    return float(value)


def lr_for_classes(foreground_classes: int, rule: Mapping[str, Any]) -> float:
    """The rule's learning rate for ``foreground_classes`` (see the module docstring)."""
    missing = [k for k in RULE_FIELDS if k not in rule]
    if missing:
        raise UserInputError(f"{RULE_KEY}: missing {', '.join(missing)} (needs {RULE_FIELDS})")
    few, lr_few, many, lr_many = (_positive(rule[k], f"{RULE_KEY}.{k}") for k in RULE_FIELDS)
    if many <= few:
        raise UserInputError(
            f"{RULE_KEY}: many_classes={rule['many_classes']} must be above "
            f"few_classes={rule['few_classes']}"
        )
    if foreground_classes <= few:
        return lr_few
    if foreground_classes >= many:
        return lr_many
    share = math.log(foreground_classes / few) / math.log(many / few)
    return lr_few * (lr_many / lr_few) ** share


def learning_rate(
    lr: Any, rule: Mapping[str, Any] | None, num_classes: int, include_background: bool
) -> LearningRate:
    """A configured number as it is; ``auto`` from the rule for the foreground classes."""
    if str(lr) != "auto":
        return LearningRate(_positive(lr, "model.optimizer.lr"))
    if rule is None:
        raise UserInputError(f"model.optimizer.lr=auto needs {RULE_KEY} ({', '.join(RULE_FIELDS)})")
    classes = num_classes if include_background else num_classes - 1
    return LearningRate(
        lr_for_classes(classes, rule), f"{classes} foreground classes: {RULE_KEY} {dict(rule)}"
    )


def resolve_learning_rate(cfg: DictConfig) -> LearningRate | None:
    """``cfg.model.optimizer.lr`` as a number (the plan sets it, and takes the rule out of the
    optimizer's arguments); ``None`` without an optimizer with a learning rate."""
    optimizer = OmegaConf.select(cfg, "model.optimizer")
    if not isinstance(optimizer, DictConfig) or "lr" not in optimizer or "num_classes" not in cfg:
        return None
    rule = optimizer.get("lr_by_classes")
    return learning_rate(
        optimizer.lr,
        plain(rule) if rule is not None else None,
        int(cfg.num_classes),
        bool(OmegaConf.select(cfg, "model.include_background", default=False)),
    )
