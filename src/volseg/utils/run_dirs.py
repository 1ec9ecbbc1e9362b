"""``${unique_dir:PATH}``: run and sweep folders of their own (``_1``, ``_2``, ...)."""

from __future__ import annotations

import os
from pathlib import Path

from omegaconf import OmegaConf

RESOLVER = "unique_dir"
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


def register_run_dir_resolver() -> None:
    """Make ``${unique_dir:...}`` known to OmegaConf (cached: one folder per config)."""
    if not OmegaConf.has_resolver(RESOLVER):
        OmegaConf.register_new_resolver(RESOLVER, unique_dir, use_cache=True)
