"""nnU-Net's 3d_fullres plan beside volseg's plan for the same GPU memory target, and volseg's
estimate of the memory of nnU-Net's planned training step.

For each dataset (the embedded one, ``data=mni152`` and an MSD-layout dataset generated here),
the cases are written in nnU-Net's raw layout (``DatasetNNN_name/imagesTr/<id>_0000.nii.gz``,
``labelsTr/<id>.nii.gz``, ``dataset.json``), then nnU-Net's own fingerprint extraction
(``DatasetFingerprintExtractor``) and its default ``ExperimentPlanner`` (its default GPU memory
target: 8 GB) run on the CPU; no preprocessing. From its ``nnUNetPlans.json``: the 3d_fullres
spacing, patch, batch, stages, features, kernels, strides and batch Dice.

Beside it, volseg's plan of the same files (:func:`volseg.plan.make_plan`, what ``python plan.py
... memory.budget=8GB memory.plan_device=cuda`` runs) with ``data.patch_size=auto``,
``model.net.depth=auto`` and ``trainer.precision=16-mixed``. Then volseg's estimator on
nnU-Net's planned step (:func:`volseg.memory.estimate.step.estimate_step`): the network as nnU-Net's
trainer builds it from the plan (``get_network_from_plans``, deep supervision on), its batch and
patch, fp16 autocast with a GradScaler, Dice+CE under ``DeepSupervisionWrapper`` with nnU-Net's
weights, SGD (lr 1e-2, momentum 0.99, Nesterov, weight decay 3e-5), gradients zeroed before the
forward and clipped to norm 12, the deep-supervision targets as int16 tensors on the GPU; eager
(nnU-Net's trainer compiles the network and the Dice loss with ``torch.compile`` on CUDA by
default, which the estimate does not model).

    pip install torch==2.13.0 && pip install -e ".[nnunet]"   # nnU-Net's planning runs on a CPU
    python -m benchmarks nnunet_side_by_side [--work DIR] [--out benchmarks/results/nnunet]

Writes ``<out>/<dataset>/nnUNetPlans.json``, ``dataset_fingerprint.json``, ``dataset.json``
(nnU-Net's own files) and ``<out>/side_by_side.json``, and prints the table.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.archive.nnunet_raw import nnunet_plan, write_raw_from_folder

REPO = Path(__file__).resolve().parents[2]
os.environ.setdefault("PROJECT_ROOT", str(REPO))

#: nnU-Net's dataset ids, names and volseg's data overrides for the same files
DATASETS: dict[str, dict[str, Any]] = {
    "synthetic": {"id": 901, "overrides": ["data=synthetic"]},
    "mni152": {"id": 902, "overrides": ["data=mni152"]},
    "msd": {"id": 903, "overrides": ["data=msd"]},
}
#: the MSD-layout dataset: volumes of the embedded generator, 2 channels, anisotropic voxels
MSD_CASES, MSD_SHAPE, MSD_SPACING = 10, (40, 160, 160), (2.5, 0.8, 0.8)
#: ExperimentPlanner's default gpu_memory_target_in_gb (read back from the planner at run time)
NNUNET_TARGET_GB = 8
#: volseg plans its own patch, depth and pooling, in the precision nnU-Net trains with
VOLSEG = [
    "data.patch_size=auto",
    "model.net.depth=auto",
    "trainer.precision=16-mixed",
    "memory.plan_device=cuda",
]
#: nnU-Net's trainer (nnUNetTrainer): optimizer, clipping
NNUNET_SGD = {"lr": 1e-2, "weight_decay": 3e-5, "momentum": 0.99, "nesterov": True}
NNUNET_CLIP_NORM = 12.0


# ---------------------------------------------------------------- the plan's step, as data


def fullres(plans: dict[str, Any]) -> dict[str, Any]:
    """The 3d_fullres configuration of a ``nnUNetPlans.json`` (``inherits_from`` resolved)."""
    configs = plans["configurations"]
    config = dict(configs["3d_fullres"])
    while "inherits_from" in config:
        parent = dict(configs[config.pop("inherits_from")])
        parent.update(config)
        config = parent
    return config


def deep_supervision_scales(strides: Sequence[Sequence[int]]) -> list[list[float]]:
    """``nnUNetTrainer._get_deep_supervision_scales``: 1 / the cumulative product of the
    strides, per stage, the last (the bottleneck) left out."""
    scales, total = [], [1, 1, 1]
    for stride in strides:
        total = [t * s for t, s in zip(total, stride, strict=True)]
        scales.append([1 / t for t in total])
    return scales[:-1]


def deep_supervision_weights(n: int) -> list[float]:
    """``nnUNetTrainer._build_loss``: 1 / 2^i per output, the lowest set to 0, normalised."""
    weights = [1 / 2**i for i in range(n)]
    weights[-1] = 0.0
    return [w / sum(weights) for w in weights]


def step_input(plans: dict[str, Any], dataset: dict[str, Any]) -> dict[str, Any]:
    """What nnU-Net's trainer builds for one 3d_fullres training step, read from its plans and
    ``dataset.json``: the network's constructor arguments, the batch ``(B, C, D, H, W)`` (in the
    plan's axis order), the deep-supervision targets' shapes ``(B, 1, d, h, w)`` and loss
    weights, batch Dice."""
    config = fullres(plans)
    arch = config["architecture"]
    kwargs = dict(arch["arch_kwargs"])
    channels = len(dataset["channel_names"])
    classes = len(dataset["labels"])
    batch, patch = int(config["batch_size"]), [int(p) for p in config["patch_size"]]
    scales = deep_supervision_scales(kwargs["strides"])
    targets = [
        (batch, 1, *[round(p * s) for p, s in zip(patch, scale, strict=True)]) for scale in scales
    ]
    return {
        "network_class_name": arch["network_class_name"],
        "arch_kwargs": kwargs,
        "kw_requires_import": list(arch["_kw_requires_import"]),
        "in_channels": channels,
        "num_classes": classes,
        "image_shape": (batch, channels, *patch),
        "target_shapes": targets,
        "loss_weights": deep_supervision_weights(len(scales)),
        "batch_dice": bool(config["batch_dice"]),
    }


def plan_summary(plans: dict[str, Any]) -> dict[str, Any]:
    """The 3d_fullres fields the table compares."""
    config = fullres(plans)
    kwargs = config["architecture"]["arch_kwargs"]
    return {
        "spacing": config["spacing"],
        "patch_size": config["patch_size"],
        "batch_size": config["batch_size"],
        "n_stages": kwargs["n_stages"],
        "features_per_stage": kwargs["features_per_stage"],
        "kernel_sizes": kwargs["kernel_sizes"],
        "strides": kwargs["strides"],
        "batch_dice": config["batch_dice"],
        "median_image_size_in_voxels": config["median_image_size_in_voxels"],
        "transpose_forward": plans.get("transpose_forward"),
    }


# ---------------------------------------------------------------- datasets in nnU-Net's layout


def write_msd(root: Path) -> Path:
    """An MSD/nnU-Net-layout dataset: the embedded generator's volumes, 2 channels (the image and
    its negative), 3 classes, voxels of ``MSD_SPACING`` (z, y, x)."""
    import numpy as np

    from volseg.data.io import write_volume
    from volseg.data.synthetic import make_volume

    if (root / "dataset.json").is_file():
        return root
    for i in range(MSD_CASES):
        image, label = make_volume(MSD_SHAPE, seed=1000 + i)
        label = np.minimum(label, 2).astype(np.uint8)
        write_volume(root / "imagesTr" / f"case_{i:03d}_0000.nii.gz", image, MSD_SPACING)
        write_volume(root / "imagesTr" / f"case_{i:03d}_0001.nii.gz", -image, MSD_SPACING)
        write_volume(root / "labelsTr" / f"case_{i:03d}.nii.gz", label, MSD_SPACING)
    dataset = {
        "channel_names": {"0": "raw", "1": "inverted"},
        "labels": {"background": 0, "blob": 1, "other": 2},
        "numTraining": MSD_CASES,
        "file_ending": ".nii.gz",
    }
    (root / "dataset.json").write_text(json.dumps(dataset, indent=2))
    return root


# ---------------------------------------------------------------- the three sides


def compose(overrides: list[str], run_dir: Path) -> Any:
    from volseg.utils.config import compose_run_config

    return compose_run_config(REPO / "configs", "plan", overrides, run_dir)


def prepare_volseg_data(overrides: list[str], run_dir: Path) -> Any:
    """The data module of ``overrides`` (an embedded dataset generated into its folder)."""
    import hydra
    from omegaconf import OmegaConf

    cfg = compose([*overrides, "data.patch_size=[32,32,32]"], run_dir)
    module = hydra.utils.instantiate(OmegaConf.to_container(cfg.data, resolve=True))
    module.prepare_data()
    return module


def proxy_gb(network: Any, step: dict[str, Any], reference: dict[str, Any]) -> dict[str, float]:
    """nnU-Net's own memory proxy of its plan, in GB: the network's summed feature-map sizes
    for one sample at the patch (``compute_conv_feature_map_size``) times the batch, against the
    reference value that stands for ``reference_gb`` (ExperimentPlanner: ``batch_size =
    reference / value * reference_batch``, so a sample counts ``reference_gb * value /
    (reference * reference_batch)``)."""
    patch = step["image_shape"][2:]
    value = float(network.compute_conv_feature_map_size(patch))
    per_sample_gb = (
        reference["reference_gb"]
        * value
        / (reference["reference_value_3d"] * reference["reference_batch_3d"])
    )
    return {"feature_map_size": value, "gb": per_sample_gb * step["image_shape"][0]}


def volseg_plan(overrides: list[str], budget: str, run_dir: Path) -> dict[str, Any]:
    """volseg's plan of the same files for ``memory.budget=budget``: plan.py's decisions."""
    from volseg.memory.fit import fit_step as search
    from volseg.plan import plan_run
    from volseg.utils.units import parse_bytes

    cfg = compose([*overrides, *VOLSEG, f"memory.budget={budget}"], run_dir)
    run_plan = plan_run(cfg, estimate_step=True, fingerprint=True, fit_budget=True)
    planned = run_plan.to_dict()
    # the planner's largest batch within the budget (volseg.memory.fit.fit_step, which plan.py
    # calls only for a step over the budget)
    largest = search(run_plan.run_config(), parse_bytes(budget, "memory.budget"), "batch", ["none"])
    decisions = planned["decisions"]
    value = {k: v["value"] for k, v in decisions.items()}
    return {
        "overrides": [*overrides, *VOLSEG, f"memory.budget={budget}"],
        "spacing": value.get("data.spacing"),
        "median_spacing": (planned.get("fingerprint") or {}).get("median_spacing"),
        "median_shape": (planned.get("fingerprint") or {}).get("median_shape"),
        "patch_size": value["data.patch_size"],
        "batch_size": value["data.batch_size"],
        "accumulate_grad_batches": value.get("trainer.accumulate_grad_batches"),
        "activation_checkpointing": value.get("model.activation_checkpointing"),
        "n_stages": value["model.net.depth"],
        "widths": value["model.net.widths"],
        "pooling": value["model.net.pooling"],
        "model": str(planned["config"]["model"]["net"].get("_target_", "")),
        "estimate": planned["estimate"],
        "batch_size_source": decisions["data.batch_size"]["source"],
        "largest_batch_within_budget": largest.batch_size,
        "largest_batch_process_total": largest.total_within_budget,
    }


def estimate_nnunet_step(step: dict[str, Any], reference: dict[str, Any]) -> dict[str, Any]:
    """volseg's estimate of one nnU-Net training step (``step``: :func:`step_input`) on CUDA,
    with nnU-Net's own proxy of it (:func:`proxy_gb`)."""
    import torch
    from nnunetv2.training.loss.compound_losses import DC_and_CE_loss
    from nnunetv2.training.loss.deep_supervision import DeepSupervisionWrapper
    from nnunetv2.training.loss.dice import MemoryEfficientSoftDiceLoss
    from nnunetv2.utilities.get_network_from_plans import get_network_from_plans
    from torch._subclasses.fake_tensor import FakeTensorMode

    from volseg.memory.estimate.step import LoopSettings, estimate_step, module_training_step

    network = get_network_from_plans(
        step["network_class_name"],
        step["arch_kwargs"],
        step["kw_requires_import"],
        step["in_channels"],
        step["num_classes"],
        allow_init=True,
        deep_supervision=True,
    )
    proxy = proxy_gb(network, step, reference)
    dice = {"batch_dice": step["batch_dice"], "smooth": 1e-5, "do_bg": False, "ddp": False}
    loss = DeepSupervisionWrapper(
        DC_and_CE_loss(
            dice, {}, weight_ce=1, weight_dice=1, dice_class=MemoryEfficientSoftDiceLoss
        ),
        step["loss_weights"],
    )

    def batch(image_shape: Sequence[int], label_shape: Sequence[int], dtype: torch.dtype):
        # nnU-Net's loader: the image in float32, one int16 target per deep-supervision output
        image = torch.empty(tuple(image_shape), dtype=torch.float32)
        return image, [torch.empty(s, dtype=torch.int16) for s in step["target_shapes"]]

    mode = FakeTensorMode()
    training_step = module_training_step(
        network,
        lambda m: torch.optim.SGD(m.parameters(), **NNUNET_SGD),
        step["image_shape"],
        "16-mixed",
        "cuda",
        LoopSettings(gradient_clip_val=NNUNET_CLIP_NORM, zero_grad="before_forward"),
        mode,
        loss=loss,
        make_batch=batch,
    )
    est = estimate_step(training_step, mode, "cuda", "16-mixed", {"cuda_context_mib": "auto"})
    keys = (
        "num_parameters",
        "params",
        "grads",
        "optimizer_state",
        "activations",
        "temporaries",
        "peak_allocated",
        "kernel_workspace",
        "peak_reserved",
        "cuda_context",
        "process_total",
        "seconds",
    )
    return {**{k: getattr(est, k) for k in keys}, "nnunet_proxy": proxy}


# ---------------------------------------------------------------- machine, table


def machine() -> dict[str, Any]:
    from importlib.metadata import version

    import torch

    model, flags = "", []
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    for line in lscpu.splitlines():
        if line.startswith("Model name:"):
            model = line.split(":", 1)[1].strip()
        if line.startswith("Flags:"):
            wanted = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
            flags = [f for f in line.split(":", 1)[1].split() if f in wanted]
    return {
        "date": datetime.date.today().isoformat(),
        "cpu": model,
        "isa_flags": flags,
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "nnunetv2": version("nnunetv2"),
        "dynamic_network_architectures": version("dynamic_network_architectures"),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


def _mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:,.0f}"


def format_table(rows: dict[str, dict[str, Any]]) -> str:
    """The markdown table docs/plan.md shows."""
    lines = [
        "| dataset | planner | spacing [z, y, x] | patch | batch | stages | features / widths |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, row in rows.items():
        n, v = row["nnunet"], row["volseg"]
        spacing = [round(s, 3) for s in n["spacing"]]
        lines.append(
            f"| {name} | nnU-Net 3d_fullres ({row['nnunet_target_gb']:g} GB target) | {spacing} "
            f"| {n['patch_size']} | {n['batch_size']} | {n['n_stages']} "
            f"| {n['features_per_stage']} |"
        )
        vs = v["spacing"] or [round(s, 3) for s in v["median_spacing"]]
        lines.append(
            f"| {name} | volseg plan.py (memory.budget={row['budget']}) | {vs} "
            f"| {v['patch_size']} | {v['batch_size']} (largest within budget: "
            f"{v['largest_batch_within_budget']}) | {v['n_stages']} | {v['widths']} |"
        )
    lines += [
        "",
        "| dataset | nnU-Net step (batch × patch) | parameters | peak allocated | peak reserved "
        "| + CUDA context | nnU-Net's proxy | nnU-Net's VRAM target |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, row in rows.items():
        e, s = row["estimate_of_nnunet_step"], row["step_input"]
        lines.append(
            f"| {name} | {s['image_shape'][0]} × {list(s['image_shape'][2:])} "
            f"| {e['num_parameters'] / 1e6:.1f}M | {_mib(e['peak_allocated'])} MiB "
            f"| {_mib(e['peak_reserved'])} MiB | {_mib(e['process_total'])} MiB "
            f"| {e['nnunet_proxy']['gb']:.2f} GB ({_mib(e['nnunet_proxy']['gb'] * 1e9)} MiB) "
            f"| {row['nnunet_target_gb']:g} GB ({_mib(row['nnunet_target_gb'] * 1e9)} MiB) |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=None, help="nnUNet_raw etc. (default: tmp)")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/nnunet")
    parser.add_argument("--datasets", default=",".join(DATASETS))
    args = parser.parse_args(argv)
    if importlib.util.find_spec("nnunetv2") is None:
        parser.error('needs nnU-Net v2: pip install -e ".[nnunet]", then pip uninstall torchvision')
    work = args.work or Path(tempfile.mkdtemp(prefix="nnunet_"))
    for key in ("raw", "preprocessed", "results"):
        os.environ[f"nnUNet_{key}"] = str(work / f"nnUNet_{key}")
        (work / f"nnUNet_{key}").mkdir(parents=True, exist_ok=True)
    rows: dict[str, dict[str, Any]] = {}
    for name in args.datasets.split(","):
        spec = DATASETS[name]
        folder_name = f"Dataset{spec['id']}_{name}"
        raw = work / "nnUNet_raw" / folder_name
        overrides = list(spec["overrides"])
        if name == "msd":
            write_msd(raw)
            overrides.append(f"data.root={raw}")
        else:
            module = prepare_volseg_data(overrides, work / "runs" / name / "data")
            write_raw_from_folder(Path(module.root), raw, list(module.class_names))
        plans, reference = nnunet_plan(spec["id"])
        target_gb = reference["target_gb"]
        budget = f"{target_gb:g}GB"
        dataset = json.loads((raw / "dataset.json").read_text())
        out = args.out / name
        out.mkdir(parents=True, exist_ok=True)
        preprocessed = work / "nnUNet_preprocessed" / folder_name
        for file in ("nnUNetPlans.json", "dataset_fingerprint.json", "dataset.json"):
            shutil.copy(preprocessed / file, out / file)
        step = step_input(plans, dataset)
        rows[name] = {
            "nnunet_dataset": folder_name,
            "nnunet_target_gb": target_gb,
            "nnunet_reference": reference,
            "budget": budget,
            "nnunet": plan_summary(plans),
            "volseg": volseg_plan(overrides, budget, work / "runs" / name / "plan"),
            "step_input": step,
            "estimate_of_nnunet_step": estimate_nnunet_step(step, reference),
        }
        print(f"{name}: done", flush=True)
    result = {
        "machine": machine(),
        "command": "python -m benchmarks nnunet_side_by_side",
        "rows": rows,
    }
    (args.out / "side_by_side.json").write_text(json.dumps(result, indent=2, default=list) + "\n")
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
