"""The run plan: the composed config in, every ``auto`` resolved once, one frozen plan out.

:func:`plan_run` is what every entry point calls first; :func:`make_plan` the planning itself
(:mod:`volseg.plan.make`), :class:`RunPlan` its result (:mod:`volseg.plan.run_plan`).
"""

from __future__ import annotations

from omegaconf import DictConfig

from volseg.plan.files import inherit_sources, plan_from_file
from volseg.plan.make import make_plan
from volseg.plan.run_plan import PLAN_FILE, Decision, RunPlan

__all__ = ["PLAN_FILE", "Decision", "RunPlan", "make_plan", "plan_run", "planned_config"]


def plan_run(
    cfg: DictConfig, estimate_step: bool = True, fingerprint: bool = False, fit_budget: bool = False
) -> RunPlan:
    """The plan of the command ``cfg`` was composed from: ``plan=PATH`` trains the plan file
    (this command's dotted overrides on top), otherwise :func:`make_plan`."""
    if cfg.get("plan"):
        laid, saved = plan_from_file(cfg)
        planned = make_plan(laid, estimate_step, fingerprint, fit_budget)
        return inherit_sources(planned, saved, f"plan file {cfg.plan}")
    return make_plan(cfg, estimate_step, fingerprint, fit_budget)


def planned_config(cfg: DictConfig) -> DictConfig:
    """The config the builders read for the composed ``cfg``: every ``auto`` resolved (no step
    estimate), for scripts that build a module or estimate a step themselves (benchmarks)."""
    return make_plan(cfg, estimate_step=False).run_config()
