"""nnU-Net v2's recipe at equal compute, on a volseg dataset: one timed run, its predictions of
the validation cases scored by volseg's Dice rule.

    pip install torch==2.13.0 && pip install -e ".[nnunet,mni152]" && pip uninstall torchvision
    python -m benchmarks nnunet_recipe --data mni152 --budget 300 --seed 1
    python -m benchmarks real_data --data mni152 --sides volseg nnunet   # beside volseg

What is nnU-Net's and what is held to volseg's:

- nnU-Net's own: fingerprint, ExperimentPlanner (kernels, convolutions per stage, instance norm,
  LeakyReLU, normalisation scheme), preprocessing (crop to non-zero, resampling to the planned
  spacing, z-score), ``nnUNetTrainer`` (Dice + CE with deep supervision, SGD lr 1e-2, momentum
  0.99, Nesterov, weight decay 3e-5, gradients clipped to 12, its augmentation, a third of the
  patches forced onto foreground, 250 training and 50 pseudo-Dice iterations an epoch), and its
  predictor for the validation cases (Gaussian-weighted sliding window, step 0.5, mirroring over
  all axes), on the CPU in float32 (nnU-Net's trainer uses autocast on CUDA only).
- Held to volseg's plan of the same ``data=<data>`` (``train.py``'s composed and planned config):
  the 3d_fullres patch, batch size, features per stage (volseg's widths) and strides (volseg's
  pooling), written into the plans file: nnU-Net's recipe at equal compute.
- Held to the budget: nnU-Net's poly schedule (``lr = 1e-2 (1 - t / T)^0.9``) runs over the
  seconds of the budget ``T`` instead of 1,000 epochs, set before every step. Training stops at
  the first step after the budget; its pseudo-Dice iterations are inside the budget, as volseg's
  validations are inside ``trainer.max_time``; the final prediction of the validation cases is
  after it. The data augmentation runs in the training process (``nnUNet_n_proc_DA=0``), as
  volseg's loader does on a CPU (``data.num_workers=auto``: 0).
- The split: volseg's ``splits.json`` (train / val), as nnU-Net's ``splits_final.json`` fold 0.
- ``--own-plan``: nnU-Net's own 3d_fullres plan instead (its planner's patch, batch and network
  for the dataset's fingerprint, e.g. 96×96×80 with 32-320 features for ``mni152``), on the same
  preprocessed data (the two plans share spacing and normalisation) and the same budget.

Beside the Dice, the row records the plan it trained (``plan``, ``plan_source``), how many
pseudo-Dice validations ran within the budget (``validations`` counts them and the final
prediction), the predicted voxels per class over the scored cases (``predicted_voxels_per_class``:
a collapse to background shows there) and the trainer's own log (``training_log``; ``real_data.py``
copies it beside its results file).

Prints the run's row and writes it as JSON (``--row-out``); ``real_data.py`` runs this script as
one side of its table. ``--prepare-only`` builds the nnU-Net folders (``--work``, default
``logs/benchmarks/nnunet/``) and exits.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
os.environ.setdefault("PROJECT_ROOT", str(REPO))

#: nnU-Net's dataset ids of the volseg datasets (any free id 1-999 would do)
DATASET_IDS = {"mni152": 911, "mni152_hemispheres": 912, "mni152_regions": 913}
DATASET_IDS["mni152_regions_lr"] = 914
#: nnU-Net's poly exponent (PolyLRScheduler)
POLY_EXPONENT = 0.9
#: the plans files under ``preprocessed/<dataset>/``: held to volseg's compute, and nnU-Net's own
#: (both name the same preprocessed data, ``nnUNetPlans_3d_fullres``)
PLANS_FILES = {"volseg_compute": "nnUNetPlans.json", "nnunet_own": "nnUNetPlansOwn.json"}


def nnunet_folders(work: Path) -> dict[str, str]:
    """nnU-Net's three folders under ``work``, as the environment variables it reads at import."""
    return {
        "nnUNet_raw": str(work / "raw"),
        "nnUNet_preprocessed": str(work / "preprocessed"),
        "nnUNet_results": str(work / "results"),
    }


def dataset_name(data: str) -> str:
    return f"Dataset{DATASET_IDS[data]:03d}_{data}"


def equal_compute(plans: dict[str, Any], compute: dict[str, Any]) -> dict[str, Any]:
    """``plans`` with its 3d_fullres patch, batch, stages, features, strides and kernels set from
    ``compute`` (``mni152_runs.volseg_recipe``: volseg's patch, batch, widths, pooling); nnU-Net's
    own convolutions per stage, norm and nonlinearity kept (the planned lists cut or extended to
    the new number of stages)."""
    config = plans["configurations"]["3d_fullres"]
    kwargs = config["architecture"]["arch_kwargs"]
    n = len(compute["widths"])
    convs, decoder = kwargs["n_conv_per_stage"], kwargs["n_conv_per_stage_decoder"]
    config["patch_size"] = list(compute["patch_size"])
    config["batch_size"] = compute["batch_size"]
    kwargs["n_stages"] = n
    kwargs["features_per_stage"] = list(compute["widths"])
    kwargs["strides"] = [[1, 1, 1], *compute["pooling"]]
    kwargs["kernel_sizes"] = [[3, 3, 3]] * n
    kwargs["n_conv_per_stage"] = (convs + [convs[-1]] * n)[:n]
    kwargs["n_conv_per_stage_decoder"] = (decoder + [decoder[-1]] * n)[: n - 1]
    return plans


def prepare(data: str, work: Path) -> dict[str, Any]:
    """nnU-Net's raw dataset (links to volseg's files), fingerprint, plans held to volseg's
    compute, 3d_fullres preprocessing and volseg's split as fold 0, under ``work``; returns the
    changed 3d_fullres fields. Done again only where volseg's compute has changed."""
    from benchmarks.archive.mni152_runs import dataset_root, volseg_recipe
    from benchmarks.archive.nnunet_raw import nnunet_plan, write_raw_from_folder

    name = dataset_name(data)
    preprocessed = work / "preprocessed" / name
    done = preprocessed / "volseg_equal_compute.json"
    recipe = volseg_recipe(data, work / "volseg_plan" / data)
    compute = {k: recipe[k] for k in ("patch_size", "batch_size", "widths", "pooling")}
    record = json.loads(done.read_text()) if done.is_file() else {}
    own = preprocessed / PLANS_FILES["nnunet_own"]
    if record.get("volseg_compute") == compute and own.is_file() and "nnunet_own" in record:
        # prepared for this compute already: a timed run starts without train.py's data check
        return record
    root = dataset_root(data)
    classes = json.loads((root / "classes.json").read_text())
    write_raw_from_folder(root, work / "raw" / name, classes)
    plans, _ = nnunet_plan(DATASET_IDS[data])
    own.parent.mkdir(parents=True, exist_ok=True)
    own.write_text(json.dumps(plans, indent=4))  # before equal_compute changes it in place
    own_record = plan_record(plans)
    plans = equal_compute(plans, compute)
    (preprocessed / PLANS_FILES["volseg_compute"]).write_text(json.dumps(plans, indent=4))
    from nnunetv2.experiment_planning.plan_and_preprocess_api import preprocess_dataset

    preprocess_dataset(DATASET_IDS[data], "nnUNetPlans", ["3d_fullres"], [1], False, False)
    splits = json.loads((root / "splits.json").read_text())
    fold = {k: [n.removesuffix(".nii.gz") for n in splits[k]] for k in ("train", "val")}
    (preprocessed / "splits_final.json").write_text(json.dumps([fold], indent=2))
    record = {"volseg_compute": compute, **plan_record(plans), "nnunet_own": own_record}
    done.write_text(json.dumps(record, indent=2))
    return record


def plan_record(plans: dict[str, Any]) -> dict[str, Any]:
    """The 3d_fullres fields of ``plans`` that a row names: spacing, patch, batch, network."""
    fields = plans["configurations"]["3d_fullres"]
    kwargs = fields["architecture"]["arch_kwargs"]
    return {
        "spacing": fields["spacing"],
        "patch_size": fields["patch_size"],
        "batch_size": fields["batch_size"],
        **{k: kwargs[k] for k in ("features_per_stage", "strides", "kernel_sizes")},
        **{k: kwargs[k] for k in ("n_conv_per_stage", "n_conv_per_stage_decoder")},
        "normalization": fields["normalization_schemes"],
    }


def plan_used(record: dict[str, Any], own_plan: bool) -> dict[str, Any]:
    """What a row says of its plan: ``plan_source`` (``nnunet_own``: nnU-Net's planner's
    3d_fullres; ``volseg_compute``: that plan held to volseg's patch, batch and network) and the
    plan's fields, from :func:`prepare`'s record."""
    if own_plan:
        return {"plan_source": "nnunet_own", "plan": record["nnunet_own"]}
    fields = {k: v for k, v in record.items() if k != "nnunet_own"}
    return {"plan_source": "volseg_compute", "plan": fields}


def budget_trainer(budget_s: float, mirroring: bool = True) -> type:
    """``nnUNetTrainer`` (``mirroring=False``: nnU-Net's own ``nnUNetTrainerNoMirroring``, no
    mirroring in training or prediction) whose poly schedule runs over ``budget_s`` seconds and
    whose training stops at the first step after them (see the module docstring)."""
    import numpy as np
    import torch
    from nnunetv2.training.nnUNetTrainer.nnUNetTrainer import nnUNetTrainer
    from nnunetv2.training.nnUNetTrainer.variants.data_augmentation import (
        nnUNetTrainerNoMirroring as no_mirroring,
    )

    base = nnUNetTrainer if mirroring else no_mirroring.nnUNetTrainerNoMirroring

    class nnUNetTrainerBudget(base):
        steps = 0
        #: pseudo-Dice validations (one an epoch) run within the budget
        validations = 0

        def run_training(self) -> None:
            self.on_train_start()
            start = time.perf_counter()
            while True:
                self.on_epoch_start()
                self.on_train_epoch_start()
                outputs = []
                for _ in range(self.num_iterations_per_epoch):
                    elapsed = time.perf_counter() - start
                    if elapsed >= budget_s:
                        break
                    lr = self.initial_lr * (1 - elapsed / budget_s) ** POLY_EXPONENT
                    for group in self.optimizer.param_groups:
                        group["lr"] = lr
                    outputs.append(self.train_step(next(self.dataloader_train)))
                    self.steps += 1
                if len(outputs) < self.num_iterations_per_epoch:
                    if outputs:
                        self.on_train_epoch_end(outputs)
                        # on_epoch_end prints an epoch's loss, but it also checkpoints and
                        # counts a full epoch, so the partial last epoch prints its own
                        loss = float(np.mean([out["loss"] for out in outputs]))
                        self.print_to_log_file(
                            f"train_loss (partial epoch, {len(outputs)} steps)", round(loss, 4)
                        )
                    break
                self.on_train_epoch_end(outputs)
                with torch.no_grad():
                    self.on_validation_epoch_start()
                    val = [
                        self.validation_step(next(self.dataloader_val))
                        for _ in range(self.num_val_iterations_per_epoch)
                    ]
                    self.on_validation_epoch_end(val)
                self.validations += 1
                self.on_epoch_end()
            self.trained_s = time.perf_counter() - start
            self.on_train_end()

    return nnUNetTrainerBudget


def score(
    pred_dir: Path, root: Path, names: list[str], classes: list[str]
) -> tuple[dict[str, float], dict[str, int]]:
    """Per-class Dice of the predicted label files in ``pred_dir`` against ``root/labels``, by
    volseg's validation rule (:mod:`volseg.models.dice`), and the predicted voxels per class
    over those files (:func:`~benchmarks.archive.mni152_runs.predicted_voxels`); background
    included (first) in both."""
    import nibabel as nib
    import numpy as np
    import torch

    from benchmarks.archive.mni152_runs import predicted_voxels
    from volseg.models.dice import case_dice, class_means

    rows = []
    for name in names:
        pred = np.asarray(nib.load(pred_dir / name).dataobj).astype(np.int64)
        label = np.asarray(nib.load(root / "labels" / name).dataobj).astype(np.int64)
        if pred.shape != label.shape:
            raise RuntimeError(f"{pred_dir / name}: shape {pred.shape}, label {label.shape}")
        rows.append(
            case_dice(
                torch.from_numpy(pred)[None, None],
                torch.from_numpy(label)[None, None],
                len(classes),
            )
        )
    per_case = torch.cat(rows)  # (N, K), NaN: class not in that case's label
    counts = (~per_case.isnan()).sum(dim=0).double()
    per_class = class_means(per_case.nan_to_num(0.0).sum(dim=0), counts)
    voxels = predicted_voxels(pred_dir, names, classes)
    return dict(zip(classes, per_class.tolist(), strict=True)), voxels


def run(
    data: str,
    work: Path,
    budget_s: float,
    seed: int,
    threads: int | None,
    mirroring: bool = True,
    own_plan: bool = False,
) -> dict[str, Any]:
    """Train nnU-Net's recipe (``own_plan``: on nnU-Net's own plan, not held to volseg's
    compute) for ``budget_s`` seconds and score its final weights on the validation cases; the
    row for ``real_data.py``'s table."""
    import numpy as np
    import torch

    start = time.perf_counter()
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)
    np.random.seed(seed)

    name = dataset_name(data)
    preprocessed = work / "preprocessed" / name
    plans_file = PLANS_FILES["nnunet_own" if own_plan else "volseg_compute"]
    plans = json.loads((preprocessed / plans_file).read_text())
    dataset = json.loads((preprocessed / "dataset.json").read_text())
    plans["continue_training"] = False  # what nnU-Net's run_training puts in for its trainer
    trainer_class = budget_trainer(budget_s, mirroring)
    trainer = trainer_class(plans, "3d_fullres", 0, dataset, torch.device("cpu"))
    variant = ("" if mirroring else "nomirror_") + ("ownplan_" if own_plan else "")
    folder = work / "results" / name / f"{variant}seed{seed}"
    trainer.output_folder_base = str(folder)
    trainer.output_folder = str(folder / "fold_0")
    # nnU-Net appends to its log: one file a run, named as nnU-Net names its own
    stamp = time.strftime("%Y_%m_%d_%H_%M_%S")
    trainer.log_file = str(Path(trainer.output_folder) / f"training_log_{stamp}.txt")
    trainer.run_training()
    trainer.perform_actual_validation()
    root = REPO / "data" / data
    classes = json.loads((root / "classes.json").read_text())
    splits = json.loads((root / "splits.json").read_text())
    per_class, voxels = score(
        Path(trainer.output_folder) / "validation", root, splits["val"], classes
    )
    per_class.pop(classes[0])
    mean = sum(per_class.values()) / len(per_class)
    zeros = sum(1 for v in per_class.values() if v == 0.0)
    params = sum(p.numel() for p in trainer.network.parameters())
    return {
        "method": (
            "nnU-Net recipe, its own plan" if own_plan else "nnU-Net recipe at equal compute"
        )
        + ("" if mirroring else ", no mirroring (nnUNetTrainerNoMirroring)"),
        "mirroring": mirroring,
        "precision": "32",
        "steps": trainer.steps,
        "dice_mean": mean,
        "final_dice_mean": mean,
        "per_class": per_class,
        "final_per_class": per_class,
        "zero_classes": zeros,
        "final_zero_classes": zeros,
        # its pseudo-Dice validations within the budget and the final prediction after it
        "validations": trainer.validations + 1,
        "pseudo_dice_validations": trainer.validations,
        "predicted_voxels_per_class": voxels,
        "trained_s": trainer.trained_s,
        "wall_s": time.perf_counter() - start,
        "parameters": params,
        "seed": seed,
        "run_dir": trainer.output_folder,
        "training_log": trainer.log_file,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="mni152", choices=sorted(DATASET_IDS))
    parser.add_argument("--budget", type=float, default=300, help="training seconds")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--work", type=Path, default=REPO / "logs" / "benchmarks" / "nnunet")
    parser.add_argument("--row-out", type=Path, default=None, help="write the row here (JSON)")
    parser.add_argument("--prepare-only", action="store_true")
    parser.add_argument(
        "--no-mirroring",
        action="store_true",
        help="nnU-Net's nnUNetTrainerNoMirroring: no mirroring in training or prediction",
    )
    parser.add_argument(
        "--own-plan",
        action="store_true",
        help="nnU-Net's own 3d_fullres plan (its patch, batch, network), not volseg's compute",
    )
    args = parser.parse_args(argv)
    if importlib.util.find_spec("nnunetv2") is None:
        parser.error('needs nnU-Net v2: pip install -e ".[nnunet]", then pip uninstall torchvision')

    work = args.work.resolve()
    # nnU-Net reads its folders and process counts when imported
    os.environ.update(nnunet_folders(work))
    os.environ["nnUNet_def_n_proc"] = "1"  # noqa: SIM112 (nnU-Net's name)
    record = prepare(args.data, work)
    if args.prepare_only:
        print(json.dumps(record, indent=2))
        return
    # augmentation in the training process (read when the trainer builds its loaders; the
    # planner above needs a positive count)
    os.environ["nnUNet_n_proc_DA"] = "0"  # noqa: SIM112
    mirroring = not args.no_mirroring
    row = run(args.data, work, args.budget, args.seed, args.threads, mirroring, args.own_plan)
    row = {**row, **plan_used(record, args.own_plan)}
    print(json.dumps(row, indent=2))
    if args.row_out is not None:
        args.row_out.write_text(json.dumps(row, indent=2))


if __name__ == "__main__":
    main()
