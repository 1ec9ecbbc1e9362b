"""``hydra.sweeper.params`` and sweep overrides on the command line as an Optuna search space.

The grammar is Hydra's override grammar: ``choice(a, b, ...)`` is categorical; ``range(a, b)``
and ``range(a, b, step)`` are integers (floats when any bound or the step is a float) from ``a``
up to, not including, ``b``, as in a plain Hydra multirun; ``interval(a, b)`` is uniform on
``[a, b]`` (floats: Hydra's grammar makes the bounds floats); ``tag(log, interval(a, b))`` is
log-uniform; any
other value is fixed (passed to every trial as written).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import (
    ChoiceSweep,
    IntervalSweep,
    Override,
    RangeSweep,
    Transformer,
)
from omegaconf import OmegaConf
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from volseg.utils.errors import UserInputError

GRAMMAR = (
    "choice(a, b, ...), range(start, stop[, step]), interval(low, high), "
    "tag(log, interval(low, high)) or a fixed value"
)


@dataclass
class SearchSpace:
    """What each trial draws (``distributions``, by override key) and what it gets as is
    (``fixed``: whole override lines). ``choice_overrides`` maps each categorical choice, as
    Optuna stores it, to the override value that sets it (a list choice is stored as the string
    ``[8,16]``, and a string choice must be escaped on the command line)."""

    distributions: dict[str, BaseDistribution] = field(default_factory=dict)
    fixed: dict[str, str] = field(default_factory=dict)
    choice_overrides: dict[str, dict[Any, str]] = field(default_factory=dict)
    #: where each key was given, for errors: ``hydra.sweeper.params.KEY`` or the override line
    where: dict[str, str] = field(default_factory=dict)

    def overrides(self, params: Mapping[str, Any]) -> list[str]:
        """The override lines of a trial whose drawn values are ``params``."""
        lines = list(self.fixed.values())
        for key, value in params.items():
            if key in self.choice_overrides:
                lines.append(f"{key}={self.choice_overrides[key][value]}")
            else:
                lines.append(f"{key}={value}")
        return lines


def parse_search_space(params: Mapping[str, Any], arguments: Sequence[str]) -> SearchSpace:
    """The search space of ``params`` (``hydra.sweeper.params``: key -> expression) and the
    command line's ``arguments`` (where a key is given twice, the command line wins)."""
    parser = OverridesParser.create()
    space = SearchSpace()
    lines = [
        (f"hydra.sweeper.params.{key}", f"{key}={_as_override_value(value)}")
        for key, value in params.items()
    ]
    lines += [(line, line) for line in arguments]
    for where, line in lines:
        try:
            (override,) = parser.parse_overrides([line])
        except Exception as err:
            raise UserInputError(
                f"{where}: {line.split('=', 1)[-1]!r} is not a search space ({GRAMMAR}): "
                f"{_first_line(err)}"
            ) from None
        key = override.get_key_element()
        space.distributions.pop(key, None)
        space.fixed.pop(key, None)
        space.choice_overrides.pop(key, None)
        space.where[key] = where
        if not override.is_sweep_override():
            space.fixed[key] = line
            continue
        space.distributions[key] = distribution(override, where)
        if isinstance(space.distributions[key], CategoricalDistribution):
            space.choice_overrides[key] = {
                Transformer.encode(x): Transformer.str(x) for x in _elements(override)
            }
    return space


def distribution(override: Override, where: str) -> BaseDistribution:
    """The Optuna distribution of one sweep override (``where`` names it in errors)."""
    value = override.value()
    if isinstance(value, ChoiceSweep) or (isinstance(value, RangeSweep) and value.shuffle):
        choices = [Transformer.encode(x) for x in _elements(override)]
        if "log" in value.tags:
            raise UserInputError(f"{where}: tag(log, ...) takes interval(low, high), not choice")
        return CategoricalDistribution(choices)
    if isinstance(value, RangeSweep):
        start, stop, step = value.start, value.stop, value.step
        if "log" in value.tags:
            raise UserInputError(f"{where}: tag(log, ...) takes interval(low, high), not range")
        if step == 0 or (stop - start) * step <= 0:
            raise UserInputError(f"{where}: range({start}, {stop}, {step}) holds no value")
        # Hydra's range stops before `stop`; Optuna's high is the last value drawn
        count = math.ceil(round((stop - start) / step, 9))
        last = start + (count - 1) * step
        if any(isinstance(x, float) for x in (start, stop, step)):
            return FloatDistribution(min(start, last), max(start, last), step=abs(step))
        return IntDistribution(min(start, last), max(start, last), step=abs(step))
    if isinstance(value, IntervalSweep):
        low, high, log = value.start, value.end, "log" in value.tags
        unknown = set(value.tags) - {"log"}
        if unknown:
            raise UserInputError(f"{where}: unknown tag {sorted(unknown)} (the one tag is log)")
        if not low < high:
            raise UserInputError(f"{where}: interval({low}, {high}) needs low < high")
        if log and low <= 0:
            raise UserInputError(f"{where}: tag(log, interval({low}, {high})) needs low > 0")
        return FloatDistribution(float(low), float(high), log=log)
    raise UserInputError(f"{where}: {override.get_value_string()!r} is not one of {GRAMMAR}")


def _elements(override: Override) -> list[Any]:
    """The parsed values of a choice or range sweep, in order."""
    return list(override.sweep_iterator(transformer=Transformer.identity))


def _as_override_value(value: Any) -> str:
    """A value of ``hydra.sweeper.params`` as the right side of an override (a number or list
    written in YAML rather than as a string)."""
    if isinstance(value, str):
        return value
    if OmegaConf.is_config(value):
        value = OmegaConf.to_container(value, resolve=True)
    return Transformer.str(value)


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
