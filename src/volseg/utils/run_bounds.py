"""``${epochs_unless_timed:N,${.max_time}}``: the default epoch bound gives way to a time bound."""

from __future__ import annotations

from typing import Any

from omegaconf import OmegaConf

RESOLVER = "epochs_unless_timed"


def epochs_unless_timed(epochs: Any, max_time: Any) -> int:
    """``epochs`` for a run without ``trainer.max_time``; -1 (no epoch bound) with one: a run given
    a time budget trains for it, not for the default epoch count."""
    if max_time is None or str(max_time).strip().lower() in ("", "null", "none"):
        return int(epochs)
    return -1


def register_run_bounds_resolver() -> None:
    """Make ``${epochs_unless_timed:...}`` known to OmegaConf."""
    if not OmegaConf.has_resolver(RESOLVER):
        OmegaConf.register_new_resolver(RESOLVER, epochs_unless_timed)
