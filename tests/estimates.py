"""The engine's answers for a planned config, as tests ask them: :func:`volseg.memory.estimate_run`
of ``RunPlan(cfg, {})`` with a :class:`~volseg.memory.Candidate`; :func:`plan_of` the plan the
searches (``fit_step``, ``Planner``, ``lever_prices``) take."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from omegaconf import DictConfig

from volseg.memory import Candidate, InferenceEstimate, MemoryEstimate, RunEstimate, estimate_run
from volseg.plan import RunPlan, applied


def plan_of(cfg: DictConfig, **memory: Any) -> RunPlan:
    """The planned ``cfg`` as a :class:`RunPlan`, each ``memory.<key>`` of ``memory`` set (the
    searches' options: ``checkpointing_options``, ``max_batch_size``)."""
    return RunPlan(applied(cfg, {f"memory.{key}": value for key, value in memory.items()}), {})


def run_of(
    cfg: DictConfig, candidate: Candidate | None = None, shape: Sequence[int] | None = None
) -> RunEstimate:
    """The planned ``cfg``'s run as ``candidate`` changes it (validation of ``shape``)."""
    return estimate_run(RunPlan(cfg, {}), candidate, shape)


def estimate(cfg: DictConfig, **candidate: Any) -> MemoryEstimate:
    """The training step of the planned ``cfg`` as ``Candidate(**candidate)`` changes it."""
    return run_of(cfg, Candidate(**candidate)).step


def estimate_validation(cfg: DictConfig, shape: Sequence[int]) -> InferenceEstimate:
    """Validating one ``[D, H, W]`` volume after the planned ``cfg``'s training steps."""
    validation = run_of(cfg, None, shape).validation
    assert validation is not None
    return validation
