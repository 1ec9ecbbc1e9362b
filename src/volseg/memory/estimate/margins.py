"""The planner's margins, and the one place they are applied: a CUDA step's, a CPU step's and
a validation's estimate all get theirs from :func:`margin_for` and are counted against a budget by
:func:`planned_total` and :func:`total_within`.

A margin is ``fixed_mib`` MiB plus ``share`` of what it was fitted on: on CUDA the estimated peak
reserved, per kind of step (:data:`KINDS`); on a CPU the step's growth
(``step_peak_growth``), per kind of CPU (:func:`volseg.utils.cpu.cpu_kind`). What it adds is
``ceil(fixed_mib x 2**20 + share x quantity)`` bytes. Validation on CUDA takes its step's
margin (no GPU validation has been recorded to fit one of its own on); on a CPU it takes none.

The margins ship with the package, beside this file: ``cuda_margins.json``, written by
``python -m benchmarks cuda_estimate_errors`` from the recorded GPU runs
(``--margins-only``: from the committed estimates), and ``cpu_margins.json``, written by
``python -m benchmarks cpu_margins`` from the committed estimator results. Each holds how every
margin was fitted (``rule``, ``source``) and each run against the margin fitted without it
(``leave_one_out``). An entry with only the older ``fraction`` reads as ``share`` with no fixed
part. Rewrite them when the estimator or the recorded runs change.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib.resources import files
from typing import Any

from volseg.memory.estimate.allocator import OutOfMemory, replay
from volseg.utils.cpu import cpu_kind
from volseg.utils.units import MIB

MARGINS_FILE = "cuda_margins.json"  # package data of volseg.memory.estimate
CPU_MARGINS_FILE = "cpu_margins.json"  # package data of volseg.memory.estimate
KINDS = ("offload", "accumulation", "other")


@dataclass(frozen=True)
class Margin:
    """``share`` of the quantity the margin was fitted on, plus ``fixed_mib`` MiB; ``source``: the
    run it came from, and how many runs it rests on."""

    share: float
    source: str
    fixed_mib: float = 0.0

    @property
    def fraction(self) -> float:
        """The share (the files' older name for it)."""
        return self.share

    def bytes_on(self, quantity: int) -> int:
        """What this margin adds to ``quantity`` bytes: ``ceil(fixed + share x quantity)``."""
        return math.ceil(self.fixed_mib * MIB + self.share * quantity)


def _read(entry: Mapping[str, Any]) -> Margin:
    """One margin of a margins file: ``fixed_mib`` and ``share``, or only ``fraction`` (a share)."""
    share = entry["share"] if "share" in entry else entry["fraction"]
    return Margin(float(share), entry["source"], float(entry.get("fixed_mib", 0.0)))


def _packaged(name: str) -> dict:
    return json.loads((files("volseg.memory.estimate") / name).read_text(encoding="utf-8"))


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
    """Each kind of step's CUDA margin (:data:`KINDS`) as ``cuda_margins.json`` holds it."""
    return {kind: _read(m) for kind, m in _packaged(MARGINS_FILE)["margins"].items()}


def packaged_cpu_margins() -> tuple[dict[str, Margin], Margin]:
    """Each CPU kind's margin as ``cpu_margins.json`` holds it, and the margin of a kind it
    has none for."""
    doc = _packaged(CPU_MARGINS_FILE)
    return {kind: _read(m) for kind, m in doc["margins"].items()}, _read(doc["unrecorded"])


def _missing(name: str, device: str, command: str) -> None:
    # an install without its package data; failing here would also stop the benchmark that
    # writes the file, so plan with no margin and say so (the plan's margin_source too)
    warnings.warn(
        f"volseg/memory/estimate/{name} is missing: the {device} planner plans with no margin "
        f"(python -m benchmarks {command} writes it)",
        stacklevel=2,
    )


try:
    _MARGINS = packaged_margins()
except FileNotFoundError:
    _missing(MARGINS_FILE, "CUDA", "cuda_estimate_errors --margins-only")
    _MARGINS = {}
try:
    _CPU_MARGINS, _CPU_UNRECORDED = packaged_cpu_margins()
except FileNotFoundError:
    _missing(CPU_MARGINS_FILE, "CPU", "cpu_margins")
    _CPU_MARGINS, _CPU_UNRECORDED = {}, Margin(0.0, f"none: {CPU_MARGINS_FILE} is missing")


def _none(kind: str) -> Margin:
    return Margin(0.0, f"none: no recorded GPU run of this kind ({kind}) in {MARGINS_FILE}")


#: the margins of the recorded runs with activation offload, with gradient accumulation, and
#: of every other run (no margin, saying why, where no recorded run of the kind has one)
OFFLOAD = _MARGINS.get("offload") or _none("offload")
ACCUMULATION = _MARGINS.get("accumulation") or _none("accumulation")
OTHER = _MARGINS.get("other") or _none("other")


def cuda_margin(offload: object, accumulate_grad_batches: int) -> Margin:
    """The margin for a CUDA step with activation offload set or not and that many
    micro-batches."""
    if offload:
        return OFFLOAD
    if accumulate_grad_batches > 1:
        return ACCUMULATION
    return OTHER


def cpu_margin(kind: str) -> Margin:
    """The margin on a CPU step's growth for a CPU of ``kind`` (``cpu_kind()``'s name): its
    own, else the stated margin of a kind with no recorded run."""
    if kind in _CPU_MARGINS:
        return _CPU_MARGINS[kind]
    named = _CPU_UNRECORDED.source.replace("this kind of CPU", kind, 1)
    return Margin(_CPU_UNRECORDED.share, named, _CPU_UNRECORDED.fixed_mib)


def margin_for(device: str, offload: object, accumulate_grad_batches: int) -> Margin:
    """The planner's margin for a step on ``device``: on CUDA its kind of step's, on a CPU this
    process's kind of CPU's."""
    if device == "cpu":
        return cpu_margin(cpu_kind())
    return cuda_margin(offload, accumulate_grad_batches)


def with_margin(est: Any, margin: Margin) -> Any:
    """``est`` (a step's or a validation's estimate) planned with ``margin``: its ``margin``
    (the share), ``margin_fixed_mib`` and ``margin_source`` set. The figures stay the bare
    estimate; :func:`planned_total` and :func:`total_within` add the margin."""
    est.margin, est.margin_fixed_mib, est.margin_source = (
        margin.share,
        margin.fixed_mib,
        margin.source,
    )
    return est


def margin_text(est: Any) -> str:
    """``+29%`` (or ``+50 MiB +29%``): the margin an estimate (or its ``to_dict()``) is planned
    with, as the reports say it."""
    margin = _margin_of(_getter(est))
    fixed = f"+{margin.fixed_mib:,.0f} MiB " if margin.fixed_mib else ""
    return f"{fixed}+{margin.share:.0%}"


def _margin_of(get: Any) -> Margin:
    return Margin(get("margin", 0.0) or 0.0, "", get("margin_fixed_mib", 0.0) or 0.0)


def _getter(est: Any) -> Any:
    if isinstance(est, Mapping):
        return est.get
    return lambda key, default=None: getattr(est, key, default)


def margin_bytes(est: Any) -> int:
    """What the margin adds to an estimate (or its ``to_dict()``) without a budget: on a CPU on
    the step's growth, on CUDA on the reserved peak."""
    get = _getter(est)
    quantity = get("step_peak_growth", 0) if get("device") == "cpu" else get("peak_reserved")
    return _margin_of(get).bytes_on(quantity or 0)


def planned_total(est: Any) -> int:
    """An estimate (a step's or a validation's, or its ``to_dict()``) as the planner counts it
    against a budget: on a CPU the process total plus the margin on the step's growth; on CUDA
    the reserved peak plus the margin on it, plus the CUDA context (the peak without a budget:
    within one, the allocator's replay decides, :func:`total_within`)."""
    get = _getter(est)
    if get("device") == "cpu":
        return int(get("process_total") + margin_bytes(est))
    return int(get("peak_reserved") + margin_bytes(est) + get("cuda_context"))


def total_within(est: Any, budget: int) -> int | None:
    """The planned total of ``est`` (``device``, ``process_total``, ``events``, ``cuda_context``,
    the margin, ``allocator``) when ``budget`` bytes is all there is; ``None``: it does not fit.
    On CUDA the allocator model replays the events within what the margin and the context leave
    of the budget, releasing its free cached segments before an out-of-memory as the real
    allocator does."""
    if est.device != "cuda":
        total = planned_total(est)
        return total if total <= budget else None
    margin = _margin_of(_getter(est))
    room = budget - est.cuda_context
    capacity = int((room - margin.fixed_mib * MIB) / (1 + margin.share))
    # the largest reserved peak whose planned total fits, whatever the float rounding above
    while capacity > 0 and capacity + margin.bytes_on(capacity) > room:
        capacity -= 1
    while capacity + 1 + margin.bytes_on(capacity + 1) <= room:
        capacity += 1
    try:
        allocator = replay(est.events, capacity=capacity, settings=est.allocator)
    except OutOfMemory:
        return None
    reserved = allocator.peak_reserved
    total = reserved + margin.bytes_on(reserved) + est.cuda_context
    return total if total <= budget else None


def whole_percent_above(ratio: float) -> float:
    """``ratio - 1`` (measured / estimated, the worst run's) rounded up to a whole percent, so
    that a margin fitted on that run still covers it; the CUDA and CPU margins are both fitted
    by it (``benchmarks/cuda_estimate_errors.py``, ``benchmarks/cpu_margins.py``)."""
    return math.ceil(round((ratio - 1) * 100, 6)) / 100
