"""Helpers every other package may use: config values, errors, units, precision, run dirs."""

__all__ = [
    "checkpoint",
    "config",
    "cpu",
    "entry",
    "errors",
    "instantiate",
    "loggers",
    "precision",
    "run_dirs",
    "sweep",
    "units",
]
