"""The reference config on a GPU: peak memory of unet_large vs unet_small, and where it goes.

For each preset and precision, one training step (forward, DiceCE loss, backward, AdamW step) at
batch 2 on 1x26x150x320, run twice: the second step is measured, so optimizer state exists as in
steady training. ``16-mixed``: float32 weights, float16 autocast and a GradScaler, as Lightning's
``trainer.precision=16-mixed`` runs it; ``16-true``: weights cast to float16 (Lightning's
``16-true``). Prints parameters, peak allocated and peak reserved (``torch.cuda.max_memory_*``),
what nvidia-smi shows used on the GPU at the peak (reserved + the CUDA context + other processes),
and the five modules whose forward keeps the most activations (torch's MemTracker, via volseg's
LayerTrace), as a Markdown table for docs/benchmarks.md. Needs CUDA; ``--device cpu`` with a
small ``--shape`` runs the same code path on a CPU for a check (16-mixed as bfloat16 autocast
there).

    python -m benchmarks gpu_memory_table [--shape 26 150 320] [--batch 2] [--device cuda]
        [--precision 16-mixed 16-true]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
from datetime import date
from pathlib import Path

import hydra
import torch
from hydra import compose, initialize_config_dir

from volseg.memory.monitor.layers import LayerTrace, block_activations
from volseg.models.segmentation_module import guard_fp16_eps
from volseg.plan import planned_config
from volseg.utils.units import MIB

REPO = Path(__file__).resolve().parents[2]
os.environ.setdefault("PROJECT_ROOT", str(REPO))


def build(preset: str):
    with initialize_config_dir(version_base="1.3", config_dir=str(REPO / "configs")):
        cfg = compose("train", overrides=[f"model={preset}", "model.scheduler=null"])
    return hydra.utils.instantiate(planned_config(cfg).model)  # pooling=auto planned


def nvidia_smi_used_mib(device: torch.device) -> float | None:
    """Memory nvidia-smi shows used on ``device``'s GPU (MiB), or ``None`` without nvidia-smi."""
    if device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    try:
        out = subprocess.run(
            [
                "nvidia-smi",
                f"--id={index}",
                "--query-gpu=memory.used",
                "--format=csv,noheader,nounits",
            ],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout
        return float(out.strip().splitlines()[0])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def measure(
    preset: str, shape: list[int], batch: int, device: torch.device, precision: str
) -> dict:
    mixed = precision == "16-mixed"
    # 16-true casts the weights; 16-mixed keeps float32 weights and runs the ops in half
    weights = torch.float32 if mixed else torch.float16
    half = torch.float16 if device.type == "cuda" else torch.bfloat16
    module = build(preset).to(device=device, dtype=weights)
    optimizer = module.optimizer_factory(params=module.parameters())
    if not mixed:
        guard_fp16_eps(optimizer)  # as SegmentationModule.configure_optimizers does
    scaler = torch.amp.GradScaler(device.type, enabled=mixed and device.type == "cuda")
    image = torch.randn(batch, 1, *shape, device=device, dtype=weights)
    label = torch.randint(0, 5, (batch, 1, *shape), device=device).to(weights)

    def step(trace: LayerTrace | None = None) -> None:
        autocast = torch.autocast(device.type, dtype=half) if mixed else contextlib.nullcontext()
        with autocast:
            logits = module(image)
        loss = module.loss(logits.float(), label)
        scaler.scale(loss).backward()
        if trace is not None:
            trace.optimizer_update_begins()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)

    step()  # creates the optimizer state
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
    step()
    peak_allocated = peak_reserved = None
    if device.type == "cuda":
        torch.cuda.synchronize()
        peak_allocated = torch.cuda.max_memory_allocated(device) / MIB
        peak_reserved = torch.cuda.max_memory_reserved(device) / MIB
    # the cache keeps its peak segments until emptied, so this is nvidia-smi at the peak
    smi = nvidia_smi_used_mib(device)
    trace = LayerTrace(module, [optimizer], [image, label])
    trace.start()
    step(trace)
    trace.stop()
    top = list(block_activations(trace.rows()).items())[:5]
    return {
        "preset": preset,
        "precision": precision,
        "nvidia_smi_mib": smi,
        "parameters": sum(p.numel() for p in module.parameters()),
        "peak_allocated_mib": peak_allocated,
        "peak_reserved_mib": peak_reserved,
        "tracked_peak_mib": sum(trace.peak().values()) / MIB,
        "top5": top,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", type=int, nargs=3, default=[26, 150, 320])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--device", default="cuda")
    parser.add_argument(
        "--precision", nargs="+", choices=["16-mixed", "16-true"], default=["16-mixed", "16-true"]
    )
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(
        f"{date.today()}, {where}, torch {torch.__version__}, batch {args.batch} "
        f"x 1x{'x'.join(map(str, args.shape))}\n"
    )
    print(
        "| preset | precision | parameters | peak allocated (MiB) | peak reserved (MiB) | "
        "nvidia-smi used (MiB) | top 5 modules by activations kept (MiB) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for precision in args.precision:
        for preset in ("unet_large", "unet_small"):
            r = measure(preset, args.shape, args.batch, device, precision)
            fmt = lambda v: "n/a" if v is None else f"{v:,.0f}"  # noqa: E731
            top = ", ".join(f"{name.removeprefix('net.')} {mib:,.0f}" for name, mib in r["top5"])
            print(
                f"| {preset} | {precision} | {r['parameters'] / 1e6:.1f}M | "
                f"{fmt(r['peak_allocated_mib'])} | {fmt(r['peak_reserved_mib'])} | "
                f"{fmt(r['nvidia_smi_mib'])} | {top} |",
                flush=True,
            )
            if device.type == "cuda":
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
