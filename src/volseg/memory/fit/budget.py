"""``memory.budget``: refuse a run whose estimated training step or validation does not fit,
before any work."""

from __future__ import annotations

import logging

from volseg.memory.estimate.inference import InferenceEstimate
from volseg.memory.estimate.margins import margin_text
from volseg.memory.estimate.step import MemoryEstimate
from volseg.memory.fit.inference import margin_note
from volseg.utils.errors import BudgetExceeded
from volseg.utils.units import MIB, parse_bytes

log = logging.getLogger(__name__)


def step_margin_note(est: MemoryEstimate) -> str:
    """How a training step's budget is counted: the planner's margin on CUDA's reserved peak or
    on a CPU step's growth, and where it comes from (``""``: no margin)."""
    if not (est.margin or est.margin_fixed_mib):
        return ""
    if est.device == "cpu":
        return (
            f" plus a margin of {margin_text(est)} of its growth "
            f"({est.step_peak_growth / MIB:,.1f} MiB), the CPU margin of its kind: "
            f"{est.margin_source}"
        )
    return (
        f" with a margin of {margin_text(est)} on the reserved peak: the estimate's largest "
        f"shortfall on a recorded GPU run, {est.margin_source}"
    )


def check_estimate_fits(est: MemoryEstimate, budget_value: str) -> int:
    """The predicted process total of ``est`` within ``memory.budget=budget_value``; raises
    :class:`BudgetExceeded` when it does not fit (a sweep records the job as pruned)."""
    budget = parse_bytes(budget_value, "memory.budget")
    total = est.total_within(budget)
    if total is None:
        raise BudgetExceeded(
            f"memory.budget={budget_value}: the estimated training step needs "
            f"{est.process_total / MIB:,.0f} MiB on {est.device} (peak allocated "
            f"{est.peak_allocated / MIB:,.0f} MiB){step_margin_note(est)}, over "
            f"{budget / MIB:,.0f} MiB. "
            "`python plan.py <the same overrides>` searches a batch, activation and loss "
            "checkpointing, micro-batches and a smaller patch that fit"
        )
    log.info(
        "memory.budget=%s: the estimated step needs %s MiB on %s, it fits",
        budget_value,
        f"{total / MIB:,.0f}",
        est.device,
    )
    return total


def check_validation_fits(
    est: InferenceEstimate,
    budget_value: str,
    shape_from: str,
    tried: str = "",
    hint: str = "",
) -> int:
    """The predicted process total of the run's validation ``est`` (of its largest volume, from
    ``shape_from``) within ``memory.budget=budget_value``; raises :class:`BudgetExceeded` in one
    line when it does not fit (``tried``: the other settings estimated, with what each needs;
    ``hint``: what else may help)."""
    budget = parse_bytes(budget_value, "memory.budget")
    total = est.total_within(budget)
    shape = "x".join(map(str, est.volume_shape))
    if total is None:
        even = f"; tried {tried}" if tried else ""
        raise BudgetExceeded(
            f"memory.budget={budget_value}: the estimated validation of one {shape} volume "
            f"({shape_from}) needs {est.process_total / MIB:,.0f} MiB on {est.device} (peak "
            f"allocated {est.peak_allocated / MIB:,.0f} MiB){margin_note(est)}, over "
            f"{budget / MIB:,.0f} MiB{even}{'. ' + hint if hint else ''}"
        )
    log.info(
        "memory.budget=%s: the estimated validation of one %s volume needs %s MiB on %s, it fits",
        budget_value,
        shape,
        f"{total / MIB:,.0f}",
        est.device,
    )
    return total
