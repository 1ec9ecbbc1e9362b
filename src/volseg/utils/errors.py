"""User-facing errors: raised for bad input, reported as one clear message without a traceback."""

from __future__ import annotations

import re


class UserInputError(Exception):
    """A problem with the user's files or config. The message names the file or key and the fix.

    Several problems can be reported together: ``problems`` holds one line each.
    """

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        self.problems = problems or []
        lines = [message, *(f"  - {p}" for p in self.problems)]
        super().__init__("\n".join(lines))


class TrialPruned(Exception):
    """A sweep job stopped on purpose, not broken: e.g. its estimated memory exceeds the budget.

    In a multirun its row in ``sweep_summary.csv`` says ``pruned`` (not ``failed``) and the sweep
    goes on; the Optuna sweeper gets no value for it (a ``FAIL`` trial its sampler ignores).
    """


class TrainingDiverged(FloatingPointError):
    """The training loss became NaN or Inf: the run stops (the optimizer's next steps would
    poison every weight). Not the input's fault: one clear error and exit code 1."""


class BudgetExceeded(TrialPruned, UserInputError):
    """The configured run does not fit ``memory.budget``: pruned in a sweep; in a single run, one
    clear error and exit code 2 like any other :class:`UserInputError`."""


def raise_problems(problems: list[str], where: str) -> None:
    """Raise one :class:`UserInputError` listing ``problems`` (one line each) found in ``where``
    (e.g. ``the dataset``); nothing when the list is empty."""
    if problems:
        raise UserInputError(f"{len(problems)} problem(s) in {where}:", problems)


def at_config_key(message: str, node: str) -> UserInputError:
    """A component's complaint about one of its own parameters (the message starts with its
    name: ``pooling must be ...``) as a :class:`UserInputError` naming the config key under
    ``node`` (``model.net.pooling must be ...``). A message that starts with a dotted config key
    (``data.patch_size=...``) names it already and is kept."""
    if re.match(r"[A-Za-z_]\w*\.\w", message):
        return UserInputError(message)
    return UserInputError(f"{node}.{message}")
