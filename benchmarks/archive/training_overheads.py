"""What a training run spends beside its steps: checkpoint writes, logging, validation overlays
and memory charts, each as a share of the run's wall time.

Runs ``train(cfg)`` in this process (the config ``python train.py`` composes, plus the
overrides given) with timers around:

- checkpoint writes during training: the time every ``ModelCheckpoint`` save (``last.ckpt``
  and the best checkpoint) holds the training loop: the whole write, or with
  ``async_checkpoint=true`` the copy to host memory (and any wait for the previous write);
- checkpoint writes at the end of fit: the final ``last.ckpt`` save and the wait for the
  background writes in flight; "background writes": the writer thread's time (beside the loop,
  not in it);
- logging: the loggers' ``log_metrics``/``log_hyperparams``/``save``/``finalize``;
- overlays: the validation overlays callback (collecting slices, rendering, writing PNGs);
- memory charts: the charts logged at the end of fit, and the memory monitor's per-step hooks.

Two runs by default: the embedded dataset as it trains (40 steps per epoch), and the same with
epochs of 2 steps and unet_large's 40.2M parameters at a small patch (a 460 MiB checkpoint with
AdamW's state against short steps), each with ``callbacks.last_checkpoint.max_time_share`` at
its default and at ``null`` (a save at every epoch end), and with ``async_checkpoint`` true and
false.

    python -m benchmarks training_overheads [--epochs 3] [--runs default,short_epochs]
        [--shares 0.02,null] [--async-checkpoint true,false] [--override KEY=VALUE ...]
        [--json-out PATH|none]

Each run (its wall time, steps and every timed item) also goes to
``benchmarks/results/cpu/<date>_training_overheads.json`` with the machine and the command.
"""

from __future__ import annotations

import argparse
import functools
import os
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from benchmarks import results_io

REPO = Path(__file__).resolve().parents[2]
os.environ.setdefault("PROJECT_ROOT", str(REPO))

#: named runs: overrides of ``python train.py``
RUNS: dict[str, list[str]] = {
    "default": [],
    "short_epochs": [
        "model=unet_large",
        "model.channels_last=false",
        "data.patch_size=[16,32,32]",
        "data.samples_per_volume=1",
        "data.synthetic.num_volumes=6",
        "data.synthetic.num_val=2",
    ],
}


class Timers:
    """Seconds and calls per item, accumulated by wrapped methods."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self._undo: list[Callable[[], None]] = []
        self._depth: dict[str, int] = defaultdict(int)

    def wrap(self, owner: object, name: str, item: str, unless_in: str | None = None) -> None:
        """Time ``owner.name`` as ``item``; not while ``unless_in``'s item is being timed."""
        original = getattr(owner, name)

        @functools.wraps(original)
        def timed(*args, **kwargs):
            if unless_in is not None and self._depth[unless_in] > 0:
                return original(*args, **kwargs)  # counted in unless_in's item
            self._depth[item] += 1  # nested calls (a subclass calling super) counted once
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self._depth[item] -= 1
                if self._depth[item] == 0:
                    self.seconds[item] += time.perf_counter() - start
                    self.calls[item] += 1

        setattr(owner, name, timed)
        self._undo.append(lambda: setattr(owner, name, original))

    def undo(self) -> None:
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()


def instrument(timers: Timers) -> None:
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

    from volseg.callbacks import overlays
    from volseg.callbacks.last_checkpoint import LastCheckpoint
    from volseg.memory.monitor.callback import MemoryMonitor
    from volseg.utils.checkpoint_io import BackgroundCheckpointIO

    end = "checkpoint writes at the end of fit (final save, waiting for writes)"
    timers.wrap(LastCheckpoint, "on_train_end", end)
    timers.wrap(BackgroundCheckpointIO, "teardown", end)
    timers.wrap(ModelCheckpoint, "_save_checkpoint", "checkpoint writes during training", end)
    timers.wrap(BackgroundCheckpointIO, "_write", "background writes (beside the loop)")
    for logger in (CSVLogger, TensorBoardLogger):
        for name in ("log_metrics", "log_hyperparams", "save", "finalize"):
            timers.wrap(logger, name, "logging")
    for name in ("on_validation_epoch_start", "on_validation_batch_end", "on_validation_epoch_end"):
        timers.wrap(overlays.ValidationOverlays, name, "validation overlays")
    for name in (
        "on_train_batch_start",
        "on_before_backward",
        "on_after_backward",
        "on_before_optimizer_step",
        "on_train_batch_end",
        "on_fit_end",
    ):
        timers.wrap(MemoryMonitor, name, "memory monitor (per-step reads, charts)")


def run(overrides: list[str], epochs: int, workdir: Path) -> tuple[float, Timers, int]:
    """(wall seconds of ``train``, timers, optimizer steps)."""
    from volseg.tasks.train import train
    from volseg.utils.config import compose_run_config

    overrides = [
        f"trainer.max_epochs={epochs}",
        "trainer.accelerator=cpu",
        "extras.print_config=false",
        f"paths.data_dir={workdir / 'data'}",
        *overrides,
    ]
    out = workdir / "run"
    cfg = compose_run_config(REPO / "configs", "train", overrides, out)
    # the dataset is generated before the clock starts
    import hydra

    hydra.utils.instantiate(cfg.data).prepare_data()
    timers = Timers()
    instrument(timers)
    start = time.perf_counter()
    try:
        train(cfg)
    finally:
        timers.undo()
    wall = time.perf_counter() - start
    import torch

    steps = torch.load(out / "checkpoints" / "last.ckpt", weights_only=False)["global_step"]
    return wall, timers, int(steps)


def main(argv: list[str] | None = None) -> None:
    from benchmarks.results_io import cpu_description

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--runs", default="default,short_epochs")
    parser.add_argument("--shares", default="0.02,null", help="max_time_share values to run")
    parser.add_argument(
        "--async-checkpoint", default="true,false", help="async_checkpoint values to run"
    )
    parser.add_argument(
        "--override", action="append", default=[], help="an override for every run (repeatable)"
    )
    results_io.add_json_out(parser, "training_overheads")
    args = parser.parse_args(argv)
    rows = []
    import torch

    print(f"CPU: {cpu_description()}\ntorch {torch.__version__}\n")
    print(
        "| run | max_time_share | async_checkpoint | steps | wall (s) | item | seconds | calls "
        "| share of wall |"
    )
    print("| --- | --- | --- | ---: | ---: | --- | ---: | ---: | ---: |")
    extra = list(args.override)
    for name in args.runs.split(","):
        for share in args.shares.split(","):
            for background in args.async_checkpoint.split(","):
                overrides = [
                    *RUNS[name],
                    *extra,
                    f"callbacks.last_checkpoint.max_time_share={share}",
                    f"async_checkpoint={background}",
                ]
                with tempfile.TemporaryDirectory() as tmp:
                    wall, timers, steps = run(overrides, args.epochs, Path(tmp))
                rows.append(
                    {
                        "run": name,
                        "max_time_share": share,
                        "async_checkpoint": background,
                        "overrides": overrides,
                        "epochs": args.epochs,
                        "steps": steps,
                        "wall_s": wall,
                        "items": {
                            item: {"seconds": timers.seconds[item], "calls": timers.calls[item]}
                            for item in sorted(timers.seconds)
                        },
                    }
                )
                for item in sorted(timers.seconds):
                    seconds = timers.seconds[item]
                    print(
                        f"| {name} | {share} | {background} | {steps} | {wall:.1f} | {item} | "
                        f"{seconds:.3f} | {timers.calls[item]} | {100 * seconds / wall:.1f}% |",
                        flush=True,
                    )
    doc = results_io.result("training_overheads", rows, script=__file__, argv=argv)
    results_io.write(doc, args.json_out)


if __name__ == "__main__":
    main()
