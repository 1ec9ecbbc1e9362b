"""Run a benchmark by name: ``python -m benchmarks <name> [args]``, ``python -m benchmarks --list``.

Every benchmark is a module with ``main(argv)``; :data:`BENCHMARKS` names them, each with its
module, its kind and one line on what it measures. A module is imported only when it runs, so
``--list`` and the GPU machine's checks need none of the benchmarks' own dependencies. A study
whose script has left the tree is in :data:`RETIRED`, with the commit and path that bring it
back.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from typing import NamedTuple

from benchmarks import results_io

#: the kinds, in the order ``--list`` prints them
KINDS = {
    "maintained": "maintained benchmarks (each guards a figure the docs state)",
    "tool": "tools (results files to docs tables, held-out grids)",
}


class Benchmark(NamedTuple):
    """One runnable name: its module (``benchmarks.<...>``), kind and what it measures."""

    module: str
    kind: str
    measures: str


def _maintained(name: str, measures: str) -> tuple[str, Benchmark]:
    return name, Benchmark(f"benchmarks.{name}", "maintained", measures)


def _tool(name: str, measures: str) -> tuple[str, Benchmark]:
    return name, Benchmark(f"benchmarks.{name}", "tool", measures)


BENCHMARKS: dict[str, Benchmark] = dict(
    [
        _maintained(
            "cuda_estimate_errors",
            "the CUDA estimate against every recorded GPU run; the planner's CUDA margins",
        ),
        _maintained(
            "cuda_results",
            "GPU runs of train.py/predict.py (steps, validation, prediction, allocator, levers)",
        ),
        _maintained(
            "estimator_accuracy", "the memory estimate against real train.py runs, per grid"
        ),
        _maintained("rule_effects", "which estimator rule changes which row of each held-out grid"),
        _maintained("gpu_train_speed", "train.py on a GPU: step time, data wait and MFU"),
        _maintained(
            "lever_time_factors", "each lever's predicted step-time factor against the measured"
        ),
        _maintained(
            "levers_estimated", "the memory levers estimated for a GPU beside what it measured"
        ),
        _maintained(
            "selective_checkpointing", "selective checkpointing beside none and all, estimated"
        ),
        _maintained(
            "fastest_fit", "the fastest fit's pick against every candidate trained, and baselines"
        ),
        _maintained("cpu_bf16_conv", "whether this CPU's bf16 3D convolutions get gradients right"),
        _tool("cpu_margins", "the CPU planner's margin per CPU kind, from the estimator's results"),
        _tool("draw_grid", "draws a held-out grid of configs for estimator_accuracy"),
        _tool("restamp", "estimates of every cited estimator file made again by today's code"),
        _tool("tables", "docs' tables regenerated from benchmarks/results/ (--check: unchanged)"),
    ]
)


class Retired(NamedTuple):
    """A study whose script left the tree: the last commit that has it, its path there and what
    it measured. ``git show COMMIT:PATH`` prints the script; ``git worktree add DIR COMMIT``
    checks that commit out whole, where ``python -m benchmarks <name>`` runs it again."""

    commit: str
    path: str
    measured: str


#: the last commit with the finished studies of ``benchmarks/archive/`` in its tree
ARCHIVE_AT = "f86c7dfed8de485ebcc7d07ff72657ab14a4f08f"


def _retired(name: str, measured: str, script: str = "") -> tuple[str, Retired]:
    return name, Retired(ARCHIVE_AT, f"benchmarks/archive/{script or name}.py", measured)


#: each retired name a results file or the docs give (its ``benchmark`` or its command's)
RETIRED: dict[str, Retired] = dict(
    [
        _retired("cpu_bf16_memory", "bf16 ops' memory beyond torch's allocator, vs the estimate"),
        _retired(
            "cpu_channels_last_memory",
            "channels-last convolutions' memory beyond their outputs, vs the estimate",
        ),
        _retired("cpu_precision", "float32 against bf16 autocast on this CPU: a conv and a step"),
        _retired("cross_entropy_weight", "unet_tiny's cross-entropy weight on the few-class tasks"),
        _retired("data_throughput", "the loader's samples/s beside the training step's"),
        _retired("default_run", "the default python train.py, timed whole"),
        _retired("gpu_memory_table", "the reference config's peak memory on a GPU, by module"),
        _retired("levers", "each memory lever's peak memory and step time on the CPU"),
        _retired(
            "loader_compare", "volseg's loader beside a MONAI loader (--compare)", "data_throughput"
        ),
        _retired(
            "memory_monitor_overhead", "seconds per training step with and without the monitor"
        ),
        _retired("network_levers", "what each memory lever cuts on networks volseg did not write"),
        _retired("nnunet_recipe", "nnU-Net v2's recipe at equal compute on a volseg dataset"),
        _retired("nnunet_side_by_side", "nnU-Net's 3d_fullres plan beside volseg's plan"),
        _retired("real_data", "volseg's default against nnU-Net and a MONAI loop on MNI152 data"),
        _retired("step_profile", "where a training step's time goes, by operator"),
        _retired(
            "train_throughput", "Lightning's step beside a plain loop's, and FLOP/s vs the CPU"
        ),
        _retired(
            "training_overheads", "a run's time beside its steps: checkpoints, logging, overlays"
        ),
        _retired("validation_memory", "validation's memory in real train.py runs vs estimate"),
    ]
)
RETIRED_TITLE = (
    "retired studies (their results files stay; `git show COMMIT:PATH` prints a script, "
    "`git worktree add DIR COMMIT` checks out the tree it ran in)"
)


def listing() -> str:
    """Every name with what it measures, grouped by kind; then the retired ones, with where."""
    width = max(map(len, [*BENCHMARKS, *RETIRED]))
    lines = []
    for kind, title in KINDS.items():
        lines += ["", f"{title}:"] if lines else [f"{title}:"]
        lines += [f"  {n:<{width}}  {b.measures}" for n, b in BENCHMARKS.items() if b.kind == kind]
    lines += ["", f"{RETIRED_TITLE}:"]
    lines += [
        f"  {n:<{width}}  {r.measured} ({r.commit[:12]}:{r.path})" for n, r in RETIRED.items()
    ]
    return "\n".join(lines)


USAGE = "usage: python -m benchmarks <name> [args] | --list   (<name> --help: its arguments)"


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``argv[0]``'s ``main(argv[1:])``; its exit code (a ``main`` that returns no int: 0).
    An unknown or retired name is one line on stderr (a retired one's: where it is) and exit
    code 2."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--list"]:
        print(listing())
        return 0
    if not args or args[0] in ("-h", "--help"):
        print(f"{USAGE}\n\n{listing()}")
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name in RETIRED:
        old = RETIRED[name]
        print(
            f"python -m benchmarks: {name} is retired; its script: git show {old.commit}:"
            f"{old.path} (to run it: git worktree add DIR {old.commit}, then in DIR: "
            f"python -m benchmarks {name})",
            file=sys.stderr,
        )
        return 2
    if name not in BENCHMARKS:
        known = ", ".join(BENCHMARKS)
        print(f"python -m benchmarks: unknown benchmark {name!r}; known: {known}", file=sys.stderr)
        return 2
    results_io.hold_code()  # the files this run writes are stamped with the code it starts with
    module = importlib.import_module(BENCHMARKS[name].module)
    # argparse names the command after argv[0]
    sys.argv = [f"python -m benchmarks {name}", *rest]
    code = module.main(rest)
    return code if isinstance(code, int) else 0
