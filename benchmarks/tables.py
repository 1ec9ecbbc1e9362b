"""The tables of docs/ regenerated from the results files under ``benchmarks/results/``.

A table from data sits between ``<!-- table: NAME -->`` and ``<!-- /table: NAME -->`` in a
Markdown file of ``docs/`` (written here: do not edit by hand), ends with a line saying whether
its rows are in sample or held out (``samples.py``), and :data:`TABLES` names the function that
builds it from the newest results file(s), which the table names with machine and command. A
marker whose table has no results file yet is left as it is. A figure quoted in prose sits
between ``<!-- figure: NAME -->`` markers; :data:`FIGURES` names the function that writes it.
This module is the one reader of results files into docs: a retired study's files (their script
left the tree, ``benchmarks.runner.RETIRED``) are read here too, and no longer change.

    python -m benchmarks tables            # rewrite every marked table in docs/*.md and README
    python -m benchmarks tables --check    # exit 1 if a marked table differs from its files
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

from benchmarks import results_io, samples
from benchmarks.grid import summary_line
from benchmarks.results_io import cpu_kind, every_file, held_isa, kind_order, newest, pct, rel
from volseg.utils.units import MIB

DOCS = results_io.REPO / "docs"
MARKER = re.compile(
    r"(<!-- table: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /table: (?P=name) -->)", re.S
)


def _recorded_gpu_runs(results: Path) -> dict[frozenset[str], tuple[dict, dict, Path]]:
    """Recorded GPU runs by their set of overrides: (run, file head, file)."""
    runs = {}
    for path in sorted((results / "cuda").glob("*.json")):
        doc = json.loads(path.read_text())
        for run in doc["runs"]:
            runs.setdefault(frozenset(run["overrides"]), (run, doc, path))
    return runs


#: the recorded GPU run the levers' cut and time ratio are taken against
LEVERS_BASE = "levers: none (16-mixed)"


def cuda_recorded(results: Path) -> str | None:
    """Every recorded GPU run as measured: peak allocated, reserved, nvidia-smi, step time
    (``benchmarks/results/cuda/*.json``; levers' cut and time ratio against their baseline)."""
    recorded = list(_recorded_gpu_runs(results).values())
    if not recorded:
        return None
    heads = {
        rel(path): f"{rel(path)} ({doc['gpu']}, torch {doc['torch']}, {doc['date']})"
        for _, doc, path in recorded
    }
    lines = [
        "; ".join(heads.values()) + ":",
        "",
        "| run | measured by | peak allocated (MiB) | peak reserved (MiB) | nvidia-smi (MiB) "
        "| s/step | cut (allocated) | time ratio |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    base = next((run["measured"] for run, *_ in recorded if run["name"] == LEVERS_BASE), None)

    def cell(value, spec=",.0f"):
        return "" if value is None else format(value, spec)

    for run, _, _ in recorded:
        m = run["measured"]
        allocated = m.get("peak_allocated_mib")
        rise = m.get("step_peak_growth_mib")
        allocated_cell = cell(allocated) if allocated is not None else f"rise {rise:,.1f}"
        cut = ratio = ""
        if run["name"].startswith("levers:") and base and allocated and m.get("step_s"):
            cut = f"{base['peak_allocated_mib'] / allocated:.2f}x"
            ratio = f"{m['step_s'] / base['step_s']:.2f}"
        lines.append(
            f"| {run['name']} | `{run['script'].split(' (')[0]}` | {allocated_cell} | "
            f"{cell(m.get('peak_reserved_mib'))} | {cell(m.get('nvidia_smi_mib'))} | "
            f"{cell(m.get('step_s'), '.3f')} | {cut} | {ratio} |"
        )
    return "\n".join(lines)


def levers_cuda(results: Path) -> str | None:
    """The levers on the reference config: the CUDA estimate (``levers_estimated.py``) beside
    each recorded GPU run of the same overrides (``benchmarks/results/cuda``)."""
    path = results_io.latest("levers_estimated", "cpu", results)
    if path is None:
        return None
    doc = results_io.load(path)
    measured = _recorded_gpu_runs(results)
    gpu_files = sorted({rel(p) for _, _, p in measured.values()})
    lines = [
        f"{rel(path)} (the estimates: {results_io.machine_line(doc)}) and "
        f"{', '.join(gpu_files)} (measured):",
        "",
        "| lever | estimated peak allocated / reserved (MiB) | measured peak allocated / "
        "reserved (MiB) | measured cut | measured time ratio |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    base = None
    for row in doc["rows"]:
        estimated = (
            f"{row['estimated_peak_allocated'] / MIB:,.0f} / "
            f"{row['estimated_peak_reserved'] / MIB:,.0f}"
        )
        found = measured.get(frozenset(row["overrides"]))
        if found is None:
            lines.append(f"| {row['lever']} | {estimated} | not yet measured | | |")
            continue
        m = found[0]["measured"]
        base = base or m
        cut = base["peak_allocated_mib"] / m["peak_allocated_mib"]
        ratio = f"{m['step_s'] / base['step_s']:.2f}" if m["step_s"] and base["step_s"] else ""
        lines.append(
            f"| {row['lever']} | {estimated} | {m['peak_allocated_mib']:,.0f} / "
            f"{m['peak_reserved_mib']:,.0f} | {cut:.2f}x | {ratio} |"
        )
    return "\n".join(lines)


@newest("cuda_estimate_errors")
def cuda_estimate_errors(path: Path, doc: dict) -> str:
    """The CUDA estimate against every recorded GPU run (``cuda_estimate_errors.py``)."""
    bounds = doc.get("bounds", {"allocated": 0.05, "reserved": 0.10})
    lines = [
        f"{rel(path)} ({results_io.machine_line(doc)}; estimated for CUDA on this CPU, "
        f"against the GPU runs in benchmarks/results/cuda; bold: outside "
        f"{bounds['allocated']:.0%} allocated / {bounds['reserved']:.0%} reserved):",
        "",
        "| run | allocated: estimated / measured MiB | error | reserved: estimated / measured "
        "MiB | error |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    a_errors, r_errors, within = [], [], 0
    for row in doc["rows"]:
        m = row["measured"]
        if row["allocated_compared"] == "peak":
            pair, digits = (row["estimated_peak_allocated"] / MIB, m["peak_allocated_mib"]), 0
        else:
            pair, digits = (row["estimated_step_peak_growth"] / MIB, m["step_peak_growth_mib"]), 1
        a, r = row["allocated_error"], row["reserved_error"]
        a_text = f"**{pct(a)}**" if abs(a) > bounds["allocated"] else pct(a)
        r_text = f"**{pct(r)}**" if abs(r) > bounds["reserved"] else pct(r)
        lines.append(
            f"| {row['run']} | {pair[0]:,.{digits}f} / {pair[1]:,.{digits}f} | {a_text} | "
            f"{row['estimated_peak_reserved'] / MIB:,.0f} / {m['peak_reserved_mib']:,.0f} | "
            f"{r_text} |"
        )
        a_errors.append(abs(a))
        r_errors.append(abs(r))
        within += abs(a) <= bounds["allocated"] and abs(r) <= bounds["reserved"]
    n = len(a_errors)
    lines += [
        "",
        f"{n - within} of {n} runs outside the bounds; mean |error| {sum(a_errors) / n:.1%} "
        f"allocated (max {max(a_errors):.1%}), {sum(r_errors) / n:.1%} reserved (max "
        f"{max(r_errors):.1%}).",
    ]
    return "\n".join(lines)


def _failure(text: str) -> str:
    """A failed config's line, a timeout's long command cut to its limit."""
    timeout = re.search(r"timed out after (\d+(?:\.\d+)?) seconds", text)
    return f"train.py ran past {float(timeout[1]):.0f} s (stopped)" if timeout else text


def _newest_estimates(results: Path) -> dict[tuple[str, str], tuple[Path, dict]]:
    """The newest estimator results file of each grid on each CPU kind, by (grid, kind)."""
    newest_of: dict[tuple[str, str], tuple[Path, dict]] = {}
    for path in reversed(results_io.runs("estimator_accuracy", "cpu", results)):
        doc = results_io.load(path)
        for grid in dict.fromkeys(r["grid"] for r in doc["rows"]):
            newest_of.setdefault((grid, cpu_kind(doc)), (path, doc))
    return newest_of


def estimator_worst_held_out(results: Path) -> str | None:
    """README's estimator headline: the largest error of any held-out grid on any kind (the
    newest file of each, whose estimates the stale-figure test holds to today's estimator)."""
    held = [
        (abs(r["error"]), r, kind, path)
        for (grid, kind), (path, doc) in _newest_estimates(results).items()
        if samples.grid(grid)[0] == samples.OUT
        for r in doc["rows"]
        if r["grid"] == grid and "error" in r
    ]
    if not held:
        return None
    _, row, kind, path = max(held, key=lambda h: h[0])
    grids = sorted({r["grid"] for _, r, *_ in held})
    side = "an over-estimate, on the safe side" if row["error"] > 0 else "an under-estimate"
    return (
        f"The largest error over the held-out grids ({', '.join(f'`{g}`' for g in grids)}; "
        f"{len(held)} runs on their CPU kinds) is {pct(row['error'])} ({side}):\n"
        f"{row['name']} in `{row['grid']}` on {kind}, {row['measured_bytes'] / MIB:,.1f} MiB "
        f"measured, {row['estimated_bytes'] / MIB:,.1f} estimated (`{rel(path)}`)."
    )


def estimator_accuracy(results: Path) -> str | None:
    """The estimate against real ``python train.py`` steps on a CPU, one row per config and one
    column per kind of CPU, from the newest file of each grid on each kind
    (``estimator_accuracy.py --grid NAME``), each row in sample or held out (``samples.py``):
    the configs of the held-out grids and of the grid judged on last (``samples.JUDGED``), a
    summary line per grid and kind for every grid."""
    newest_of = _newest_estimates(results)
    if not newest_of:
        return None
    lines = []
    heads = {path: doc for path, doc in newest_of.values()}
    for path, doc in heads.items():
        partial = "" if doc.get("complete", True) else "; stopped before its last config"
        lines.append(
            f"{rel(path)} ({results_io.machine_line(doc)}; host resident memory, "
            f"{doc.get('malloc')}; a steady step's rise over {doc.get('steps')} optimizer "
            f"steps{partial}):"
        )
    kinds = sorted({kind for _, kind in newest_of}, key=kind_order)
    lines += [
        "Each cell: measured / estimated MiB (error).",
        "",
        f"| grid | sample | config | {' | '.join(kinds)} |",
        f"| --- | --- | --- |{' --- |' * len(kinds)}",
    ]
    cells: dict[tuple[str, str], dict[str, str]] = {}
    summaries = []
    judged_last = list(samples.JUDGED)[-1:]
    for grid in dict.fromkeys(grid for grid, _ in newest_of):
        name = samples.GRID_ALIASES.get(grid, grid)
        sample = samples.grid(grid)[0]
        detailed = sample == samples.OUT or grid in judged_last
        for kind in kinds:
            if (grid, kind) not in newest_of:
                continue
            rows = [r for r in newest_of[(grid, kind)][1]["rows"] if r["grid"] == grid]
            for r in rows if detailed else ():
                cells.setdefault((name, r["name"]), {"sample": sample})[kind] = _cell(r)
            summaries.append(f"- {name} ({sample}), {kind}: {summary_line(rows)}")
    for (name, config), by_kind in cells.items():
        row = " | ".join(by_kind.get(kind, "not run") for kind in kinds)
        lines.append(f"| {name} | {by_kind['sample']} | {config} | {row} |")
    note = "The configs of the other grids are in their files; every grid's summary:"
    return "\n".join([*lines, "", note, "", *summaries])


def _cell(row: dict) -> str:
    """One config on one kind of CPU: measured / estimated MiB (error), or why it failed."""
    if "failed" in row:
        return f"failed: {_failure(row['failed'])}"
    return (
        f"{row['measured_bytes'] / MIB:,.1f} / {row['estimated_bytes'] / MIB:,.1f} "
        f"({pct(row['error'])})"
    )


#: which recorded steps a CUDA margin covers, by the kinds that share it
MARGIN_STEPS = {
    ("offload", "accumulation"): "with activation offload or gradient accumulation",
    ("other",): "with neither",
    ("offload", "accumulation", "other"): "every step",
}


def cuda_margins(results: Path) -> str | None:
    """The planner's CUDA margins on the reserved peak, each the largest shortfall of the
    estimate on the recorded GPU runs of its kind (``src/volseg/memory/estimate/cuda_margins.json``,
    written by ``cuda_estimate_errors.py``): in sample, fitted on the runs it lists."""
    path = results_io.REPO / "src" / "volseg" / "memory" / "estimate" / "cuda_margins.json"
    if not path.exists():
        return None
    doc = json.loads(path.read_text())
    lines = [
        f"{rel(path)} (`{doc['command']}`, from {', '.join(doc['recorded'])} and "
        f"{doc['estimates']}; in sample: each margin is fitted on the runs it counts):",
        "",
        "| steps | margin | worst run | recorded runs | their steps (estimated reserved) |",
        "| --- | ---: | --- | ---: | ---: |",
    ]
    seen = set()
    for margin in doc["margins"].values():
        kinds = tuple(margin["kinds"])
        if kinds in seen:
            continue
        seen.add(kinds)
        run, _, measured = margin["source"].split(", the worst of")[0].partition(" (reserved ")
        low, high = margin["step_mib_range"]
        lines.append(
            f"| {MARGIN_STEPS.get(kinds, ', '.join(kinds))} | {_two_part(margin)} | "
            f"{run}: {measured.rstrip(')')} | {margin['runs']} | {low:,}–{high:,} MiB |"
        )
    loo = doc.get("leave_one_out")
    if loo and "covered_by_kind" in loo:
        kinds = ", ".join(
            f"{kind} {loo['covered_by_kind'][kind]} of {v['of']}"
            for kind, v in loo["by_kind"].items()
        )
        lines += [
            "",
            "Leave-one-out (each run left out of its own margin's fit): the margin fitted "
            f"without it covers {loo['covered']} of the {loo['of']} recorded runs ({kinds}).",
        ]
    return "\n".join(lines)


CPU_MARGINS = results_io.REPO / "src" / "volseg" / "memory" / "estimate" / "cpu_margins.json"


def _two_part(margin: dict) -> str:
    """``fixed MiB + share``, as the planner adds it."""
    return f"{margin.get('fixed_mib', 0.0):,.1f} MiB + {margin.get('share', 0.0):.1%}"


def cpu_margins(results: Path) -> str | None:
    """The CPU planner's margin per CPU kind on a step's growth, a fixed part plus a share, the
    two that put the estimate at or above every in-sample estimator run of that kind, and each
    kind's worst run against the margin fitted without it (``src/volseg/memory/
    cpu_margins.json``, written by ``cpu_margins.py`` from the estimator's results files)."""
    from benchmarks.cpu_margins import kind_text
    from benchmarks.results_io import NOT_REPRODUCIBLE

    if not CPU_MARGINS.exists():
        return None
    doc = json.loads(CPU_MARGINS.read_text())
    lines = [
        f"{rel(CPU_MARGINS)} (`{doc['command']}`, from {len(doc['files'])} results files: "
        "the newest of each grid and kind):",
        "",
        "| CPU kind | margin | worst run | in-sample runs | safe without a margin | "
        "fitted without each run: covered | worst run covered without it | estimates |",
        "| --- | ---: | --- | ---: | ---: | ---: | --- | --- |",
    ]
    loo = doc["leave_one_out"]["two_part_by_kind"]
    # a held kind that plans with the kind it stands in for has no row of its own
    for kind, margin in ((k, m) for k, m in doc["margins"].items() if "same_as" not in m):
        worst = margin["from"]
        source = (
            f"{worst['config']} ({worst['grid']}): {worst['measured'] / MIB:,.1f} MiB measured, "
            f"{worst['estimated'] / MIB:,.1f} estimated"
        )
        tally = loo[kind]
        why = NOT_REPRODUCIBLE.get(kind)
        made = f"as recorded: {why}" if why else "made again by the current estimator"
        lines.append(
            f"| {kind_text(kind)} | {_two_part(margin)} | {source} | {margin['runs']} | "
            f"{margin['safe_without_margin']} | {tally['covered']} of {tally['of']} | "
            f"{'yes' if tally['worst_covered'] else 'no'} | {made} |"
        )
    other = doc["unrecorded"]
    lines.append(
        f"| any other (no recorded run) | {_two_part(other)} | each part the largest of any "
        "kind's | 0 | | | | |"
    )
    return "\n".join(lines)


FIGURE = re.compile(
    r"(<!-- figure: (?P<name>[\w-]+) -->)(?P<body>.*?)(<!-- /figure: (?P=name) -->)", re.S
)


def _sample(pair: tuple[str, str]) -> str:
    """``in sample: why`` / ``held out: why`` (``samples.py``'s pair)."""
    return f"{pair[0]}: {pair[1]}"


#: the held-out learning tasks as README names them
def estimator_held_out_kinds(results: Path) -> str | None:
    """docs/benchmarks.md's sentence naming the CPU kinds each frozen held-out estimator grid
    has run on (``estimator_accuracy.py``'s files), or that it has not run yet."""
    kinds: dict[str, dict[str, Path]] = {}
    for path in results_io.runs("estimator_accuracy", "cpu", results):
        doc = results_io.load(path)
        for grid in dict.fromkeys(r["grid"] for r in doc["rows"]):
            kinds.setdefault(grid, {})[cpu_kind(doc)] = path
    held = [
        p.stem
        for p in sorted(samples.GRIDS_DIR.glob("*.json"))
        if samples.grid(p.stem)[0] == samples.OUT
    ]
    if not held:
        return None
    out = []
    for grid in held:
        found = kinds.get(grid)
        if not found:
            out.append(f"The held-out grid `{grid}` has not run yet.")
            continue
        out.append(
            # a held kind's name has commas of its own
            f"The held-out grid `{grid}` has run on {' and on '.join(found)}"
            f"{' only' if len(found) == 1 else ''} "
            f"({', '.join(f'`{rel(p)}`' for p in dict.fromkeys(found.values()))})."
        )
    return "\n".join(out)  # a line a grid: docs lines stay under 400 characters


def _reference_runs(results: Path) -> tuple[dict, dict, Path] | None:
    """The recorded reference-table runs of unet_small and unet_large in ``16-mixed``."""
    runs = {run["name"]: (run, path) for run, _, path in _recorded_gpu_runs(results).values()}
    small = runs.get("reference table: unet_small 16-mixed")
    large = runs.get("reference table: unet_large 16-mixed")
    if small is None or large is None:
        return None
    return small[0]["measured"], large[0]["measured"], small[1]


def memory_fewer_parameters(results: Path) -> str | None:
    """docs/memory.md's figures of unet_small against unet_large (the recorded GPU runs)."""
    found = _reference_runs(results)
    if found is None:
        return None
    small, large, path = found
    return (
        f"{small['peak_allocated_mib']:,} against {large['peak_allocated_mib']:,} MiB allocated, "
        f"{small['nvidia_smi_mib']:,} against {large['nvidia_smi_mib']:,} MiB in nvidia-smi "
        f"(`{rel(path)}`, the `reference table` rows; "
        f"{_sample(samples.BENCHMARKS['cuda_recorded'])})"
    )


#: inline marker name -> the function that writes its sentence from ``benchmarks/results``
def networks_tight_budget(results: Path) -> str | None:
    """docs/networks.md's sentence on MONAI's UNet and AttentionUnet planned under the resident
    state plus a share of the step's growth, and the plans trained
    (``estimator_accuracy --grid monai-unets --budget-of-growth F``)."""
    path = results / "cpu" / "estimator_monai_unets.json"
    if not path.is_file():
        return None
    doc = results_io.load(path)
    rows = [r for r in doc["rows"] if r["grid"] == "monai-unets" and "planner" in r]
    if not rows:
        return None
    answers = []
    for row in rows:
        check = row["planner"]
        name = row["name"].split(" (")[0]
        if "failed" in check:
            answers.append(f"{name}: the plan failed to train ({check['failed']})")
        elif check["answer"] is None:
            answers.append(f"{name}: nothing fits {check['budget_bytes'] / MIB:,.0f} MiB")
        else:
            answer = " ".join(f"`{a}`" for a in check["answer"]) or "unchanged"
            verdict = "under" if check["under_budget"] else "over"
            answers.append(
                f"{name} at {check['budget_bytes'] / MIB:,.0f} MiB: {answer}, trained at "
                f"{check['measured_peak_bytes'] / MIB:,.1f} MiB ({verdict})"
            )
    share = doc.get("budget_of_growth")
    text = (
        f"Under a budget of the resident state plus {share:.0%} of the step's growth (float32, "
        f"batch 2 of 32×64×64; {doc.get('cpu_description') or doc['cpu']}; "
        f"{_sample(samples.grid('monai-unets'))}): " + "; ".join(answers) + f" (`{rel(path)}`)."
    )
    return textwrap.fill(text, 100, break_long_words=False, break_on_hyphens=False)


def rule_effects(results: Path) -> str | None:
    """Per held-out grid (its newest report): the rules added since the grid before it, the rows
    each rule changes and the added rules that change none."""
    reports = {}
    for path in results_io.runs("rule_effects", "cpu", results):  # oldest first
        doc = results_io.load(path)
        reports.update(dict.fromkeys(doc["grids"], (path, doc)))
    if not reports:
        return None
    captions = {f"{rel(p)} ({results_io.machine_line(d)})" for p, d in reports.values()}
    lines = [
        *sorted(captions),
        "",
        "| grid | rules added since the grid before | rules that change a row: rows, largest "
        "change of the growth | added, no row |",
        "| --- | --- | --- | --- |",
    ]
    for name, (_, doc) in sorted(reports.items()):
        found = doc["grids"][name]
        rows = [r for r in doc["rows"] if r["grid"] == name and "without" in r]
        cells = []
        for rule in dict.fromkeys(rule for r in rows for rule in r["without"]):
            changed = [r for r in rows if rule in r["without"]]
            changes = [r["without"][rule] / r["estimated_bytes"] - 1 for r in changed]
            cells.append(f"{rule}: {len(changes)} of {len(rows)}, {pct(max(changes, key=abs))}")
        added = found["added_since_previous"] if found["previous"] else ["(the first grid)"]
        untested = [rule for rule in added if rule in found["unchanged_by"]]
        lines.append(
            f"| {name} | {', '.join(added) or 'none'} | {'; '.join(cells) or 'none'} | "
            f"{', '.join(untested) or 'none'} |"
        )
    return "\n".join(lines)


# the tables of the retired studies' results files (``benchmarks.runner.RETIRED``)

#: the input depths docs/benchmarks.md shows of ``cpu_bf16_conv.py``'s files (they hold 1 to 4)
BF16_CONV_DEPTHS = (2,)


@newest("validation_memory")
def validation_memory(path: Path, doc: dict) -> str:
    """Validation's memory on the CPU, measured against the estimate (``validation_memory.py``)."""
    lines = [
        f"{rel(path)} ({results_io.machine_line(doc)}):",
        "",
        "| case | volume | precision | windows | measured rise MiB | estimated MiB | error |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for r in doc["rows"]:
        lines.append(
            f"| {r['case']} | {'×'.join(map(str, r['volume_shape']))} | {r['precision']} | "
            f"{r['windows']} | {r['measured_growth'] / MIB:,.1f} | "
            f"{r['estimated_growth'] / MIB:,.1f} | {pct(r['error'])} |"
        )
    return "\n".join(lines)


#: ``data_throughput.py --compare``'s loaders by their key (files of 2026-12-02 and -03 named
#: them ``MONAI:`` and ``MONAI on volseg's terms:``)
LOADER_NAMES = {
    "monai": "a ten-line MONAI loader",
    "monai_in_place": "the ten-line MONAI loader on volseg's terms",
    "volseg": "volseg",
}


@every_file(
    "loader_compare",
    "| file | machine, command | loader (1 thread, 0 workers) | build + first batch (s) "
    "| s/batch |",
    "| --- | --- | --- | ---: | ---: |",
)
def loader_compare(path: Path, doc: dict) -> list[str]:
    """volseg's loader against a ten-line MONAI loader, as written and on volseg's terms, per
    results file (``data_throughput.py --compare``). A file whose rows do not record their
    threads has the process's count before the comparison in ``settings.threads``: the
    comparison itself ran on one thread, and the table says so."""
    threads = doc.get("settings", {}).get("threads")
    note = (
        f" (ran on 1 thread, not its recorded {threads})"
        if threads not in (None, 1) and all("threads" not in r for r in doc["rows"])
        else ""
    )
    lines = []
    for r in doc["rows"]:
        what = r["label"].split(": ", 1)[-1]
        name = LOADER_NAMES.get(r.get("loader"), r["label"].split(": ", 1)[0])
        lines.append(
            f"| {rel(path)}{note} | {results_io.machine_line(doc)} | {name}: {what} | "
            f"{r['first_batch_s']:.2f} | {r['s_per_batch']:.3f} |"
        )
    return lines


@every_file(
    "step_profile",
    "| file | CPU | ISA | network | s/step | GFLOP/step | of fp32 GEMM peak | in convolutions "
    "| next largest operators |",
    "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | --- |",
)
def step_profile(path: Path, doc: dict) -> list[str]:
    """A float32 training step's self CPU time by operator, per network and results file
    (``step_profile.py``): the share spent in convolutions (forward and backward) and the
    three largest other operators."""
    lines = []
    for r in doc["rows"]:
        total = r["profiled_self_s_per_step"]
        conv = [o for o in r["ops"] if "convolution" in o["op"]]
        others = [o for o in r["ops"] if "convolution" not in o["op"]][:3]
        rest = ", ".join(f"{o['op']} {o['self_s_per_step'] / total:.1%}" for o in others)
        lines.append(
            f"| {rel(path)} | {doc['cpu']} | {held_isa(doc)} | {r['network']} | "
            f"{r['seconds_per_step']:.3f} | {r['flops_per_step'] / 1e9:.1f} | "
            f"{r['of_fp32_peak']:.2f} | {sum(o['self_s_per_step'] for o in conv) / total:.0%} | "
            f"{rest} |"
        )
    return lines


@newest("network_levers")
def network_levers(path: Path, doc: dict) -> str:
    """Each lever's cut per network: measured on the CPU, estimated for a GPU
    (``network_levers.py``)."""
    lines = [
        f"{rel(path)} ({results_io.machine_line(doc)}; float32 on the CPU, a steady step's "
        f"peak rise over {doc['steps']} optimizer steps; the GPU column: the estimator's peak "
        f"allocated for {doc['gpu_estimate']}, not measured):",
        "",
        "| network | lever | CPU measured MiB | cut | CPU estimated MiB | GPU estimated MiB "
        "| cut |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in doc["rows"]:
        measured = r.get("cpu_measured_growth")
        cpu = (
            f"{measured / MIB:,.1f} | {r['cpu_measured_cut']:.2f}x | "
            f"{r['cpu_estimated_growth'] / MIB:,.1f}"
            if measured is not None
            else "not on a CPU | | "
        )
        lines.append(
            f"| {r['network'].split(' (')[0].split(' fp32')[0]} | {r['lever']} | {cpu} | "
            f"{r['gpu_estimated_peak'] / MIB:,.1f} | {r['gpu_estimated_cut']:.2f}x |"
        )
    return "\n".join(lines)


#: sides that a later ``real_data.py --sides ...`` file adds to a learning table
LATER_SIDES = ("nnunet_nomirror", "nnunet_own_plan")


#: nnU-Net v2's full schedule in optimizer steps: ``nnUNetTrainer``'s ``num_epochs`` (1000)
#: times its ``num_iterations_per_epoch`` (250)
NNUNET_SCHEDULE_STEPS = 1000 * 250


def side_label(side: str, rows: list[dict]) -> str:
    """What a learning table's side ran, by name: nnU-Net's rows say the share of its schedule
    they got and whose patch and network they trained; the MONAI loop given volseg's recipe is
    named as the equal-terms anchor."""
    if side.startswith("nnunet"):
        steps = sum(r["steps"] for r in rows) / len(rows)
        share = 100 * steps / NNUNET_SCHEDULE_STEPS
        # a handful of steps is still a share of the schedule, not 0.00%
        shown = f"{share:.2f}" if share >= 0.01 else f"{share:.1g}"
        plan = "its own plan" if side == "nnunet_own_plan" else "volseg's patch and network"
        label = f"nnU-Net v2's trainer, {shown}% of its schedule, {plan}"
        return label + (", no mirroring" if side == "nnunet_nomirror" else "")
    if side == "monai_volseg":
        return "MONAI loop, volseg's recipe (the equal-terms anchor)"
    return rows[0]["method"].split(" (")[0]


def _real_data_files(results: Path, data: str) -> list[Path]:
    """The newest ``real_data.py`` file of ``data`` that ran nnU-Net's recipe beside volseg,
    then the newest file of each of :data:`LATER_SIDES` run on the same terms after it: the same
    data, budget, precision and mode on the same CPU and kernels (a wall-clock budget buys
    different work on another CPU)."""
    paths = results_io.runs("real_data", "cpu", results)
    settings = {}
    for path in paths:
        doc = results_io.load(path)
        machine = {"cpu": doc.get("cpu"), "cpu_capability": doc.get("cpu_capability")}
        settings[path] = {**doc.get("settings", {}), **machine}
    base = next(
        (
            p
            for p in reversed(paths)
            if settings[p].get("data") == data and "nnunet" in settings[p].get("sides", [])
        ),
        None,
    )
    if base is None:
        return []
    terms = ("data", "budget_s", "precision", "mode", "cpu", "cpu_capability")
    later = []
    for side in LATER_SIDES:
        same = [
            p
            for p in paths[paths.index(base) + 1 :]
            if side in settings[p].get("sides", [])
            and all(settings[p].get(k) == settings[base].get(k) for k in terms)
        ]
        later += same[-1:]
    return [base, *dict.fromkeys(later)]


def learning(results: Path, data: str) -> str | None:
    """volseg, nnU-Net's recipe at equal compute and the MONAI loop (as its tutorials, and with
    volseg's recipe) on ``data=<data>``: per side the mean over its runs (``real_data``; the
    Dice per class stays in the results file)."""
    paths = _real_data_files(results, data)
    if not paths:
        return None
    doc = results_io.load(paths[0])
    s = doc["settings"]
    rows = list(doc["rows"])
    for path in paths[1:]:
        rows += [r for r in results_io.load(path)["rows"] if r["side"] in LATER_SIDES]
    also = "".join(f" and {rel(p)}" for p in paths[1:])
    head = (
        f"{rel(paths[0])}{also} ({results_io.machine_line(doc)}; {s['budget_s']} s a run, "
        f"{s['mode']}, precision {s['precision']} on every side, seeds "
        f"{', '.join(map(str, s['seeds']))}):"
    )
    return f"{head}\n\n{learning_rows(rows)}"


def learning_rows(rows: list[dict]) -> str:
    """The learning table of ``real_data`` rows: per side the mean over its runs."""
    sides = list(dict.fromkeys(r["side"] for r in rows))
    runs = {side: [r for r in rows if r["side"] == side] for side in sides}
    method = {side: side_label(side, runs[side]) for side in sides}
    # files from before the predicted labels were counted: the table as it was
    voxels = any("predicted_voxels_per_class" in r for r in rows)
    lines = [
        "| side | runs | steps (mean) | final val Dice (mean) | per run | best val Dice (mean) "
        "| classes at 0 (final) |" + (" background, of the predicted voxels |" if voxels else ""),
        "| --- | ---: | ---: | ---: | --- | ---: | ---: |" + (" ---: |" if voxels else ""),
    ]
    for side in sides:
        rs = runs[side]
        mean = {k: sum(r[k] for r in rs) / len(rs) for k in ("steps", "final_dice_mean")}
        best = sum(r["dice_mean"] for r in rs) / len(rs)
        each = ", ".join(f"{r['final_dice_mean']:.3f}" for r in rs)
        zeros = ", ".join(str(r["final_zero_classes"]) for r in rs)
        shares = ", ".join(background_share(r) for r in rs)
        lines.append(
            f"| {method[side]} | {len(rs)} | {mean['steps']:.0f} | {mean['final_dice_mean']:.3f} "
            f"| {each} | {best:.3f} | {zeros} |" + (f" {shares} |" if voxels else "")
        )
    return "\n".join(lines)


def background_share(row: dict) -> str:
    """The share of a run's predicted voxels (its ``predicted_voxels_per_class`` over the
    scored validation cases, background first) that are background, e.g. ``97.31%`` (``100%``
    only where every voxel is); ``-`` where the row has no count. 100.0% with a Dice of 0 on
    every class: a collapse to background."""
    counts = row.get("predicted_voxels_per_class")
    if not counts:
        return "-"
    background, total = next(iter(counts.values())), sum(counts.values())
    if background == total:  # all background: no rounding can say so by mistake
        return "100%"
    return f"{min(100 * background / total, 99.99):.2f}%"


@newest("cross_entropy_weight")
def cross_entropy_weight(path: Path, doc: dict) -> str:
    """unet_tiny's cross-entropy weight 0.25 against 1.0 on few-class tasks
    (``cross_entropy_weight.py``)."""
    s = doc["settings"]
    head = (
        f"{rel(path)} ({results_io.machine_line(doc)}; {s['budget_s']} s a run, the two "
        f"weights at the same time, 1 thread each, {s['precision']}):"
    )
    rows = doc["rows"]
    lines = [
        head,
        "",
        "| data | lambda_ce | runs | best val Dice (mean) | final val Dice (mean) "
        "| best, per run |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for data in dict.fromkeys(r["data"] for r in rows):
        for weight in sorted({r["lambda_ce"] for r in rows if r["data"] == data}):
            rs = [r for r in rows if (r["data"], r["lambda_ce"]) == (data, weight)]
            best = sum(r["dice_mean"] for r in rs) / len(rs)
            final = sum(r["final_dice_mean"] for r in rs) / len(rs)
            each = ", ".join(f"{r['dice_mean']:.3f}" for r in rs)
            lines.append(f"| {data} | {weight:g} | {len(rs)} | {best:.3f} | {final:.3f} | {each} |")
    return "\n".join(lines)


@newest("data_throughput")
def data_throughput(path: Path, doc: dict) -> str:
    """The training loader's samples/s per dataset and worker count, the CPU step beside it, and
    the workers a recorded GPU step needs (``data_throughput.py``)."""
    rows = doc["rows"]
    lines = [
        f"{rel(path)} ({results_io.machine_line(doc)}; batch 2, cached in memory):",
        "",
        "| what | data | setting | first batch (s) | training samples/s |",
        "| --- | --- | --- | ---: | ---: |",
    ]
    for r in rows:
        if r["what"] == "loader":
            data = f"{r['data']} {'x'.join(map(str, r['shape']))}, patch " + "x".join(
                map(str, r["patch"])
            )
            auto = f" ({r['resolved_workers']})" if r["num_workers"] == "auto" else ""
            lines.append(
                f"| loader | {data} | `data.num_workers={r['num_workers']}`{auto} | "
                f"{r['first_batch_s']:.2f} | {r['samples_per_s']:.1f} |"
            )
        elif r["what"] == "cpu_step":
            lines.append(
                f"| CPU training step | {r['shape']} | {r['model']}, {r['precision']} | | "
                f"{r['samples_per_s']:.2f} |"
            )
    feed = [r for r in rows if r["what"] == "gpu_feed"]
    if feed:
        lines += [
            "",
            "| recorded GPU step | samples/s needed | one worker delivers | workers needed |",
            "| --- | ---: | ---: | ---: |",
        ]
        for r in feed:
            lines.append(
                f"| {r['model']} {r['shape']}, {r['gpu']} ({r['recorded_in']}) | "
                f"{r['samples_per_s_needed']:.1f} | {r['one_worker_samples_per_s']:.1f} | "
                f"{r['workers_needed']} |"
            )
    return "\n".join(lines)


#: training_overheads.py's timer items, in the table's order
OVERHEADS = {
    "checkpoint writes during training": "saves during training (loop held)",
    "checkpoint writes at the end of fit (final save, waiting for writes)": "end of fit",
    "background writes (beside the loop)": "writer thread (beside the loop)",
    "logging": "logging",
    "validation overlays": "validation overlays",
    "memory monitor (per-step reads, charts written)": "memory monitor",
}


@newest("training_overheads")
def training_overheads(path: Path, doc: dict) -> str:
    """Wall time and what a run spends beside its steps, per ``async_checkpoint``
    (``training_overheads.py``)."""
    lines = [
        f"{rel(path)} ({results_io.machine_line(doc)}):",
        "",
        "| run | `async_checkpoint` | steps | wall (s) | " + " | ".join(OVERHEADS.values()) + " |",
        "| --- | --- | ---: | ---: | " + " | ".join("---:" for _ in OVERHEADS) + " |",
    ]
    for r in doc["rows"]:
        cells = []
        for item in OVERHEADS:
            got = r["items"].get(item)
            if got is None:
                cells.append("–")
                continue
            share = got["seconds"] / r["wall_s"]
            cells.append(f"{got['seconds']:.2f} s, {got['calls']} calls, {share:.1%}")
        lines.append(
            f"| {r['run']}, {r['epochs']} epochs, max_time_share {r['max_time_share']} | "
            f"{r['async_checkpoint']} | {r['steps']} | {r['wall_s']:.1f} | "
            + " | ".join(cells)
            + " |"
        )
    return "\n".join(lines)


@newest("levers")
def levers_cpu(path: Path, doc: dict) -> str:
    """Each memory lever's step rise, activations kept and step time on a CPU
    (``levers.py``)."""
    s = doc["settings"]
    lines = [
        f"{rel(path)} ({results_io.machine_line(doc)}; batch {s['batch']} of "
        f"1×{'×'.join(map(str, s['shape']))}, best of {s['steps']} steps):",
        "",
        "| lever | step adds (MiB) | ratio | activations kept (MiB) | ratio | s/step | ratio |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    base = doc["rows"][0]
    for r in doc["rows"]:
        lines.append(
            f"| {r['lever']} | {r['added_mib']:,.0f} | {r['added_mib'] / base['added_mib']:.2f} | "
            f"{r['activations_mib']:,.0f} | "
            f"{r['activations_mib'] / base['activations_mib']:.2f} | {r['seconds']:.2f} | "
            f"{r['seconds'] / base['seconds']:.2f} |"
        )
    return "\n".join(lines)


@newest("lever_time_factors")
def lever_time_factors(path: Path, doc: dict) -> str:
    """Each lever's predicted step-time factor (and its FLOPs factor) against the measured one
    (``lever_time_factors.py``)."""
    lines = [
        f"{rel(path)} ({results_io.machine_line(doc)}; float32, the fastest step of at least "
        f"{doc['steps']} and 3 s):",
        "",
        "| network | setting | predicted | FLOPs alone | measured | error |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for r in doc["rows"]:
        if not r["setting"]:
            continue  # the configured step: 1.00 by definition
        flops = r.get("flops_factor")
        lines.append(
            f"| {r['network']} | {r['setting'] or 'as configured'} | "
            f"{r['predicted_factor']:.2f} | {'' if flops is None else f'{flops:.2f}'} | "
            f"{r['measured_factor']:.2f} | {pct(r['error'])} |"
        )
    # the headline is the worst: each run of the same code, back to back, by its worst row
    same = [
        (p, d)
        for p in results_io.runs("lever_time_factors", "cpu", path.parent.parent)
        if (d := results_io.load(p))["code"]["sources"] == doc["code"]["sources"]
        and results_io.held_isa(d) == results_io.held_isa(doc)
    ]
    if len(same) > 1:
        worst = []
        for p, d in same:
            row = max(d["rows"], key=lambda r: abs(r["error"]))
            worst.append(f"`{p.name}` {pct(row['error'])} ({row['network']}, {row['lever']})")
        lines += ["", f"Every run of this code, by its worst row: {'; '.join(worst)}"]
    return "\n".join(lines)


@newest("train_throughput")
def train_throughput(path: Path, doc: dict) -> str:
    """Steps per second through Lightning and a plain loop, FLOPs and the fraction of the
    dtype's matmul peak (``train_throughput.py``)."""
    s = doc["settings"]
    peaks = s["matmul_peak_flops_per_s"]
    lines = [
        f"{rel(path)} ({results_io.machine_line(doc)}; batch {'×'.join(map(str, s['batch']))}, "
        f"best of {s['repeats']} after {s['warmup']} warm-up steps; matmul peak fp32 "
        f"{peaks['fp32'] / 1e9:,.0f} GFLOP/s, bf16 {peaks['bf16'] / 1e9:,.0f}):",
        "",
        "| network | variant | Lightning it/s | plain it/s | Lightning/plain | GFLOP/step "
        "| GFLOP/s | of dtype peak | plain |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in doc["rows"]:
        peak = peaks["bf16" if r["variant"].startswith("bf16") else "fp32"]
        lightning, plain = r["lightning_s_per_step"], r["plain_s_per_step"]
        lines.append(
            f"| {r['model']} | {r['variant']} | {1 / lightning:.2f} | {1 / plain:.2f} | "
            f"{plain / lightning:.2f} | {r['flops_per_step'] / 1e9:,.1f} | "
            f"{r['flops_per_step'] / lightning / 1e9:,.0f} | {r['of_dtype_peak']:.2f} | "
            f"{r['flops_per_step'] / plain / peak:.2f} |"
        )
    return "\n".join(lines)


@every_file(
    "default_run",
    "| file | CPU (cores) | ISA | precision `auto` chose | whole command | steps "
    "| best `val/dice_mean` | reached 0.80 at epoch |",
    "| --- | --- | --- | --- | ---: | ---: | ---: | ---: |",
)
def default_run(path: Path, doc: dict) -> list[str]:
    """``python train.py`` timed whole, one row per results file (``default_run.py``)."""
    r = doc["rows"][0]
    minutes, seconds = divmod(round(r["whole_command_s"]), 60)
    return [
        f"| {rel(path)} | {doc['cpu']} ({doc.get('cores')}) | {held_isa(doc)} | "
        f"{r['precision']} | {minutes} min {seconds} s | {r['steps']} | "
        f"{r['best_val_dice_mean']:.3f} | {r['first_epoch_reaching']} |"
    ]


@every_file(
    "cpu_precision",
    "| file | CPU | ISA | work | float32 (s) | bf16 autocast (s) | bf16 / float32 |",
    "| --- | --- | --- | --- | ---: | ---: | ---: |",
)
def cpu_precision(path: Path, doc: dict) -> list[str]:
    """float32 against bf16 autocast per CPU and ISA setting (``cpu_precision.py``)."""
    return [
        f"| {rel(path)} | {doc['cpu']} | {held_isa(doc)} | {r['work']} | "
        f"{r['float32_s']:.3f} | {r['bf16_s']:.3f} | {r['ratio']:.2f} |"
        for r in doc["rows"]
    ]


@every_file(
    "memory_monitor_overhead",
    "| file | CPU | step without (ms) | with the monitor (ms) | difference | hooks (ms) "
    "| hooks, share of the step |",
    "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
)
def memory_monitor_overhead(path: Path, doc: dict) -> list[str]:
    """The memory monitor's hooks and a step with and without it, per results file
    (``memory_monitor_overhead.py``)."""
    lines = []
    for r in doc["rows"]:
        without, with_ = r["s_per_step_without"], r["s_per_step_with"]
        lines.append(
            f"| {rel(path)} | {doc['cpu']} | {without * 1e3:.1f} | {with_ * 1e3:.1f} | "
            f"{pct(with_ / without - 1)} | {r['hooks_s_per_step'] * 1e3:.2f} | "
            f"{r['hooks_share']:.2%} |"
        )
    return lines


@every_file(
    "cpu_bf16_conv",
    "| file | CPU | ISA | layer | input (N, C, D, H, W) | output | input gradient "
    "| weight gradient |",
    "| --- | --- | --- | --- | --- | ---: | ---: | ---: |",
)
def cpu_bf16_conv(path: Path, doc: dict) -> list[str]:
    """The largest relative error of bf16 convolutions against float32 per layer at the input
    depths of :data:`BF16_CONV_DEPTHS`, per CPU and ISA setting (``cpu_bf16_conv.py``); a wrong
    kernel's cell in bold."""
    lines = []
    for r in doc["rows"]:
        if r["input_shape"][2] not in BF16_CONV_DEPTHS:
            continue
        cells = [
            f"**{value:.2g}**" if wrong else f"{value:.4f}"
            for value, wrong in zip(
                (r["output"], r["input_gradient"], r["weight_gradient"]), r["wrong"], strict=True
            )
        ]
        lines.append(
            f"| {rel(path)} | {doc['cpu']} | {held_isa(doc)} | {r['layer']} | "
            f"{tuple(r['input_shape'])} | " + " | ".join(cells) + " |"
        )
    return lines


def nnunet_side_by_side(results: Path) -> str | None:
    """nnU-Net's 3d_fullres plan beside volseg's for the same 8 GB target, and volseg's estimate
    of nnU-Net's planned step on CUDA (``benchmarks/results/nnunet/side_by_side.json``)."""
    path = results / "nnunet" / "side_by_side.json"
    if not path.exists():
        return None
    doc = json.loads(path.read_text())
    m = doc["machine"]
    head = (
        f"{rel(path)} ({m['cpu']} ({', '.join(m['isa_flags'])}), torch {m['torch']}, nnU-Net v2 "
        f"{m['nnunetv2']}, {m['date']}: `{doc['command']}`; the step's memory is estimated by "
        f"volseg's estimator as of that date, not measured; the CUDA context is the estimator's "
        f"figure of that date, not a GPU's):"
    )
    return f"{head}\n\n{side_by_side_rows(doc['rows'])}"


def side_by_side_rows(rows: dict[str, dict]) -> str:
    """nnU-Net's and volseg's plans of each dataset, then nnU-Net's step as volseg estimates it."""
    lines = [
        "| dataset | planner | spacing [z, y, x] | patch | batch | stages | features / widths |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, row in rows.items():
        n, v = row["nnunet"], row["volseg"]
        spacing = [round(s, 3) for s in n["spacing"]]
        lines.append(
            f"| {name} | nnU-Net 3d_fullres ({row['nnunet_target_gb']:g} GB target) | {spacing} "
            f"| {n['patch_size']} | {n['batch_size']} | {n['n_stages']} "
            f"| {n['features_per_stage']} |"
        )
        vs = v["spacing"] or [round(s, 3) for s in v["median_spacing"]]
        lines.append(
            f"| {name} | volseg plan.py (memory.budget={row['budget']}) | {vs} "
            f"| {v['patch_size']} | {v['batch_size']} (largest within budget: "
            f"{v['largest_batch_within_budget']}) | {v['n_stages']} | {v['widths']} |"
        )
    lines += [
        "",
        "| dataset | nnU-Net step (batch × patch) | parameters | peak allocated | peak reserved "
        "| + CUDA context | nnU-Net's proxy | nnU-Net's VRAM target |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, row in rows.items():
        e, s = row["estimate_of_nnunet_step"], row["step_input"]
        lines.append(
            f"| {name} | {s['image_shape'][0]} × {list(s['image_shape'][2:])} "
            f"| {e['num_parameters'] / 1e6:.1f}M | {_mib_text(e['peak_allocated'])} MiB "
            f"| {_mib_text(e['peak_reserved'])} MiB | {_mib_text(e['process_total'])} MiB "
            f"| {e['nnunet_proxy']['gb']:.2f} GB ({_mib_text(e['nnunet_proxy']['gb'] * 1e9)} MiB) "
            f"| {row['nnunet_target_gb']:g} GB ({_mib_text(row['nnunet_target_gb'] * 1e9)} MiB) |"
        )
    return "\n".join(lines)


def _mib_text(nbytes: float) -> str:
    return f"{nbytes / MIB:,.0f}"


FIGURES: dict[str, Callable[[Path], str | None]] = {
    "memory_fewer_parameters": memory_fewer_parameters,
    "estimator_held_out_kinds": estimator_held_out_kinds,
    "estimator_worst_held_out": estimator_worst_held_out,
    "networks_tight_budget": networks_tight_budget,
}


#: marker name -> the function that builds its table from ``benchmarks/results``
TABLES: dict[str, Callable[[Path], str | None]] = {
    "levers_cuda": levers_cuda,
    "cuda_estimate_errors": cuda_estimate_errors,
    "cuda_recorded": cuda_recorded,
    "validation_memory": validation_memory,
    "loader_compare": loader_compare,
    "step_profile": step_profile,
    "network_levers": network_levers,
    "learning_mni152": functools.partial(learning, data="mni152"),
    "learning_mni152_regions": functools.partial(learning, data="mni152_regions"),
    "learning_mni152_hemispheres": functools.partial(learning, data="mni152_hemispheres"),
    "cross_entropy_weight": cross_entropy_weight,
    "default_run": default_run,
    "cpu_precision": cpu_precision,
    "estimator_accuracy": estimator_accuracy,
    "learning_mni152_regions_lr": functools.partial(learning, data="mni152_regions_lr"),
    "data_throughput": data_throughput,
    "training_overheads": training_overheads,
    "levers_cpu": levers_cpu,
    "lever_time_factors": lever_time_factors,
    "train_throughput": train_throughput,
    "memory_monitor_overhead": memory_monitor_overhead,
    "cpu_bf16_conv": cpu_bf16_conv,
    "nnunet_side_by_side": nnunet_side_by_side,
    "cuda_margins": cuda_margins,
    "cpu_margins": cpu_margins,
    "rule_effects": rule_effects,
}


def regenerate(text: str, results: Path = results_io.RESULTS) -> tuple[str, list[str]]:
    """``text`` with every marked table rebuilt; the names of the tables rebuilt."""
    done = []

    def replace(match: re.Match) -> str:
        name = match["name"]
        if name not in TABLES:
            raise KeyError(f"<!-- table: {name} -->: no such table (known: {', '.join(TABLES)})")
        table = TABLES[name](results)
        if table is None:  # no results file yet: left as it is
            return match[0]
        done.append(name)
        return f"{match[1]}{table}\n\n{samples.table_line(name)}\n{match[4]}"

    def figure(match: re.Match) -> str:
        name = match["name"]
        if name not in FIGURES:
            raise KeyError(f"<!-- figure: {name} -->: no such figure (known: {', '.join(FIGURES)})")
        sentence = FIGURES[name](results)
        if sentence is None:  # no results file yet: left as it is
            return match[0]
        done.append(name)
        return f"{match[1]}{sentence}{match[4]}"

    return FIGURE.sub(figure, MARKER.sub(replace, text)), done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check, write nothing")
    parser.add_argument("--docs", type=Path, default=DOCS)
    parser.add_argument("--results", type=Path, default=results_io.RESULTS)
    args = parser.parse_args(argv)
    stale = []
    # the one writer of docs' tables; README's prose is written by hand (tests/test_docs.py
    # checks each of its figures against the table it links to)
    for doc in sorted(args.docs.glob("*.md")):
        if not doc.exists():
            continue
        text = doc.read_text()
        new, done = regenerate(text, args.results)
        if doc.name == "benchmarks.md":  # the networks tables: a table per results file
            from benchmarks import estimator_accuracy as networks

            files = [networks.NETWORKS_RESULTS, *networks.foreign_results(args.results)]
            new = networks.networks_docs(new, files, doc)
        if new != text:
            stale.append(doc.name)
            if not args.check:
                doc.write_text(new)
        if done:
            print(f"{doc.name}: {', '.join(done)}" + (" (changed)" if new != text else ""))
    index = json.dumps(samples.index(args.results), indent=2) + "\n"
    index_path = args.results / samples.INDEX.name
    if not index_path.exists() or index_path.read_text() != index:
        stale.append(str(index_path))
        if not args.check:
            index_path.write_text(index)
    if args.check and stale:
        print(f"out of date: {', '.join(stale)}; run python -m benchmarks tables")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
