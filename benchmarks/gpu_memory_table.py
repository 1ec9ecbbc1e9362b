"""The seed case on a GPU: peak memory of unet_large vs unet_small, and where it goes.

For each preset, one training step (forward, DiceCE loss, backward, AdamW step) at batch 2 on
1x26x150x320 with ``16-true`` weights (as Lightning's ``trainer.precision=16-true`` casts them),
run twice: the second step is measured, so optimizer state exists as in steady training.
Prints parameters, peak allocated and peak reserved (``torch.cuda.max_memory_*``), and the
five modules whose forward keeps the most activations (torch's MemTracker, via volseg's
LayerTrace), as a Markdown table for docs/benchmarks.md. Needs CUDA; ``--device cpu`` with a small
``--shape`` runs the same code path on a CPU for a check.

    python benchmarks/gpu_memory_table.py [--shape 26 150 320] [--batch 2] [--device cuda]
"""

from __future__ import annotations

import argparse
import os
from datetime import date
from pathlib import Path

import hydra
import torch
from hydra import compose, initialize_config_dir

from volseg.memory.layers import LayerTrace, block_activations
from volseg.models.segmentation_module import guard_fp16_eps
from volseg.utils.units import MIB

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("PROJECT_ROOT", str(REPO))


def build(preset: str):
    with initialize_config_dir(version_base="1.3", config_dir=str(REPO / "configs")):
        cfg = compose("train", overrides=[f"model={preset}", "model.scheduler=null"])
    return hydra.utils.instantiate(cfg.model)


def measure(preset: str, shape: list[int], batch: int, device: torch.device) -> dict:
    module = build(preset).to(device=device, dtype=torch.float16)
    optimizer = module.optimizer_factory(params=module.parameters())
    guard_fp16_eps(optimizer)  # as SegmentationModule.configure_optimizers does
    image = torch.randn(batch, 1, *shape, device=device, dtype=torch.float16)
    label = torch.randint(0, 5, (batch, 1, *shape), device=device).half()

    def step(trace: LayerTrace | None = None) -> None:
        loss = module.loss(module(image).float(), label)
        loss.backward()
        if trace is not None:
            trace.optimizer_update_begins()
        optimizer.step()
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
    trace = LayerTrace(module, [optimizer], [image, label])
    trace.start()
    step(trace)
    trace.stop()
    top = list(block_activations(trace.rows()).items())[:5]
    return {
        "preset": preset,
        "parameters": sum(p.numel() for p in module.parameters()),
        "peak_allocated_mib": peak_allocated,
        "peak_reserved_mib": peak_reserved,
        "tracked_peak_mib": sum(trace.peak().values()) / MIB,
        "top5": top,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", type=int, nargs=3, default=[26, 150, 320])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    device = torch.device(args.device)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(
        f"{date.today()}, {where}, torch {torch.__version__}, 16-true, batch {args.batch} "
        f"x 1x{'x'.join(map(str, args.shape))}\n"
    )
    print(
        "| preset | parameters | peak allocated (MiB) | peak reserved (MiB) | top 5 modules by "
        "activations kept (MiB) |"
    )
    print("| --- | --- | --- | --- | --- |")
    for preset in ("unet_large", "unet_small"):
        r = measure(preset, args.shape, args.batch, device)
        fmt = lambda v: "n/a" if v is None else f"{v:,.0f}"  # noqa: E731
        top = ", ".join(f"{name.removeprefix('net.')} {mib:,.0f}" for name, mib in r["top5"])
        print(
            f"| {preset} | {r['parameters'] / 1e6:.1f}M | {fmt(r['peak_allocated_mib'])} | "
            f"{fmt(r['peak_reserved_mib'])} | {top} |",
            flush=True,
        )
        if device.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
