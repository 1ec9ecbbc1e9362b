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
