"""The configs' own resolvers: ``${unique_dir:PATH}`` (configs/hydra/default.yaml) and
``${epochs_unless_timed:N,${.max_time}}`` (configs/trainer/default.yaml)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

# tasks of one SLURM job (srun --ntasks=N, one per DDP rank) are one run: they share its folder
SHARED_RUN_ENV = "SLURM_NTASKS"


def unique_dir(path: str) -> str:
    """``path``, or ``path_1``, ``path_2``, ...: the first this call creates (``mkdir`` claims it,
    so two runs cannot share one). The tasks of one SLURM job share it."""
    if int(os.environ.get(SHARED_RUN_ENV, "1") or 1) > 1:
        return path
    base = Path(path)
    base.parent.mkdir(parents=True, exist_ok=True)
    candidate, n = base, 0
    while True:
        try:
            candidate.mkdir()
            return str(candidate)
        except FileExistsError:
            n += 1
            candidate = base.with_name(f"{base.name}_{n}")


def epochs_unless_timed(epochs: Any, max_time: Any) -> int:
    """``epochs`` for a run without ``trainer.max_time``; -1 (no epoch bound) with one: a run given
    a time budget trains for it, not for the default epoch count."""
    if max_time is None or str(max_time).strip().lower() in ("", "null", "none"):
        return int(epochs)
    return -1


def register_resolvers() -> None:
    """Make both known to OmegaConf (``unique_dir`` cached: one folder per config)."""
    OmegaConf.register_new_resolver("unique_dir", unique_dir, use_cache=True, replace=True)
    OmegaConf.register_new_resolver("epochs_unless_timed", epochs_unless_timed, replace=True)
