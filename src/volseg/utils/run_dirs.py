"""Run and sweep folders of their own: ``${unique_dir:PATH}`` in ``configs/hydra/default.yaml``.

Folders are named by the second they start (``2026-01-31_12-00-00``); a second run started in
the same second gets ``<name>_1`` (then ``_2``, ...) instead of sharing, and overwriting, the
first one's files.
"""

from __future__ import annotations

import os
from pathlib import Path

from omegaconf import OmegaConf

RESOLVER = "unique_dir"
# tasks of one SLURM job (srun --ntasks=N, one per DDP rank) are one run: they share its folder
SHARED_RUN_ENV = "SLURM_NTASKS"


def unique_dir(path: str) -> str:
    """``path``, or ``path_1``, ``path_2``, ... : the first that this call creates.

    Creating the folder claims it (``mkdir`` fails for all but one of two processes), so two
    runs started together cannot end up in one folder. Within one job every resolution returns
    the same folder: Hydra's resolver cache is copied into each job's config.
    """
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
