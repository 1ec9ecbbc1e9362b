"""Memory levers on the CPU: peak memory and step time of each lever, relative to no lever.

A seed-like scaled config: the unet_large layout (5 levels, decoder widths as the preset) at a
quarter of its width (16..128 channels) on the reference input, batch 2 of 1x26x150x320, 5
classes. For each lever (and useful combinations) it runs training steps (forward, DiceCE,
backward, AdamW) and reports, from the memory monitor's host reader (resident memory with
glibc's mmap threshold fixed, so freed tensors leave it):

- the step's peak minus its start (what the step added: activations, temporaries, gradients),
- the activations kept for backward (counted by torch's MemTracker at the end of forward + loss,
  in one extra step),
- seconds per step (best of ``--steps`` after one warm-up step),

each also as a ratio to the no-lever baseline measured in the same run.

    python -m benchmarks levers [--shape 26 150 320] [--batch 2] [--steps 2]

``--device cuda`` measures the levers that matter on a GPU on the reference config: full-width
unet_large (40.2M parameters) under float16 autocast (``16-mixed``), with the caching allocator's
peak allocated and peak reserved instead of host memory, and step times synchronized.

    python -m benchmarks levers --device cuda

Every row also goes to ``benchmarks/results/<cpu|cuda>/<date>_levers.json`` (``--json-out``)
with the machine and the command.
"""

from __future__ import annotations

import argparse
import time
from contextlib import nullcontext

import torch
from monai.losses import DiceCELoss
from torch.distributed._tools.mem_tracker import MemTracker

from benchmarks import results_io
from volseg.memory.monitor.readers import CudaMemoryReader, HostMemoryReader, set_mmap_threshold
from volseg.models.segmentation_module import SegmentationModule
from volseg.models.unet import UNet3D
from volseg.utils.units import MIB

LEVERS: dict[str, dict] = {
    "none (fp32)": {},
    "checkpointing: encoder": {"activation_checkpointing": "encoder"},
    "checkpointing: decoder": {"activation_checkpointing": "decoder"},
    "checkpointing: level 0": {"activation_checkpointing": [0]},
    "checkpointing: all": {"activation_checkpointing": "all"},
    "checkpointing: all + loss": {"activation_checkpointing": "all", "checkpoint_loss": True},
    "bf16 autocast": {"autocast": True},
    "bf16 autocast + checkpointing: all + loss": {
        "autocast": True,
        "activation_checkpointing": "all",
        "checkpoint_loss": True,
    },
    "micro-batch 1 (x2 accumulation)": {"micro_batch": 1},
    "micro-batch 1 + bf16 + checkpointing: all + loss": {
        "micro_batch": 1,
        "autocast": True,
        "activation_checkpointing": "all",
        "checkpoint_loss": True,
    },
}


#: on a GPU: the float16 autocast baseline and the levers that cut its peak most
LEVERS_CUDA: dict[str, dict] = {
    "none (16-mixed)": {"autocast": True},
    "checkpointing: all + loss": {
        "autocast": True,
        "activation_checkpointing": "all",
        "checkpoint_loss": True,
    },
    "activation offload": {"autocast": True, "offload_activations": True},
    "micro-batch 1 (x2 accumulation)": {"autocast": True, "micro_batch": 1},
    "micro-batch 1 + offload": {"autocast": True, "micro_batch": 1, "offload_activations": True},
}
#: (encoder widths, decoder widths): the unet_large layout at full and at a quarter width
LAYOUTS = {
    "cuda": ([64, 128, 256, 512, 512], [64, 64, 128, 256]),
    "cpu": ([16, 32, 64, 128, 128], [16, 16, 32, 64]),
}


def build(lever: dict, device: str = "cpu") -> SegmentationModule:
    torch.manual_seed(0)
    widths, decoder_widths = LAYOUTS[device]
    net = UNet3D(
        1, 5, widths=widths, decoder_widths=decoder_widths, norm="batch", activation="relu"
    )
    return SegmentationModule(
        net,
        DiceCELoss(to_onehot_y=True, softmax=True, include_background=False),
        lambda params: torch.optim.AdamW(params, lr=1e-3),
        activation_checkpointing=lever.get("activation_checkpointing"),
        checkpoint_loss=lever.get("checkpoint_loss", False),
        offload_activations=lever.get("offload_activations", False),
        nonfinite_check_every_n_steps=1,
    ).to(device)


def train_step(
    module, optimizer, x, y, lever: dict, before_backward=None, after_micro_batch=None
) -> None:
    micro = lever.get("micro_batch", x.shape[0])
    # CUDA: float16 autocast as 16-mixed runs it (GradScaler left out: it moves no memory)
    dtype = torch.float16 if x.is_cuda else torch.bfloat16
    autocast = torch.autocast(x.device.type, dtype=dtype) if lever.get("autocast") else None
    for start in range(0, x.shape[0], micro):
        xs, ys = x[start : start + micro], y[start : start + micro]
        with autocast or nullcontext():
            logits = module(xs)
        # the same loss code as SegmentationModule.training_step
        loss = module.compute_loss(logits, ys) * xs.shape[0] / x.shape[0]
        if before_backward is not None:
            before_backward()
        loss.backward()
        if after_micro_batch is not None:
            after_micro_batch()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _sync(x: torch.Tensor) -> None:
    if x.is_cuda:
        torch.cuda.synchronize(x.device)


def measure(lever: dict, x, y, steps: int, reader) -> dict[str, float]:
    module = build(lever, x.device.type)
    module.train()
    optimizer = module.optimizer_factory(module.parameters())
    train_step(module, optimizer, x, y, lever)  # warm-up; creates the optimizer state
    best_time, added, peak, reserved = float("inf"), 0.0, 0.0, 0.0
    for _ in range(steps):
        _sync(x)
        reader.reset_peak()
        start = reader.read()
        began = time.perf_counter()
        train_step(module, optimizer, x, y, lever)
        _sync(x)
        best_time = min(best_time, time.perf_counter() - began)
        end = reader.read()
        added = max(added, end.peak_allocated - start.allocated)
        peak, reserved = max(peak, end.peak_allocated), max(reserved, end.peak_reserved)
    tracker = MemTracker()
    tracker.track_external(module, optimizer, x, y)
    kept = []

    def record() -> None:  # activations kept for backward: all of them exist right now
        now = tracker.get_tracker_snapshot("current")
        kept.append(sum(d["Activation"] for d in now.values()))

    with tracker:  # MemTracker follows one call per module: reset it between micro-batches
        train_step(module, optimizer, x, y, lever, record, tracker.reset_mod_stats)
    activations = max(kept)
    return {
        "added_mib": added / MIB,
        "activations_mib": activations / MIB,
        "seconds": best_time,
        "peak_allocated_mib": peak / MIB,
        "peak_reserved_mib": reserved / MIB,
    }


def save(args: argparse.Namespace, rows: list[dict], argv: list[str] | None) -> None:
    """The rows as ``benchmarks/results/<device>/<date>_levers.json`` (``--json-out``)."""
    settings = {"shape": args.shape, "batch": args.batch, "steps": args.steps}
    doc = results_io.result(
        "levers", rows, script=__file__, argv=argv, device=args.device, settings=settings
    )
    results_io.write(doc, args.json_out, args.device)


def main_cuda(args: argparse.Namespace, argv: list[str] | None = None) -> None:
    device = torch.device("cuda")
    reader = CudaMemoryReader(device)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(args.batch, 1, *args.shape, generator=generator).to(device)
    y = torch.randint(0, 5, (args.batch, 1, *args.shape), generator=generator).float().to(device)
    print(
        f"unet_large (full width), batch {args.batch} x 1x{'x'.join(map(str, args.shape))}, "
        f"5 classes, AdamW, float16 autocast; {torch.cuda.get_device_name(device)}, "
        f"torch {torch.__version__}\n"
    )
    print("| lever | peak allocated (MiB) | peak reserved (MiB) | cut | s/step | ratio |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    base, rows = None, []
    for name, lever in LEVERS_CUDA.items():
        r = measure(lever, x, y, args.steps, reader)
        rows.append({"lever": name, "settings": lever, **r})
        base = base or r
        print(
            f"| {name} | {r['peak_allocated_mib']:,.0f} | {r['peak_reserved_mib']:,.0f} "
            f"| {base['peak_allocated_mib'] / r['peak_allocated_mib']:.2f}x "
            f"| {r['seconds']:.3f} | {r['seconds'] / base['seconds']:.2f} |",
            flush=True,
        )
        torch.cuda.empty_cache()
    save(args, rows, argv)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", type=int, nargs=3, default=[26, 150, 320])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    results_io.add_json_out(parser, "levers")
    args = parser.parse_args(argv)
    if args.device == "cuda":
        main_cuda(args, argv)
        return
    set_mmap_threshold(65536)
    reader = HostMemoryReader()
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(args.batch, 1, *args.shape, generator=generator)
    y = torch.randint(0, 5, (args.batch, 1, *args.shape), generator=generator).float()
    print(
        f"unet_large layout at 1/4 width (16..128 channels), batch {args.batch} x "
        f"1x{'x'.join(map(str, args.shape))}, 5 classes, AdamW; CPU host memory, "
        f"{torch.get_num_threads()} threads, torch {torch.__version__}\n"
    )
    header = (
        f"| {'lever':<42} | step adds (MiB) | ratio | activations (MiB) | ratio | s/step | ratio |"
    )
    print(header)
    print("| --- | --- | --- | --- | --- | --- | --- |")
    base, rows = None, []
    for name, lever in LEVERS.items():
        r = measure(lever, x, y, args.steps, reader)
        rows.append({"lever": name, "settings": lever, **r})
        base = base or r
        print(
            f"| {name:<42} | {r['added_mib']:15,.0f} | {r['added_mib'] / base['added_mib']:5.2f} "
            f"| {r['activations_mib']:17,.0f} | "
            f"{r['activations_mib'] / base['activations_mib']:5.2f} | {r['seconds']:6.2f} "
            f"| {r['seconds'] / base['seconds']:5.2f} |",
            flush=True,
        )
    save(args, rows, argv)


if __name__ == "__main__":
    main()
