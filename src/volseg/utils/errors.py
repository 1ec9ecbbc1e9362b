"""User-facing errors: raised for bad input, reported as one clear message without a traceback."""

from __future__ import annotations

import re


class UserInputError(Exception):
    """A problem with the user's files or config, named with the fix."""

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        self.problems = problems or []
        super().__init__("\n".join([message, *(f"  - {p}" for p in self.problems)]))


class TrialPruned(Exception):
    """A sweep job stopped on purpose (over budget): pruned, the sweep goes on."""


class TrainingDiverged(FloatingPointError):
    """The training loss became NaN or Inf: the run stops, exit code 1."""


class BudgetExceeded(TrialPruned, UserInputError):
    """The run does not fit ``memory.budget``: pruned in a sweep, else exit code 2."""


def raise_problems(problems: list[str], where: str) -> None:
    """One :class:`UserInputError` listing ``problems`` found in ``where``; nothing for none."""
    if problems:
        raise UserInputError(f"{len(problems)} problem(s) in {where}:", problems)


def at_config_key(message: str, node: str) -> UserInputError:
    """A component's complaint about its own parameter (``pooling must be ...``) naming the config
    key under ``node``; one naming a dotted key already is kept."""
    if re.match(r"[A-Za-z_]\w*\.\w", message):
        return UserInputError(message)
    return UserInputError(f"{node}.{message}")


def causes(err: BaseException | None) -> list[BaseException]:
    """``err`` and the errors it was raised from (``raise ... from``), outermost first."""
    chain: list[BaseException] = []
    while err is not None and err not in chain:
        chain.append(err)
        err = err.__cause__
    return chain
