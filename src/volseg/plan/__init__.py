"""The run plan: every ``auto`` resolved once (:func:`plan_run`, every entry point)."""

from __future__ import annotations

from omegaconf import DictConfig

from volseg.plan.files import inherit_sources, plan_from_file
from volseg.plan.make import make_plan
from volseg.plan.run_plan import PLAN_FILE, Decision, RunPlan, applied

__all__ = ["PLAN_FILE", "Decision", "RunPlan", "applied", "make_plan", "plan_run", "planned_config"]


def plan_run(
    cfg: DictConfig, estimate_step: bool = True, fingerprint: bool = False, fit_budget: bool = False
) -> RunPlan:
    """The command's plan: ``plan=PATH``'s with this command's overrides, else made."""
    if cfg.get("plan"):
        laid, saved = plan_from_file(cfg)
        planned = make_plan(laid, estimate_step, fingerprint, fit_budget)
        return inherit_sources(planned, saved, f"plan file {cfg.plan}")
    return make_plan(cfg, estimate_step, fingerprint, fit_budget)


def planned_config(cfg: DictConfig) -> DictConfig:
    """The config the builders read (every ``auto`` resolved, no step estimate), for scripts."""
    return make_plan(cfg, estimate_step=False).run_config()
