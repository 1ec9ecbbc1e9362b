"""The planner's margins: how far the estimate has fallen short of recorded runs, on CUDA per
kind of step (here) and on a CPU per kind of CPU (:func:`cpu_margin`, at the end).

Until the estimate is within its bounds everywhere
(``tests/memory/estimate/test_recorded_cuda.py``), the
planner plans with ``reserved x (1 + margin)``: the largest ratio of measured to estimated peak
reserved among the recorded GPU runs (not held out) of the same kind of step, less 1, rounded up
to a whole percent. A kind with fewer than 3 recorded runs shares its margin with the other such
kinds (with every kind where those are still fewer than 3 runs together), so that no margin
rests on fewer than 3 runs. Each margin's ``source`` names the run it came from, how many runs
it rests on and their step sizes. The margins ship with the package (``cuda_margins.json``
beside this file, with each run against the margin fitted without it: ``leave_one_out``);
``python -m benchmarks cuda_estimate_errors`` writes them from the repository's recorded runs
and their estimates (``--margins-only``: from the committed estimates, estimating nothing).
Rewrite them when the estimator or the recorded runs change.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from importlib.resources import files

MARGINS_FILE = "cuda_margins.json"  # package data of volseg.memory.estimate
KINDS = ("offload", "accumulation", "other")


@dataclass(frozen=True)
class Margin:
    """``fraction`` added to the estimated peak reserved; ``source``: the run it came from, and
    how many runs of which step sizes it rests on."""

    fraction: float
    source: str


def step_kind(overrides: Iterable[str]) -> str:
    """``offload``, ``accumulation`` or ``other``: the kind of step a run's ``train.py``
    overrides make (offload wins over accumulation, as in :func:`cuda_margin`)."""
    values = dict(o.lstrip("+").split("=", 1) for o in overrides if "=" in o)
    if values.get("model.offload_activations", "false").lower() not in ("false", "null", "none"):
        return "offload"
    if int(values.get("trainer.accumulate_grad_batches", "1")) > 1:
        return "accumulation"
    return "other"


def packaged_margins() -> dict[str, Margin]:
    """Each kind's margin (:data:`KINDS`) as ``cuda_margins.json`` holds it."""
    doc = json.loads((files("volseg.memory.estimate") / MARGINS_FILE).read_text(encoding="utf-8"))
    return {kind: Margin(m["fraction"], m["source"]) for kind, m in doc["margins"].items()}


def _missing(kind: str) -> Margin:
    return Margin(0.0, f"none: no recorded GPU run of this kind ({kind}) in {MARGINS_FILE}")


try:
    _MARGINS = packaged_margins()
except FileNotFoundError:
    # an install without its package data; failing here would also stop the benchmark that
    # writes the file, so plan with no margin and say so (the plan's margin_source too)
    warnings.warn(
        f"volseg/memory/{MARGINS_FILE} is missing: the CUDA planner plans with no margin "
        "(python -m benchmarks cuda_estimate_errors --margins-only writes it)",
        stacklevel=1,
    )
    _MARGINS = {}

#: the margins of the recorded runs with activation offload, with gradient accumulation, and
#: of every other run (no margin, saying why, where no recorded run of the kind has one)
OFFLOAD = _MARGINS.get("offload") or _missing("offload")
ACCUMULATION = _MARGINS.get("accumulation") or _missing("accumulation")
OTHER = _MARGINS.get("other") or _missing("other")


def cuda_margin(offload: object, accumulate_grad_batches: int) -> Margin:
    """The margin for a step with activation offload set or not and that many micro-batches."""
    if offload:
        return OFFLOAD
    if accumulate_grad_batches > 1:
        return ACCUMULATION
    return OTHER


# The CPU margins. On a CPU the planner plans with ``process_total + margin x step_peak_growth``:
# per kind of CPU (:func:`volseg.utils.cpu.cpu_kind`), the largest ratio of measured to
# estimated step rise among the in-sample estimator runs on that kind, less 1, rounded up to a
# whole percent (0 where the estimate covers them all). A kind with no recorded run plans with
# the largest margin of any kind, and its source says so. ``cpu_margins.json`` beside this file
# holds them, each run against the margin fitted without it (``leave_one_out``); ``python -m
# benchmarks cpu_margins`` writes it from the committed estimator results files.

CPU_MARGINS_FILE = "cpu_margins.json"  # package data of volseg.memory.estimate


def packaged_cpu_margins() -> tuple[dict[str, Margin], Margin]:
    """Each CPU kind's margin as ``cpu_margins.json`` holds it, and the margin of a kind it
    has none for."""
    doc = json.loads(
        (files("volseg.memory.estimate") / CPU_MARGINS_FILE).read_text(encoding="utf-8")
    )
    kinds = {kind: Margin(m["fraction"], m["source"]) for kind, m in doc["margins"].items()}
    return kinds, Margin(doc["unrecorded"]["fraction"], doc["unrecorded"]["source"])


try:
    _CPU_MARGINS, _CPU_UNRECORDED = packaged_cpu_margins()
except FileNotFoundError:
    warnings.warn(
        f"volseg/memory/{CPU_MARGINS_FILE} is missing: the CPU planner plans with no margin "
        "(python -m benchmarks cpu_margins writes it)",
        stacklevel=1,
    )
    _CPU_MARGINS = {}
    _CPU_UNRECORDED = Margin(0.0, f"none: {CPU_MARGINS_FILE} is missing")


def whole_percent_above(ratio: float) -> float:
    """``ratio - 1`` (measured / estimated, the worst run's) rounded up to a whole percent, so
    that a margin fitted on that run still covers it; the CUDA and CPU margins are both fitted
    by it (``benchmarks/cuda_estimate_errors.py``, ``benchmarks/cpu_margins.py``)."""
    return math.ceil(round((ratio - 1) * 100, 6)) / 100


def cpu_margin_bytes(fraction: float, step_peak_growth: int) -> int:
    """What a CPU margin adds to a step's estimate: ``fraction x step_peak_growth``, rounded
    up."""
    return math.ceil(fraction * step_peak_growth)


def cpu_margin(kind: str) -> Margin:
    """The margin on a CPU step's growth for a CPU of ``kind`` (``cpu_kind()``'s name): its
    own, else the stated margin of a kind with no recorded run."""
    if kind in _CPU_MARGINS:
        return _CPU_MARGINS[kind]
    named = _CPU_UNRECORDED.source.replace("this kind of CPU", kind, 1)
    return Margin(_CPU_UNRECORDED.fraction, named)
