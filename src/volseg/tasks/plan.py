"""``plan_command(cfg)``: what ``python plan.py`` runs."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from volseg.memory import lever_prices
from volseg.plan import applied, make_plan, plan_run
from volseg.plan.report import format_fingerprint, format_lever_prices
from volseg.utils.errors import BudgetExceeded

log = logging.getLogger(__name__)


def plan_command(cfg: DictConfig) -> dict[str, Any]:
    """Fingerprint, plan (fitted to ``memory.budget``), print, write ``plan.yaml``."""
    try:
        run_plan = plan_run(cfg, estimate_step=True, fingerprint=True, fit_budget=True)
    except BudgetExceeded:
        print_lever_prices(cfg)
        raise
    print(format_fingerprint(run_plan.fingerprint))
    print(run_plan.format())
    path = run_plan.write(Path(cfg.paths.output_dir))
    print(f"Wrote {path}; train it with: python train.py plan={path}")
    return run_plan.to_dict()


def print_lever_prices(cfg: DictConfig) -> None:
    """Nothing fits ``memory.budget``: every lever with its price, before the refusal."""
    unbounded = {"memory.budget": None}
    for key, unplanned in (("data.batch_size", 1), ("model.activation_checkpointing", "none")):
        if str(OmegaConf.select(cfg, key)) == "auto":
            unbounded[key] = unplanned
    try:
        unbounded_plan = make_plan(applied(cfg, unbounded), estimate_step=False)
        print(format_lever_prices(lever_prices(unbounded_plan)))
    except Exception as err:  # the refusal that follows is the answer; the table is a help
        log.info("the lever table was not made: %s", err)
