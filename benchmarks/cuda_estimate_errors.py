"""The CUDA estimate against every GPU run kept in ``benchmarks/results/cuda/*.json``, on any CPU.

Each run not held out is estimated as ``tests/memory/test_recorded_cuda.py`` estimates it: its
``train.py`` overrides, ``estimate.device=cuda`` and its loop's ``estimate.zero_grad`` (the run's
``zero_grad``; Lightning's closure where it has none). Prints one Markdown row per run: peak
allocated (or, where only the rise above the step's start was measured, that rise) and peak
reserved, estimated / measured in MiB with the error, bold outside the test's bounds (5%
allocated, 10% reserved), then the mean |error| of each and the runs within both.

The newest estimates file and the recorded runs also give the planner's CUDA margins
(:mod:`volseg.memory.residuals`), which ship with the package as
``src/volseg/memory/cuda_margins.json``: written after the estimates, or alone with
``--margins-only``.

    python benchmarks/cuda_estimate_errors.py      # about 4 s a run on a 2-core CPU
    python benchmarks/cuda_estimate_errors.py --margins-only   # from the committed estimates
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "benchmarks"))
os.environ.setdefault("PROJECT_ROOT", str(REPO))

import results_io  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402

from volseg.memory.estimator import estimate  # noqa: E402
from volseg.memory.residuals import KINDS, step_kind  # noqa: E402
from volseg.plan import planned_config  # noqa: E402
from volseg.utils.units import MIB  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "cuda"
ALLOCATED_WITHIN, RESERVED_WITHIN = 0.05, 0.10
BENCHMARK = "cuda_estimate_errors"
MARGINS = REPO / "src" / "volseg" / "memory" / "cuda_margins.json"


def margins(results: Path = results_io.RESULTS) -> dict[str, Any]:
    """What ``cuda_margins.json`` holds, from ``results/cuda/*.json`` (measured) and the newest
    ``results/cpu/<date>_cuda_estimate_errors.json``: per kind of step
    (:func:`~volseg.memory.residuals.step_kind`), the largest measured / estimated peak reserved
    less 1, rounded up to 0.01, and the run it came from."""
    estimates = results_io.latest(BENCHMARK, "cpu", results)
    if estimates is None:
        raise FileNotFoundError(
            f"no {results / 'cpu'}/*_{BENCHMARK}.json: the CUDA margins come from the "
            "estimates of the recorded GPU runs (python benchmarks/cuda_estimate_errors.py)"
        )
    estimated = {
        (row["file"], row["run"]): row["estimated_peak_reserved"]
        for row in json.loads(estimates.read_text())["rows"]
    }
    recorded = sorted((results / "cuda").glob("*.json"))
    worst: dict[str, tuple[float, str]] = {}
    for path in recorded:
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
    found = {}
    for kind in (k for k in KINDS if k in worst):
        ratio, source = worst[kind]
        # rounded up, so that the margin still covers the run it came from
        found[kind] = {"fraction": math.ceil(round((ratio - 1) * 100, 6)) / 100, "source": source}
    root = results.parent.parent  # the paths as the repository names them
    return {
        "command": f"python benchmarks/{Path(__file__).name} --margins-only",
        "recorded": [path.relative_to(root).as_posix() for path in recorded],
        "estimates": estimates.relative_to(root).as_posix(),
        "margins": found,
    }


def write_margins(results: Path = results_io.RESULTS, out: Path = MARGINS) -> Path:
    """Write :func:`margins` to ``out`` (the package's ``cuda_margins.json``)."""
    out.write_text(json.dumps(margins(results), indent=2, ensure_ascii=False) + "\n")
    print(f"Wrote {out}", flush=True)
    return out


def _cell(estimated: float, measured: float, within: float, digits: int) -> tuple[str, float]:
    """``estimated / measured | error`` (bold outside ``within``) and the error."""
    error = estimated / measured - 1
    text = f"{error:+.1%}".replace("-", "−")
    shown = f"**{text}**" if abs(error) > within else text
    return f"{estimated:,.{digits}f} / {measured:,.{digits}f} | {shown}", error


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    results_io.add_json_out(parser, BENCHMARK)
    parser.add_argument(
        "--margins-only",
        action="store_true",
        help=f"only rewrite {MARGINS.relative_to(REPO)} from the committed results files",
    )
    args = parser.parse_args(argv)
    if args.margins_only:
        write_margins()
        return
    rows = []
    print(
        "| run | allocated: estimated / measured MiB | error "
        "| reserved: estimated / measured MiB | error |"
    )
    print("| --- | ---: | ---: | ---: | ---: |")
    allocated_errors, reserved_errors, within = [], [], 0
    for path in sorted(RESULTS.glob("*.json")):
        for run in json.loads(path.read_text())["runs"]:
            if run["held_out"]:
                continue
            overrides = [
                *run["overrides"],
                f"estimate.zero_grad={run.get('zero_grad', 'closure')}",
                "estimate.device=cuda",
            ]
            with initialize_config_dir(version_base="1.3", config_dir=str(REPO / "configs")):
                cfg = planned_config(compose("train", overrides=overrides))
            est = estimate(cfg)
            m = run["measured"]
            if m.get("peak_allocated_mib") is not None:
                pair, digits = (est.peak_allocated / MIB, m["peak_allocated_mib"]), 0
            else:
                pair, digits = (est.step_peak_growth / MIB, m["step_peak_growth_mib"]), 1
            allocated, a_error = _cell(*pair, ALLOCATED_WITHIN, digits)
            reserved, r_error = _cell(
                est.peak_reserved / MIB, m["peak_reserved_mib"], RESERVED_WITHIN, 0
            )
            allocated_errors.append(abs(a_error))
            reserved_errors.append(abs(r_error))
            ok = abs(a_error) <= ALLOCATED_WITHIN and abs(r_error) <= RESERVED_WITHIN
            within += ok
            print(f"| {run['name']} | {allocated} | {reserved} |", flush=True)
            rows.append(
                {
                    "file": path.stem,
                    "run": run["name"],
                    "overrides": overrides,
                    "measured": m,
                    "estimated_peak_allocated": est.peak_allocated,
                    "estimated_peak_reserved": est.peak_reserved,
                    "estimated_step_peak_growth": est.step_peak_growth,
                    "allocated_compared": "peak" if digits == 0 else "step_peak_growth",
                    "allocated_error": a_error,
                    "reserved_error": r_error,
                    "within_bounds": bool(ok),
                }
            )
    count = len(allocated_errors)
    print(
        f"\n{within} of {count} runs within both bounds; mean |error| "
        f"{sum(allocated_errors) / count:.1%} allocated, {sum(reserved_errors) / count:.1%} "
        "reserved"
    )
    doc = results_io.result(
        BENCHMARK,
        rows,
        script=__file__,
        argv=argv,
        bounds={"allocated": ALLOCATED_WITHIN, "reserved": RESERVED_WITHIN},
        estimated_for="cuda (estimate.device=cuda), on this CPU",
    )
    written, newest = results_io.write(doc, args.json_out), results_io.latest(BENCHMARK)
    # margins from estimates written elsewhere would not be what the committed files give
    if written is not None and newest is not None and written.resolve() == newest.resolve():
        write_margins()


if __name__ == "__main__":
    main()
