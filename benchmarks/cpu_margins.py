"""The CPU planner's margins, one per kind of CPU, from the committed estimator results files.

The rows: ``benchmarks/results/cpu/*estimator*.json``'s (a config's measured steady-step rise in
``python train.py`` beside its ``estimate_run(plan).step.step_peak_growth``), the newest file of
each grid on each CPU kind (:func:`benchmarks.results_io.cpu_kind`), in sample only
(:func:`benchmarks.samples.grid`), failed configs left out.

A kind's margin: ``fixed_mib + share x step_peak_growth`` (:mod:`benchmarks.two_part`), the
two that make every one of its rows safe, which the planner adds to a CPU step's estimate
(:mod:`volseg.memory.estimate.margins`); ``fraction``, the share alone. A held kind of
:data:`STAND_INS` is fitted as the kind it stands in for. A kind with no rows plans with each part
the largest of any kind's (``unrecorded``), its text giving both and whose. Each row is also
checked against the margin fitted without it (:func:`leave_one_out`), and each kind's text says
whether its worst row is covered so.

A row's estimate is its file's: after an estimator change, ``python -m benchmarks restamp`` makes
every cited file's estimates again (a stamp where the bytes stay, a new file, the newest of its
grid, where they change; minutes, where rerunning the grids takes hours), then refits.

    # writes src/volseg/memory/estimate/cpu_margins.json
    python -m benchmarks cpu_margins
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks import results_io, samples, two_part
from benchmarks.results_io import NOT_REPRODUCIBLE, cpu_kind, kind_order
from volseg.memory.estimate.margins import whole_percent_above
from volseg.utils.units import MIB

MARGINS = results_io.REPO / "src" / "volseg" / "memory" / "estimate" / "cpu_margins.json"
COMMAND = "python -m benchmarks cpu_margins"
#: held kind -> the kind it stands in for, and what that was recorded on: held to AVX512_CORE_VNNI,
#: oneDNN emulates bf16 on avx512_core and ATen keeps avx512, as on Ice Lake (no AVX512_BF16)
STAND_INS = {"AVX512_BF16, held to AVX512_CORE_VNNI": ("AVX-512", "its stand-in, an AVX512_BF16 "
             "CPU held to AVX512_CORE_VNNI by ONEDNN_MAX_CPU_ISA: no bf16 kernels")}  # fmt: skip


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
    the newest file of each grid and CPU kind."""
    docs = sorted(
        ((p, json.loads(p.read_text())) for p in (results / "cpu").glob("*estimator*.json")),
        key=lambda found: _order(*found),
    )
    newest: dict[tuple[str, str], tuple[Path, list[dict]]] = {}
    for path, doc in docs:
        kind = STAND_INS.get(cpu_kind(doc), (cpu_kind(doc),))[0]
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
    return steps


def round_up(ratio: float) -> float:
    """``ratio - 1`` rounded up to a whole percent, 0 where it is not above 1."""
    return max(0.0, whole_percent_above(ratio))


def _mib(nbytes: int) -> str:
    return f"{nbytes / MIB:,.1f}"


def kind_text(kind: str) -> str:
    """``kind``, and what its runs were recorded on where a held kind stands in for it."""
    held = [what for stand_in, what in STAND_INS.values() if stand_in == kind]
    return f"{kind} as recorded on {held[0]}" if held else kind


def fit(steps: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each kind's margin from its rows: :func:`round_up` of the largest measured / estimated
    rise, the row it came from and how many rows it rests on."""
    found = {}
    for kind in sorted({s["kind"] for s in steps}, key=kind_order):
        rows = [s for s in steps if s["kind"] == kind]
        worst = max(rows, key=lambda s: s["measured"] / s["estimated"])
        fraction = round_up(worst["measured"] / worst["estimated"])
        safe = sum(s["estimated"] >= s["measured"] for s in rows)
        source = (
            f"none needed: the estimate is at or above all {len(rows)} in-sample runs on "
            f"{kind_text(kind)}"
            if fraction == 0
            else f"{worst['config']} ({worst['grid']}, {worst['file']}: {_mib(worst['measured'])} "
            f"MiB measured, {_mib(worst['estimated'])} estimated), the worst of "
            f"{len(rows)} in-sample runs on {kind_text(kind)} ({safe} safe without a margin)"
        )
        fixed_mib, share = two_part.fit([(s["estimated"], s["measured"]) for s in rows])
        if kind in NOT_REPRODUCIBLE:
            source += "; estimates as recorded, not re-estimated by the current estimator "
            source += f"({NOT_REPRODUCIBLE[kind]})"
        found[kind] = {
            "fixed_mib": fixed_mib,
            "share": share,
            # one share for every size, as readers of the margin before fixed_mib/share take it
            "fraction": fraction,
            "source": source,
            "runs": len(rows),
            "safe_without_margin": safe,
            "from": {k: worst[k] for k in ("file", "grid", "config", "measured", "estimated")},
        }
    return found


def unrecorded(margins: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The margin of a kind with no rows: each part the largest of any kind's (every kind's runs
    covered), its text giving the figures it applies, whose they are and why."""
    if not margins:
        return {"fixed_mib": 0.0, "share": 0.0, "fraction": 0.0, "source": "none: no in-sample "
                "estimator run on any CPU"}  # fmt: skip
    fixed_of, share_of = (max(margins, key=lambda k: margins[k][p]) for p in ("fixed_mib", "share"))
    fixed, share = margins[fixed_of]["fixed_mib"], margins[share_of]["share"]
    kind = max(margins, key=lambda k: margins[k]["fraction"])
    whose = f"{share_of}'s {share:.1%}" if share else f"{share:.1%}: none of them has one"
    return {
        "fixed_mib": fixed,
        "share": share,
        "fraction": margins[kind]["fraction"],  # the share alone, for a reader of one part
        "source": (
            f"no in-sample estimator run on this kind of CPU, so +{fixed:.1f} MiB + {share:.1%} "
            f"of the step's growth: the largest fixed part ({fixed_of}'s {fixed:.1f} MiB) and the "
            f"largest share ({whose}) of the {len(margins)} fitted kinds ({'; '.join(margins)})"
        ),
        "kind": kind,
    }


def leave_one_out(steps: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Each row against the margin its kind gets fitted without it (:func:`fit` of the other
    rows; with no other row of its kind, :func:`unrecorded` of them): ``safe`` where the
    estimate times 1 + that margin is at or above the measured rise."""
    runs, by_kind, two_parts = [], {}, {}
    for i, step in enumerate(steps):
        others = fit([*steps[:i], *steps[i + 1 :]])
        without = others.get(step["kind"]) or unrecorded(others)
        margin = without["fraction"]
        safe = step["estimated"] * (1 + margin) >= step["measured"]
        fixed_mib, share = without["fixed_mib"], without["share"]
        covered = two_part.covered(fixed_mib, share, step["estimated"], step["measured"])
        runs.append(
            {k: step[k] for k in ("file", "config", "kind", "measured", "estimated")}
            | {
                "margin_without_it": margin,
                "safe": bool(safe),
                "fixed_mib_without_it": fixed_mib,
                "share_without_it": share,
                "covered": bool(covered),
            }
        )
    for kind in sorted({r["kind"] for r in runs}, key=kind_order):
        mine = [r for r in runs if r["kind"] == kind]
        by_kind[kind] = {"safe": sum(r["safe"] for r in mine), "of": len(mine)}
        # the run that sets the kind's margin: is it covered by the margin fitted without it?
        worst = max(mine, key=lambda r: r["measured"] / r["estimated"])
        two_parts[kind] = {
            "covered": sum(r["covered"] for r in mine),
            "of": len(mine),
            "worst": worst["config"],
            "worst_covered": worst["covered"],
            "worst_without_it": [worst["fixed_mib_without_it"], worst["share_without_it"]],
        }
    return {
        "safe": sum(r["safe"] for r in runs),
        "of": len(runs),
        "by_kind": by_kind,
        # fixed_mib + share fitted without each run: covered per kind, and its worst run
        "covered": sum(r["covered"] for r in runs),
        "two_part_by_kind": two_parts,
        "runs": runs,
    }


def margins(results: Path = results_io.RESULTS) -> dict[str, Any]:
    """What ``cpu_margins.json`` holds: each kind's margin (:func:`fit`; a held kind standing in for
    one plans with its), a kind's with no rows (:func:`unrecorded`), and :func:`leave_one_out`."""
    steps = fitted_rows(results)
    fitted, loo = fit(steps), leave_one_out(steps)
    for kind, margin in fitted.items():  # the figure to trust, said where the plan shows it
        tally = loo["two_part_by_kind"][kind]
        fixed, share = tally["worst_without_it"]
        margin["source"] += (
            f"; left out of its own fit, the worst run "
            f"{'is' if tally['worst_covered'] else 'is not'} covered by the margin fitted "
            f"without it (+{fixed:.1f} MiB + {share:.1%})"
        )
    other = unrecorded(fitted)
    fitted |= {held: {**fitted[kind], "same_as": kind} for held, (kind, _) in STAND_INS.items()
               if kind in fitted}  # fmt: skip
    return {
        "command": COMMAND,
        "rule": "per CPU kind, fixed_mib + share x the step's estimated rise, the two parts that "
        "put the estimate at or above every in-sample run's measured rise withholding the least on "
        "average (benchmarks/two_part.py; newest file of each grid and kind; held-out grids are "
        "not fitted on); fraction: the least whole percent that does the same alone",
        "files": sorted({s["file"] for s in steps}),
        "margins": fitted,
        "unrecorded": other,
        "leave_one_out": loo,
    }


def write_margins(results: Path = results_io.RESULTS, out: Path = MARGINS) -> Path:
    """Write :func:`margins` to ``out`` (the package's ``cpu_margins.json``)."""
    out.write_text(json.dumps(margins(results), indent=2, ensure_ascii=False) + "\n")
    print(f"Wrote {out}", flush=True)
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=results_io.RESULTS)
    parser.add_argument("--out", type=Path, default=MARGINS)
    args = parser.parse_args(argv)
    doc = json.loads(write_margins(args.results, args.out).read_text())
    for kind, margin in [*doc["margins"].items(), ("any other kind", doc["unrecorded"])]:
        # each text says its runs and whether its worst is covered fitted without it
        print(f"{kind}: +{margin['fixed_mib']:.1f} MiB + {margin['share']:.1%}: {margin['source']}")


if __name__ == "__main__":
    main()
