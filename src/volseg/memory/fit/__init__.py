"""The largest run that fits a budget, each answer a :class:`~volseg.memory.estimate.Candidate`:
:func:`fit_step` the training step's, :func:`largest_batch` ``data.batch_size=auto``'s,
:func:`fit_validation` validation's and :func:`plan_stitching` prediction's, through the searches
in ``search``; :func:`lever_prices` prices each lever. Every candidate is answered by
:mod:`volseg.memory.estimate`."""

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

__all__ = [
    "ROI",
    "STITCH_DEVICE",
    "SW_BATCH",
    "StitchPlan",
    "fit_step",
    "fit_validation",
    "largest_batch",
    "lever_prices",
    "margin_note",
    "plan_stitching",
]
