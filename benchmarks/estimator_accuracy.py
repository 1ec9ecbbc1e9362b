"""How close is ``estimate_memory.py`` to real ``python train.py`` runs?

For each config, ``python train.py <overrides>`` runs in a fresh process for 3 optimizer steps
(validation off, the embedded dataset generated into a temporary folder, the run dir there too;
a config with another ``num_classes`` than the dataset's 5 trains on a copy with that many),
and the memory monitor's per-step figures are read back from the run's ``csv/metrics.csv``: a
step's measured rise is its peak (``mem/peak_allocated_mib``, the largest over the step's
micro-batches with ``trainer.accumulate_grad_batches``) minus what was held at its start
(``mem/step_start_allocated_mib`` of its first micro-batch), and the measured figure is the
largest rise of the steady steps (the 2nd and 3rd; the first also creates the optimizer state).
The estimate is ``estimate_run(plan).step.step_peak_growth`` of the config composed from the same
overrides: how far a steady step rises above what it holds at its start.

On a CPU the monitor reads the process's resident memory (VmRSS, and VmHWM reset at each phase
boundary). glibc keeps freed heap memory resident and reuses it, so by default a step's measured
rise is what it adds beyond the memory an earlier step left behind, not what its tensors take;
the children run with ``MALLOC_MMAP_THRESHOLD_=65536``, which serves every allocation of 64 KiB
or more with mmap and returns it to the system when freed, so the resident set follows the
tensors (``--malloc-default`` runs them as ``train.py`` runs by default, for comparison). With
``--device cuda`` (on a GPU) the children run ``trainer=gpu`` and the monitor's figures are the
caching allocator's (``max_memory_allocated`` rise, ``max_memory_reserved``), compared with the
CUDA estimate (CUDA context 0: the allocator's figures hold none of it).

The grids, each in sample (the estimator was tuned on it, or a change to it was judged on it) or
held out (:data:`SAMPLE`; each row of a results file says which): ``TUNED``, the configs the
estimator was tuned on; ``CHECKED``, fixed on 2026-12-02 as a held-out check and tuned on since;
the frozen held-out grids of ``benchmarks/grids/<name>.json`` (drawn by
``benchmarks/draw_grid.py``; the commit that added the file is recorded with each row);
``NETWORKS``, networks volseg did not write (MONAI's
DynUNet, SegResNet, SwinUNETR, BasicUNet, and the widely copied DoubleConv/Down/Up/OutConv U-Net
as a user's ``my_unet.py``, written into the work dir and put on the children's ``PYTHONPATH``);
``FOREIGN_NETWORKS`` (``foreign-networks``), other projects' U-Nets from their shipped configs
(nnU-Net's PlainConvUNet and ResidualEncoderUNet, pytorch-3dunet's UNet3D and ResidualUNet3D:
the networks extra). A run of the planned network grids alone writes
``<date>_estimator_networks[-N].json`` by default.
Each network is also planned under a budget below its configured step (75% of the estimated
total: ``python plan.py ... memory.budget=X``), and the plan trained (``python train.py
plan=plan.yaml``) to see whether its measured peak stays under the budget.

    python -m benchmarks estimator_accuracy                        # CPU, every grid
    python -m benchmarks estimator_accuracy --grid held-out-2026-12-03-b   # one grid
    python -m benchmarks estimator_accuracy --grid networks \\
        --json-out benchmarks/results/cpu/estimator_networks.json
    python -m benchmarks estimator_accuracy --grid foreign-networks --budget-of-growth 0.6
    python -m benchmarks estimator_accuracy --device cuda          # on a GPU machine
    python -m benchmarks estimator_accuracy --device cuda --snapshot-dir DIR

Also prints how long the reference config (unet_large, batch 2, 1x26x150x320, 16-true) takes to
estimate.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import textwrap
from pathlib import Path

import torch

from benchmarks import grid, results_io, samples
from benchmarks.grid import NETWORKS, Grid
from volseg.utils.units import MIB

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("PROJECT_ROOT", str(REPO))


def _grid(name: str) -> Grid:
    """A grid kept as ``benchmarks/grids/cpu/<name>.json`` (as CUDA's): ``[[name, overrides]]``."""
    path = REPO / "benchmarks" / "grids" / "cpu" / f"{name}.json"
    return [(n, list(o)) for n, o in json.loads(path.read_text())["configs"]]


#: the configs the estimator was tuned on
TUNED = _grid("tuned")
#: fixed before any of its results were seen (2026-12-02) as a held-out check; a change to the
#: estimator has been judged on it since, so it is in sample
CHECKED = _grid("checked-2026-12-02")


FROZEN = grid.frozen_grids()

GRIDS: dict[str, Grid] = {
    "tuned": TUNED,
    "checked-2026-12-02": CHECKED,
    **{
        name: [(c["name"], c["overrides"]) for c in frozen["configs"]]
        for name, frozen in FROZEN.items()
    },
    "networks": NETWORKS,
    "monai-unets": grid.MONAI_UNETS,
    "foreign-networks": grid.FOREIGN_NETWORKS,
}

#: grids whose configs are also planned under a budget below them and the plan trained
PLANNED = ("networks", "monai-unets", "foreign-networks")

#: in sample: the estimator was tuned on the grid, or a change to it was judged on its results;
#: held out: neither yet (a frozen grid says so in its file until it is judged on)
SAMPLE: dict[str, str] = {
    "tuned": "in sample",
    "checked-2026-12-02": "in sample",
    "networks": "in sample",
    "monai-unets": "in sample",
    "foreign-networks": "in sample",
    # a frozen grid's file, unless the estimator was judged on it since (benchmarks/samples.py)
    **{name: samples.grid(name)[0] for name in FROZEN},
}


#: the planner check's budget: this fraction of the configured step's estimated total. At a
#: batch of one the only lever is checkpointing, which leaves DynUNet and SwinUNETR about 79%
#: of their step here: a budget of 75% has no answer for them
BUDGET_FRACTION = 0.85

#: docs/benchmarks.md's networks tables lie between these lines: MONAI's networks and a user's
#: file, and other projects' U-Nets (the networks extra)
DOCS = REPO / "docs" / "benchmarks.md"
TABLE_START = "<!-- networks-table: written by benchmarks/estimator_accuracy.py --grid networks -->"
TABLE_END = "<!-- /networks-table -->"
FOREIGN_START = (
    "<!-- foreign-networks-table: written by benchmarks/estimator_accuracy.py "
    "--grid foreign-networks -->"
)
FOREIGN_END = "<!-- /foreign-networks-table -->"
#: each docs table's grid and markers
DOCS_TABLES = {
    "networks": (TABLE_START, TABLE_END),
    "foreign-networks": (FOREIGN_START, FOREIGN_END),
}

SEED = [
    "model=unet_large",
    "data.batch_size=2",
    "data.patch_size=[26,150,320]",
    "trainer.precision=16-true",
]


def _mib(nbytes: float) -> str:
    return f"{nbytes / MIB:,.1f}"


def _budget_rule(results: dict) -> str:
    share = results.get("budget_of_growth")
    if share is not None:
        return (
            f"the resident state its step holds at the start plus {100 * share:.0f}% of the "
            "step's estimated growth"
        )
    return f"{100 * results['budget_fraction']:.0f}% of the configured step's estimated total"


def networks_table(results: dict, grid_name: str = "networks") -> str:
    """A docs/networks.md table (the lines between its markers) from a ``--json-out`` file of
    the grid ``grid_name``: a sentence naming the CPU and the date, then one row per network."""
    rows = results["grids"][grid_name]
    versions = ", ".join(
        f"{name} {version}" for name, version in results.get("packages", {}).items()
    )
    caption = (
        f"Measured on {results.get('cpu_description') or results['cpu']}, {results['date']} "
        f"(torch {results['torch']}, MONAI {results['monai']}"
        f"{', ' + versions if versions else ''}; `{results['command']}`): "
        f"each row a real `python train.py` run of {results['steps']} optimizer steps on the "
        f"embedded dataset, the steady step's peak RSS rise (`{results['malloc']}`) against "
        "`estimate_run(plan).step.step_peak_growth`; then a budget of "
        f"{_budget_rule(results)} given "
        "to `python plan.py <overrides> memory.budget=X`, and the plan trained with `python "
        "train.py plan=plan.yaml`: its peak counted as the CPU estimate counts a total (tensor "
        "bytes: parameters, gradients and optimizer state held at the step's start, plus the "
        "step's measured rise)."
    )
    # a caption of short lines (a Markdown paragraph), the table after it
    lines = [
        textwrap.fill(caption, 100, break_long_words=False, break_on_hyphens=False),
        "",
        "| network | override | patch / batch | estimated MiB | measured MiB | error "
        "| budget MiB: the planner's answer | planned run: measured peak / budget MiB |",
        "| --- | --- | --- | ---: | ---: | ---: | --- | --- |",
    ]
    for row in rows:
        override = " ".join(
            o for o in row["overrides"] if o.startswith(("model/net=", "model.net.", "+model.net."))
        )
        if "failed" in row:
            lines.append(f"| `{row['name']}` | `{override}` | failed: {row['failed']} | | | | | |")
            continue
        patch = "×".join(str(p) for p in row["patch_size"])
        line = (
            f"| `{row['network']}` | `{override}` | {patch} / {row['batch_size']} "
            f"| {_mib(row['estimated_bytes'])} | {_mib(row['measured_bytes'])} "
            f"| {100 * row['error']:+.1f}% |"
        )
        check = row.get("planner")
        if check is None:
            line += " not run | not run |"
        elif "failed" in check:
            line += f" failed: {check['failed']} | not trained |"
        elif check["answer"] is None:
            line += f" {check['budget_bytes'] / MIB:,.0f}: nothing fits | not trained |"
        else:
            answer = " ".join(f"`{a}`" for a in check["answer"]) or "unchanged"
            verdict = "under" if check["under_budget"] else "**over**"
            line += (
                f" {check['budget_bytes'] / MIB:,.0f}: {answer} "
                f"| {_mib(check['measured_peak_bytes'])} / {check['budget_bytes'] / MIB:,.0f} "
                f"({verdict}) |"
            )
        lines.append(line)
    return "\n".join(lines) + "\n"


def networks_docs(text: str, results_paths: list[Path], docs: Path = DOCS) -> str:
    """``text`` (of ``docs``) with what lies between each table's markers
    (:data:`DOCS_TABLES`) replaced by :func:`networks_table` of each results file that holds its
    grid, one after the other in the order given (``benchmarks/tables.py`` writes them)."""
    documents = [json.loads(path.read_text()) for path in results_paths]
    for grid_name, (start, end) in DOCS_TABLES.items():
        holding = [doc for doc in documents if grid_name in doc.get("grids", {})]
        if not holding:
            continue
        head, found, rest = text.partition(start + "\n")
        _, found_end, tail = rest.partition(end)
        if not found or not found_end:
            raise SystemExit(f"{docs}: no '{start}' ... '{end}' markers")
        tables = "\n".join(networks_table(doc, grid_name) for doc in holding)
        text = head + start + "\n" + tables + end + tail
    return text


#: the results file of ``--grid networks`` that docs/benchmarks.md's networks table reads
NETWORKS_RESULTS = REPO / "benchmarks" / "results" / "cpu" / "estimator_networks.json"
#: the dated results files of the planned network grids (``<date>_estimator_networks[-N].json``)
NETWORKS_BENCHMARK = "estimator_networks"


def foreign_results(root: Path = results_io.RESULTS) -> list[Path]:
    """For each kind of CPU, the newest ``<date>_estimator_networks[-N].json`` run on it that
    holds the foreign-networks grid, complete; oldest first."""
    runs = results_io.runs(NETWORKS_BENCHMARK, "cpu", root)
    newest: dict[str, Path] = {}
    for path in runs:
        doc = json.loads(path.read_text())
        if "foreign-networks" in doc.get("grids", {}) and doc.get("complete"):
            newest[results_io.cpu_kind(doc)] = path
    return sorted(newest.values(), key=runs.index)


def network_packages() -> dict[str, str]:
    """The versions of the networks extra's packages installed here (by distribution name)."""
    from importlib import metadata

    found = {}
    for name in ("dynamic-network-architectures", "pytorch3dunet"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--grid", default="all", choices=["all", *GRIDS])
    parser.add_argument(
        "--malloc-default",
        action="store_true",
        help="CPU: run train.py without MALLOC_MMAP_THRESHOLD_ (glibc reuses freed heap memory)",
    )
    parser.add_argument(
        "--work-dir",
        type=Path,
        default=None,
        help="where the data and run dirs go (default: a temporary folder, removed after)",
    )
    parser.add_argument(
        "--snapshot-dir",
        type=Path,
        default=None,
        help="CUDA: write each run's allocator snapshot here (<grid>_<i>.pickle)",
    )
    parser.add_argument(
        "--shared-cpu",
        action="store_true",
        help="other work ran on the CPU meanwhile: the results file says that its run_seconds "
        "are no speed figure (the memory figures do not depend on it)",
    )
    parser.add_argument(
        "--only",
        default=None,
        nargs="+",
        metavar="TEXT",
        help="run only the configs whose name contains one of these TEXTs",
    )
    parser.add_argument(
        "--budget-of-growth",
        type=float,
        default=None,
        metavar="FRACTION",
        help="planned grids (networks, monai-unets): plan each config under the resident state "
        "its step holds at the start plus FRACTION of the step's growth (default: "
        f"{100 * BUDGET_FRACTION:.0f}%% of the step's estimated total)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=grid.RUN_TIMEOUT_S,
        help=f"seconds a train.py child may run before its config is recorded as failed "
        f"(default {grid.RUN_TIMEOUT_S}; raise it for bf16 configs on a CPU without native bf16)",
    )
    results_io.add_json_out(parser, "estimator_accuracy")
    parser.add_argument(
        "--resume",
        type=Path,
        default=None,
        metavar="RESULTS",
        help="an earlier, incomplete results file of the same grid: its measured configs are "
        "kept, the others run, and the file is rewritten in place",
    )
    args = parser.parse_args(argv)
    if args.snapshot_dir:
        args.snapshot_dir.mkdir(parents=True, exist_ok=True)

    grids = GRIDS if args.grid == "all" else {args.grid: GRIDS[args.grid]}
    if args.only is not None:
        grids = {
            g: [c for c in configs if any(text in c[0] for text in args.only)]
            for g, configs in grids.items()
        }
        grids = {g: configs for g, configs in grids.items() if configs}
        if not grids:
            only = " ".join(args.only)
            parser.error(f"--only {only}: no config of --grid {args.grid} has it in its name")

    today = datetime.date.today().isoformat()
    print(f"# estimator accuracy against python train.py on {args.device}, {today}")
    print()
    print(f"CPU: {results_io.cpu_description()}; torch {torch.__version__}")
    if args.device == "cuda" and torch.cuda.is_available():
        print(f"GPU: {torch.cuda.get_device_name()}")
    malloc = "glibc default" if args.malloc_default else "MALLOC_MMAP_THRESHOLD_=65536"
    print(
        f"child processes: python train.py ... trainer.max_steps={grid.STEPS}"
        + (f"; {malloc}" if args.device == "cpu" else "")
    )
    print()
    import monai

    records: dict[str, list[dict]] = {}
    written: list[Path | None] = []
    done: dict[str, dict[str, dict]] = {}
    if args.resume is not None:
        earlier = results_io.load(args.resume)
        if earlier.get("benchmark") != "estimator_accuracy":
            parser.error(f"--resume {args.resume}: not an estimator_accuracy results file")
        for row in earlier["rows"]:
            done.setdefault(row["grid"], {})[row["name"]] = row
        written.append(args.resume)

    def with_earlier(label: str, rows: list[dict]) -> list[dict]:
        """``rows`` with the resumed file's records of the configs this run left out
        (``--only``), in the grid's order."""
        new = {r["name"]: r for r in rows}
        earlier = done.get(label, {})
        names = [name for name, _ in GRIDS[label]]
        return [new.get(n) or earlier[n] for n in names if n in new or n in earlier]

    def save(
        label: str | None = None, rows: list[dict] | None = None, complete: bool = False
    ) -> None:
        """The results file of the grids so far (rewritten after each config)."""
        if label is not None:
            records[label] = with_earlier(label, list(rows or []))
        doc = results_io.result(
            "estimator_accuracy",
            [{"grid": g, **r} for g, grid_rows in records.items() for r in grid_rows],
            script=__file__,
            argv=argv,
            device=args.device,
            monai=monai.__version__,
            packages=network_packages(),
            python=sys.version.split()[0],
            malloc=malloc if args.device == "cpu" else None,
            steps=grid.STEPS,
            budget_fraction=BUDGET_FRACTION,
            budget_of_growth=args.budget_of_growth,
            timeout_s=args.timeout,
            complete=complete,
            run_seconds=(
                "wall time on a CPU shared with other work: not a speed figure"
                if args.shared_cpu
                else "wall time, nothing else running"
            ),
            samples={
                g: {"sample": SAMPLE[g], "frozen_in": grid.frozen_in(g)} for g in (*records, *grids)
            },
            grids=records,
        )
        target = written[0] if written else args.json_out
        # the planned network grids alone: <date>_estimator_networks[-N].json by default
        name = NETWORKS_BENCHMARK if set(grids) <= {"networks", "foreign-networks"} else None
        path = results_io.write(doc, target, device=args.device, name=name)
        if not written:
            written.append(path)

    with tempfile.TemporaryDirectory(prefix="volseg-estimator-") as tmp:
        work_dir = args.work_dir or Path(tmp)
        work_dir.mkdir(parents=True, exist_ok=True)
        for label, configs in grids.items():
            rows = grid.run_grid(
                configs,
                label,
                args.device,
                work_dir,
                SAMPLE[label],
                args.malloc_default,
                args.snapshot_dir,
                planner=label in PLANNED and args.device == "cpu",
                on_record=save,
                done=done.get(label),
                timeout=args.timeout,
                budget_fraction=BUDGET_FRACTION,
                growth_fraction=args.budget_of_growth,
            )
            records[label] = with_earlier(label, rows)
    for label, rows in records.items():
        print(f"{label}: {grid.summary_line(rows)}")
    save(complete=args.only is None)
    seed = grid.predict(SEED, "cuda", Path(tempfile.gettempdir()))
    print(
        f"reference config (unet_large, batch 2, 1x26x150x320, 16-true) estimated for CUDA in "
        f"{seed['seconds']:.1f} s: peak allocated {seed['peak_allocated'] / MIB:,.0f} MiB, "
        f"reserved {seed['peak_reserved'] / MIB:,.0f} MiB"
    )


if __name__ == "__main__":
    main()
