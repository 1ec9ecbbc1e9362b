"""Training throughput: Lightning Trainer vs a plain PyTorch loop, and FLOP/s vs the machine.

For each model (the default unet_tiny and unet_small) on one fixed batch of 2x1x32x64x64 and for
each variant (fp32, fp32 channels_last_3d, bf16 autocast) this prints:

- steps/s through the Lightning Trainer (our SegmentationModule.training_step, DiceCE, AdamW) and
  through a plain PyTorch loop doing the same work, and their ratio;
- achieved FLOP/s (FLOPs of one forward+backward counted by torch.utils.flop_counter, times
  steps/s) divided by this machine's matmul FLOP/s in the dtype the step computes in, measured
  in the same run: fp32 rows by the best fp32 GEMM, bf16 rows by the best bf16 GEMM ("of dtype
  peak" for the Lightning step, "plain" for the plain loop).

The CPU's model and ISA flags are printed with the table: bf16 is fast only on CPUs with
AVX512_BF16 or AMX, and fp32 kernels differ between AVX2 and AVX-512.

The batch lives in memory, so the numbers measure the training step, not data loading.
Each timing is the best of ``--repeats`` runs of a model's timed steps after warm-up, alternating
Lightning and plain runs so that both see the same machine state.

    python -m benchmarks train_throughput [--models unet_tiny:10,unet_small:3] [--repeats 3]

(``model:steps`` sets the timed steps per run; unet_small takes ~5 s a step on 2 cores.)
``--override`` (repeatable) changes the network for a study, e.g.
``--override "model.net.widths=[32,32,64,128,256]"``. The rows go to
``benchmarks/results/cpu/<date>_train_throughput.json`` (``--json-out``), with the matmul peaks.
"""

from __future__ import annotations

import argparse
import copy
import os
import time
from contextlib import nullcontext

import lightning as L
import torch

from benchmarks import results_io
from benchmarks.archive.steps import (
    BATCH_SHAPE,
    RepeatBatch,
    StepTimer,
    build_module,
    flops_per_step,
    make_batch,
    matmul_flops_per_s,
)
from benchmarks.results_io import cpu_description

os.environ.setdefault("PROJECT_ROOT", str(results_io.REPO))
VARIANTS = ("fp32", "fp32+channels_last_3d", "bf16-autocast", "bf16-autocast+channels_last_3d")


def lightning_seconds_per_step(
    module: L.LightningModule, batch: dict, steps: int, warmup: int, precision: str
) -> float:
    timer = StepTimer(warmup)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        precision=precision,
        max_steps=steps + warmup,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[timer],
    )
    loader = torch.utils.data.DataLoader(RepeatBatch(batch, steps + warmup), batch_size=None)
    trainer.fit(module, train_dataloaders=loader)
    return (timer.end - timer.start) / steps


def plain_seconds_per_step(
    module: L.LightningModule, batch: dict, steps: int, warmup: int, autocast: bool
) -> float:
    net, loss_fn = module.net, module.loss
    net.train()
    optimizer = module.optimizer_factory(params=net.parameters())
    context = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else nullcontext()
    start = 0.0
    for i in range(steps + warmup):
        if i == warmup:
            start = time.perf_counter()
        with context:
            logits = net(batch["image"])
        loss = loss_fn(logits.float(), batch["label"])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return (time.perf_counter() - start) / steps


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", default="unet_tiny:10,unet_small:3")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset")
    parser.add_argument(
        "--override",
        action="append",
        default=[],
        help="a train.py override for every model, e.g. 'model.net.widths=[32,32,64,128,256]'",
    )
    results_io.add_json_out(parser, "train_throughput")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    print(f"CPU: {cpu_description()}")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} intra-op threads")
    peaks = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        rates = matmul_flops_per_s(dtype)
        peaks[name] = max(rates.values())
        per_library = ", ".join(f"{k} {v / 1e9:.0f}" for k, v in rates.items())
        print(
            f"{name} matmul peak: {peaks[name] / 1e9:.0f} GFLOP/s "
            f"(2048x2048, best of 10; {per_library})"
        )
    print(
        f"batch {'x'.join(map(str, BATCH_SHAPE))}, timed steps after {args.warmup} warm-up, "
        f"best of {args.repeats}"
        + (f"; overrides: {' '.join(args.override)}" if args.override else "")
    )
    print()
    header = (
        f"{'model':<11} {'variant':<30} {'Lightning it/s':>14} {'plain it/s':>10} "
        f"{'ratio':>6} {'GFLOP/step':>10} {'GFLOP/s':>8} {'of dtype peak':>13} {'plain':>6}"
    )
    print(header)
    print("-" * len(header))
    rows = []
    for entry in args.models.split(","):
        model, steps = entry.split(":")[0], int(entry.split(":")[1])
        for variant in args.variants.split(","):
            channels_last = "channels_last" in variant
            autocast = variant.startswith("bf16")
            batch = make_batch(channels_last)
            base = build_module(model, channels_last, args.override)
            flops = flops_per_step(base, batch)
            lightning_best = plain_best = float("inf")
            for _ in range(args.repeats):
                lightning_best = min(
                    lightning_best,
                    lightning_seconds_per_step(
                        copy.deepcopy(base),
                        batch,
                        steps,
                        args.warmup,
                        "bf16-mixed" if autocast else "32-true",
                    ),
                )
                plain_best = min(
                    plain_best,
                    plain_seconds_per_step(
                        copy.deepcopy(base), batch, steps, args.warmup, autocast
                    ),
                )
            achieved = flops / lightning_best
            peak = peaks["bf16" if autocast else "fp32"]
            print(
                f"{model:<11} {variant:<30} {1 / lightning_best:>14.2f} {1 / plain_best:>10.2f} "
                f"{plain_best / lightning_best:>6.3f} {flops / 1e9:>10.1f} "
                f"{achieved / 1e9:>8.1f} {achieved / peak:>13.2f} "
                f"{flops / plain_best / peak:>6.2f}",
                flush=True,
            )
            rows.append(
                {
                    "model": model,
                    "variant": variant,
                    "lightning_s_per_step": lightning_best,
                    "plain_s_per_step": plain_best,
                    "flops_per_step": flops,
                    "of_dtype_peak": achieved / peak,
                }
            )
    settings = {
        "batch": list(BATCH_SHAPE),
        "warmup": args.warmup,
        "repeats": args.repeats,
        "overrides": args.override,
        "matmul_peak_flops_per_s": peaks,
    }
    doc = results_io.result("train_throughput", rows, script=__file__, argv=argv, settings=settings)
    results_io.write(doc, args.json_out)


if __name__ == "__main__":
    main()
