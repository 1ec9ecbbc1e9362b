"""Can the loader feed the step? Training samples/s of the loader next to the step's, on
real-sized volumes.

Three parts, each a table:

- ``--compare``: volseg's training loader (``data=folder``, ``data.cache=memory``) against the
  loader a MONAI user writes in ten lines (``CacheDataset``, ``ClassesToIndicesd`` once per
  volume, ``RandCropByLabelClassesd`` on those indices, one flip), seconds per batch, one
  thread, no loader workers, on generated cases (default: 4 cases of 128x256x256, 5 classes,
  patch 64x96x96, batch 2). The MONAI loader runs twice: as the ten lines write it (every
  class location kept, each cached volume and its locations deep-copied for every sample,
  ``items x samples`` cached copies), and on volseg's terms (``monai_in_place``: the locations
  capped at ``data.max_locations_per_class`` per class, the cache read in place with
  ``copy_cache=False``, each volume cached once). ``--loaders`` picks the rows
  (``monai,monai_in_place,volseg``), so that one can be timed alone.
- loader rows: volseg's training loader on generated real-sized datasets (128x256x256 MR-like
  cases; 26x150x320 stacks, the reference config's shape; a 512x512x256 CT-sized volume) with
  ``data.num_workers`` 0, 1, 2 and ``auto``. The first batch (cache filling, worker start-up)
  is timed apart.
- step rows: the samples/s each preset's training step consumes, measured on this CPU
  (forward, DiceCE, backward, AdamW; ``trainer.precision=auto`` as resolved here) and, for
  CUDA, from the GPU runs recorded in ``benchmarks/results/cuda/*.json`` (:data:`CUDA_FEEDS`).
  A loader that delivers fewer samples/s than a step consumes starves it.

    python -m benchmarks data_throughput [--compare [--loaders monai,monai_in_place,volseg]]
        [--datasets mr,stack,ct] [--workers 0,1,2,auto] [--models unet_small,unet_large]
        [--batches 12] [--scale 1.0] [--json-out PATH|none]

Every row also goes to ``benchmarks/results/cpu/<date>_data_throughput.json`` (``--compare``:
``<date>_loader_compare.json``), with the machine and the command.

``--scale`` shrinks every generated shape (and patch) by that factor per axis (tests use it).
Generated cases are kept under ``--cache`` (default: a temporary folder).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import hydra
import lightning as L
import torch
from hydra import compose, initialize_config_dir

from benchmarks import results_io
from benchmarks.cases import NUM_CLASSES, write_cases
from benchmarks.results_io import cpu_description
from volseg.plan import planned_config

REPO = Path(__file__).resolve().parents[2]
os.environ.setdefault("PROJECT_ROOT", str(REPO))

#: generated datasets: (cases, shape [D, H, W], patch [D, H, W], voxel size [z, y, x])
DATASETS: dict[str, tuple[int, list[int], list[int], list[float]]] = {
    # brain-MR-sized cases (the comparison)
    "mr": (4, [128, 256, 256], [64, 96, 96], [1.0, 1.0, 1.0]),
    # the reference config's stacks (unet_large's patch is the whole stack)
    "stack": (4, [26, 150, 320], [26, 150, 320], [2.0, 0.5, 0.5]),
    # one CT-sized volume (and a second one to validate on)
    "ct": (2, [256, 512, 512], [64, 128, 128], [2.5, 0.8, 0.8]),
}
BATCH = 2

#: GPU training steps a loader must feed, each a run recorded in
#: ``benchmarks/results/cuda/*.json``: (run name, preset, batch shape, precision, the dataset
#: whose loader feeds it)
CUDA_FEEDS = [
    ("levers: none (16-mixed)", "unet_large", "2x1x26x150x320", "16-mixed", "stack"),
    (
        "train.py: model=unet_small trainer.precision=16-mixed",
        "unet_small",
        "2x1x32x64x64",
        "16-mixed",
        "embedded",
    ),
]
#: the MONAI loader rows of ``--compare``, then volseg's
LOADERS = ("monai", "monai_in_place", "volseg")
#: volseg's default ``data.max_locations_per_class``, the in-place MONAI row's cap
MAX_LOCATIONS = 10000


def cuda_steps(results: Path = REPO / "benchmarks" / "results" / "cuda") -> list[tuple]:
    """(preset, batch shape, precision, seconds per step, dataset, GPU, file) of each of
    :data:`CUDA_FEEDS`, read from the recorded runs: their ``step_s``, or where only a whole
    run's time was recorded, ``wall_s / steps``."""
    runs = {}
    for path in sorted(results.glob("*.json")):
        doc = json.loads(path.read_text())
        for run in doc["runs"]:
            runs.setdefault(run["name"], (run["measured"], doc["gpu"], path.name))
    steps = []
    for name, model, shape, precision, data in CUDA_FEEDS:
        measured, gpu, file = runs[name]
        seconds = measured.get("step_s") or measured["wall_s"] / measured["steps"]
        steps.append((model, shape, precision, seconds, data, gpu, file))
    return steps


def scaled(shape: Sequence[int], scale: float) -> list[int]:
    return [max(4, round(s * scale)) for s in shape]


def compose_train(overrides: list[str]):
    with initialize_config_dir(version_base="1.3", config_dir=str(REPO / "configs")):
        return compose("train", overrides=overrides)


def volseg_loader(root: Path | None, patch: Sequence[int], workers: str, samples: int):
    """volseg's training loader for ``root`` (``data=folder``, cached in memory); ``None``: the
    default data config (the embedded dataset, generated on first use)."""
    data = ["data=folder", f"data.root={root}"] if root is not None else []
    cfg = compose_train(
        [
            *data,
            f"data.patch_size=[{','.join(str(p) for p in patch)}]",
            f"data.batch_size={BATCH}",
            f"data.num_workers={workers}",
            f"data.samples_per_volume={samples}",
            f"num_classes={NUM_CLASSES}",
        ]
    )
    L.seed_everything(0, verbose=False)
    datamodule = hydra.utils.instantiate(cfg.data)
    datamodule.prepare_data()
    datamodule.setup("fit")
    return datamodule.train_dataloader()


def monai_loader(root: Path, patch: Sequence[int], samples: int, in_place: bool = False):
    """The ten-line MONAI loader: cached volumes, class indices once per volume, a
    class-balanced crop on them, one flip. As the ten lines write it, every item is listed
    ``samples`` times (each cached), every class location is kept and each sample deep-copies
    its cached volume; ``in_place``: on volseg's terms, each volume cached once and read in place
    (``copy_cache=False``), at most :data:`MAX_LOCATIONS` locations per class."""
    from monai.data import CacheDataset, DataLoader, list_data_collate
    from monai.transforms import (
        ClassesToIndicesd,
        Compose,
        EnsureChannelFirstd,
        LoadImaged,
        RandCropByLabelClassesd,
        RandFlipd,
    )

    names = json.loads((root / "splits.json").read_text())["train"]
    items = [{"image": str(root / "images" / n), "label": str(root / "labels" / n)} for n in names]
    keys = ["image", "label"]
    cap = MAX_LOCATIONS if in_place else None
    transform = Compose(
        [
            LoadImaged(keys, image_only=True),
            EnsureChannelFirstd(keys),
            ClassesToIndicesd("label", num_classes=NUM_CLASSES, max_samples_per_class=cap),
            RandCropByLabelClassesd(
                keys,
                "label",
                list(patch)[::-1],
                num_classes=NUM_CLASSES,
                indices_key="label_cls_indices",
                num_samples=1,
                warn=False,
            ),
            RandFlipd(keys, prob=0.5, spatial_axis=0),
        ]
    )
    if not in_place:
        dataset = CacheDataset(items * samples, transform, progress=False, num_workers=None)
    else:
        # the crop returns views and the flip a new tensor: nothing writes into the cache
        cached = CacheDataset(items, transform, progress=False, num_workers=None, copy_cache=False)
        dataset = torch.utils.data.Subset(cached, list(range(len(items))) * samples)
    return DataLoader(dataset, batch_size=BATCH, shuffle=True, collate_fn=list_data_collate)


def time_loader(build, batches: int) -> tuple[float, float, float]:
    """(seconds to build and to the first batch, seconds per batch after it, samples/s)."""
    start = time.perf_counter()
    loader = build()
    iterator = iter(loader)
    next(iterator)
    first = time.perf_counter() - start
    start, samples, count = time.perf_counter(), 0, 0
    for _, batch in zip(range(batches), iterator, strict=False):
        samples += batch["image"].shape[0]
        count += 1
    seconds = time.perf_counter() - start
    return first, seconds / max(count, 1), samples / seconds


def compare(
    root: Path, patch: Sequence[int], batches: int, loaders: Sequence[str] = LOADERS
) -> list[dict]:
    """volseg's loader against the ten-line MONAI loader (as written, and on volseg's terms),
    one thread, no workers; the rows of ``loaders`` (:data:`LOADERS`)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    samples = max(2, math.ceil((batches + 1) * BATCH / 3))
    builds = {
        "monai": (
            "a ten-line MONAI loader: CacheDataset + ClassesToIndicesd + RandCropByLabelClassesd "
            "+ flip (every location, cache deep-copied per sample)",
            lambda: monai_loader(root, patch, samples),
        ),
        "monai_in_place": (
            f"the ten-line MONAI loader on volseg's terms: locations capped at {MAX_LOCATIONS:,} "
            "per class, copy_cache=False, each volume cached once",
            lambda: monai_loader(root, patch, samples, in_place=True),
        ),
        "volseg": (
            "volseg: data=folder, data.cache=memory",
            lambda: volseg_loader(root, patch, "0", samples),
        ),
    }
    unknown = [name for name in loaders if name not in builds]
    if unknown:
        raise ValueError(f"--loaders {','.join(unknown)}: choose from {','.join(LOADERS)}")
    print("| loader (1 thread, 0 workers) | build + first batch (s) | s/batch |")
    print("| --- | ---: | ---: |")
    rows = []
    for key in loaders:
        name, build = builds[key]
        first, per_batch, rate = time_loader(build, batches)
        print(f"| {name} | {first:.2f} | {per_batch:.4f} |", flush=True)
        rows.append(
            {
                "loader": key,
                "label": name,
                "first_batch_s": first,
                "s_per_batch": per_batch,
                "samples_per_s": rate,
                "batches": batches,
                # the threads the loader was timed with (this function holds torch to one)
                "threads": torch.get_num_threads(),
            }
        )
    torch.set_num_threads(threads)
    return rows


def step_rate(model: str, patch: Sequence[int], steps: int) -> tuple[float, str]:
    """(samples/s of ``model``'s training step on this CPU at ``patch``, precision)."""
    from volseg.memory.estimate.step import build_training_step

    # planned as train.py plans it on this CPU (pooling=auto, precision=auto)
    patch_override = f"data.patch_size=[{','.join(str(p) for p in patch)}]"
    cfg = planned_config(
        compose_train([f"model={model}", patch_override, "trainer.accelerator=cpu"])
    )
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


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compare", action="store_true", help="volseg vs MONAI loader only")
    parser.add_argument(
        "--loaders", default=",".join(LOADERS), help="the --compare rows, e.g. monai_in_place"
    )
    parser.add_argument("--datasets", default="embedded,mr,stack,ct")
    parser.add_argument("--workers", default="0,1,2,auto")
    parser.add_argument("--models", default="unet_small,unet_large")
    parser.add_argument("--batches", type=int, default=12)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--cache", default=None, help="folder for the generated cases")
    results_io.add_json_out(parser, "data_throughput")
    args = parser.parse_args(argv)
    benchmark = "loader_compare" if args.compare else "data_throughput"
    settings = {"batch": BATCH, "scale": args.scale, "threads": torch.get_num_threads()}
    cache = Path(args.cache) if args.cache else Path(tempfile.mkdtemp(prefix="volseg-bench-"))
    print(f"CPU: {cpu_description()}")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, batch {BATCH}\n")

    def dataset(name: str) -> tuple[Path | None, list[int], list[int], int]:
        """(root, shape, patch, training cases) of a generated dataset; ``embedded``: the
        default data config's (24 volumes of 32x96x96, 20 train, patch 32x64x64)."""
        if name == "embedded":
            return None, [32, 96, 96], [32, 64, 64], 20
        count, shape, patch, spacing = DATASETS[name]
        shape, patch = scaled(shape, args.scale), scaled(patch, args.scale)
        root = cache / f"{name}-{'x'.join(map(str, shape))}"
        return write_cases(root, count, shape, spacing), shape, patch, count - 1

    if args.compare:
        root, shape, patch, _ = dataset("mr")
        print(
            f"{DATASETS['mr'][0]} cases of {'x'.join(map(str, shape))}, patch "
            f"{'x'.join(map(str, patch))}, {NUM_CLASSES} classes\n"
        )
        rows = compare(root, patch, args.batches, args.loaders.split(","))
        # the comparison runs on one thread, whatever this process had before it
        settings |= {
            "cases": DATASETS["mr"][0],
            "shape": shape,
            "patch": patch,
            "threads": rows[0]["threads"],
        }
        doc = results_io.result(benchmark, rows, script=__file__, argv=argv, settings=settings)
        results_io.write(doc, args.json_out)
        return
    rows: list[dict] = []
    print("| what | data | setting | first batch (s) | training samples/s |")
    print("| --- | --- | --- | ---: | ---: |")
    one_worker: dict[str, float] = {}
    for name in args.datasets.split(","):
        root, shape, patch, train_cases = dataset(name)
        samples = max(1, math.ceil((args.batches + 1) * BATCH / train_cases))
        data = f"{name} {'x'.join(map(str, shape))}, patch {'x'.join(map(str, patch))}"
        for workers in args.workers.split(","):
            built = []

            def build(w=workers, r=root, p=patch, n=samples, keep=built):
                keep.append(volseg_loader(r, p, w, n))
                return keep[-1]

            first, _, rate = time_loader(build, args.batches)
            resolved = built[-1].num_workers
            setting = f"num_workers={workers}" + (f" ({resolved})" if workers == "auto" else "")
            # a worker process loads with one thread: its rate is what each added worker adds
            if workers == "1" or (workers == "0" and name not in one_worker):
                one_worker[name] = rate
            print(f"| loader | {data} | {setting} | {first:.2f} | {rate:.1f} |", flush=True)
            rows.append(
                {
                    "what": "loader",
                    "data": name,
                    "shape": shape,
                    "patch": patch,
                    "num_workers": workers,
                    "resolved_workers": resolved,
                    "first_batch_s": first,
                    "samples_per_s": rate,
                }
            )
    patches = {"unet_small": [32, 64, 64], "unet_large": [26, 150, 320]}
    for model in [m for m in args.models.split(",") if m]:
        patch = scaled(patches.get(model, [32, 64, 64]), args.scale)
        rate, precision = step_rate(model, patch, args.steps)
        shape = f"{BATCH}x1x{'x'.join(map(str, patch))}"
        print(f"| CPU training step | {shape} | {model}, {precision} | | {rate:.2f} |", flush=True)
        rows.append(
            {
                "what": "cpu_step",
                "model": model,
                "shape": shape,
                "precision": precision,
                "samples_per_s": rate,
            }
        )
    recorded = cuda_steps()
    for model, shape, precision, seconds, _, gpu, file in recorded:
        print(
            f"| {gpu} training step ({file}) | {shape} | {model}, {precision} | | "
            f"{BATCH / seconds:.1f} |"
        )
    from volseg.data.loader_options import resolve_loader_options

    auto = resolve_loader_options("auto", "auto", "auto", "cuda").num_workers
    print(
        f"\nWorkers that feed the H200 step (each worker ~ the 1-worker rate, else the 0-worker "
        f"one; data.num_workers=auto on CUDA on this machine: {auto}):\n"
    )
    print("| preset step | samples/s needed | loader samples/s per worker | workers needed |")
    print("| --- | ---: | ---: | ---: |")
    for model, shape, _, seconds, name, gpu, file in recorded:
        if name in one_worker:
            need = BATCH / seconds
            workers = math.ceil(need / one_worker[name]) if one_worker[name] else float("inf")
            print(f"| {model} {shape} | {need:.1f} | {one_worker[name]:.1f} | {workers} |")
            rows.append(
                {
                    "what": "gpu_feed",
                    "model": model,
                    "shape": shape,
                    "gpu": gpu,
                    "recorded_in": file,
                    "gpu_step_s": seconds,
                    "samples_per_s_needed": need,
                    "one_worker_samples_per_s": one_worker[name],
                    "workers_needed": workers,
                }
            )
    doc = results_io.result(benchmark, rows, script=__file__, argv=argv, settings=settings)
    results_io.write(doc, args.json_out)


if __name__ == "__main__":
    main()
