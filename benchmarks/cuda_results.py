"""GPU runs kept as data: ``benchmarks/results/cuda/<date>_<gpu>.json``.

Each run is a real ``python train.py trainer=gpu <overrides>`` in a fresh process (3 optimizer
steps, validation off, the memory monitor on every micro-batch into the CSV logger, step time
from :class:`volseg.callbacks.step_timer.StepTimer`), as ``benchmarks/estimator_accuracy.py``
runs them. ``measured`` holds the steady step's (the 2nd or 3rd, the larger rise) peak
allocated and peak reserved, its rise above the step's start, and the median step time of steps
2..3; ``nvidia_smi_mib`` is left null (the monitor reads the caching allocator; the file's
``cuda_context_mib`` is nvidia-smi's figure less reserved, measured once at start).

Two grids: ``recorded``, the configs of the runs already in ``benchmarks/results/cuda`` (what
``tests/memory/test_recorded_cuda.py`` holds the estimate to), and ``HELD_OUT``, written before
any GPU ran it and never tuned on (widths, depths, anisotropic patches, batch 1-4, every
precision, each lever, 2-32 classes), each run marked ``held_out``. The file is rewritten after
every run, so a run cut short by ``--budget-s`` or a timeout keeps what was measured; the runs
not reached are listed under ``not_run`` (the two grids' runs alternate, so that a cut loses some
of each).

    python benchmarks/cuda_results.py [--grid recorded held-out] [--budget-s 380] [--out DIR]
    python benchmarks/cuda_results.py --dry-run     # tiny sizes on the CPU: checks the pipeline
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from itertools import zip_longest
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "benchmarks"))
os.environ.setdefault("PROJECT_ROOT", str(REPO))

import estimator_accuracy as accuracy  # noqa: E402

from volseg.memory.cuda_context import nvidia_smi  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "cuda"
SEED = ["model=unet_large", "data.batch_size=2", "data.patch_size=[26,150,320]"]
STEP_TIMER = "+callbacks.step_timer._target_=volseg.callbacks.step_timer.StepTimer"

#: fixed before any GPU ran it; the estimator is never tuned on it
HELD_OUT: list[tuple[str, list[str]]] = [
    (
        "[32,64,128,256] group-norm 16-mixed b3 32x128x128, 8 classes",
        [
            "model.net.widths=[32,64,128,256]",
            "model.net.norm=group",
            "num_classes=8",
            "data.batch_size=3",
            "data.patch_size=[32,128,128]",
            "trainer.precision=16-mixed",
        ],
    ),
    (
        "depth 6 [16..320] bf16-mixed b1 64x128x128, 3 classes",
        [
            "model.net.widths=[16,32,64,128,256,320]",
            "num_classes=3",
            "data.batch_size=1",
            "data.patch_size=[64,128,128]",
            "trainer.precision=bf16-mixed",
        ],
    ),
    (
        "unet_small pooling=auto anisotropic bf16-mixed b2 16x192x192, 2 classes",
        [
            "model=unet_small",
            "model.net.pooling=auto",
            "num_classes=2",
            "data.batch_size=2",
            "data.patch_size=[16,192,192]",
            "trainer.precision=bf16-mixed",
        ],
    ),
    (
        "unet_large 16-mixed b1 32x128x128, 32 classes",
        [
            "model=unet_large",
            "num_classes=32",
            "data.batch_size=1",
            "data.patch_size=[32,128,128]",
            "trainer.precision=16-mixed",
        ],
    ),
    (
        "unet_large 16-true b4 16x96x96",
        [
            "model=unet_large",
            "data.batch_size=4",
            "data.patch_size=[16,96,96]",
            "trainer.precision=16-true",
        ],
    ),
    (
        "unet_large NCDHW bf16-true b2 24x128x160",
        [
            "model=unet_large",
            "model.channels_last=false",
            "data.batch_size=2",
            "data.patch_size=[24,128,160]",
            "trainer.precision=bf16-true",
        ],
    ),
    (
        "unet_tiny fp32 b4 32x96x96",
        ["data.batch_size=4", "data.patch_size=[32,96,96]", "trainer.precision=32"],
    ),
    (
        "[24,48,96,192] instance-norm checkpointing=decoder 32 b2 48x96x96, 4 classes",
        [
            "model.net.widths=[24,48,96,192]",
            "model.net.norm=instance",
            "model.activation_checkpointing=decoder",
            "num_classes=4",
            "data.batch_size=2",
            "data.patch_size=[48,96,96]",
            "trainer.precision=32",
        ],
    ),
    (
        "unet_small_gn transposed 16-mixed b2 x2 accumulation 32x128x128, clip norm 1",
        [
            "model=unet_small_gn",
            "model.net.upsampling=transposed",
            "data.batch_size=2",
            "trainer.accumulate_grad_batches=2",
            "trainer.gradient_clip_val=1.0",
            "data.patch_size=[32,128,128]",
            "trainer.precision=16-mixed",
        ],
    ),
    (
        "seed: offload full resolution",
        [*SEED, "trainer.precision=16-mixed", "model.offload_activations=full_resolution"],
    ),
    (
        "seed: micro-batch 1 + checkpointing all + loss",
        [
            "model=unet_large",
            "data.batch_size=1",
            "trainer.accumulate_grad_batches=2",
            "data.patch_size=[26,150,320]",
            "trainer.precision=16-mixed",
            "model.activation_checkpointing=all",
            "model.checkpoint_loss=true",
        ],
    ),
    (
        "seed: cuDNN workspace capped at 0",
        [*SEED, "trainer.precision=16-mixed", "model.cudnn_workspace_mib=0"],
    ),
    (
        "seed: trainer.benchmark=true",
        [*SEED, "trainer.precision=16-mixed", "trainer.benchmark=true"],
    ),
    (
        "seed: bf16-mixed checkpointing=encoder",
        [*SEED, "trainer.precision=bf16-mixed", "model.activation_checkpointing=encoder"],
    ),
    (
        "seed: 16-true + micro-batch 1 + offload",
        [
            "model=unet_large",
            "data.batch_size=1",
            "trainer.accumulate_grad_batches=2",
            "data.patch_size=[26,150,320]",
            "trainer.precision=16-true",
            "model.offload_activations=true",
        ],
    ),
]

#: appended in --dry-run: the same runs at a size a CPU takes in seconds
TINY = [
    "data.patch_size=[16,32,32]",
    "model.net.widths=[4,8,16]",
    "model.net.decoder_widths=null",
    "model.net.pooling=null",
    "model.activation_checkpointing=none",
]


def recorded_grid() -> list[tuple[str, list[str]]]:
    """The not-held-out runs of the files already in :data:`RESULTS` (one per config)."""
    seen: dict[str, list[str]] = {}
    for path in sorted(RESULTS.glob("*.json")):
        for run in json.loads(path.read_text())["runs"]:
            name = run["name"].removeprefix("train.py: ")
            if not run["held_out"] and name not in seen:
                seen[name] = run["overrides"]
    return list(seen.items())


def device_info(device: str) -> dict:
    import torch

    info = {
        "gpu": "cpu (dry run)",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "driver": None,
        "date": datetime.date.today().isoformat(),
        "cuda_context_mib": None,
    }
    if device != "cuda":
        return info
    torch.ones(1, device="cuda")
    torch.cuda.synchronize()
    info["gpu"] = torch.cuda.get_device_name()
    info["gpu_memory_mib"] = torch.cuda.get_device_properties(0).total_memory // 2**20
    driver = nvidia_smi("gpu=driver_version")
    info["driver"] = driver[0] if driver else None
    mine = [line.split(",") for line in nvidia_smi("compute-apps=pid,used_memory")]
    used = [float(m[1]) for m in mine if m[0].strip() == str(os.getpid())]
    if used:
        info["cuda_context_mib"] = round(used[0] - torch.cuda.memory_reserved() / 2**20)
    return info


def step_seconds(metrics_csv: Path) -> float | None:
    """Median ``time/step_s`` of the steps after the first (a warm-up), or ``None``."""
    with metrics_csv.open(newline="") as f:
        times = [float(r["time/step_s"]) for r in csv.DictReader(f) if r.get("time/step_s")]
    return statistics.median(times[1:]) if len(times) > 1 else None


def measure(name: str, overrides: list[str], device: str, work_dir: Path) -> dict:
    k = next(
        (
            int(o.split("=")[1])
            for o in overrides
            if o.startswith("trainer.accumulate_grad_batches=")
        ),
        1,
    )
    slug = re.sub(r"[^A-Za-z0-9]+", "_", name)[:60]
    timed = [*overrides, STEP_TIMER, "trainer.log_every_n_steps=1"]
    steady = accuracy.measure(timed, device, work_dir, slug, k)
    return {
        "peak_allocated_mib": round(steady["peak_allocated"] / 2**20, 1),
        "peak_reserved_mib": round(steady["peak_reserved"] / 2**20, 1),
        "nvidia_smi_mib": None,
        "step_s": step_seconds(work_dir / "runs" / slug / "csv" / "metrics.csv"),
        "step_peak_growth_mib": round(steady["growth"] / 2**20, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--grid", nargs="+", choices=["recorded", "held-out"], default=["recorded", "held-out"]
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--budget-s", type=float, default=380.0, help="start no new run after this many seconds"
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="tiny sizes on the CPU, 1 run per grid, into a temporary folder",
    )
    args = parser.parse_args()
    device = "cpu" if args.dry_run else "cuda"
    grids = {"recorded": recorded_grid(), "held-out": HELD_OUT}
    lists = []
    for grid in args.grid:
        runs = grids[grid][:1] if args.dry_run else grids[grid]
        lists.append([(name, overrides, grid == "held-out") for name, overrides in runs])
    # alternating between the grids: a run cut short by the budget loses some of each
    todo = [run for group in zip_longest(*lists) for run in group if run is not None]
    info = device_info(device)
    out_dir = Path(tempfile.mkdtemp(prefix="cuda_results_")) if args.dry_run else args.out
    out_dir.mkdir(parents=True, exist_ok=True)
    gpu_slug = re.sub(r"[^a-z0-9]+", "-", info["gpu"].lower()).strip("-")
    path = out_dir / f"{info['date']}_{gpu_slug}.json"
    doc = {**info, "source": "python benchmarks/cuda_results.py", "runs": [], "not_run": []}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="volseg_gpu_runs_") as work:
        for index, (name, overrides, held_out) in enumerate(todo):
            if time.perf_counter() - started > args.budget_s:
                doc["not_run"] = [n for n, _, _ in todo[index:]]
                break
            run_overrides = [*overrides, *TINY, "data.batch_size=1"] if args.dry_run else overrides
            try:
                measured = measure(name, run_overrides, device, Path(work))
            except (RuntimeError, subprocess.SubprocessError) as err:
                print(f"{name}: failed: {str(err)[-400:]}", flush=True)
                doc["not_run"].append(name)
                continue
            doc["runs"].append(
                {
                    "name": f"train.py: {name}",
                    "script": "benchmarks/cuda_results.py (python train.py trainer=gpu)",
                    "overrides": run_overrides,
                    "held_out": held_out,
                    "measured": measured,
                }
            )
            path.write_text(json.dumps(doc, indent=1) + "\n")
            print(f"{name}: {json.dumps(measured)}", flush=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {path} ({len(doc['runs'])} runs, {len(doc['not_run'])} not run)")


if __name__ == "__main__":
    main()
