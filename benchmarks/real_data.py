"""volseg's default against a plain MONAI training loop on real brain MRI, at equal wall-clock.

    python benchmarks/real_data.py                         # data=mni152 (lobes), 300 s each
    python benchmarks/real_data.py --data mni152_hemispheres --budget 300
    python benchmarks/real_data.py --only volseg --name no-flips -- data.augment.flip_axes=[]

The dataset is built from the MNI152 template in nilearn's wheel (``volseg.data.mni152``) by
``python train.py data=<data> data.check_only=true`` on first use. Then, one after the other on the
same CPU:

- volseg: ``python train.py data=<data> trainer.max_time=<budget> trainer.precision=32`` (+ any
  overrides after ``--``) as a subprocess; its figures come from the run dir's ``summary.json``.
- MONAI: the loop of MONAI's tutorials, written out below: BasicUNet features
  (16, 16, 32, 64, 128, 16), DiceCELoss, AdamW lr 2e-3, batches of 2 volumes × 2 class-balanced
  32×64×64 patches (``RandCropByLabelClassesd``, equal class ratios), float32, trained for
  ``budget`` seconds, then one validation (``sliding_window_inference``, ``DiceMetric``); its
  validation time is *not* counted in the budget (volseg's validations are).

Prints a markdown table (steps, best validation Dice = mean over foreground classes, per class,
wall time) with the CPU's model and flags; ``--json`` appends each row to a file.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PATCH_ZYX = (32, 64, 64)


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
    name = {"mni152": "mni152", "mni152_hemispheres": "mni152_hemispheres"}[data]
    return REPO / "data" / name


def start_volseg(
    data: str, budget_s: int, overrides: list[str], name: str, threads: int | None
) -> tuple[subprocess.Popen, list[str], Path, float, str]:
    """Start ``python train.py data=<data> trainer.max_time=... trainer.precision=32 [overrides]``
    (``threads``: its OMP_NUM_THREADS, i.e. torch's CPU threads)."""
    stamp = datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    run_dir = REPO / "logs" / "benchmarks" / "real_data" / f"{stamp}_{data}_{name}"
    max_time = str(datetime.timedelta(seconds=budget_s)).zfill(8)
    cmd = [sys.executable, "train.py", f"data={data}", f"trainer.max_time=00:{max_time}"]
    cmd += ["trainer.precision=32", f"hydra.run.dir={run_dir}", "extras.print_config=false"]
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
    return {
        "method": f"volseg ({run_dir.name.split(f'_{data}_', 1)[-1]})",
        "steps": summary["global_step"],
        "dice_mean": summary["best_val_dice_mean"],
        "per_class": per_class,
        "wall_s": wall,
        "run_dir": str(run_dir),
    }


def run_monai(root: Path, budget_s: int, seed: int = 0, threads: int | None = None) -> dict:
    """The plain MONAI loop (see the module docstring) for ``budget_s`` seconds of training."""
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
                keys, "label", spatial_size=PATCH_ZYX, num_classes=k, num_samples=2, warn=False
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
    steps = 0
    train_start = time.perf_counter()
    done = False
    while not done:
        net.train()
        for batch in loader:
            opt.zero_grad()
            loss = loss_fn(net(batch["image"]), batch["label"])
            loss.backward()
            opt.step()
            steps += 1
            if time.perf_counter() - train_start >= budget_s:
                done = True
                break
    net.eval()
    metric = DiceMetric(include_background=False, reduction="none", ignore_empty=True)
    with torch.no_grad():
        for item in val_ds:
            image, label = item["image"][None], item["label"][None]
            logits = sliding_window_inference(image, PATCH_ZYX, 2, net, overlap=0.25)
            pred = logits.argmax(1, keepdim=True)
            metric(one_hot(pred, k), one_hot(label.long(), k))
    per_class = metric.aggregate().nanmean(0).nan_to_num(0.0).tolist()
    return {
        "method": "MONAI loop",
        "steps": steps,
        "dice_mean": sum(per_class) / len(per_class),
        "per_class": dict(zip(classes[1:], per_class, strict=True)),
        "wall_s": time.perf_counter() - start,
    }


def table(rows: list[dict]) -> str:
    classes = list(rows[0]["per_class"])
    lines = [
        "| method | steps | best val Dice (mean fg) | "
        + " | ".join(classes)
        + " | wall time (s) |",
        "| --- | ---: | ---: | " + " | ".join("---:" for _ in classes) + " | ---: |",
    ]
    for r in rows:
        per = " | ".join(f"{r['per_class'][c]:.3f}" for c in classes)
        lines.append(
            f"| {r['method']} | {r['steps']} | {r['dice_mean']:.3f} | {per} | {r['wall_s']:.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", choices=["mni152", "mni152_hemispheres"], default="mni152")
    parser.add_argument("--budget", type=int, default=300, help="training seconds per method")
    parser.add_argument("--only", choices=["volseg", "monai"], default=None)
    parser.add_argument("--name", default="default", help="label of the volseg row")
    parser.add_argument("--json", type=Path, default=None, help="append each row to this file")
    parser.add_argument(
        "--parallel",
        action="store_true",
        help="run both at once, 1 CPU thread each, so both see the same load on a shared machine",
    )
    parser.add_argument("overrides", nargs="*", help="train.py overrides for volseg (after --)")
    args = parser.parse_args()

    root = dataset_root(args.data)
    rows = []
    threads = 1 if args.parallel else None
    started = None
    if args.only in (None, "volseg"):
        started = start_volseg(args.data, args.budget, args.overrides, args.name, threads)
        if not args.parallel:
            rows.append(finish_volseg(*started))
    if args.only in (None, "monai"):
        rows.append(run_monai(root, args.budget, threads=threads))
    if args.parallel and started is not None:
        rows.insert(0, finish_volseg(*started))
    cpu = cpu_line()
    mode = "at the same time, 1 thread each" if args.parallel else "one after the other"
    asked = [o.split("=", 1)[1] for o in args.overrides if o.startswith("trainer.precision=")]
    precision = "float32" + (f" (volseg: trainer.precision={asked[-1]})" if asked else "")
    print(f"\ndata={args.data}, {args.budget} s of training each ({mode}), {precision}; {cpu}\n")
    print(table(rows))
    if args.json is not None:
        with open(args.json, "a") as f:
            for r in rows:
                meta = {"data": args.data, "budget_s": args.budget, "cpu": cpu, "mode": mode}
                f.write(json.dumps({**r, **meta}))
                f.write("\n")


if __name__ == "__main__":
    main()
