"""``plan_command(cfg)``: what ``python plan.py`` runs."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from volseg.plan import plan_run
from volseg.plan.report import format_fingerprint

log = logging.getLogger(__name__)


def plan_command(cfg: DictConfig) -> dict[str, Any]:
    """Fingerprint the dataset, plan the run (a step over ``memory.budget`` gets what the
    planner fits), print both and write ``plan.yaml`` into the run folder; returns the plan as
    plain data."""
    run_plan = plan_run(cfg, estimate_step=True, fingerprint=True, fit_budget=True)
    print(format_fingerprint(run_plan.fingerprint))
    print(run_plan.format())
    path = run_plan.write(Path(cfg.paths.output_dir))
    print(f"Wrote {path}; train it with: python train.py plan={path}")
    return run_plan.to_dict()
