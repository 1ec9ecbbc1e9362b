"""The CPU planner's margins, one per kind of CPU, from the committed estimator results files.

The rows are those of ``benchmarks/results/cpu/*estimator*.json`` (``estimator_accuracy.py``'s
files: a config's measured steady-step rise in a real ``python train.py`` beside its estimate,
``estimate(cfg).step_peak_growth``), the newest file of each grid on each CPU kind
(:func:`benchmarks.tables.cpu_kind`, the kind :func:`volseg.utils.cpu.cpu_kind` names a run's
CPU by), in sample only (:func:`benchmarks.samples.grid`: a held-out grid's rows are never
fitted on), failed configs left out.

A kind's margin is the least fraction that makes every one of its rows safe: the largest
measured / estimated step rise less 1, rounded up to a whole percent, 0 where the estimate is
at or above every row. The planner adds ``margin x step_peak_growth`` to a CPU step's estimate
(:mod:`volseg.memory.residuals`). A kind with no rows (AVX-512 without BF16, a CPU held by
``ONEDNN_MAX_CPU_ISA``) plans with the largest margin of any kind (``unrecorded``). Each row is
also checked against the margin fitted without it (:func:`leave_one_out`): is it still safe?

A row's estimate is the one its estimator file recorded, unless a newer
``<date>_cpu_margin_estimates.json`` made on a CPU of the same kind has it (``--reestimate``:
each fitted row of this CPU's kind estimated again with this checkout's estimator, its measured
rise kept; minutes, where rerunning the grids takes hours).

    python -m benchmarks cpu_margins                # writes src/volseg/memory/cpu_margins.json
    python -m benchmarks cpu_margins --reestimate   # after an estimator change, on that CPU kind
"""

from __future__ import annotations

import argparse
import json
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks import results_io, samples
from benchmarks.tables import _kind_order, cpu_kind
from volseg.utils.units import MIB

MARGINS = results_io.REPO / "src" / "volseg" / "memory" / "cpu_margins.json"
COMMAND = "python -m benchmarks cpu_margins"
#: the results file of ``--reestimate`` (``<date>_cpu_margin_estimates.json``)
REESTIMATES = "cpu_margin_estimates"


def _rows(doc: dict) -> list[dict]:
    """A results file's rows, each with its ``grid`` (a file of 2026-12-02 keeps them by grid)."""
    if "rows" in doc:
        return list(doc["rows"])
    return [{**r, "grid": g} for g, rows in doc.get("grids", {}).items() for r in rows]


def _order(path: Path, doc: dict) -> tuple[str, int, str]:
    """Oldest first: the file's date, then its ``-N``."""
    number = re.search(r"-(\d+)$", path.stem)
    return (str(doc.get("date", "")), int(number[1]) if number else 1, path.name)


def fitted_rows(results: Path = results_io.RESULTS) -> list[dict[str, Any]]:
    """Each in-sample measured row the margins are fitted on: ``file``, ``grid``, ``config``,
    ``overrides``, ``kind``, ``measured`` and ``estimated`` (a steady step's rise, bytes), from
    the newest file of each grid and CPU kind; the estimate from the newest
    ``--reestimate`` file of the same kind that has the row (``estimated_in``), if any."""
    docs = sorted(
        ((p, json.loads(p.read_text())) for p in (results / "cpu").glob("*estimator*.json")),
        key=lambda found: _order(*found),
    )
    newest: dict[tuple[str, str], tuple[Path, list[dict]]] = {}
    for path, doc in docs:
        kind = cpu_kind(doc)
        for grid in dict.fromkeys(r["grid"] for r in _rows(doc)):
            newest[(grid, kind)] = (path, [r for r in _rows(doc) if r["grid"] == grid])
    # the paths as the repository names them (a folder elsewhere: from its parent)
    root = results_io.REPO if results.resolve().is_relative_to(results_io.REPO) else results.parent
    steps = []
    for (grid, kind), (path, rows) in newest.items():
        if samples.grid(grid)[0] != samples.IN:
            continue
        for r in rows:
            if "failed" in r or not r.get("measured_bytes") or not r.get("estimated_bytes"):
                continue
            steps.append(
                {
                    "file": path.resolve().relative_to(root.resolve()).as_posix(),
                    "grid": samples.GRID_ALIASES.get(grid, grid),
                    "config": r["name"],
                    "kind": kind,
                    "overrides": list(r.get("overrides", [])),
                    "measured": int(r["measured_bytes"]),
                    "estimated": int(r["estimated_bytes"]),
                }
            )
    for path in results_io.runs(REESTIMATES, "cpu", results):  # oldest first: the newest wins
        doc = json.loads(path.read_text())
        again = {(r["file"], r["config"]): r["estimated_bytes"] for r in doc["rows"]}
        for step in steps:
            found = again.get((step["file"], step["config"]))
            if found is not None and cpu_kind(doc) == step["kind"]:
                step["estimated"] = int(found)
                step["estimated_in"] = path.resolve().relative_to(root.resolve()).as_posix()
    return steps


def round_up(ratio: float) -> float:
    """``ratio - 1`` rounded up to a whole percent (0 where it is not above 1), so that the margin
    still covers the row it came from."""
    return max(0.0, math.ceil(round((ratio - 1) * 100, 6)) / 100)


def _mib(nbytes: int) -> str:
    return f"{nbytes / MIB:,.1f}"


def fit(steps: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each kind's margin from its rows: :func:`round_up` of the largest measured / estimated
    rise, the row it came from and how many rows it rests on."""
    found = {}
    for kind in sorted({s["kind"] for s in steps}, key=_kind_order):
        rows = [s for s in steps if s["kind"] == kind]
        worst = max(rows, key=lambda s: s["measured"] / s["estimated"])
        fraction = round_up(worst["measured"] / worst["estimated"])
        safe = sum(s["estimated"] >= s["measured"] for s in rows)
        if fraction == 0:
            source = (
                f"none needed: the estimate is at or above all {len(rows)} in-sample runs on {kind}"
            )
        else:
            source = (
                f"{worst['config']} ({worst['grid']}, {worst['file']}: {_mib(worst['measured'])} "
                f"MiB measured, {_mib(worst['estimated'])} estimated), the worst of "
                f"{len(rows)} in-sample runs on {kind} ({safe} safe without a margin)"
            )
        found[kind] = {
            "fraction": fraction,
            "source": source,
            "runs": len(rows),
            "safe_without_margin": safe,
            "from": {k: worst[k] for k in ("file", "grid", "config", "measured", "estimated")},
        }
    return found


def unrecorded(margins: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The margin of a kind with no rows: the largest of any kind, saying whose."""
    if not margins:
        return {"fraction": 0.0, "source": "none: no in-sample estimator run on any CPU"}
    kind, margin = max(margins.items(), key=lambda item: item[1]["fraction"])
    return {
        "fraction": margin["fraction"],
        "source": (
            f"no in-sample estimator run on this kind of CPU: the largest margin of any kind, "
            f"{kind}'s +{margin['fraction']:.0%} ({margin['source']})"
        ),
        "kind": kind,
    }


def leave_one_out(steps: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Each row against the margin its kind gets fitted without it (:func:`fit` of the other
    rows; with no other row of its kind, :func:`unrecorded` of them): ``safe`` where the
    estimate times 1 + that margin is at or above the measured rise."""
    runs, by_kind = [], {}
    for i, step in enumerate(steps):
        others = fit([*steps[:i], *steps[i + 1 :]])
        margin = (others.get(step["kind"]) or unrecorded(others))["fraction"]
        safe = step["estimated"] * (1 + margin) >= step["measured"]
        runs.append(
            {
                "file": step["file"],
                "config": step["config"],
                "kind": step["kind"],
                "measured": step["measured"],
                "estimated": step["estimated"],
                "margin_without_it": margin,
                "safe": bool(safe),
            }
        )
        tally = by_kind.setdefault(step["kind"], {"safe": 0, "of": 0})
        tally["safe"] += bool(safe)
        tally["of"] += 1
    return {
        "safe": sum(r["safe"] for r in runs),
        "of": len(runs),
        "by_kind": {k: by_kind[k] for k in sorted(by_kind, key=_kind_order)},
        "runs": runs,
    }


def margins(results: Path = results_io.RESULTS) -> dict[str, Any]:
    """What ``cpu_margins.json`` holds: each kind's margin (:func:`fit`), a kind's with no rows
    (:func:`unrecorded`), and each row against the margin fitted without it."""
    steps = fitted_rows(results)
    fitted = fit(steps)
    return {
        "command": COMMAND,
        "rule": (
            "per CPU kind, the least whole percent of a step's estimated rise that puts the "
            "estimate at or above every in-sample run's measured rise (newest file of each grid "
            "and kind; held-out grids are not fitted on)"
        ),
        "files": sorted(
            {s["file"] for s in steps} | {s.get("estimated_in") for s in steps} - {None}
        ),
        "margins": fitted,
        "unrecorded": unrecorded(fitted),
        "leave_one_out": leave_one_out(steps),
    }


def reestimate(
    results: Path,
    work_dir: Path,
    argv: Sequence[str] | None = None,
    json_out: Any = results_io.DEFAULT,
) -> Path | None:
    """Estimate again, with this checkout's estimator, every fitted row of this CPU's kind
    (:func:`volseg.utils.cpu.cpu_kind`), and write them as ``<date>_cpu_margin_estimates.json``
    (``results_io.write``'s ``json_out``); the measured rises stay those of the estimator
    files."""
    from benchmarks import grid
    from volseg.utils.cpu import cpu_kind as this_kind

    kind = this_kind()
    rows = []
    for step in fitted_rows(results):
        if step["kind"] != kind:
            continue
        grid.prepare_data(step["overrides"], work_dir)
        predicted = grid.predict(step["overrides"], "cpu", work_dir)
        rows.append(
            {
                **{k: step[k] for k in ("file", "grid", "config", "overrides")},
                "estimated_bytes": predicted["growth"],
                "recorded_estimate_bytes": step["estimated"],
                "measured_bytes": step["measured"],
            }
        )
        print(
            f"{step['config']}: {predicted['growth'] / MIB:,.1f} MiB estimated "
            f"({step['estimated'] / MIB:,.1f} recorded, {step['measured'] / MIB:,.1f} measured)",
            flush=True,
        )
    if not rows:
        print(f"no fitted row of this CPU's kind ({kind}): nothing to estimate again")
        return None
    doc = results_io.result(REESTIMATES, rows, script=__file__, argv=argv, kind=kind)
    return results_io.write(doc, json_out)


def write_margins(results: Path = results_io.RESULTS, out: Path = MARGINS) -> Path:
    """Write :func:`margins` to ``out`` (the package's ``cpu_margins.json``)."""
    out.write_text(json.dumps(margins(results), indent=2, ensure_ascii=False) + "\n")
    print(f"Wrote {out}", flush=True)
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=results_io.RESULTS)
    parser.add_argument("--out", type=Path, default=MARGINS)
    parser.add_argument(
        "--reestimate",
        action="store_true",
        help="first estimate again every fitted row of this CPU's kind (a results file)",
    )
    parser.add_argument("--work-dir", type=Path, default=None, help="data for --reestimate")
    results_io.add_json_out(parser, REESTIMATES)
    args = parser.parse_args(argv)
    if args.reestimate:
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            reestimate(args.results, args.work_dir or Path(tmp), argv, args.json_out)
    doc = json.loads(write_margins(args.results, args.out).read_text())
    for kind, margin in doc["margins"].items():
        loo = doc["leave_one_out"]["by_kind"][kind]
        print(
            f"{kind}: +{margin['fraction']:.0%} over {margin['runs']} runs; left out of its own "
            f"fit, {loo['safe']} of {loo['of']} still safe"
        )
    print(f"any other kind: +{doc['unrecorded']['fraction']:.0%}")


if __name__ == "__main__":
    main()
