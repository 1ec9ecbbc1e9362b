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
imports these names from here or from a room's ``__init__``, never a room's modules.
"""

from volseg.memory.estimate import (
    Candidate,
    InferenceEstimate,
    MemoryEstimate,
    RunEstimate,
    estimate_prediction,
    estimate_run,
    planned_device,
    planned_total,
    resolve_cuda_context,
    validation_shape,
)
from volseg.memory.fit import (
    ROI,
    STITCH_DEVICE,
    SW_BATCH,
    StitchPlan,
    fit_step,
    fit_validation,
    largest_batch,
    lever_prices,
    margin_note,
    plan_stitching,
)
from volseg.memory.monitor import MemoryMonitor

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
