"""Which measured rows were used to choose a default, a rule or a margin (in sample), and which
were not (held out).

A row is held out only where it was written down as held out before anything was judged on it
(a frozen grid of ``benchmarks/grids/``, a task no default was chosen on); once a change has been
judged on it, it is in sample, and the next check needs a new held-out set. Every other row is in
sample: nothing in it was set aside before it was seen.

``python -m benchmarks tables`` writes :data:`INDEX` (``benchmarks/results/samples.json``: each
results file, and for a file of several grids or tasks each of them, with its sample and why) and
ends every generated table with its line (:func:`table_line`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from benchmarks import results_io

IN, OUT = "in sample", "held out"
INDEX = results_io.RESULTS / "samples.json"

#: nothing in these rows was set aside before they were seen
UNMARKED = "nothing in it was set aside as held out before it was seen"

#: per benchmark (a results file's name): its sample and why
BENCHMARKS: dict[str, tuple[str, str]] = {
    "cpu_bf16_conv": (IN, "chose the U-Net's float32 fallback for bf16 convolutions at depth 2"),
    "cpu_bf16_memory": (IN, "the estimator's rule for torch's own 16-bit GEMM was read from it"),
    "cpu_channels_last_memory": (
        IN,
        "the estimator's rule for channels-last convolutions was read from it",
    ),
    "cpu_precision": (IN, "chose `trainer.precision=auto`'s CPU rule"),
    "cross_entropy_weight": (IN, "judged the many-class cross-entropy weight on few-class tasks"),
    "cuda_estimate_errors": (
        IN,
        "every recorded GPU run was used to tune the CUDA estimate and to fit its margins",
    ),
    "cuda_grid_estimates": (IN, "the estimates of the recorded GPU runs, used to tune it"),
    "default_run": (IN, "the defaults were chosen on the embedded dataset this run trains on"),
    "estimator_networks": (IN, "the estimator's network adapters were written against these runs"),
    "estimator_monai_unets": (
        IN,
        "the planner's levers were added after these networks found no plan",
    ),
    "levers_estimated": (IN, "the CUDA estimates of the recorded lever runs, used to tune it"),
    "validation_memory": (IN, "the validation estimate was tuned on these cases"),
    "data_throughput": (IN, UNMARKED),
    "levers": (IN, UNMARKED),
    "loader_compare": (IN, "the loader was changed after these timings were seen"),
    "memory_monitor_overhead": (IN, UNMARKED),
    "network_levers": (IN, UNMARKED),
    "selective_checkpointing": (IN, UNMARKED),
    "lever_time_factors": (IN, UNMARKED),
    "step_profile": (IN, UNMARKED),
    "train_throughput": (IN, UNMARKED),
    "training_overheads": (IN, UNMARKED),
    "nnunet_side_by_side": (IN, UNMARKED),
    "cuda_recorded": (
        IN,
        "every recorded GPU run was used to tune the CUDA estimate and to fit its margins",
    ),
    "cuda_margins": (IN, "each margin is fitted on the recorded runs it counts"),
    "cpu_margins": (IN, "each margin is fitted on the in-sample estimator runs it counts"),
    "cpu_margin_estimates": (IN, "the estimates of the in-sample runs the CPU margins count"),
    "rule_effects": (
        IN,
        "estimates only, nothing measured; the newest grid was drawn so that the rules added "
        "since the grid before it change its rows",
    ),
}

#: ``real_data.py``'s learning tasks (``settings.data``)
TASKS: dict[str, tuple[str, str]] = {
    "mni152": (IN, "volseg's defaults were chosen on the lobe task"),
    "mni152_regions": (IN, "the cross-entropy weight and the lr rule were chosen on it"),
    "mni152_hemispheres": (IN, "options were judged on it (and kept off: no gain held on it)"),
    "mni152_regions_lr": (OUT, "no default, rule or margin was chosen or judged on it"),
}

#: ``estimator_accuracy.py``'s grids (a row's ``grid``); frozen grids say so in their file
GRIDS: dict[str, tuple[str, str]] = {
    "tuned": (IN, "the estimator was tuned on it"),
    "checked-2026-12-02": (
        IN,
        "fixed as a held-out check on 2026-12-02; changes to the estimator were judged on it since",
    ),
    "networks": (IN, "the estimator's network adapters were written against it"),
    "monai-unets": (IN, "the planner's levers were added after these networks found no plan"),
    "foreign-networks": (IN, "the adapters of these networks were written against it"),
}
#: the name the 2026-12-02 files gave the grid that is now ``checked-2026-12-02``
GRID_ALIASES = {"held-out": "checked-2026-12-02"}
GRIDS_DIR = results_io.BENCHMARKS / "grids"

#: frozen grids that changes to the estimator (or margins fitted on its rows) were judged on
#: after they ran: in sample, whatever their frozen file says, each with why
JUDGED: dict[str, str] = {
    "held-out-2026-12-03-b": (
        "drawn and frozen in held-out-2026-12-03-b.json before it ran; changes to the estimator "
        "were judged on it since, and the CPU margins are fitted on it"
    ),
    "held-out-2026-12-04": (
        "drawn and frozen in held-out-2026-12-04.json before it ran; the estimator's rule for "
        "channels-last convolutions was read from its AVX2 rows since, and the CPU margins are "
        "fitted on it"
    ),
    "held-out-2026-12-05": (
        "drawn and frozen in held-out-2026-12-05.json before it ran; the estimator's rules for "
        "a channels-last network's softmax and pooling gradient were read from its rows since, "
        "and the CPU margins are fitted on it"
    ),
    "held-out-2026-12-07": (
        "drawn and frozen in held-out-2026-12-07.json before it ran; the estimator's rule for "
        "bf16 weight gradients on AVX512_BF16 was read from its worst row since, and the CPU "
        "margins are fitted on it"
    ),
}


def grid(name: str) -> tuple[str, str]:
    """A grid's sample and why: :data:`JUDGED` first (a frozen grid judged on since), then a
    frozen grid's file, else :data:`GRIDS`."""
    name = GRID_ALIASES.get(name, name)
    if name in JUDGED:
        return IN, JUDGED[name]
    path = GRIDS_DIR / f"{name}.json"
    if path.exists():
        doc = json.loads(path.read_text())
        return doc["sample"], f"drawn by a seeded generator and frozen in {path.name} before it ran"
    return GRIDS[name]


def text(sample: tuple[str, str]) -> str:
    """``In sample: why.`` / ``Held out: why.``"""
    return f"{sample[0][0].upper()}{sample[0][1:]}: {sample[1]}."


def _benchmark(path: Path) -> str:
    match = re.fullmatch(r"(?:\d{4}-\d{2}-\d{2}_)?(.+?)(?:-\d+)?", path.stem)
    return match[1] if match else path.stem


def of_file(path: Path) -> dict[str, Any]:
    """A results file's sample: ``{"sample", "why"}``, or per grid or task where it holds
    several (``{"grids": {...}}`` / ``{"task": ...}``)."""
    name = _benchmark(path)
    doc = json.loads(path.read_text())
    if name == "estimator_accuracy":
        grids = dict.fromkeys(r["grid"] for r in doc["rows"])
        return {"grids": {g: dict(zip(("sample", "why"), grid(g), strict=True)) for g in grids}}
    if name == "real_data":
        task = doc["settings"]["data"]
        return {"task": task, **dict(zip(("sample", "why"), TASKS[task], strict=True))}
    if path.name == "side_by_side.json":
        name = "nnunet_side_by_side"
    return dict(zip(("sample", "why"), BENCHMARKS[name], strict=True))


def index(results: Path = results_io.RESULTS) -> dict[str, Any]:
    """Every results file under ``results`` (by its path there) with its sample; nnU-Net's own
    plans files are its planner's output, not rows."""
    out = {}
    for path in sorted(results.rglob("*.json")):
        where = path.relative_to(results)
        if path == results / INDEX.name or (where.parts[0] == "nnunet" and len(where.parts) > 2):
            continue
        if where.parts[0] == "cuda":
            out[str(where)] = dict(zip(("sample", "why"), BENCHMARKS["cuda_recorded"], strict=True))
        else:
            out[str(where)] = of_file(path)
    return {
        "rule": "held out: written down as held out before anything was judged on it; every "
        "other row is in sample (benchmarks/samples.py)",
        "files": out,
    }


def table_line(name: str) -> str:
    """The line that ends a generated table (``<!-- table: NAME -->``): its rows' sample."""
    if name.startswith("learning_"):
        return text(TASKS[name.removeprefix("learning_")])
    if name == "estimator_accuracy":
        return (
            "In sample or held out: per row (the `sample` column); held out only where the grid "
            "was drawn and frozen in a file before it ran."
        )
    return text(BENCHMARKS[MARKERS.get(name, name)])


#: a table's marker -> the benchmark whose rows it shows, where the names differ
MARKERS = {"levers_cpu": "levers", "levers_cuda": "levers_estimated"}
