"""The planner's margin on CUDA: how far the estimate has fallen short of recorded GPU runs.

``benchmarks/results/cuda/*.json`` keeps real runs (what each measured);
``benchmarks/results/cpu/<date>_cuda_estimate_errors.json`` (``python
benchmarks/cuda_estimate_errors.py``) keeps the estimate of each of them. Until the estimate is
within its bounds everywhere (``tests/memory/test_recorded_cuda.py``), the planner plans with
``reserved x (1 + margin)``: the largest ratio of measured to estimated peak reserved among the
recorded runs (not held out) that use the same kind of lever, rounded up to a whole percent,
named with the run it came from. Both are read from those files when this module is imported;
re-estimate (and commit the new file) when the estimator or the recorded runs change.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

#: the repository's ``benchmarks/results`` (this file is ``src/volseg/memory/residuals.py``)
RESULTS = Path(__file__).resolve().parents[3] / "benchmarks" / "results"
ESTIMATES = "cuda_estimate_errors"  # the benchmark whose files hold the estimates
KINDS = ("offload", "accumulation", "other")


@dataclass(frozen=True)
class Margin:
    """``fraction`` added to the estimated peak reserved; ``source``: the run it came from."""

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


def estimates_file(results: Path = RESULTS) -> Path:
    """The newest ``benchmarks/results/cpu/<date>_cuda_estimate_errors[-N].json`` (a second
    run on one day writes ``-2``)."""
    pattern = re.compile(rf"(\d{{4}}-\d{{2}}-\d{{2}})_{ESTIMATES}(?:-(\d+))?\.json")
    found = sorted(
        (match[1], int(match[2] or 1), path)
        for path in (results / "cpu").glob(f"*_{ESTIMATES}*.json")
        if (match := pattern.fullmatch(path.name))
    )
    files = [path for *_, path in found]
    if not files:
        raise FileNotFoundError(
            f"no {results / 'cpu'}/*_{ESTIMATES}.json: the CUDA margin is read from the "
            "estimates of the recorded GPU runs (python benchmarks/cuda_estimate_errors.py)"
        )
    return files[-1]


def load_margins(results: Path = RESULTS) -> dict[str, Margin]:
    """Each kind's margin (:data:`KINDS`) from the recorded runs and their estimates: the largest
    measured / estimated peak reserved, less 1, rounded up to 0.01."""
    estimated = {
        (row["file"], row["run"]): row["estimated_peak_reserved"]
        for row in json.loads(estimates_file(results).read_text())["rows"]
    }
    worst: dict[str, tuple[float, str]] = {}
    for path in sorted((results / "cuda").glob("*.json")):
        for run in json.loads(path.read_text())["runs"]:
            if run["held_out"] or run["measured"].get("peak_reserved_mib") is None:
                continue
            key = (path.stem, run["name"])
            if key not in estimated:  # recorded after the estimates: tests/memory says so
                continue
            measured, est_mib = run["measured"]["peak_reserved_mib"], estimated[key] / 2**20
            ratio = measured / est_mib
            kind = step_kind(run["overrides"])
            if kind not in worst or ratio > worst[kind][0]:
                source = (
                    f"{run['name']} (reserved {measured:,.0f} MiB measured, {est_mib:,.0f} "
                    "estimated)"
                )
                worst[kind] = (ratio, source)
    margins = {}
    for kind, (ratio, source) in worst.items():
        # rounded up, so that the margin still covers the run it came from
        margins[kind] = Margin(math.ceil(round((ratio - 1) * 100, 6)) / 100, source)
    return margins


def _missing() -> Margin:
    return Margin(0.0, f"none: no estimates of recorded GPU runs in {RESULTS / 'cpu'}")


try:
    _MARGINS: dict[str, Margin] = load_margins()
except FileNotFoundError:
    # volseg used outside its repository (or before the first estimates file): no margin, and
    # the plan's margin_source says so
    _MARGINS = {}

#: the margins of the recorded runs with activation offload, with gradient accumulation, and
#: of every other run (no margin, saying why, where no recorded run of the kind has one)
OFFLOAD = _MARGINS.get("offload") or _missing()
ACCUMULATION = _MARGINS.get("accumulation") or _missing()
OTHER = _MARGINS.get("other") or _missing()


def cuda_margin(offload: object, accumulate_grad_batches: int) -> Margin:
    """The margin for a step with activation offload set or not and that many micro-batches."""
    if offload:
        return OFFLOAD
    if accumulate_grad_batches > 1:
        return ACCUMULATION
    return OTHER
