"""Can the loader feed the step? Training samples/s of the loader alone next to the step's.

The loader rows iterate the training DataLoader of the default data config (the embedded
dataset, cached volumes, class-balanced patch sampling, augmentations, batch 2) with
``data.num_workers`` 0, 1, 2 and ``auto``, nothing else running. The first batch (worker
start-up) is timed apart. The step rows time the presets' training step on this CPU (forward,
DiceCE, backward, AdamW; ``trainer.precision=auto`` as resolved here) on in-memory batches of
the same shape. A loader that delivers fewer samples/s than a step consumes starves it.

    python benchmarks/data_throughput.py [--batches 24] [--models unet_tiny,unet_small]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import hydra
import lightning as L
import torch
from hydra import compose, initialize_config_dir

from volseg.memory.estimator import build_training_step
from volseg.plan import planned_config
from volseg.utils.cpu import cpu_description

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("PROJECT_ROOT", str(REPO))


def compose_train(overrides: list[str]):
    with initialize_config_dir(version_base="1.3", config_dir=str(REPO / "configs")):
        return compose("train", overrides=overrides)


def loader_rate(workers: str, batches: int) -> tuple[float, float, int]:
    """(seconds to the first batch, samples/s after it, resolved workers) on this CPU."""
    cfg = compose_train([f"data.num_workers={workers}", f"data.samples_per_volume={batches}"])
    L.seed_everything(0, verbose=False)
    datamodule = hydra.utils.instantiate(cfg.data)
    datamodule.prepare_data()
    datamodule.setup("fit")
    loader = datamodule.train_dataloader()
    start = time.perf_counter()
    iterator = iter(loader)
    first = next(iterator)
    first_s = time.perf_counter() - start
    start, samples = time.perf_counter(), 0
    for _, batch in zip(range(batches), iterator, strict=False):
        samples += batch["image"].shape[0]
    del first
    return first_s, samples / (time.perf_counter() - start), loader.num_workers


def step_rate(model: str, steps: int) -> tuple[float, str]:
    """(samples/s of the training step, precision) for ``model`` on this CPU."""
    # planned as train.py plans it on this CPU (pooling=auto, precision=auto)
    cfg = planned_config(compose_train([f"model={model}", "trainer.accelerator=cpu"]))
    precision = str(cfg.trainer.precision)
    step = build_training_step(cfg, "cpu")
    num_classes = int(cfg.num_classes)

    def batch(image_shape, label_shape, dtype):
        image = torch.randn(image_shape, dtype=dtype)
        return image, torch.randint(0, num_classes, label_shape).to(dtype)

    step.run(1, new_batch=batch)  # warm-up
    start = time.perf_counter()
    step.run(steps, new_batch=batch)
    seconds = (time.perf_counter() - start) / steps
    return step.image_shape[0] * step.loop.accumulate_grad_batches / seconds, precision


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=24)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--workers", default="0,1,2,auto")
    parser.add_argument("--models", default="unet_tiny,unet_small")
    args = parser.parse_args()
    print(f"CPU: {cpu_description()}")
    print(f"torch {torch.__version__}, batch 2 of 1x32x64x64 patches\n")
    print("| what | setting | first batch (s) | training samples/s |")
    print("| --- | --- | ---: | ---: |")
    for workers in args.workers.split(","):
        first, rate, resolved = loader_rate(workers, args.batches)
        setting = f"num_workers={workers}" + (f" ({resolved})" if workers == "auto" else "")
        print(f"| loader | {setting} | {first:.2f} | {rate:.1f} |", flush=True)
    for model in args.models.split(","):
        rate, precision = step_rate(model, args.steps)
        print(f"| training step | {model}, {precision} | | {rate:.2f} |", flush=True)


if __name__ == "__main__":
    main()
