"""How close is ``estimate_memory.py`` to a real training step?

For each config the estimator predicts how far a steady training step rises above the memory
held at its start (``step_peak_growth``); an independent measurement runs two real steps in a
fresh process and reads the process's peak resident memory during the second (VmHWM, reset
through /proc/self/clear_refs). glibc's mmap threshold is set to 64 KiB
(``MALLOC_MMAP_THRESHOLD_``) so that freed tensors leave the resident set at once. With
``--device cuda`` (on a GPU) the measurement is ``torch.cuda.max_memory_allocated`` /
``max_memory_reserved`` of the second step, compared with the CUDA estimate.

    python benchmarks/estimator_accuracy.py                 # CPU, prints a Markdown table
    python benchmarks/estimator_accuracy.py --device cuda   # on a GPU machine

Also prints how long the seed config (unet_large, batch 2, 1x26x150x320, 16-true) takes to
estimate.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import torch

from volseg.utils.units import MIB

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
os.environ.setdefault("PROJECT_ROOT", str(REPO))

CONFIGS: list[tuple[str, list[str]]] = [
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
SEED = [
    "model=unet_large",
    "data.batch_size=2",
    "data.patch_size=[26,150,320]",
    "trainer.precision=16-true",
]


def compose(overrides: list[str], device: str):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(version_base="1.3", config_dir=str(REPO / "configs")):
        return hydra_compose(
            "train",
            overrides=[*overrides, f"estimate.device={device}", "estimate.cuda_context_mib=0"],
        )


def measure(overrides: list[str], device: str, snapshot: Path | None = None) -> dict[str, float]:
    """Two real training steps; the second's peak rise above its start (bytes).

    ``snapshot``: on CUDA, a file for the allocator's memory snapshot of both steps (every
    allocation, free and segment with its Python stack; open it at pytorch.org/memory_viz).
    """
    from volseg.memory.estimator import MIXED, build_training_step
    from volseg.memory.readers import HostMemoryReader

    cfg = compose(overrides, device)
    torch.manual_seed(0)
    step = build_training_step(cfg, device)
    num_classes = int(cfg.num_classes)
    target = torch.device(device)
    if device == "cuda":
        # the same Parameter objects move, so the optimizer keeps them; real autocast on a GPU
        step.module.to(target)
        if step.autocast_in_backward:
            dtype = MIXED[str(cfg.trainer.precision)]
            # as Lightning's MixedPrecision: no cast cache, a CUDA GradScaler for float16
            step.autocast = partial(torch.autocast, "cuda", dtype=dtype, cache_enabled=False)
            step.autocast_in_backward = False
        if step.scaler is not None:
            step.scaler = torch.amp.GradScaler("cuda")
    reader = HostMemoryReader()
    readings: dict[str, float] = {}

    def new_batch(image_shape, label_shape, dtype):
        image = torch.randn(image_shape, dtype=dtype, device=target)
        label = torch.randint(0, num_classes, label_shape, device=target).to(dtype)
        return image, label

    def on_step_start() -> None:
        gc.collect()
        if device == "cuda":
            torch.cuda.synchronize()
            readings["start_allocated"] = torch.cuda.memory_allocated()
            readings["start_reserved"] = torch.cuda.memory_reserved()
            torch.cuda.reset_peak_memory_stats()
        else:
            readings["start"] = reader.read().allocated
            reader.reset_peak()

    if snapshot is not None and device == "cuda":
        torch.cuda.memory._record_memory_history(max_entries=200_000, stacks="python")
    started = time.perf_counter()
    step.run(2, new_batch, on_step_start)
    if device == "cuda":
        torch.cuda.synchronize()
        if snapshot is not None:
            torch.cuda.memory._dump_snapshot(str(snapshot))
        return {
            "growth": torch.cuda.max_memory_allocated() - readings["start_allocated"],
            "peak_allocated": torch.cuda.max_memory_allocated(),
            "peak_reserved": torch.cuda.max_memory_reserved(),
            "seconds": time.perf_counter() - started,
        }
    return {
        "growth": reader.read().peak_allocated - readings["start"],
        "seconds": time.perf_counter() - started,
    }


def predict(overrides: list[str], device: str) -> dict[str, float]:
    from volseg.memory.estimator import estimate

    est = estimate(compose(overrides, device))
    return {
        "growth": est.step_peak_growth,
        "peak_allocated": est.peak_allocated,
        "peak_reserved": est.peak_reserved,
        "seconds": est.seconds,
    }


def child(index: int, device: str, snapshot_dir: Path | None = None) -> None:
    """Measure one config in this (fresh) process and print the result as JSON."""
    snapshot = snapshot_dir / f"config_{index}.pickle" if snapshot_dir else None
    print(json.dumps(measure(CONFIGS[index][1], device, snapshot)))


def run_child(index: int, device: str, snapshot_dir: Path | None = None) -> dict[str, float]:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    extra = ["--snapshot-dir", str(snapshot_dir)] if snapshot_dir else []
    out = subprocess.run(
        [sys.executable, __file__, "--child", str(index), "--device", device, *extra],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument(
        "--snapshot-dir",
        type=Path,
        default=None,
        help="CUDA: write each measured step's allocator snapshot here (config_<i>.pickle)",
    )
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.snapshot_dir:
        args.snapshot_dir.mkdir(parents=True, exist_ok=True)
    if args.child is not None:
        child(args.child, args.device, args.snapshot_dir)
        return

    print(
        f"# estimator accuracy on {args.device}: {platform.processor() or platform.machine()}, "
        f"torch {torch.__version__}, {os.cpu_count()} CPUs"
    )
    print()
    what = "peak RSS rise in the 2nd step" if args.device == "cpu" else "max_memory_allocated rise"
    print(f"| config | predicted MiB | measured MiB ({what}) | error |")
    print("|---|---:|---:|---:|")
    errors = []
    for index, (name, overrides) in enumerate(CONFIGS):
        predicted = predict(overrides, args.device)
        measured = run_child(index, args.device, args.snapshot_dir)
        error = predicted["growth"] / measured["growth"] - 1
        errors.append(abs(error))
        row = (
            f"| {name} | {predicted['growth'] / MIB:,.1f} | {measured['growth'] / MIB:,.1f} "
            f"| {100 * error:+.1f}% |"
        )
        if args.device == "cuda":
            reserved_error = predicted["peak_reserved"] / measured["peak_reserved"] - 1
            row += (
                f" reserved: predicted {predicted['peak_reserved'] / MIB:,.0f}, measured "
                f"{measured['peak_reserved'] / MIB:,.0f} MiB ({100 * reserved_error:+.1f}%) |"
            )
        print(row, flush=True)
    print()
    print(f"mean |error| {100 * sum(errors) / len(errors):.1f}%, max {100 * max(errors):.1f}%")
    seed = predict(SEED, "cuda")
    print(
        f"seed config (unet_large, batch 2, 1x26x150x320, 16-true) estimated for CUDA in "
        f"{seed['seconds']:.1f} s: peak allocated {seed['peak_allocated'] / MIB:,.0f} MiB, "
        f"reserved {seed['peak_reserved'] / MIB:,.0f} MiB"
    )


if __name__ == "__main__":
    main()
