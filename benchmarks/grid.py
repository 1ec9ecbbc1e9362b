"""The grid runner: a grid of configs (a name and its ``train.py`` overrides each), each run as
a real ``python train.py`` and estimated from the same overrides, recorded side by side.

``estimator_accuracy`` (its grids on the CPU, or on a GPU with ``--device cuda``),
``cuda_results`` (the GPU runs kept as data) and ``network_levers`` hold their grids, options and
reading; what they share lives here: the overrides of a measured run (:func:`run_overrides`) and
the config composed from them (:func:`compose`), the data a config trains on
(:func:`prepare_data`, :func:`prepare_volume`), a user's own network on the children's path
(:func:`user_network`, :func:`child_env`), the estimate (:func:`predict`), the measurement
through :mod:`benchmarks.harness` (:func:`measure`), the planner check (:func:`plan_under_budget`)
and a grid's table and records (:func:`run_grid`, :func:`record`).

A run is :data:`STEPS` optimizer steps in a fresh process, validation off, the memory monitor on
every micro-batch into the CSV logger. A step's measured rise is its peak (the largest over its
micro-batches) minus what was held at its start; the measured figure is the largest rise of the
steady steps (the first also creates the optimizer state). The estimate is
``estimate_run(plan).step.step_peak_growth`` of the config composed from the same overrides.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np

from benchmarks import harness
from benchmarks.results_io import REPO
from volseg.memory.estimate.events import held_at_last_mark
from volseg.utils.units import MIB

#: optimizer steps per run: the first creates the optimizer state, the others are steady
STEPS = 3


#: held around Hydra's compose (global state) and data generation in the runs' threads
COMPOSE_LOCK = threading.RLock()

#: seconds a train.py or plan.py child may run (``--timeout``): emulated bf16 on an AVX2 CPU
#: takes many times a float32 step
RUN_TIMEOUT_S = 900


Grid = list[tuple[str, list[str]]]


#: networks volseg did not write, each at a patch its divisibility allows (SwinUNETR 32, DynUNet
#: and BasicUNet 16, SegResNet 8) within the embedded dataset's 32x96x96 volumes, float32, sized
#: so that a run takes well under a minute on 2 cores; the last is a user's own class from a file
#: (:data:`MY_UNET`, written into the work dir as ``my_unet.py``)
NETWORKS: Grid = [
    (
        "DynUNet (deep supervision) fp32 b1 32x64x64",
        ["model/net=dynunet", "data.batch_size=1", "data.patch_size=[32,64,64]"],
    ),
    (
        "SegResNet fp32 b2 32x64x64",
        ["model/net=segresnet", "data.batch_size=2", "data.patch_size=[32,64,64]"],
    ),
    (
        "SwinUNETR fp32 b1 32x64x64",
        ["model/net=swin_unetr", "data.batch_size=1", "data.patch_size=[32,64,64]"],
    ),
    (
        "BasicUNet fp32 b2 32x64x64",
        ["model/net=basic_unet", "data.batch_size=2", "data.patch_size=[32,64,64]"],
    ),
    (
        "my_unet.UNet (DoubleConv/Down/Up/OutConv, trilinear) fp32 b2 32x64x64",
        [
            "model/net=custom",
            "model.net._target_=my_unet.UNet",
            "data.batch_size=2",
            "data.patch_size=[32,64,64]",
        ],
    ),
]


NETWORKS = [(name, [*overrides, "trainer.precision=32"]) for name, overrides in NETWORKS]

#: MONAI's residual UNet and AttentionUnet, each as a user would bring it (``model/net=custom``
#: with the tutorials' channels): the planner's check under a tight budget
#: (``--budget-of-growth``), where it once found nothing at batch 2
MONAI_UNETS: Grid = [
    (
        "MONAI UNet (16-256 channels, 2 residual units) fp32 b2 32x64x64",
        [
            "model/net=custom",
            "model.net._target_=monai.networks.nets.UNet",
            "+model.net.spatial_dims=3",
            "+model.net.channels=[16,32,64,128,256]",
            "+model.net.strides=[2,2,2,2]",
            "+model.net.num_res_units=2",
            "data.batch_size=2",
            "data.patch_size=[32,64,64]",
        ],
    ),
    (
        "MONAI AttentionUnet (16-256 channels) fp32 b2 32x64x64",
        [
            "model/net=custom",
            "model.net._target_=monai.networks.nets.AttentionUnet",
            "+model.net.spatial_dims=3",
            "+model.net.channels=[16,32,64,128,256]",
            "+model.net.strides=[2,2,2,2]",
            "data.batch_size=2",
            "data.patch_size=[32,64,64]",
        ],
    ),
]
MONAI_UNETS = [(name, [*overrides, "trainer.precision=32"]) for name, overrides in MONAI_UNETS]

#: other projects' U-Nets (the networks extra), each from its shipped config, float32, batch 2 of
#: 32x64x64 within the embedded dataset's 32x96x96 volumes: nnU-Net's PlainConvUNet and
#: ResidualEncoderUNet (dynamic-network-architectures, deep supervision) and pytorch-3dunet's
#: UNet3D and ResidualUNet3D
FOREIGN_NETWORKS: Grid = [
    (
        "nnU-Net PlainConvUNet (16-256, deep supervision) fp32 b2 32x64x64",
        ["model/net=plain_conv_unet", "data.batch_size=2", "data.patch_size=[32,64,64]"],
    ),
    (
        "nnU-Net ResidualEncoderUNet (16-256, deep supervision) fp32 b2 32x64x64",
        ["model/net=residual_encoder_unet", "data.batch_size=2", "data.patch_size=[32,64,64]"],
    ),
    (
        "pytorch-3dunet UNet3D (f_maps 16, 4 levels, gcr) fp32 b2 32x64x64",
        ["model/net=pytorch3dunet_unet3d", "data.batch_size=2", "data.patch_size=[32,64,64]"],
    ),
    (
        "pytorch-3dunet ResidualUNet3D (f_maps 16, 5 levels, gcr) fp32 b2 32x64x64",
        [
            "model/net=pytorch3dunet_residual_unet3d",
            "data.batch_size=2",
            "data.patch_size=[32,64,64]",
        ],
    ),
]
FOREIGN_NETWORKS = [
    (name, [*overrides, "trainer.precision=32"]) for name, overrides in FOREIGN_NETWORKS
]


#: the frozen held-out grids (``benchmarks/draw_grid.py``)
GRIDS_DIR = REPO / "benchmarks" / "grids"

#: the widely copied 2D U-Net (``unet_model.py`` / ``unet_parts.py``: DoubleConv, Down, Up,
#: OutConv) in 3D, as a user would bring it (``UNet(n_channels, n_classes, bilinear=True)``),
#: written into a run's work dir as ``my_unet.py``
MY_UNET = (GRIDS_DIR / "my_unet.py").read_text()


def frozen_grids(folder: Path = GRIDS_DIR) -> dict[str, dict]:
    """Every grid file of ``folder`` by its name: ``{"sample": ..., "configs": [...], ...}``."""
    return {path.stem: json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))}


def frozen_in(name: str) -> str | None:
    """The commit that added a frozen grid's file (None: not a frozen grid, or no git here)."""
    path = GRIDS_DIR / f"{name}.json"
    if not path.is_file():
        return None
    try:
        found = subprocess.run(
            ["git", "log", "--no-renames", "--diff-filter=A", "--format=%H", "--", str(path)],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        return None
    return found[-1] if found else None


def run_overrides(overrides: list[str], device: str, data_dir: Path) -> list[str]:
    """``train.py``'s overrides for a config: its trainer for ``device``, 3 optimizer steps, no
    validation, the memory monitor on every micro-batch into the CSV logger, data under
    ``data_dir``. The estimate is composed from the same list."""
    return [
        f"trainer={'gpu' if device == 'cuda' else 'cpu'}",
        *overrides,
        f"trainer.max_steps={STEPS}",
        "trainer.limit_val_batches=0",
        "trainer.num_sanity_val_steps=0",
        "memory.every_n_steps=1",
        "logger=csv",
        f"paths.data_dir={data_dir}",
    ]


def compose(overrides: list[str], device: str, data_dir: Path):
    """The ``train`` config of a benchmark run, as ``train.py`` composes it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    with COMPOSE_LOCK:  # Hydra's global state, from the runs' threads
        GlobalHydra.instance().clear()
        with initialize_config_dir(version_base="1.3", config_dir=str(REPO / "configs")):
            return hydra_compose(
                "train",
                overrides=[
                    *run_overrides(overrides, device, data_dir),
                    f"memory.plan_device={device}",
                    # the allocator's figures that the monitor reads hold no CUDA context
                    "memory.cuda_context_mib=0",
                ],
            )


def _data_dir_for(num_classes: int, work_dir: Path) -> Path:
    """``work_dir/data`` for the embedded dataset's own 5 classes, else
    ``work_dir/data_<K>_classes``."""
    from volseg.data.synthetic import CLASS_NAMES

    if num_classes == len(CLASS_NAMES):
        return work_dir / "data"
    return work_dir / f"data_{num_classes}_classes"


def data_dir(overrides: list[str], work_dir: Path) -> Path:
    """Where a config's run finds the embedded dataset (``paths.data_dir``): ``work_dir/data``
    for its own 5 classes, ``work_dir/data_<K>_classes`` for ``num_classes=K``."""
    return _data_dir_for(int(compose(overrides, "cpu", work_dir / "data").num_classes), work_dir)


def prepare_data(overrides: list[str], work_dir: Path) -> Path:
    """The config's ``paths.data_dir`` (:func:`data_dir`). The embedded dataset has 5 classes
    (``train.py`` generates it on first use); a config with ``num_classes=K`` trains on a copy
    whose labels are cut to K classes (the last ones merged) and whose class list has K names,
    made here. Memory does not depend on which labels the voxels carry."""
    from omegaconf import OmegaConf

    from volseg.data.io import read_array, write_volume
    from volseg.data.synthetic import CLASS_NAMES, SPACING_ZYX, generate_synthetic_dataset

    cfg = compose(overrides, "cpu", work_dir / "data")
    k = int(cfg.num_classes)
    target = _data_dir_for(k, work_dir)
    if target == work_dir / "data" or (target / "synthetic").exists():
        return target
    base = Path(cfg.data.synthetic.root)
    if not base.exists():
        generate_synthetic_dataset(**OmegaConf.to_container(cfg.data.synthetic, resolve=True))
    partial = target / "synthetic.partial"
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(base, partial)
    for path in sorted((partial / "labels").iterdir()):
        label = read_array(path)
        write_volume(path, np.minimum(label, k - 1).astype(label.dtype), SPACING_ZYX)
    names = [*CLASS_NAMES[:k], *(f"class_{i}" for i in range(len(CLASS_NAMES), k))]
    (partial / "classes.json").write_text(json.dumps(names))
    partial.rename(target / "synthetic")
    return target


def user_network(work_dir: Path) -> None:
    """Writes :data:`MY_UNET` into ``work_dir`` as ``my_unet.py`` and imports it as ``my_unet``
    in this process (for the estimate: Hydra finds it among the imported modules);
    :func:`child_env` puts ``work_dir`` on the children's ``PYTHONPATH``, as a user runs
    ``PYTHONPATH=. python train.py model/net=custom ...``."""
    work_dir.mkdir(parents=True, exist_ok=True)
    path = work_dir / "my_unet.py"
    if not path.exists() or path.read_text() != MY_UNET:
        path.write_text(MY_UNET)
    if "my_unet" not in sys.modules:
        spec = importlib.util.spec_from_file_location("my_unet", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules["my_unet"] = module


def child_env(device: str, work_dir: Path, malloc_default: bool = False) -> dict[str, str]:
    """The environment of a ``train.py``/``plan.py`` child: this one's, ``work_dir`` first on
    ``PYTHONPATH`` (``my_unet.py``), ``MALLOC_MMAP_THRESHOLD_=65536`` on the CPU unless
    ``malloc_default``."""
    user_network(work_dir)
    mmap = device == "cpu" and not malloc_default
    return harness.child_env({"MALLOC_MMAP_THRESHOLD_": "65536"} if mmap else {}, [work_dir])


def predict(
    overrides: list[str], device: str, work_dir: Path, volume: tuple[int, ...] | None = None
) -> dict:
    """The estimate of the config composed from the same overrides as its run (bytes); with a
    ``volume`` [D, H, W] also its validation and predict.py's prediction (float32, stitched on
    the device) of that volume."""
    from volseg.memory import estimate_prediction
    from volseg.plan import planned_config

    user_network(work_dir)
    # planned as train.py plans it (pooling=auto, precision for the device)
    cfg = planned_config(compose(overrides, device, data_dir(overrides, work_dir)))
    est = harness.estimated(cfg).step
    out = {
        "network": str(cfg.model.net._target_),
        "growth": est.step_peak_growth,
        "held_at_start": held_at_last_mark(est.events),
        "peak_allocated": est.peak_allocated,
        "peak_reserved": est.peak_reserved,
        "process_total": est.process_total,
        "accumulate_grad_batches": est.accumulate_grad_batches,
        "batch_size": est.batch_size,
        "patch_size": est.patch_size,
        "precision": est.precision,
        "num_parameters": est.num_parameters,
        "seconds": est.seconds,
    }
    if volume:
        for kind, made in (
            ("validation", harness.estimated(cfg, None, volume).validation),
            ("prediction", estimate_prediction(cfg, volume, stitch="device")),
        ):
            out[kind] = {
                "peak_allocated": made.peak_allocated,
                "peak_reserved": made.peak_reserved,
                "peak_growth": made.peak_growth,
                "windows": made.windows,
            }
    return out


def measure(
    overrides: list[str],
    device: str,
    work_dir: Path,
    name: str,
    accumulate_grad_batches: int = 1,
    malloc_default: bool = False,
    snapshot: Path | None = None,
    timeout: float = RUN_TIMEOUT_S,
) -> dict[str, float]:
    """Run ``python train.py`` for the config in a fresh process; its steady step (bytes): the
    largest rise of steps 2..STEPS, and that step's peak allocated and reserved.

    ``snapshot``: on CUDA, a file for the allocator's memory snapshot of the run's steps
    (``memory.snapshot_steps``; open it at pytorch.org/memory_viz).
    """
    run_dir = work_dir / "runs" / name
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    arguments = run_overrides(overrides, device, prepare_data(overrides, work_dir))
    if snapshot is not None and device == "cuda":
        arguments.append(f"memory.snapshot_steps={STEPS}")
    env = child_env(device, work_dir, malloc_default)
    run = harness.train(arguments, run_dir, work_dir, env, timeout)
    steady = harness.steady_step(run, accumulate_grad_batches, STEPS)
    if snapshot is not None and device == "cuda":
        shutil.copy(run_dir / "memory_snapshot.pickle", snapshot)
    return {**steady, "seconds": run.seconds}


#: the keys the planner may set to fit a budget (volseg.plan.make._plan_step)
PLANNED_KEYS = (
    "data.batch_size",
    "data.patch_size",
    "model.activation_checkpointing",
    "model.checkpoint_loss",
    "trainer.accumulate_grad_batches",
)


def check_budget(
    configured: dict[str, float], budget_fraction: float, growth_fraction: float | None = None
) -> int:
    """The planner check's budget in bytes, whole MiB: ``budget_fraction`` of the configured
    step's estimated process total, or (``growth_fraction``) the resident state its step holds at
    the start plus that fraction of its growth."""
    if growth_fraction is None:
        return int(budget_fraction * configured["process_total"]) // MIB * MIB
    tight = configured["held_at_start"] + growth_fraction * configured["growth"]
    return int(tight) // MIB * MIB


def plan_under_budget(
    overrides: list[str],
    device: str,
    work_dir: Path,
    name: str,
    configured: dict[str, float],
    malloc_default: bool = False,
    budget_fraction: float = 0.85,
    timeout: float = RUN_TIMEOUT_S,
    growth_fraction: float | None = None,
) -> dict:
    """The planner's answer for a budget below the configured step, trained.

    The budget is ``budget_fraction`` of the configured step's estimated process total
    (``configured``: its :func:`predict`), in whole MiB; with ``growth_fraction``, the resident
    state the step holds at its start plus that fraction of the step's growth instead. ``python
    plan.py <run overrides> memory.budget=<budget>`` writes the plan (a step over the budget
    gets the planner's batch, checkpointing or micro-batches); ``python train.py
    plan=<plan.yaml>`` trains it for :data:`STEPS` steps. On the CPU the budget counts tensor
    bytes (the estimate's process total there is its peak allocated, no interpreter or
    libraries), so the run's peak is counted the same way: what its steady step holds at its
    start (parameters, buffers, gradients, optimizer state: their sizes, from the estimate of
    the planned config) plus the step's measured rise.
    """
    import yaml

    budget = check_budget(configured, budget_fraction, growth_fraction)
    plan_dir = work_dir / "plans" / name
    run_dir = work_dir / "runs" / f"{name}_planned"
    for folder in (plan_dir, run_dir):
        shutil.rmtree(folder, ignore_errors=True)
        folder.parent.mkdir(parents=True, exist_ok=True)
    data = prepare_data(overrides, work_dir)
    env = child_env(device, work_dir, malloc_default)
    budget_override = f"memory.budget={budget // MIB}MiB"
    run = [*run_overrides(overrides, device, data), budget_override]
    try:
        harness.run("plan.py", [*run, f"hydra.run.dir={plan_dir}"], work_dir, env, timeout)
    except harness.RunFailed as err:  # nothing fits: the planner's answer, nothing to train
        if "over" not in str(err):
            raise
        return {"budget": budget, "answer": None, "message": str(err).splitlines()[-1]}
    plan_file = plan_dir / "plan.yaml"
    saved = yaml.safe_load(plan_file.read_text())
    decisions = saved["decisions"]
    answer = [
        f"{key}={json.dumps(decisions[key]['value'], separators=(',', ':'))}"
        for key in PLANNED_KEYS
        if key in decisions and decisions[key]["source"] == "planned"
    ]
    planned = predict([*overrides, *answer], device, work_dir)
    arguments = [f"plan={plan_file}", f"paths.data_dir={data}"]
    trained = harness.train(arguments, run_dir, work_dir, env, timeout)
    steady = harness.steady_step(trained, int(planned["accumulate_grad_batches"]), STEPS)
    peak = planned["held_at_start"] + steady["growth"]
    return {
        "budget": budget,
        "answer": answer,
        "estimated": int(saved["estimate"]["process_total"]),
        "estimated_growth": planned["growth"],
        "measured_growth": steady["growth"],
        "held_at_start": planned["held_at_start"],
        "measured_peak": peak,
        "under_budget": peak <= budget,
        "rises": steady["rises"],
        "seconds": trained.seconds,
    }


def record(name: str, sample: str, overrides: list[str], predicted: dict, measured: dict) -> dict:
    """A grid's record of one config: what was estimated (:func:`predict`) beside what was
    measured (:func:`measure`), in bytes; ``error`` = estimated / measured - 1 of the steady
    step's rise; ``sample``: whether the estimator was tuned on the grid."""
    return {
        "name": name,
        "sample": sample,
        "network": predicted["network"],
        "overrides": overrides,
        "batch_size": predicted["batch_size"],
        "patch_size": predicted["patch_size"],
        "precision": predicted["precision"],
        "num_parameters": predicted["num_parameters"],
        "estimated_bytes": int(predicted["growth"]),
        "measured_bytes": int(measured["growth"]),
        "error": predicted["growth"] / measured["growth"] - 1,
        "measured_rises_bytes": [int(r) for r in measured["rises"]],
        "estimated_process_total_bytes": int(predicted["process_total"]),
        "run_seconds": round(measured["seconds"], 1),
    }


def planner_record(check: dict) -> dict:
    """A record's ``planner`` entry from :func:`plan_under_budget` (bytes)."""
    if check["answer"] is None:
        return {"budget_bytes": check["budget"], "answer": None, "message": check["message"]}
    return {
        "budget_bytes": check["budget"],
        "answer": check["answer"],
        "estimated_process_total_bytes": check["estimated"],
        "estimated_growth_bytes": int(check["estimated_growth"]),
        "measured_growth_bytes": int(check["measured_growth"]),
        "held_at_start_bytes": int(check["held_at_start"]),
        "measured_peak_bytes": int(check["measured_peak"]),
        "under_budget": check["under_budget"],
        "measured_rises_bytes": [int(r) for r in check["rises"]],
        "run_seconds": round(check["seconds"], 1),
    }


def run_grid(
    grid: Grid,
    label: str,
    device: str,
    work_dir: Path,
    sample: str,
    malloc_default: bool = False,
    snapshot_dir: Path | None = None,
    planner: bool = False,
    on_record: Callable[[str, list[dict]], None] | None = None,
    done: dict[str, dict] | None = None,
    timeout: float = RUN_TIMEOUT_S,
    budget_fraction: float = 0.85,
    growth_fraction: float | None = None,
) -> list[dict]:
    """Print one grid's table; returns a :func:`record` per config (a config whose run or
    estimate failed: ``failed``, the error's last line). ``sample``: in sample or held out, for
    every record. ``planner``: also plan each config under ``budget_fraction`` of it and train
    the plan (:func:`plan_under_budget`; ``growth_fraction``: its other budget rule);
    ``timeout``: seconds a child may run.
    ``on_record(label, records)`` is called after each config (the results file so far).
    ``done``: records by config name from an earlier run of this grid (``--resume``); a config
    measured there is kept as it is, not run again."""
    print(f"## {label}")
    print()
    if device == "cuda":
        print(
            "| config | estimated MiB | measured MiB (max_memory_allocated rise) | error "
            "| reserved: estimated / measured MiB | error |"
        )
        print("|---|---:|---:|---:|---:|---:|")
    else:
        head = "| config | estimated MiB | measured MiB (peak RSS rise) | error |"
        rule = "|---|---:|---:|---:|"
        if planner:
            head += " budget MiB | planned | planned run's peak MiB |"
            rule += "---:|---|---:|"
        print(head)
        print(rule)
    records = []
    for index, (name, overrides) in enumerate(grid):
        kept = (done or {}).get(name)
        if kept is not None and "failed" not in kept and kept.get("overrides") == overrides:
            records.append(kept)
            print(
                f"| {name} | {kept['estimated_bytes'] / MIB:,.1f} | "
                f"{kept['measured_bytes'] / MIB:,.1f} | {100 * kept['error']:+.1f}% | "
                "(kept from the resumed file)",
                flush=True,
            )
            continue
        snapshot = snapshot_dir / f"{label}_{index}.pickle" if snapshot_dir else None
        try:
            predicted = predict(overrides, device, work_dir)
            measured = measure(
                overrides,
                device,
                work_dir,
                f"{label}_{index}",
                int(predicted["accumulate_grad_batches"]),
                malloc_default,
                snapshot,
                timeout,
            )
        except Exception as err:  # noqa: BLE001  (a held-out grid reports every config)
            last = failure(err)
            records.append({"name": name, "sample": sample, "overrides": overrides, "failed": last})
            print(f"| {name} | failed: {last} | | |", flush=True)
            if on_record:
                on_record(label, records)
            continue
        entry = record(name, sample, overrides, predicted, measured)
        error = entry["error"]
        row = (
            f"| {name} | {predicted['growth'] / MIB:,.1f} | {measured['growth'] / MIB:,.1f} "
            f"| {100 * error:+.1f}% |"
        )
        if device == "cuda":
            reserved_error = predicted["peak_reserved"] / measured["peak_reserved"] - 1
            row += (
                f" {predicted['peak_reserved'] / MIB:,.0f} / "
                f"{measured['peak_reserved'] / MIB:,.0f} | {100 * reserved_error:+.1f}% |"
            )
        elif planner:
            try:
                check = plan_under_budget(
                    overrides,
                    device,
                    work_dir,
                    f"{label}_{index}",
                    predicted,
                    malloc_default,
                    budget_fraction,
                    timeout,
                    growth_fraction,
                )
            except Exception as err:  # noqa: BLE001  (a plan train.py refuses is a finding)
                entry["planner"] = {"failed": failure(err)}
                row += f" | planner check failed: {entry['planner']['failed']} | |"
            else:
                entry["planner"] = planner_record(check)
                row += f" {check['budget'] / MIB:,.0f} | " + (
                    "nothing fits | |"
                    if check["answer"] is None
                    else f"{' '.join(check['answer']) or 'unchanged'} "
                    f"| {check['measured_peak'] / MIB:,.1f} "
                    f"({'under' if check['under_budget'] else 'OVER'}) |"
                )
        records.append(entry)
        print(row, flush=True)
        if on_record:
            on_record(label, records)
        rises = ", ".join(f"{r / MIB:,.1f}" for r in measured["rises"])
        print(f"<!-- rises by step: {rises} MiB; run {measured['seconds']:.0f} s -->", flush=True)
    print()
    print(summary_line(records))
    print()
    return records


def failure(err: Exception) -> str:
    """One line for a config whose run or estimate failed: a timeout's limit, else the error's
    last line."""
    if isinstance(err, harness.TimedOut):
        return str(err)
    text = str(err).strip()
    return text.splitlines()[-1] if text else type(err).__name__


def safe_count(records: list[dict]) -> tuple[int, int]:
    """``(safe, measured)``: of the configs measured, how many the estimate covers, its
    estimated step rise at or above the measured one (``error >= 0``: the planner's safe side)."""
    errors = [r["error"] for r in records if r.get("error") is not None]
    return sum(e >= 0 for e in errors), len(errors)


def safe_text(records: list[dict]) -> str:
    """``safe in 7 of 9 (78%)``: :func:`safe_count` as the tables say it."""
    safe, measured = safe_count(records)
    return f"safe in {safe} of {measured} ({safe / measured:.0%})" if measured else "none measured"


def summary_line(records: list[dict]) -> str:
    """Mean and largest |error| over a grid's configs, how often the estimate is at or above the
    measured rise (:func:`safe_text`), and how many failed."""
    absolute = [abs(r["error"]) for r in records if r.get("error") is not None]
    failed = len(records) - len(absolute)
    tail = f", {failed} failed" if failed else ""
    if not absolute:
        return f"no config measured ({len(records)} configs{tail})"
    return (
        f"mean |error| {100 * sum(absolute) / len(absolute):.1f}%, "
        f"max |error| {100 * max(absolute):.1f}% ({len(absolute)} configs{tail}); "
        f"{safe_text(records)}"
    )


def merge(*lists: list[str] | tuple[str, ...]) -> list[str]:
    """Override lists joined, a later value of a key replacing an earlier one in place."""
    merged: dict[str, str] = {}
    for overrides in lists:
        for override in overrides:
            key = override.split("=", 1)[0].lstrip("+~")
            merged.pop(key, None)
            merged[key] = override
    return list(merged.values())


def accumulation(overrides: tuple[str, ...] | list[str]) -> int:
    return next(
        (
            int(o.split("=")[1])
            for o in overrides
            if o.startswith("trainer.accumulate_grad_batches=")
        ),
        1,
    )


def class_names(k: int) -> list[str]:
    from volseg.data.synthetic import CLASS_NAMES

    return [*CLASS_NAMES[:k], *(f"class_{i}" for i in range(len(CLASS_NAMES), k))]


def generated_volume(shape: tuple[int, ...], seed: int = 0):
    """An embedded-dataset-like ``(image, label)`` of ``shape``; a large one tiles a volume of
    at most ~1.5M voxels (memory does not depend on the content; generating 300x512x512 whole
    takes ~30 s of CPU, tiling ~2 s)."""
    import numpy as np

    from volseg.data.synthetic import make_volume

    tiles = [1, 1, 1]
    while np.prod([-(-s // t) for s, t in zip(shape, tiles, strict=True)]) > 1_500_000:
        axis = max(range(3), key=lambda a: shape[a] / tiles[a])
        tiles[axis] *= 2
    block = [-(-s // t) for s, t in zip(shape, tiles, strict=True)]
    image, label = make_volume(block, seed=seed)
    crop = tuple(slice(0, s) for s in shape)
    return np.tile(image, tiles)[crop], np.tile(label, tiles)[crop]


def ensure_embedded(work: Path) -> None:
    """The embedded dataset under ``work/data``, generated once here rather than by each child."""
    from omegaconf import OmegaConf

    from volseg.data.synthetic import generate_synthetic_dataset

    cfg = compose([], "cpu", work / "data")
    if not Path(cfg.data.synthetic.root).exists():
        generate_synthetic_dataset(**OmegaConf.to_container(cfg.data.synthetic, resolve=True))


def prepare_volume(overrides: list[str], volume: tuple[int, ...], work: Path) -> tuple[Path, Path]:
    """``paths.data_dir`` of one training and one validation case of ``volume`` [D, H, W] (the
    same generated volume, uncompressed NIfTI) with the config's number of classes, and the
    validation case's image (the volume predict.py reads)."""
    with COMPOSE_LOCK:
        k = int(compose(overrides, "cpu", work / "data").num_classes)
        data_dir = work / f"data_{'x'.join(map(str, volume))}_{k}_classes"
        root = data_dir / "synthetic"
        if not root.exists():
            from volseg.data.dataset_defaults import EMBEDDED_DEFAULTS
            from volseg.data.io import write_dataset, write_volume
            from volseg.data.synthetic import SPACING_ZYX

            image, label = generated_volume(volume)

            def write_case(i: int, image_path: Path, label_path: Path) -> None:
                write_volume(image_path, image, spacing_zyx=SPACING_ZYX)
                write_volume(label_path, label, spacing_zyx=SPACING_ZYX)

            names = ["case_000.nii", "case_001.nii"]
            write_dataset(root, names, write_case, 1, class_names(k), EMBEDDED_DEFAULTS)
        return data_dir, root / "images" / "case_001.nii"
