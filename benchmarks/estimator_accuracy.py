"""How close is ``estimate_memory.py`` to real ``python train.py`` runs?

For each config, ``python train.py <overrides>`` runs in a fresh process for 3 optimizer steps
(validation off, the embedded dataset generated into a temporary folder, the run dir there too;
a config with another ``num_classes`` than the dataset's 5 trains on a copy with that many),
and the memory monitor's per-step figures are read back from the run's ``csv/metrics.csv``: a
step's measured rise is its peak (``mem/peak_allocated_mib``, the largest over the step's
micro-batches with ``trainer.accumulate_grad_batches``) minus what was held at its start
(``mem/step_start_allocated_mib`` of its first micro-batch), and the measured figure is the
largest rise of the steady steps (the 2nd and 3rd; the first also creates the optimizer state).
The estimate is ``estimate(cfg).step_peak_growth`` of the config composed from the same
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

Two grids: ``TUNED``, the configs the estimator was tuned on, and ``HELD_OUT``, fixed before any
result on it was seen and never tuned on.

    python benchmarks/estimator_accuracy.py                        # CPU, both grids
    python benchmarks/estimator_accuracy.py --grid held-out        # one grid
    python benchmarks/estimator_accuracy.py --device cuda          # on a GPU machine
    python benchmarks/estimator_accuracy.py --device cuda --snapshot-dir DIR

Also prints how long the reference config (unet_large, batch 2, 1x26x150x320, 16-true) takes to
estimate.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
os.environ.setdefault("PROJECT_ROOT", str(REPO))

from volseg.utils.cpu import cpu_description  # noqa: E402
from volseg.utils.units import MIB  # noqa: E402

#: optimizer steps per run: the first creates the optimizer state, the others are steady
STEPS = 3

Grid = list[tuple[str, list[str]]]

#: the configs the estimator was tuned on
TUNED: Grid = [
    (
        "unet_tiny fp32 b2 32x64x64",
        ["data.batch_size=2", "data.patch_size=[32,64,64]", "trainer.precision=32"],
    ),
    (
        "unet_tiny bf16-mixed b2 32x64x64",
        ["data.batch_size=2", "data.patch_size=[32,64,64]", "trainer.precision=bf16-mixed"],
    ),
    (
        "depth 3 [8,16,32] fp32 b4 16x64x64",
        [
            "model.net.widths=[8,16,32]",
            "data.batch_size=4",
            "data.patch_size=[16,64,64]",
            "trainer.precision=32",
        ],
    ),
    (
        "depth 5 [16..256] bf16-mixed b1 32x96x96",
        [
            "model.net.widths=[16,32,64,128,256]",
            "data.batch_size=1",
            "data.patch_size=[32,96,96]",
            "trainer.precision=bf16-mixed",
        ],
    ),
    (
        "unet_small fp32 b1 16x64x64",
        [
            "model=unet_small",
            "data.batch_size=1",
            "data.patch_size=[16,64,64]",
            "trainer.precision=32",
        ],
    ),
    (
        "width 32 batch-norm bf16-true b2 16x96x96",
        [
            "model.net.widths=[32,64,128,256]",
            "model.net.norm=batch",
            "data.batch_size=2",
            "data.patch_size=[16,96,96]",
            "trainer.precision=bf16-true",
        ],
    ),
    (
        "unet_tiny checkpointing=all fp32 b2 32x64x64",
        [
            "data.batch_size=2",
            "data.patch_size=[32,64,64]",
            "model.activation_checkpointing=all",
            "model.checkpoint_loss=true",
            "trainer.precision=32",
        ],
    ),
]

#: fixed before any of its results were seen; the estimator is never tuned on it
HELD_OUT: Grid = [
    (
        "[8,16,32,64] group-norm transposed fp32 b2 24x64x64, 2 classes",
        [
            "model.net.widths=[8,16,32,64]",
            "model.net.norm=group",
            "model.net.upsampling=transposed",
            "num_classes=2",
            "data.batch_size=2",
            "data.patch_size=[24,64,64]",
            "trainer.precision=32",
        ],
    ),
    (
        "[24,48,96] batch-norm bf16-mixed b1 32x64x64, 32 classes",
        [
            "model.net.widths=[24,48,96]",
            "model.net.norm=batch",
            "num_classes=32",
            "data.batch_size=1",
            "data.patch_size=[32,64,64]",
            "trainer.precision=bf16-mixed",
        ],
    ),
    (
        "[16,32,64,128] pooling [[1,2,2],[1,2,2],[2,2,2]] fp32 b2 16x96x96, 3 classes",
        [
            "model.net.widths=[16,32,64,128]",
            "model.net.pooling=[[1,2,2],[1,2,2],[2,2,2]]",
            "num_classes=3",
            "data.batch_size=2",
            "data.patch_size=[16,96,96]",
            "trainer.precision=32",
        ],
    ),
    (
        "[16,32,64] group-norm bf16-true b3 16x64x64, 8 classes, clip norm 1",
        [
            "model.net.widths=[16,32,64]",
            "model.net.norm=group",
            "num_classes=8",
            "data.batch_size=3",
            "data.patch_size=[16,64,64]",
            "trainer.precision=bf16-true",
            "trainer.gradient_clip_val=1.0",
        ],
    ),
    (
        "unet_tiny fp32 b1 x2 accumulation 32x64x64, 4 classes, clip value 0.5",
        [
            "num_classes=4",
            "data.batch_size=1",
            "data.patch_size=[32,64,64]",
            "trainer.precision=32",
            "trainer.accumulate_grad_batches=2",
            "trainer.gradient_clip_val=0.5",
            "trainer.gradient_clip_algorithm=value",
        ],
    ),
    (
        "unet_tiny checkpointing=decoder bf16-mixed b2 32x64x64, 6 classes",
        [
            "model.activation_checkpointing=decoder",
            "num_classes=6",
            "data.batch_size=2",
            "data.patch_size=[32,64,64]",
            "trainer.precision=bf16-mixed",
        ],
    ),
    (
        "[12,24,48,96] batch-norm checkpointing=encoder + loss fp32 b2 24x80x80",
        [
            "model.net.widths=[12,24,48,96]",
            "model.net.norm=batch",
            "model.activation_checkpointing=encoder",
            "model.checkpoint_loss=true",
            "data.batch_size=2",
            "data.patch_size=[24,80,80]",
            "trainer.precision=32",
        ],
    ),
    (
        "unet_tiny checkpointing=[0,1] transposed relu dropout 0.1 fp32 b1 32x96x96, 2 classes",
        [
            "model.activation_checkpointing=[0,1]",
            "model.net.upsampling=transposed",
            "model.net.activation=relu",
            "model.net.dropout=0.1",
            "num_classes=2",
            "data.batch_size=1",
            "data.patch_size=[32,96,96]",
            "trainer.precision=32",
        ],
    ),
    (
        "[16,32,64,128] channels_last fp32 b2 16x64x64",
        [
            "model.net.widths=[16,32,64,128]",
            "model.channels_last=true",
            "data.batch_size=2",
            "data.patch_size=[16,64,64]",
            "trainer.precision=32",
        ],
    ),
    (
        "unet_tiny offload fp32 b2 32x64x64, 3 classes",
        [
            "model.offload_activations=true",
            "num_classes=3",
            "data.batch_size=2",
            "data.patch_size=[32,64,64]",
            "trainer.precision=32",
        ],
    ),
    (
        "[16,32,64,128] group-norm 16-mixed b1 x3 accumulation 32x64x64, 12 classes, clip norm 1",
        [
            "model.net.widths=[16,32,64,128]",
            "model.net.norm=group",
            "num_classes=12",
            "data.batch_size=1",
            "data.patch_size=[32,64,64]",
            "trainer.precision=16-mixed",
            "trainer.accumulate_grad_batches=3",
            "trainer.gradient_clip_val=1.0",
        ],
    ),
    (
        "unet_small_gn bf16-mixed b1 16x64x64, 2 classes",
        [
            "model=unet_small_gn",
            "num_classes=2",
            "data.batch_size=1",
            "data.patch_size=[16,64,64]",
            "trainer.precision=bf16-mixed",
        ],
    ),
]

GRIDS: dict[str, Grid] = {"tuned": TUNED, "held-out": HELD_OUT}

SEED = [
    "model=unet_large",
    "data.batch_size=2",
    "data.patch_size=[26,150,320]",
    "trainer.precision=16-true",
]


def run_overrides(overrides: list[str], device: str, data_dir: Path) -> list[str]:
    """``train.py``'s overrides for a config: its trainer for ``device``, 3 optimizer steps, no
    validation, the memory monitor on every micro-batch into the CSV logger, data under
    ``data_dir``. The estimate is composed from the same list."""
    return [
        f"trainer={'gpu' if device == 'cuda' else 'cpu'}",
        *overrides,
        f"trainer.max_steps={STEPS}",
        "trainer.limit_val_batches=0",
        "trainer.num_sanity_val_steps=0",
        "memory.every_n_steps=1",
        "logger=csv",
        f"paths.data_dir={data_dir}",
    ]


def compose(overrides: list[str], device: str, data_dir: Path):
    """The ``train`` config of a benchmark run, as ``train.py`` composes it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(version_base="1.3", config_dir=str(REPO / "configs")):
        return hydra_compose(
            "train",
            overrides=[
                *run_overrides(overrides, device, data_dir),
                f"estimate.device={device}",
                # the allocator's figures that the monitor reads hold no CUDA context
                "estimate.cuda_context_mib=0",
            ],
        )


def _data_dir_for(num_classes: int, work_dir: Path) -> Path:
    """``work_dir/data`` for the embedded dataset's own 5 classes, else
    ``work_dir/data_<K>_classes``."""
    from volseg.data.synthetic import CLASS_NAMES

    if num_classes == len(CLASS_NAMES):
        return work_dir / "data"
    return work_dir / f"data_{num_classes}_classes"


def data_dir(overrides: list[str], work_dir: Path) -> Path:
    """Where a config's run finds the embedded dataset (``paths.data_dir``): ``work_dir/data``
    for its own 5 classes, ``work_dir/data_<K>_classes`` for ``num_classes=K``."""
    return _data_dir_for(int(compose(overrides, "cpu", work_dir / "data").num_classes), work_dir)


def prepare_data(overrides: list[str], work_dir: Path) -> Path:
    """The config's ``paths.data_dir`` (:func:`data_dir`). The embedded dataset has 5 classes
    (``train.py`` generates it on first use); a config with ``num_classes=K`` trains on a copy
    whose labels are cut to K classes (the last ones merged) and whose class list has K names,
    made here. Memory does not depend on which labels the voxels carry."""
    from omegaconf import OmegaConf

    from volseg.data.io import read_array, write_volume
    from volseg.data.synthetic import CLASS_NAMES, SPACING_ZYX, generate_synthetic_dataset

    cfg = compose(overrides, "cpu", work_dir / "data")
    k = int(cfg.num_classes)
    target = _data_dir_for(k, work_dir)
    if target == work_dir / "data" or (target / "synthetic").exists():
        return target
    base = Path(cfg.data.synthetic.root)
    if not base.exists():
        generate_synthetic_dataset(**OmegaConf.to_container(cfg.data.synthetic, resolve=True))
    partial = target / "synthetic.partial"
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(base, partial)
    for path in sorted((partial / "labels").iterdir()):
        label = read_array(path)
        write_volume(path, np.minimum(label, k - 1).astype(label.dtype), SPACING_ZYX)
    names = [*CLASS_NAMES[:k], *(f"class_{i}" for i in range(len(CLASS_NAMES), k))]
    (partial / "classes.json").write_text(json.dumps(names))
    partial.rename(target / "synthetic")
    return target


def predict(overrides: list[str], device: str, work_dir: Path) -> dict[str, float]:
    """The estimate of the config composed from the same overrides as its run (bytes)."""
    from volseg.memory.estimator import estimate
    from volseg.plan import planned_config

    # planned as train.py plans it (pooling=auto, precision for the device)
    est = estimate(planned_config(compose(overrides, device, data_dir(overrides, work_dir))))
    return {
        "growth": est.step_peak_growth,
        "peak_allocated": est.peak_allocated,
        "peak_reserved": est.peak_reserved,
        "accumulate_grad_batches": est.accumulate_grad_batches,
        "seconds": est.seconds,
    }


def monitor_rows(metrics_csv: Path) -> list[dict[str, float]]:
    """The memory monitor's rows of a run's ``metrics.csv``, in the order they were logged (one
    per micro-batch; Lightning's own rows, without ``mem/*``, are left out)."""
    with metrics_csv.open(newline="") as f:
        rows = [row for row in csv.DictReader(f) if row.get("mem/peak_allocated_mib")]
    return [{k: float(v) for k, v in row.items() if v not in ("", None)} for row in rows]


def step_rises(rows: list[dict[str, float]], accumulate_grad_batches: int) -> list[dict]:
    """Per optimizer step (``accumulate_grad_batches`` consecutive rows): peak allocated and
    reserved, what was held at its start and its rise above it (bytes)."""
    k = accumulate_grad_batches
    if len(rows) % k:
        raise ValueError(f"{len(rows)} monitor rows are not whole steps of {k} micro-batches")
    steps = []
    for first in range(0, len(rows), k):
        micro = rows[first : first + k]
        start = micro[0]["mem/step_start_allocated_mib"] * MIB
        peak = max(r["mem/peak_allocated_mib"] for r in micro) * MIB
        steps.append(
            {
                "start": start,
                "peak_allocated": peak,
                "peak_reserved": max(r["mem/peak_reserved_mib"] for r in micro) * MIB,
                "growth": peak - start,
            }
        )
    return steps


def measure(
    overrides: list[str],
    device: str,
    work_dir: Path,
    name: str,
    accumulate_grad_batches: int = 1,
    malloc_default: bool = False,
    snapshot: Path | None = None,
) -> dict[str, float]:
    """Run ``python train.py`` for the config in a fresh process; its steady step (bytes): the
    largest rise of steps 2..STEPS, and that step's peak allocated and reserved.

    ``snapshot``: on CUDA, a file for the allocator's memory snapshot of the run's steps
    (``memory.snapshot_steps``; open it at pytorch.org/memory_viz).
    """
    run_dir = work_dir / "runs" / name
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        str(REPO / "train.py"),
        *run_overrides(overrides, device, prepare_data(overrides, work_dir)),
        f"hydra.run.dir={run_dir}",
    ]
    if snapshot is not None and device == "cuda":
        command.append(f"memory.snapshot_steps={STEPS}")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if device == "cpu" and not malloc_default:
        env["MALLOC_MMAP_THRESHOLD_"] = "65536"
    started = time.perf_counter()
    out = subprocess.run(
        command, cwd=work_dir, env=env, capture_output=True, text=True, timeout=900
    )
    if out.returncode != 0:
        raise RuntimeError(f"train.py {' '.join(overrides)} failed:\n{out.stderr[-3000:]}")
    steps = step_rises(monitor_rows(run_dir / "csv" / "metrics.csv"), accumulate_grad_batches)
    if len(steps) != STEPS:
        raise RuntimeError(f"{name}: the monitor logged {len(steps)} steps, not {STEPS}")
    if snapshot is not None and device == "cuda":
        shutil.copy(run_dir / "memory_snapshot.pickle", snapshot)
    steady = max(steps[1:], key=lambda s: s["growth"])
    seconds = time.perf_counter() - started
    return {**steady, "rises": [s["growth"] for s in steps], "seconds": seconds}


def run_grid(
    grid: Grid,
    label: str,
    device: str,
    work_dir: Path,
    malloc_default: bool = False,
    snapshot_dir: Path | None = None,
) -> list[float]:
    """Print one grid's table; returns the errors (fractions)."""
    print(f"## {label}")
    print()
    if device == "cuda":
        print(
            "| config | estimated MiB | measured MiB (max_memory_allocated rise) | error "
            "| reserved: estimated / measured MiB | error |"
        )
        print("|---|---:|---:|---:|---:|---:|")
    else:
        print("| config | estimated MiB | measured MiB (peak RSS rise) | error |")
        print("|---|---:|---:|---:|")
    errors = []
    for index, (name, overrides) in enumerate(grid):
        predicted = predict(overrides, device, work_dir)
        snapshot = snapshot_dir / f"{label}_{index}.pickle" if snapshot_dir else None
        measured = measure(
            overrides,
            device,
            work_dir,
            f"{label}_{index}",
            int(predicted["accumulate_grad_batches"]),
            malloc_default,
            snapshot,
        )
        error = predicted["growth"] / measured["growth"] - 1
        errors.append(error)
        row = (
            f"| {name} | {predicted['growth'] / MIB:,.1f} | {measured['growth'] / MIB:,.1f} "
            f"| {100 * error:+.1f}% |"
        )
        if device == "cuda":
            reserved_error = predicted["peak_reserved"] / measured["peak_reserved"] - 1
            row += (
                f" {predicted['peak_reserved'] / MIB:,.0f} / "
                f"{measured['peak_reserved'] / MIB:,.0f} | {100 * reserved_error:+.1f}% |"
            )
        print(row, flush=True)
        rises = ", ".join(f"{r / MIB:,.1f}" for r in measured["rises"])
        print(f"<!-- rises by step: {rises} MiB; run {measured['seconds']:.0f} s -->", flush=True)
    print()
    print(summary_line(errors))
    print()
    return errors


def summary_line(errors: list[float]) -> str:
    absolute = [abs(e) for e in errors]
    return (
        f"mean |error| {100 * sum(absolute) / len(absolute):.1f}%, "
        f"max |error| {100 * max(absolute):.1f}% ({len(errors)} configs)"
    )


def main() -> None:
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
    args = parser.parse_args()
    if args.snapshot_dir:
        args.snapshot_dir.mkdir(parents=True, exist_ok=True)

    today = datetime.date.today().isoformat()
    print(f"# estimator accuracy against python train.py on {args.device}, {today}")
    print()
    print(f"CPU: {cpu_description()}; torch {torch.__version__}")
    if args.device == "cuda" and torch.cuda.is_available():
        print(f"GPU: {torch.cuda.get_device_name()}")
    malloc = "glibc default" if args.malloc_default else "MALLOC_MMAP_THRESHOLD_=65536"
    malloc = f"; {malloc}" if args.device == "cpu" else ""
    print(f"child processes: python train.py ... trainer.max_steps={STEPS}{malloc}")
    print()
    grids = GRIDS if args.grid == "all" else {args.grid: GRIDS[args.grid]}
    with tempfile.TemporaryDirectory(prefix="volseg-estimator-") as tmp:
        work_dir = args.work_dir or Path(tmp)
        work_dir.mkdir(parents=True, exist_ok=True)
        summaries = {
            label: summary_line(
                run_grid(grid, label, args.device, work_dir, args.malloc_default, args.snapshot_dir)
            )
            for label, grid in grids.items()
        }
    for label, line in summaries.items():
        print(f"{label}: {line}")
    seed = predict(SEED, "cuda", Path(tempfile.gettempdir()))
    print(
        f"reference config (unet_large, batch 2, 1x26x150x320, 16-true) estimated for CUDA in "
        f"{seed['seconds']:.1f} s: peak allocated {seed['peak_allocated'] / MIB:,.0f} MiB, "
        f"reserved {seed['peak_reserved'] / MIB:,.0f} MiB"
    )


if __name__ == "__main__":
    main()
