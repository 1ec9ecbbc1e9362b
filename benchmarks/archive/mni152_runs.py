"""volseg's own runs on the MNI152 tasks, shared by the studies that train on them
(``real_data``, ``cross_entropy_weight``, ``nnunet_recipe``): the dataset built through
train.py's data config, a timed ``python train.py`` through :mod:`benchmarks.harness` and its
row, volseg's recipe for a task, the CPU line of a table."""

from __future__ import annotations

import datetime
import os
import platform
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from benchmarks import harness

if TYPE_CHECKING:
    import torch

REPO = Path(__file__).resolve().parents[2]


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


def label_histogram(preds: Iterable[torch.Tensor], classes: Sequence[str]) -> dict[str, int]:
    """Voxels predicted as each class (background first, as ``classes``) summed over the label
    maps ``preds`` (class indices, any shape): where a run's Dice is 0 on every class, whether
    it predicts background only."""
    import torch

    counts = torch.zeros(len(classes), dtype=torch.int64)
    for pred in preds:
        flat = pred.reshape(-1).long()
        if flat.numel() and (flat.min() < 0 or flat.max() >= len(classes)):
            raise ValueError(f"predicted labels {flat.min()}..{flat.max()}: {len(classes)} classes")
        counts += torch.bincount(flat, minlength=len(classes))
    return dict(zip(classes, counts.tolist(), strict=True))


def predicted_voxels(pred_dir: Path, names: Sequence[str], classes: Sequence[str]) -> dict:
    """:func:`label_histogram` of the label files ``pred_dir/<name>`` (NIfTI)."""
    import nibabel as nib
    import numpy as np
    import torch

    preds = (
        torch.from_numpy(np.asarray(nib.load(pred_dir / n).dataobj).astype(np.int64)) for n in names
    )
    return label_histogram(preds, classes)


def volseg_predicted_voxels(
    run_dir: Path, root: Path, threads: int | None = None
) -> dict[str, int]:
    """The predicted voxels per class of a volseg run's final weights (``run_dir``'s
    ``checkpoints/last.ckpt``) over the validation cases of the dataset at ``root``:
    ``python eval.py`` writes the predictions into ``run_dir/eval``, :func:`predicted_voxels`
    counts them."""
    import json

    out = run_dir / "eval"
    args = [f"ckpt_path={run_dir / 'checkpoints' / 'last.ckpt'}", f"hydra.run.dir={out}"]
    args += ["extras.print_config=false", "overwrite=true"]
    env = harness.child_env({"OMP_NUM_THREADS": str(threads)} if threads else {})
    try:
        harness.run("eval.py", args, env=env)
    except harness.RunFailed as err:
        raise RuntimeError(f"python eval.py {' '.join(args)}: {err}") from None
    classes = json.loads((root / "classes.json").read_text())
    names = json.loads((root / "splits.json").read_text())["val"]
    return predicted_voxels(out / "predictions", names, classes)


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
    check = [f"data={data}", "data.check_only=true", "logger=csv", "extras.print_config=false"]
    harness.train(check, REPO / "logs" / "benchmarks" / "real_data" / "check")
    return REPO / "data" / data


def start_volseg(
    data: str,
    budget_s: int,
    overrides: list[str],
    name: str,
    threads: int | None,
    precision: str = "32",
) -> tuple[harness.Child, list[str], Path, str]:
    """Start ``python train.py data=<data> trainer.max_time=... trainer.precision=<precision>
    [overrides]`` (``threads``: its OMP_NUM_THREADS, i.e. torch's CPU threads)."""
    stamp = datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    run_dir = REPO / "logs" / "benchmarks" / "real_data" / f"{stamp}_{data}_{name}"
    max_time = str(datetime.timedelta(seconds=budget_s)).zfill(8)
    args = [f"data={data}", f"trainer.max_time=00:{max_time}", f"trainer.precision={precision}"]
    args += ["extras.print_config=false", "callbacks.rich_progress_bar=null", *overrides]
    env = harness.child_env({"OMP_NUM_THREADS": str(threads)} if threads else {})
    return harness.start_train(args, run_dir, env=env), args, run_dir, data


def finish_volseg(child: harness.Child, args: list[str], run_dir: Path, data: str) -> dict:
    """Wait for a run of :func:`start_volseg`; its row from the run dir's ``summary.json``."""
    try:
        run = harness.read(run_dir, child.wait())
    except harness.RunFailed as err:
        raise RuntimeError(f"python train.py {' '.join(args)}: {err}") from None
    wall, summary = run.seconds, run.summary
    per_class = dict(summary["best_val_dice_per_class"])
    per_class.pop(next(iter(per_class)))  # background first
    final, final_per_class = final_validation(run.rows, list(per_class))
    return {
        "method": f"volseg ({run_dir.name.split(f'_{data}_', 1)[-1]})",
        "precision": summary["precision"],
        "steps": summary["global_step"],
        "dice_mean": summary["best_val_dice_mean"],
        "final_dice_mean": final,
        "per_class": per_class,
        "zero_classes": zero_classes(per_class),
        "final_per_class": final_per_class,
        "final_zero_classes": zero_classes(final_per_class),
        # the budget's seconds not in training steps: validations, checkpoints, epoch ends
        "outside_steps_s": outside_steps(summary),
        "wall_s": wall,
        "run_dir": str(run_dir),
    }


def outside_steps(summary: dict) -> float | None:
    """Seconds of a run's wall time not in its training steps (``summary.json``: wall time
    minus steps × the measured step time); None without the training-speed callback."""
    step_s = (summary.get("speed") or {}).get("step_s")
    if step_s is None:
        return None
    return summary["wall_time_s"] - summary["global_step"] * step_s


def final_validation(
    rows: list[dict[str, str]], classes: list[str]
) -> tuple[float, dict[str, float]]:
    """The last validation's ``val/dice_mean`` and per-class Dice in a run's metrics rows."""
    last = harness.last_with(rows, "val/dice_mean")
    return last["val/dice_mean"], {c: last[f"val/dice_{c}"] for c in classes}


def volseg_recipe(data: str, run_dir: Path | None = None) -> dict:
    """What ``python train.py data=<data>`` trains with, from its composed and planned config:
    patch ``[z, y, x]``, patches per step, draws per volume, widths and pooling of its network,
    learning rate (resolved), AdamW weight decay, Dice/CE weights, whether background is in the
    Dice term, intensity augmentation."""
    from volseg.plan import planned_config
    from volseg.utils.config import compose_run_config

    run_dir = run_dir or REPO / "logs" / "benchmarks" / "real_data" / "recipe" / data
    cfg = planned_config(compose_run_config(REPO / "configs", "train", [f"data={data}"], run_dir))
    augment = cfg.data.augment
    return {
        "patch_size": [int(p) for p in cfg.data.patch_size],
        "batch_size": int(cfg.data.batch_size),
        "samples_per_volume": int(cfg.data.samples_per_volume),
        "widths": [int(w) for w in cfg.model.net.widths],
        "pooling": [[int(k) for k in level] for level in cfg.model.net.pooling],
        "lr": float(cfg.model.optimizer.lr),
        "weight_decay": float(cfg.model.optimizer.weight_decay),
        "lambda_ce": float(cfg.model.loss.lambda_ce),
        "lambda_dice": float(cfg.model.loss.lambda_dice),
        "include_background": bool(cfg.model.loss.include_background),
        "intensity_scale": float(augment.intensity_scale),
        "intensity_shift": float(augment.intensity_shift),
        "augment_prob": float(augment.prob),
    }
