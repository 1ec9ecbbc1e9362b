"""User-facing errors: raised for bad input, reported as one clear message without a traceback."""

from __future__ import annotations


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


class BudgetExceeded(TrialPruned, UserInputError):
    """The configured run does not fit ``memory.budget``: pruned in a sweep; in a single run, one
    clear error and exit code 2 like any other :class:`UserInputError`."""
