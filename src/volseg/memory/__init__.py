"""Everything about bytes, in three rooms:

- :mod:`~volseg.memory.estimate`: what a run needs. One build and one fake-tensor trace of a
  planned run give one ledger of allocations and frees (``events``); every figure is read off
  it: peak by category and per module, the allocator's reserved bytes, FLOPs, validation.
  Public call: :func:`~volseg.memory.estimate.estimate_run` of a :class:`Candidate`.
- :mod:`~volseg.memory.fit`: the largest run that fits a budget. One search
  (``fit.search``) serves the step's planner and the validation planner.
  Public call: :func:`~volseg.memory.fit.fit_step`.
- :mod:`~volseg.memory.monitor`: what a training run measures (allocated, reserved, peaks,
  per layer, snapshots, the OOM report, charts). Public call:
  :class:`~volseg.memory.monitor.MemoryMonitor`.

Imports point one way inside: monitor and fit read estimate; estimate reads neither. The levers
that cut memory are applied by the model: :mod:`volseg.models.levers`. Outside memory/, code
imports these names from here, never from a room.
"""

from volseg.memory.estimate.candidate import Candidate
from volseg.memory.estimate.cuda_context import resolve_cuda_context
from volseg.memory.estimate.engine import RunEstimate, estimate_run
from volseg.memory.estimate.inference_pass import (
    InferenceEstimate,
    estimate_prediction,
    validation_shape,
)
from volseg.memory.estimate.margins import planned_total
from volseg.memory.estimate.training_step import MemoryEstimate, planned_device
from volseg.memory.fit.inference_fit import (
    ROI,
    STITCH_DEVICE,
    SW_BATCH,
    StitchPlan,
    fit_validation,
    margin_note,
    plan_stitching,
)
from volseg.memory.fit.lever_prices import lever_prices
from volseg.memory.fit.step_fit import fit_step, largest_batch
from volseg.memory.monitor.callback import MemoryMonitor

__all__ = [
    "ROI",
    "STITCH_DEVICE",
    "SW_BATCH",
    "Candidate",
    "InferenceEstimate",
    "MemoryEstimate",
    "MemoryMonitor",
    "RunEstimate",
    "StitchPlan",
    "estimate_prediction",
    "estimate_run",
    "fit_step",
    "fit_validation",
    "largest_batch",
    "lever_prices",
    "margin_note",
    "plan_stitching",
    "planned_device",
    "planned_total",
    "resolve_cuda_context",
    "validation_shape",
]
