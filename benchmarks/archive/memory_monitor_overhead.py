"""Overhead of the memory monitor: seconds per training step with and without it.

Trains the default model (unet_tiny, bf16-mixed on the CPU) on one in-memory batch of
2x1x32x64x64 through the Lightning Trainer, alternating runs without the monitor and with it
logging every step (``memory.every_n_steps=1``, the most expensive setting), and prints the best
seconds per step of each. Differences of ~1% are within run-to-run noise on a shared 2-core
machine, so it also times the monitor's own hooks (reads, peak resets, logging) inside the run
and prints them as a share of the step. Target: <= 1% of step time.

    python -m benchmarks memory_monitor_overhead [--steps 20] [--repeats 5]

The figures go to ``benchmarks/results/cpu/<date>_memory_monitor_overhead.json`` (``--json-out``).
"""

from __future__ import annotations

import argparse
import copy
import tempfile
import time

import lightning as L
import torch

from benchmarks import results_io
from benchmarks.archive.steps import RepeatBatch, StepTimer, build_module, make_batch
from volseg.memory.monitor.callback import MemoryMonitor


class TimedMonitor(MemoryMonitor):
    """MemoryMonitor that adds up the wall time spent in its per-step hooks."""

    HOOKS = (
        "on_train_batch_start",
        "on_before_backward",
        "on_after_backward",
        "on_before_optimizer_step",
        "on_train_batch_end",
    )

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.hook_seconds = 0.0
        for name in self.HOOKS:
            setattr(self, name, self._timed(getattr(self, name)))

    def _timed(self, hook):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            hook(*args, **kwargs)
            self.hook_seconds += time.perf_counter() - start

        return wrapper


def seconds_per_step(module, batch, steps: int, warmup: int, monitor: bool) -> tuple[float, float]:
    """(seconds per step, seconds per step spent in the monitor's hooks)."""
    timer = StepTimer(warmup)
    callbacks: list[L.Callback] = [timer]
    timed = TimedMonitor(tempfile.mkdtemp(), every_n_steps=1) if monitor else None
    if timed is not None:
        callbacks.append(timed)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        precision="bf16-mixed",
        max_steps=steps + warmup,
        limit_val_batches=0,
        logger=L.pytorch.loggers.CSVLogger(tempfile.mkdtemp()),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
    )
    loader = torch.utils.data.DataLoader(RepeatBatch(batch, steps + warmup), batch_size=None)
    trainer.fit(module, train_dataloaders=loader)
    hooks = timed.hook_seconds / (steps + warmup) if timed is not None else 0.0
    return (timer.end - timer.start) / steps, hooks


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    results_io.add_json_out(parser, "memory_monitor_overhead")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    base, batch = build_module("unet_tiny", channels_last=False), make_batch(False)
    best = {False: float("inf"), True: float("inf")}
    hook_times = []
    for _ in range(args.repeats):
        for monitor in (False, True):
            step, hooks = seconds_per_step(
                copy.deepcopy(base), batch, args.steps, args.warmup, monitor
            )
            best[monitor] = min(best[monitor], step)
            if monitor:
                hook_times.append(hooks)
    hooks = min(hook_times)
    print(
        f"unet_tiny bf16-mixed, batch 2x1x32x64x64, {args.steps} steps, best of {args.repeats}:\n"
        f"  without monitor:           {best[False] * 1e3:7.1f} ms/step\n"
        f"  with monitor (every step): {best[True] * 1e3:7.1f} ms/step "
        f"({100 * (best[True] / best[False] - 1):+.2f}%, within run-to-run noise)\n"
        f"  monitor hooks:             {hooks * 1e3:7.3f} ms/step = "
        f"{100 * hooks / best[False]:.2f}% of the step  (target <= 1%)"
    )
    row = {
        "model": "unet_tiny",
        "batch": [2, 1, 32, 64, 64],
        "s_per_step_without": best[False],
        "s_per_step_with": best[True],
        "hooks_s_per_step": hooks,
        "hooks_share": hooks / best[False],
    }
    settings = {"steps": args.steps, "warmup": args.warmup, "repeats": args.repeats}
    doc = results_io.result(
        "memory_monitor_overhead", [row], script=__file__, argv=argv, settings=settings
    )
    results_io.write(doc, args.json_out)


if __name__ == "__main__":
    main()
