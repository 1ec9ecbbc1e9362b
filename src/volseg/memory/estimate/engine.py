"""``estimate_run(plan, candidate)``: one build and one fake-tensor trace of a planned run answer
its training step (peak by category and module, FLOPs) and then its validation, which starts
from what training leaves. A :class:`Candidate` is what a planner weighs.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from omegaconf import DictConfig, OmegaConf

from volseg.memory.estimate.candidate import Candidate
from volseg.memory.estimate.inference_pass import (
    InferenceEstimate,
    allocator_settings,
    validation_phase,
    whole_volume,
)
from volseg.memory.estimate.margins import Margin
from volseg.memory.estimate.training_step import (
    MemoryEstimate,
    estimate_step,
    fake_step,
    planned_precision,
    trace_steps,
)
from volseg.memory.estimate.workspace import RULES
from volseg.speed.step_time import StepWork

#: answers kept for repeated questions (the planner asks for a candidate's memory, then its time)
CACHED_RUNS = 32


@dataclass
class RunEstimate:
    """One candidate of a planned run, from one trace."""

    step: MemoryEstimate
    flops_per_step: int
    work: StepWork
    validation: InferenceEstimate | None = None


class PlannedRun(Protocol):
    """What the engine reads of a :class:`volseg.plan.RunPlan` (memory/ does not import plan/):
    its config with a candidate applied."""

    def run_config(self, candidate: Candidate | None = None) -> DictConfig: ...


_runs: OrderedDict[tuple, RunEstimate] = OrderedDict()


def estimate_run(
    plan: PlannedRun,
    candidate: Candidate | None = None,
    validation_shape: Sequence[int] | None = None,
) -> RunEstimate:
    """``plan``'s run as ``candidate`` changes it, and its validation of one
    ``validation_shape`` ``[D, H, W]`` volume where given. A run asked again is answered from its
    cached trace."""
    cfg = plan.run_config(candidate)
    shape = None if validation_shape is None else tuple(whole_volume(validation_shape))
    run_key = (OmegaConf.to_yaml(cfg), repr(RULES))
    found = _runs.get((*run_key, shape))
    if found is None and shape is None:
        found = next((r for k, r in _runs.items() if k[:-1] == run_key), None)
    if found is None:
        found = _trace(cfg, shape)
        _runs[(*run_key, shape)] = found
        while len(_runs) > CACHED_RUNS:
            _runs.popitem(last=False)
    return found


def _trace(cfg: DictConfig, shape: tuple[int, ...] | None) -> RunEstimate:
    started = time.perf_counter()
    settings = cfg.get("memory")  # cuda_context_mib and gpu
    device, mode, step = fake_step(cfg)
    precision = planned_precision(cfg)
    allocator = allocator_settings(cfg)
    phase = None if shape is None else validation_phase(cfg, step, device, shape)
    trace = trace_steps(step, mode, device, None if phase is None else phase.then)
    est = estimate_step(step, mode, device, precision, settings, started, allocator, trace)
    validation = None
    if phase is not None:
        validation = phase.estimate(trace, precision, settings, allocator, started)
        if device == "cuda":  # validation's reserved peak rests on the step's replay
            validation.set_margin(Margin(est.margin, est.margin_source, est.margin_fixed_mib))
    return RunEstimate(est, trace.flops, trace.work, validation)
