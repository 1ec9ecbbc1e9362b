"""How well ``python train.py`` keeps a GPU busy: step time, data-wait fraction and model FLOP
utilization of a whole training run at the reference config, with volseg's own loader.

Trains the reference config (unet_large, batch 2 of 1x26x150x320, 5 classes, ``16-mixed``) on
generated stacks of that shape (``data=folder``, cached in memory, ``data.num_workers=auto``)
for ``--steps`` optimizer steps (no validation), timing each step from the callback hooks
(the device synchronized at every step end, so a step's time is its GPU time):

- step time: median seconds from one step's end to the next, after ``--warmup`` steps;
- data wait: the share of that time spent between a step's end and the next step's start
  (the loop fetching the next batch: what the GPU waits for);
- MFU: FLOPs of one training step (``torch.utils.flop_counter`` over forward and backward)
  / step time / the GPU's dense bf16/fp16 peak (``--peak-tflops``, or looked up by name).

Anchors: the seed step alone on an H200 (benchmarks/levers.py) 0.073 s for 10.5 TFLOP, 0.15
of 989 TFLOP/s; NVIDIA's tuned nnU-Net (DynUNet, AMP, channels-last) 0.25 of an A100's 312.

    python benchmarks/gpu_train_speed.py [--steps 60] [--override KEY=VALUE ...]
    python benchmarks/gpu_train_speed.py --dry-run   # CPU, tiny sizes: checks the script
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
from lightning.pytorch import Callback

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("PROJECT_ROOT", str(REPO))

#: dense bf16/fp16 tensor-core peaks (TFLOP/s, no sparsity), by a part of the device name
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10G": 125.0}


def _data_throughput():
    spec = importlib.util.spec_from_file_location("dt", REPO / "benchmarks" / "data_throughput.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class StepClock(Callback):
    """Per step: seconds from the previous step's end to this one's start (data wait) and to
    this one's end (the step), the device synchronized at each end."""

    def __init__(self) -> None:
        self.waits: list[float] = []
        self.steps: list[float] = []
        self._end: float | None = None
        self._start = 0.0

    def _sync(self, pl_module) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._start = time.perf_counter()
        if self._end is not None:
            self.waits.append(self._start - self._end)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._sync(pl_module)
        end = time.perf_counter()
        if self._end is not None:
            self.steps.append(end - self._end)
        self._end = end


def step_flops(module, batch_shape: list[int], num_classes: int, device: str) -> int:
    """FLOPs of one forward and backward of ``module.net`` (with its loss) on a batch of
    ``batch_shape`` ``(B, C, D, H, W)``."""
    from torch.utils.flop_counter import FlopCounterMode

    net = module.net.to(device).train()
    image = torch.randn(batch_shape, device=device)
    label = torch.randint(0, num_classes, (batch_shape[0], 1, *batch_shape[2:]), device=device)
    dtype = torch.bfloat16 if device == "cpu" else torch.float16
    with FlopCounterMode(display=False) as counter:
        with torch.autocast(device, dtype=dtype):
            loss = module.loss(net(image), label)
        loss.backward()
    net.zero_grad(set_to_none=True)
    return int(counter.get_total_flops())


def main(argv: list[str] | None = None) -> None:
    from volseg.tasks import train as train_task
    from volseg.utils.config import compose_run_config

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes")
    parser.add_argument("--peak-tflops", type=float, default=None)
    parser.add_argument("--out", default=None, help="JSON file for the figures")
    parser.add_argument("--override", action="append", default=[])
    args = parser.parse_args(argv)
    shape, patch = [26, 150, 320], [26, 150, 320]
    model, steps, warmup = ["model=unet_large"], args.steps, args.warmup
    device = "cuda" if torch.cuda.is_available() and not args.dry_run else "cpu"
    if args.dry_run:
        shape, patch, steps, warmup = [8, 24, 24], [8, 16, 16], 6, 2
        model = ["model=unet_tiny"]
    tmp = Path(tempfile.mkdtemp(prefix="volseg-gpu-speed-"))
    root = _data_throughput().write_cases(tmp / "data", 4, shape, [2.0, 0.5, 0.5])
    trainer = (
        ["trainer=gpu", "trainer.precision=16-mixed"]
        if device == "cuda"
        else ["trainer.accelerator=cpu", "trainer.precision=bf16-mixed"]
    )
    overrides = [
        *model,
        *trainer,
        "data=folder",
        f"data.root={root}",
        f"data.patch_size=[{','.join(map(str, patch))}]",
        "data.batch_size=2",
        f"data.samples_per_volume={steps}",
        f"trainer.max_steps={steps}",
        "trainer.limit_val_batches=0",
        "trainer.num_sanity_val_steps=0",
        "callbacks.rich_progress_bar=null",
        "callbacks.early_stopping=null",
        "callbacks.model_checkpoint=null",
        "callbacks.validation_overlays=null",
        "extras.print_config=false",
        *args.override,
    ]
    cfg = compose_run_config(REPO / "configs", "train", overrides, tmp / "run")
    clock = StepClock()
    modules: list = []
    build = train_task.instantiate_callbacks

    def with_clock(*a, **kw):
        return [*build(*a, **kw), clock]

    train_task.instantiate_callbacks = with_clock
    original_fit = train_task.L.Trainer.fit

    def fit(self, *a, **kw):
        modules.append(kw.get("model", a[0] if a else None))
        return original_fit(self, *a, **kw)

    train_task.L.Trainer.fit = fit
    try:
        train_task.train(cfg)
    finally:
        train_task.instantiate_callbacks = build
        train_task.L.Trainer.fit = original_fit
    timed = clock.steps[warmup:]
    waits = clock.waits[warmup:]
    step_s = statistics.median(timed)
    wait_share = sum(waits) / sum(timed)
    flops = step_flops(modules[0], [2, 1, *patch], int(cfg.num_classes), device)
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    peak = args.peak_tflops or next((v for k, v in PEAK_TFLOPS.items() if k in name), None)
    mfu = flops / step_s / (peak * 1e12) if peak else None
    result = {
        "date": datetime.date.today().isoformat(),
        "device": name,
        "torch": torch.__version__,
        "overrides": overrides,
        "steps_timed": len(timed),
        "step_s_median": step_s,
        "data_wait_fraction": wait_share,
        "step_tflop": flops / 1e12,
        "peak_tflops": peak,
        "mfu": mfu,
    }
    mfu_text = f"{mfu:.3f}" if mfu is not None else "n/a (no peak for this device)"
    print(
        f"{name}: {len(timed)} steps, median {step_s:.4f} s/step, data wait "
        f"{100 * wait_share:.1f}% of step time, {flops / 1e12:.3f} TFLOP/step, MFU {mfu_text}"
    )
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
