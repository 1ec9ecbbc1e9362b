"""The CUDA estimate against every GPU run kept in ``benchmarks/results/cuda/*.json``, on any CPU.

Each run not held out is estimated as ``tests/memory/test_recorded_cuda.py`` estimates it: its
``train.py`` overrides, ``memory.plan_device=cuda`` and its loop's ``estimate.zero_grad`` (the run's
``zero_grad``; Lightning's closure where it has none). Prints one Markdown row per run: peak
allocated (or, where only the rise above the step's start was measured, that rise) and peak
reserved, estimated / measured in MiB with the error, bold outside the test's bounds (5%
allocated, 10% reserved), then the mean |error| of each and the runs within both.

The newest estimates file and the recorded runs also give the planner's CUDA margins
(:mod:`volseg.memory.estimate.margins`; kinds of step with fewer than :data:`MIN_RUNS` runs share
one,
:func:`pools`) and, for each recorded run, the margin its kind gets with that run left out of the
fit and whether a plan with it would have been overcommitted (:func:`leave_one_out`: how the
margins do on a run they were not fitted on). Both ship with the package as
``src/volseg/memory/estimate/cuda_margins.json``: written after the estimates, or alone with
``--margins-only``.

    python -m benchmarks cuda_estimate_errors      # about 4 s a run on a 2-core CPU
    python -m benchmarks cuda_estimate_errors --margins-only   # from the committed estimates
"""

from __future__ import annotations

import argparse
import json
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir

from benchmarks import harness, results_io, two_part
from volseg.memory.estimate.margins import KINDS, step_kind, whole_percent_above
from volseg.plan import planned_config
from volseg.utils.units import MIB

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("PROJECT_ROOT", str(REPO))

RESULTS = REPO / "benchmarks" / "results" / "cuda"
ALLOCATED_WITHIN, RESERVED_WITHIN = 0.05, 0.10
BENCHMARK = "cuda_estimate_errors"
MARGINS = REPO / "src" / "volseg" / "memory" / "estimate" / "cuda_margins.json"


#: the fewest recorded runs a margin the planner uses may rest on (see :func:`pools`)
MIN_RUNS = 3


def recorded_steps(results: Path = results_io.RESULTS) -> tuple[list[dict[str, Any]], Path]:
    """Each recorded run of ``results/cuda/*.json`` (not held out, its peak reserved measured,
    its estimate in the newest ``results/cpu/<date>_cuda_estimate_errors.json``): ``file``,
    ``run``, ``kind`` (:func:`~volseg.memory.estimate.margins.step_kind`) and its peak reserved,
    ``measured`` and ``estimated`` (MiB); and the estimates file."""
    estimates = results_io.latest(BENCHMARK, "cpu", results)
    if estimates is None:
        raise FileNotFoundError(
            f"no {results / 'cpu'}/*_{BENCHMARK}.json: the CUDA margins come from the "
            "estimates of the recorded GPU runs (python -m benchmarks cuda_estimate_errors)"
        )
    estimated = {
        (row["file"], row["run"]): row["estimated_peak_reserved"]
        for row in json.loads(estimates.read_text())["rows"]
    }
    steps = []
    for path in sorted((results / "cuda").glob("*.json")):
        for run in json.loads(path.read_text())["runs"]:
            if run["held_out"] or run["measured"].get("peak_reserved_mib") is None:
                continue
            key = (path.stem, run["name"])
            if key not in estimated:  # recorded after the estimates: tests/memory says so
                continue
            steps.append(
                {
                    "file": path.stem,
                    "run": run["name"],
                    "kind": step_kind(run["overrides"]),
                    "measured": run["measured"]["peak_reserved_mib"],
                    "estimated": estimated[key] / 2**20,
                }
            )
    return steps, estimates


def pools(counts: Mapping[str, int]) -> dict[str, tuple[str, ...]]:
    """The kinds whose runs each kind's margin is fitted on, given each kind's number of runs.

    A kind with at least :data:`MIN_RUNS` runs has its own margin. The kinds with fewer share
    one margin, fitted on their runs together where those are at least :data:`MIN_RUNS`, and on
    the runs of every kind where they are not; so every margin rests on :data:`MIN_RUNS` runs
    or more whenever that many are recorded."""
    few = tuple(k for k in KINDS if counts.get(k, 0) < MIN_RUNS)
    shared = few if sum(counts.get(k, 0) for k in few) >= MIN_RUNS else KINDS
    return {kind: shared if kind in few else (kind,) for kind in KINDS}


def _runs_of(group: Sequence[str]) -> str:
    if tuple(group) == KINDS:
        return "of every kind"
    if tuple(group) == ("other",):
        return "with neither offload nor accumulation"
    levers = {"offload": "activation offload", "accumulation": "gradient accumulation"}
    return "with " + " or ".join(levers.get(k, "neither") for k in group)


def fit(steps: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each kind's margin from these recorded steps (kinds pooled as :func:`pools` says): the
    largest measured / estimated peak reserved of the runs it is fitted on, less 1, rounded up
    to 0.01; the run it came from, how many runs and which step sizes (estimated peak reserved,
    MiB) it rests on."""
    counts = Counter(s["kind"] for s in steps)
    found = {}
    for kind, group in pools(counts).items():
        fitted = [s for s in steps if s["kind"] in group]
        if not fitted:
            continue
        worst = max(fitted, key=lambda s: s["measured"] / s["estimated"])
        low, high = (f(s["estimated"] for s in fitted) for f in (min, max))
        fixed_mib, share = two_part.fit(
            [(s["estimated"] * MIB, s["measured"] * MIB) for s in fitted]
        )
        found[kind] = {
            "fixed_mib": fixed_mib,
            "share": share,
            # one share for every size, as readers of the margin before fixed_mib/share take it
            "fraction": whole_percent_above(worst["measured"] / worst["estimated"]),
            "source": (
                f"{worst['run']} (reserved {worst['measured']:,.0f} MiB measured, "
                f"{worst['estimated']:,.0f} estimated), the worst of {len(fitted)} recorded GPU "
                f"runs {_runs_of(group)} (steps of {low:,.0f} to {high:,.0f} MiB estimated "
                "reserved)"
            ),
            "kinds": list(group),
            "runs": len(fitted),
            "step_mib_range": [round(low), round(high)],
        }
    return found


def leave_one_out(steps: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Each recorded run against the margin of its kind fitted without it (:func:`fit` on the
    other runs, pooled by the same rule): ``overcommitted`` where its measured peak reserved is
    over the estimate times 1 + that margin, as a plan made before the run would have been."""
    runs, by_kind = [], {}
    for i, step in enumerate(steps):
        without = fit([*steps[:i], *steps[i + 1 :]]).get(step["kind"])
        margin = without["fraction"] if without else 0.0
        over = step["measured"] > step["estimated"] * (1 + margin)
        fixed_mib, share = (without["fixed_mib"], without["share"]) if without else (0.0, 0.0)
        covered = two_part.covered(
            fixed_mib, share, step["estimated"] * MIB, step["measured"] * MIB
        )
        runs.append(
            {
                "file": step["file"],
                "run": step["run"],
                "kind": step["kind"],
                "measured_reserved_mib": step["measured"],
                "estimated_reserved_mib": round(step["estimated"], 3),
                "margin_without_it": margin,
                "overcommitted": over,
                "fixed_mib_without_it": fixed_mib,
                "share_without_it": share,
                "covered": covered,
            }
        )
        tally = by_kind.setdefault(step["kind"], {"overcommitted": 0, "of": 0})
        tally["overcommitted"] += over
        tally["of"] += 1
    return {
        "overcommitted": sum(r["overcommitted"] for r in runs),
        "of": len(runs),
        "by_kind": {k: by_kind[k] for k in KINDS if k in by_kind},
        # fixed_mib + share fitted without each run: how many it still covers, per kind
        "covered": sum(r["covered"] for r in runs),
        "covered_by_kind": {
            k: sum(r["covered"] for r in runs if r["kind"] == k) for k in KINDS if k in by_kind
        },
        "runs": runs,
    }


def margins(results: Path = results_io.RESULTS) -> dict[str, Any]:
    """What ``cuda_margins.json`` holds, from ``results/cuda/*.json`` (measured) and the newest
    ``results/cpu/<date>_cuda_estimate_errors.json``: each kind's margin (:func:`fit`) and each
    recorded run against the margin fitted without it (:func:`leave_one_out`)."""
    steps, estimates = recorded_steps(results)
    root = results.parent.parent  # the paths as the repository names them
    return {
        "command": results_io.command(__file__, ["--margins-only"]),
        "recorded": [
            p.relative_to(root).as_posix() for p in sorted((results / "cuda").glob("*.json"))
        ],
        "estimates": estimates.relative_to(root).as_posix(),
        "min_runs": MIN_RUNS,
        "margins": fit(steps),
        "leave_one_out": leave_one_out(steps),
    }


def write_margins(results: Path = results_io.RESULTS, out: Path = MARGINS) -> Path:
    """Write :func:`margins` to ``out`` (the package's ``cuda_margins.json``)."""
    out.write_text(json.dumps(margins(results), indent=2, ensure_ascii=False) + "\n")
    print(f"Wrote {out}", flush=True)
    return out


def _cell(estimated: float, measured: float, within: float, digits: int) -> tuple[str, float]:
    """``estimated / measured | error`` (bold outside ``within``) and the error."""
    error = estimated / measured - 1
    text = results_io.pct(error)
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
                f"+estimate.zero_grad={run.get('zero_grad', 'closure')}",
                "memory.plan_device=cuda",
            ]
            with initialize_config_dir(version_base="1.3", config_dir=str(REPO / "configs")):
                cfg = planned_config(compose("train", overrides=overrides))
            est = harness.estimated(cfg).step
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
        estimated_for="cuda (memory.plan_device=cuda), on this CPU",
    )
    written, newest = results_io.write(doc, args.json_out), results_io.latest(BENCHMARK)
    # margins from estimates written elsewhere would not be what the committed files give
    if written is not None and newest is not None and written.resolve() == newest.resolve():
        write_margins()


if __name__ == "__main__":
    main()
