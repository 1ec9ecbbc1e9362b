"""``plan_command(cfg)``: what ``python plan.py`` runs."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from volseg.plan import plan_run

log = logging.getLogger(__name__)


def format_fingerprint(fingerprint: dict[str, Any] | None) -> str:
    """The dataset's fingerprint as the lines ``plan.py`` prints."""
    if not fingerprint:
        return "Dataset fingerprint: none (no data read)"
    resampled = fingerprint.get("shapes_resampled_to")
    grid = f" on the data.spacing={resampled} grid" if resampled else ""
    return "\n".join(
        [
            f"Dataset fingerprint: {fingerprint['cases']} cases",
            f"  median shape [D, H, W] {fingerprint['median_shape']}{grid} (smallest "
            f"{fingerprint['min_shape']}, largest {fingerprint['max_shape']})",
            f"  median spacing [z, y, x] {fingerprint['median_spacing']}",
        ]
    )


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
