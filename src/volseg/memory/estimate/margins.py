"""The planner's margins and the one place they are applied: ``fixed_mib`` plus ``share`` of
the CUDA peak reserved (per kind of step) or of a CPU step's growth (per kind of CPU), read from
``cuda_margins.json`` and ``cpu_margins.json`` beside this file (``docs/memory.md``).
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from importlib.resources import files
from typing import Any

from volseg.memory.estimate.allocator import AllocatorSettings, OutOfMemory, replay
from volseg.utils.cpu import cpu_kind
from volseg.utils.units import MIB

MARGINS_FILE = "cuda_margins.json"  # package data of volseg.memory.estimate
CPU_MARGINS_FILE = "cpu_margins.json"  # package data of volseg.memory.estimate
KINDS = ("offload", "accumulation", "other")


@dataclass(frozen=True)
class Margin:
    """``share`` of the quantity the margin was fitted on, plus ``fixed_mib`` MiB; ``source``: the
    run it came from."""

    share: float
    source: str
    fixed_mib: float = 0.0

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
    """The kind of step (:data:`KINDS`) a run's ``train.py`` overrides make (offload first)."""
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
    # failing would also stop the benchmark that writes the file: plan with no margin, say so
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


#: each kind's margin (none, saying why, where no recorded run of the kind has one)
OFFLOAD = _MARGINS.get("offload") or _none("offload")
ACCUMULATION = _MARGINS.get("accumulation") or _none("accumulation")
OTHER = _MARGINS.get("other") or _none("other")


def cuda_margin(offload: object, accumulate_grad_batches: int) -> Margin:
    """The margin of a CUDA step by its kind (:data:`KINDS`)."""
    if offload:
        return OFFLOAD
    if accumulate_grad_batches > 1:
        return ACCUMULATION
    return OTHER


def cpu_margin(kind: str) -> Margin:
    """The margin of a CPU of ``kind`` (``cpu_kind()``), else that of a kind with no runs."""
    if kind in _CPU_MARGINS:
        return _CPU_MARGINS[kind]
    named = _CPU_UNRECORDED.source.replace("this kind of CPU", kind, 1)
    return Margin(_CPU_UNRECORDED.share, named, _CPU_UNRECORDED.fixed_mib)


def margin_for(device: str, offload: object, accumulate_grad_batches: int) -> Margin:
    """The margin of a step on ``device``: its kind of step's (CUDA) or this CPU kind's."""
    if device == "cpu":
        return cpu_margin(cpu_kind())
    return cuda_margin(offload, accumulate_grad_batches)


def margin_text(est: Any) -> str:
    """``+29%`` (or ``+50 MiB +29%``): an estimate's (or its ``to_dict()``'s) margin."""
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
    """What the margin adds to an estimate (or its ``to_dict()``) without a budget."""
    get = _getter(est)
    quantity = get("step_peak_growth", 0) if get("device") == "cpu" else get("peak_reserved")
    return _margin_of(get).bytes_on(quantity or 0)


def planned_total(est: Any) -> int:
    """An estimate (or its ``to_dict()``) as the planner counts it against a budget: process
    total plus margin (CPU), or peak reserved plus margin plus the CUDA context."""
    get = _getter(est)
    if get("device") == "cpu":
        return int(get("process_total") + margin_bytes(est))
    return int(get("peak_reserved") + margin_bytes(est) + get("cuda_context"))


class Planned:
    """What a step's and an inference's estimate answer of a budget, from their ledger
    (``events``) replayed under ``allocator``'s settings; neither is a figure of ``to_dict``."""

    def __post_init__(self) -> None:
        self.events: list[tuple[str, int, int]] = []
        self.allocator = AllocatorSettings()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def set_margin(self, margin: Margin) -> None:
        """``margin`` as ``margin`` (share), ``margin_fixed_mib`` and ``margin_source``; the
        figures stay bare."""
        self.margin, self.margin_fixed_mib = margin.share, margin.fixed_mib
        self.margin_source = margin.source

    def total_within(self, budget: int) -> int | None:
        """The planned total when ``budget`` bytes is all there is; ``None``: it does not fit.
        On CUDA the ledger is replayed within what the margin and the context leave of the
        budget, the allocator releasing its cache before an out-of-memory as the real one does."""
        if self.device != "cuda":
            total = planned_total(self)
            return total if total <= budget else None
        margin = _margin_of(_getter(self))
        room = budget - self.cuda_context
        capacity = int((room - margin.fixed_mib * MIB) / (1 + margin.share))
        # the largest reserved peak whose planned total fits, whatever the float rounding above
        while capacity > 0 and capacity + margin.bytes_on(capacity) > room:
            capacity -= 1
        while capacity + 1 + margin.bytes_on(capacity + 1) <= room:
            capacity += 1
        try:
            allocator = replay(self.events, capacity=capacity, settings=self.allocator)
        except OutOfMemory:
            return None
        reserved = allocator.peak_reserved
        total = reserved + margin.bytes_on(reserved) + self.cuda_context
        return total if total <= budget else None

    def fits(self, budget: int) -> bool:
        return self.total_within(budget) is not None

    @property
    def margin_bytes(self) -> int:
        return margin_bytes(self)


def whole_percent_above(ratio: float) -> float:
    """``ratio - 1`` (the worst run's measured / estimated) rounded up to a whole percent, so a
    margin fitted on that run covers it."""
    return math.ceil(round((ratio - 1) * 100, 6)) / 100
