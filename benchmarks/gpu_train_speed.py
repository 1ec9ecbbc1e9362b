"""How well ``python train.py`` keeps a GPU busy: step time, data-wait fraction and model FLOP
utilization of a whole training run at the reference config, with volseg's own loader.

Trains the reference config (unet_large, batch 2 of 1x26x150x320, 5 classes, ``16-mixed``) on
generated stacks of that shape (``data=folder``, cached in memory, ``data.num_workers=auto``)
for ``--steps`` optimizer steps (no validation) and prints what the run's own training-speed
callback (``callbacks.training_speed``, summary.json's ``speed``) measured after ``--warmup``
steps:

- step time: mean wall seconds per optimizer step, the fetching of its batch included;
- data wait: the share of that time spent between a step's end and the next step's start
  (the loop fetching the next batch: what the GPU waits for);
- MFU: FLOPs of one training step (the plan's count, ``torch.utils.flop_counter`` over
  forward, loss and backward) / step time / the GPU's dense bf16/fp16 peak (``--peak-tflops``,
  or the callback's table of GPUs).

Anchors: the seed step alone on an H200 (the retired study levers) 0.073 s for 10.5 TFLOP, 0.15
of 989 TFLOP/s; NVIDIA's tuned nnU-Net (DynUNet, AMP, channels-last) 0.25 of an A100's 312.

    python -m benchmarks gpu_train_speed [--steps 60] [--override KEY=VALUE ...]
    python -m benchmarks gpu_train_speed --dry-run   # CPU, tiny sizes: checks the script
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import tempfile
from pathlib import Path

import torch

from benchmarks import results_io

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("PROJECT_ROOT", str(REPO))


def main(argv: list[str] | None = None) -> None:
    from benchmarks.cases import write_cases
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
    root = write_cases(tmp / "data", 4, shape, [2.0, 0.5, 0.5])
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
        f"callbacks.training_speed.warmup_steps={warmup}",
        *([f"callbacks.training_speed.peak_tflops={args.peak_tflops}"] if args.peak_tflops else []),
        *args.override,
    ]
    cfg = compose_run_config(REPO / "configs", "train", overrides, tmp / "run")
    train_task.train(cfg)
    speed = json.loads((Path(cfg.paths.output_dir) / "summary.json").read_text())["speed"]
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    result = {
        "date": datetime.date.today().isoformat(),
        "device": name,
        "torch": torch.__version__,
        "code": results_io.code("gpu_train_speed"),
        "overrides": overrides,
        **speed,
    }
    if speed["step_s"] is None:
        raise SystemExit(f"{name}: no step measured after {warmup} of warm-up")
    flops = speed["flops_per_step"]
    rate = f"{flops / 1e12:.3f} TFLOP/step" if flops else "FLOPs not planned"
    mfu = speed["mfu"]
    mfu_text = f"{mfu:.3f}" if mfu is not None else f"n/a ({speed['peak_source']})"
    print(
        f"{name}: {speed['steps_measured']} steps, mean {speed['step_s']:.4f} s/step, data wait "
        f"{100 * speed['data_wait_share']:.1f}% of step time, {rate}, MFU {mfu_text}"
    )
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
