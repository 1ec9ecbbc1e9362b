"""How close is ``estimate_memory.py`` to real ``python train.py`` runs?

For each config, ``python train.py <overrides>`` runs in a fresh process for 3 optimizer steps
(validation off, the embedded dataset generated into a temporary folder, the run dir there too;
a config with another ``num_classes`` than the dataset's 5 trains on a copy with that many),
and the memory monitor's per-step figures are read back from the run's ``csv/metrics.csv``: a
step's measured rise is its peak (``mem/peak_allocated_mib``, the largest over the step's
micro-batches with ``trainer.accumulate_grad_batches``) minus what was held at its start
(``mem/step_start_allocated_mib`` of its first micro-batch), and the measured figure is the
largest rise of the steady steps (the 2nd and 3rd; the first also creates the optimizer state).
The estimate is ``estimate(cfg).step_peak_growth`` of the config composed from the same
overrides: how far a steady step rises above what it holds at its start.

On a CPU the monitor reads the process's resident memory (VmRSS, and VmHWM reset at each phase
boundary). glibc keeps freed heap memory resident and reuses it, so by default a step's measured
rise is what it adds beyond the memory an earlier step left behind, not what its tensors take;
the children run with ``MALLOC_MMAP_THRESHOLD_=65536``, which serves every allocation of 64 KiB
or more with mmap and returns it to the system when freed, so the resident set follows the
tensors (``--malloc-default`` runs them as ``train.py`` runs by default, for comparison). With
``--device cuda`` (on a GPU) the children run ``trainer=gpu`` and the monitor's figures are the
caching allocator's (``max_memory_allocated`` rise, ``max_memory_reserved``), compared with the
CUDA estimate (CUDA context 0: the allocator's figures hold none of it).

The grids, each in sample (the estimator was tuned on it, or a change to it was judged on it) or
held out (:data:`SAMPLE`; each row of a results file says which): ``TUNED``, the configs the
estimator was tuned on; ``CHECKED``, fixed on 2026-12-02 as a held-out check and tuned on since;
the frozen held-out grids of ``benchmarks/grids/<name>.json`` (drawn by
``benchmarks/draw_grid.py``; the commit that added the file is recorded with each row);
``NETWORKS``, networks volseg did not write (MONAI's
DynUNet, SegResNet, SwinUNETR, BasicUNet, and the widely copied DoubleConv/Down/Up/OutConv U-Net
as a user's ``my_unet.py``, written into the work dir and put on the children's ``PYTHONPATH``).
Each network is also planned under a budget below its configured step (75% of the estimated
total: ``python plan.py ... memory.budget=X``), and the plan trained (``python train.py
plan=plan.yaml``) to see whether its measured peak stays under the budget.

    python -m benchmarks estimator_accuracy                        # CPU, every grid
    python -m benchmarks estimator_accuracy --grid held-out-2026-12-03-b   # one grid
    python -m benchmarks estimator_accuracy --grid networks \\
        --json-out benchmarks/results/cpu/estimator_networks.json
    python -m benchmarks estimator_accuracy --write-docs           # docs/networks.md's table
    python -m benchmarks estimator_accuracy --device cuda          # on a GPU machine
    python -m benchmarks estimator_accuracy --device cuda --snapshot-dir DIR

Also prints how long the reference config (unet_large, batch 2, 1x26x150x320, 16-true) takes to
estimate.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from benchmarks import harness, results_io
from volseg.memory.events import held_at_last_mark
from volseg.utils.cpu import cpu_description
from volseg.utils.units import MIB

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("PROJECT_ROOT", str(REPO))

#: optimizer steps per run: the first creates the optimizer state, the others are steady
STEPS = 3
#: seconds a train.py or plan.py child may run (``--timeout``): emulated bf16 on an AVX2 CPU
#: takes many times a float32 step
RUN_TIMEOUT_S = 900

Grid = list[tuple[str, list[str]]]

#: the configs the estimator was tuned on
TUNED: Grid = [
    (
        "unet_tiny fp32 b2 32x64x64",
        ["data.batch_size=2", "data.patch_size=[32,64,64]", "trainer.precision=32"],
    ),
    (
        "unet_tiny bf16-mixed b2 32x64x64",
        ["data.batch_size=2", "data.patch_size=[32,64,64]", "trainer.precision=bf16-mixed"],
    ),
    (
        "depth 3 [8,16,32] fp32 b4 16x64x64",
        [
            "model.net.widths=[8,16,32]",
            "data.batch_size=4",
            "data.patch_size=[16,64,64]",
            "trainer.precision=32",
        ],
    ),
    (
        "depth 5 [16..256] bf16-mixed b1 32x96x96",
        [
            "model.net.widths=[16,32,64,128,256]",
            "data.batch_size=1",
            "data.patch_size=[32,96,96]",
            "trainer.precision=bf16-mixed",
        ],
    ),
    (
        "unet_small fp32 b1 16x64x64",
        [
            "model=unet_small",
            "data.batch_size=1",
            "data.patch_size=[16,64,64]",
            "trainer.precision=32",
        ],
    ),
    (
        "width 32 batch-norm bf16-true b2 16x96x96",
        [
            "model.net.widths=[32,64,128,256]",
            "model.net.norm=batch",
            "data.batch_size=2",
            "data.patch_size=[16,96,96]",
            "trainer.precision=bf16-true",
        ],
    ),
    (
        "unet_tiny checkpointing=all fp32 b2 32x64x64",
        [
            "data.batch_size=2",
            "data.patch_size=[32,64,64]",
            "model.activation_checkpointing=all",
            "model.checkpoint_loss=true",
            "trainer.precision=32",
        ],
    ),
]

#: fixed before any of its results were seen (2026-12-02) as a held-out check; a change to the
#: estimator has been judged on it since, so it is in sample
CHECKED: Grid = [
    (
        "[8,16,32,64] group-norm transposed fp32 b2 24x64x64, 2 classes",
        [
            "model.net.widths=[8,16,32,64]",
            "model.net.norm=group",
            "model.net.upsampling=transposed",
            "num_classes=2",
            "data.batch_size=2",
            "data.patch_size=[24,64,64]",
            "trainer.precision=32",
        ],
    ),
    (
        "[24,48,96] batch-norm bf16-mixed b1 32x64x64, 32 classes",
        [
            "model.net.widths=[24,48,96]",
            "model.net.norm=batch",
            "num_classes=32",
            "data.batch_size=1",
            "data.patch_size=[32,64,64]",
            "trainer.precision=bf16-mixed",
        ],
    ),
    (
        "[16,32,64,128] pooling [[1,2,2],[1,2,2],[2,2,2]] fp32 b2 16x96x96, 3 classes",
        [
            "model.net.widths=[16,32,64,128]",
            "model.net.pooling=[[1,2,2],[1,2,2],[2,2,2]]",
            "num_classes=3",
            "data.batch_size=2",
            "data.patch_size=[16,96,96]",
            "trainer.precision=32",
        ],
    ),
    (
        "[16,32,64] group-norm bf16-true b3 16x64x64, 8 classes, clip norm 1",
        [
            "model.net.widths=[16,32,64]",
            "model.net.norm=group",
            "num_classes=8",
            "data.batch_size=3",
            "data.patch_size=[16,64,64]",
            "trainer.precision=bf16-true",
            "trainer.gradient_clip_val=1.0",
        ],
    ),
    (
        "unet_tiny fp32 b1 x2 accumulation 32x64x64, 4 classes, clip value 0.5",
        [
            "num_classes=4",
            "data.batch_size=1",
            "data.patch_size=[32,64,64]",
            "trainer.precision=32",
            "trainer.accumulate_grad_batches=2",
            "trainer.gradient_clip_val=0.5",
            "trainer.gradient_clip_algorithm=value",
        ],
    ),
    (
        "unet_tiny checkpointing=decoder bf16-mixed b2 32x64x64, 6 classes",
        [
            "model.activation_checkpointing=decoder",
            "num_classes=6",
            "data.batch_size=2",
            "data.patch_size=[32,64,64]",
            "trainer.precision=bf16-mixed",
        ],
    ),
    (
        "[12,24,48,96] batch-norm checkpointing=encoder + loss fp32 b2 24x80x80",
        [
            "model.net.widths=[12,24,48,96]",
            "model.net.norm=batch",
            "model.activation_checkpointing=encoder",
            "model.checkpoint_loss=true",
            "data.batch_size=2",
            "data.patch_size=[24,80,80]",
            "trainer.precision=32",
        ],
    ),
    (
        "unet_tiny checkpointing=[0,1] transposed relu dropout 0.1 fp32 b1 32x96x96, 2 classes",
        [
            "model.activation_checkpointing=[0,1]",
            "model.net.upsampling=transposed",
            "model.net.activation=relu",
            "model.net.dropout=0.1",
            "num_classes=2",
            "data.batch_size=1",
            "data.patch_size=[32,96,96]",
            "trainer.precision=32",
        ],
    ),
    (
        "[16,32,64,128] channels_last fp32 b2 16x64x64",
        [
            "model.net.widths=[16,32,64,128]",
            "model.channels_last=true",
            "data.batch_size=2",
            "data.patch_size=[16,64,64]",
            "trainer.precision=32",
        ],
    ),
    (
        "unet_tiny offload fp32 b2 32x64x64, 3 classes",
        [
            "model.offload_activations=true",
            "num_classes=3",
            "data.batch_size=2",
            "data.patch_size=[32,64,64]",
            "trainer.precision=32",
        ],
    ),
    (
        "[16,32,64,128] group-norm 16-mixed b1 x3 accumulation 32x64x64, 12 classes, clip norm 1",
        [
            "model.net.widths=[16,32,64,128]",
            "model.net.norm=group",
            "num_classes=12",
            "data.batch_size=1",
            "data.patch_size=[32,64,64]",
            "trainer.precision=16-mixed",
            "trainer.accumulate_grad_batches=3",
            "trainer.gradient_clip_val=1.0",
        ],
    ),
    (
        "unet_small_gn bf16-mixed b1 16x64x64, 2 classes",
        [
            "model=unet_small_gn",
            "num_classes=2",
            "data.batch_size=1",
            "data.patch_size=[16,64,64]",
            "trainer.precision=bf16-mixed",
        ],
    ),
]

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

#: the widely copied 2D U-Net (``unet_model.py`` / ``unet_parts.py``: DoubleConv, Down, Up,
#: OutConv) in 3D, as a user would bring it: base width 16, 4 downs, trilinear upsampling padded
#: to the skip's size, BatchNorm3d + ReLU; ``UNet(n_channels, n_classes, bilinear=True)``
MY_UNET = '''"""The DoubleConv / Down / Up / OutConv U-Net, in 3D."""

import torch
import torch.nn.functional as F
from torch import nn


class DoubleConv(nn.Module):
    """(convolution => BatchNorm => ReLU) * 2"""

    def __init__(self, in_channels, out_channels, mid_channels=None):
        super().__init__()
        mid_channels = mid_channels or out_channels
        self.double_conv = nn.Sequential(
            nn.Conv3d(in_channels, mid_channels, kernel_size=3, padding=1, bias=False),
            nn.BatchNorm3d(mid_channels),
            nn.ReLU(inplace=True),
            nn.Conv3d(mid_channels, out_channels, kernel_size=3, padding=1, bias=False),
            nn.BatchNorm3d(out_channels),
            nn.ReLU(inplace=True),
        )

    def forward(self, x):
        return self.double_conv(x)


class Down(nn.Module):
    """Max-pooling, then a double convolution"""

    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.maxpool_conv = nn.Sequential(nn.MaxPool3d(2), DoubleConv(in_channels, out_channels))

    def forward(self, x):
        return self.maxpool_conv(x)


class Up(nn.Module):
    """Upsampling, then a double convolution of the skip and the upsampled map"""

    def __init__(self, in_channels, out_channels, bilinear=True):
        super().__init__()
        if bilinear:
            self.up = nn.Upsample(scale_factor=2, mode="trilinear", align_corners=True)
            self.conv = DoubleConv(in_channels, out_channels, in_channels // 2)
        else:
            self.up = nn.ConvTranspose3d(in_channels, in_channels // 2, kernel_size=2, stride=2)
            self.conv = DoubleConv(in_channels, out_channels)

    def forward(self, x1, x2):
        x1 = self.up(x1)
        # (B, C, D, H, W): pad x1 to the skip's size
        dz, dy, dx = (b - a for a, b in zip(x1.shape[2:], x2.shape[2:]))
        x1 = F.pad(x1, [dx // 2, dx - dx // 2, dy // 2, dy - dy // 2, dz // 2, dz - dz // 2])
        return self.conv(torch.cat([x2, x1], dim=1))


class OutConv(nn.Module):
    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size=1)

    def forward(self, x):
        return self.conv(x)


class UNet(nn.Module):
    def __init__(self, n_channels, n_classes, bilinear=True, base=16):
        super().__init__()
        self.n_channels = n_channels
        self.n_classes = n_classes
        self.bilinear = bilinear
        factor = 2 if bilinear else 1
        self.inc = DoubleConv(n_channels, base)
        self.down1 = Down(base, base * 2)
        self.down2 = Down(base * 2, base * 4)
        self.down3 = Down(base * 4, base * 8)
        self.down4 = Down(base * 8, base * 16 // factor)
        self.up1 = Up(base * 16, base * 8 // factor, bilinear)
        self.up2 = Up(base * 8, base * 4 // factor, bilinear)
        self.up3 = Up(base * 4, base * 2 // factor, bilinear)
        self.up4 = Up(base * 2, base, bilinear)
        self.outc = OutConv(base, n_classes)

    def forward(self, x):
        x1 = self.inc(x)
        x2 = self.down1(x1)
        x3 = self.down2(x2)
        x4 = self.down3(x3)
        x5 = self.down4(x4)
        x = self.up1(x5, x4)
        x = self.up2(x, x3)
        x = self.up3(x, x2)
        x = self.up4(x, x1)
        return self.outc(x)
'''

#: the frozen held-out grids (``benchmarks/draw_grid.py``)
GRIDS_DIR = REPO / "benchmarks" / "grids"


def frozen_grids(folder: Path = GRIDS_DIR) -> dict[str, dict]:
    """Every grid file of ``folder`` by its name: ``{"sample": ..., "configs": [...], ...}``."""
    return {path.stem: json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))}


FROZEN = frozen_grids()

GRIDS: dict[str, Grid] = {
    "tuned": TUNED,
    "checked-2026-12-02": CHECKED,
    **{
        name: [(c["name"], c["overrides"]) for c in grid["configs"]]
        for name, grid in FROZEN.items()
    },
    "networks": NETWORKS,
}

#: in sample: the estimator was tuned on the grid, or a change to it was judged on its results;
#: held out: neither yet (a frozen grid says so in its file until it is judged on)
SAMPLE: dict[str, str] = {
    "tuned": "in sample",
    "checked-2026-12-02": "in sample",
    "networks": "in sample",
    **{name: grid["sample"] for name, grid in FROZEN.items()},
}


def frozen_in(name: str) -> str | None:
    """The commit that added a frozen grid's file (None: not a frozen grid, or no git here)."""
    path = GRIDS_DIR / f"{name}.json"
    if name not in FROZEN:
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


#: the planner check's budget: this fraction of the configured step's estimated total. At a
#: batch of one the only lever is checkpointing, which leaves DynUNet and SwinUNETR about 79%
#: of their step here: a budget of 75% has no answer for them
BUDGET_FRACTION = 0.85

#: docs/networks.md's table lies between these lines
DOCS = REPO / "docs" / "networks.md"
TABLE_START = "<!-- networks-table: written by benchmarks/estimator_accuracy.py --grid networks -->"
TABLE_END = "<!-- /networks-table -->"

SEED = [
    "model=unet_large",
    "data.batch_size=2",
    "data.patch_size=[26,150,320]",
    "trainer.precision=16-true",
]


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

    GlobalHydra.instance().clear()
    with initialize_config_dir(version_base="1.3", config_dir=str(REPO / "configs")):
        return hydra_compose(
            "train",
            overrides=[
                *run_overrides(overrides, device, data_dir),
                f"memory.plan_device={device}",
                # the allocator's figures that the monitor reads hold no CUDA context
                "estimate.cuda_context_mib=0",
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


def predict(overrides: list[str], device: str, work_dir: Path) -> dict[str, float]:
    """The estimate of the config composed from the same overrides as its run (bytes)."""
    from volseg.memory.estimator import estimate
    from volseg.plan import planned_config

    user_network(work_dir)
    # planned as train.py plans it (pooling=auto, precision for the device)
    cfg = planned_config(compose(overrides, device, data_dir(overrides, work_dir)))
    est = estimate(cfg)
    return {
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


def measure(
    overrides: list[str],
    device: str,
    work_dir: Path,
    name: str,
    accumulate_grad_batches: int = 1,
    malloc_default: bool = False,
    snapshot: Path | None = None,
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
    run = harness.train(arguments, run_dir, work_dir, env, RUN_TIMEOUT_S)
    steady = harness.steady_step(run, accumulate_grad_batches, STEPS)
    if snapshot is not None and device == "cuda":
        shutil.copy(run_dir / "memory_snapshot.pickle", snapshot)
    return {**steady, "seconds": run.seconds}


#: the keys the planner may set to fit a budget (volseg.plan.make._plan_step)
PLANNED_KEYS = (
    "data.batch_size",
    "model.activation_checkpointing",
    "trainer.accumulate_grad_batches",
)


def plan_under_budget(
    overrides: list[str],
    device: str,
    work_dir: Path,
    name: str,
    configured: dict[str, float],
    malloc_default: bool = False,
) -> dict:
    """The planner's answer for a budget below the configured step, trained.

    The budget is :data:`BUDGET_FRACTION` of the configured step's estimated process total
    (``configured``: its :func:`predict`), in whole MiB. ``python plan.py <run overrides>
    memory.budget=<budget>`` writes the plan (a step over the budget gets the planner's batch,
    checkpointing or micro-batches); ``python train.py plan=<plan.yaml>`` trains it for
    :data:`STEPS` steps. On the CPU the budget counts tensor bytes (the estimate's process total
    there is its peak allocated, no interpreter or libraries), so the run's peak is counted the
    same way: what its steady step holds at its start (parameters, buffers, gradients, optimizer
    state: their sizes, from the estimate of the planned config) plus the step's measured rise.
    """
    import yaml

    budget = int(BUDGET_FRACTION * configured["process_total"]) // MIB * MIB
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
        harness.run("plan.py", [*run, f"hydra.run.dir={plan_dir}"], work_dir, env, RUN_TIMEOUT_S)
    except harness.RunFailed as err:  # nothing fits: the planner's answer, nothing to train
        if "over" not in str(err):
            raise
        return {"budget": budget, "answer": None, "message": str(err).splitlines()[-1]}
    plan_file = plan_dir / "plan.yaml"
    saved = yaml.safe_load(plan_file.read_text())
    decisions = saved["decisions"]
    answer = [
        f"{key}={json.dumps(decisions[key]['value'])}"
        for key in PLANNED_KEYS
        if key in decisions and decisions[key]["source"] == "planned"
    ]
    planned = predict([*overrides, *answer], device, work_dir)
    arguments = [f"plan={plan_file}", f"paths.data_dir={data}"]
    trained = harness.train(arguments, run_dir, work_dir, env, RUN_TIMEOUT_S)
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


def run_grid(
    grid: Grid,
    label: str,
    device: str,
    work_dir: Path,
    malloc_default: bool = False,
    snapshot_dir: Path | None = None,
    planner: bool = False,
    on_record: Callable[[str, list[dict]], None] | None = None,
    done: dict[str, dict] | None = None,
) -> list[dict]:
    """Print one grid's table; returns a record per config (bytes; ``error`` a fraction; a
    config whose run or estimate failed: ``failed``, the error's last line). ``planner``: also
    plan each config under a budget below it and train the plan (:func:`plan_under_budget`).
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
            )
        except Exception as err:  # noqa: BLE001  (a held-out grid reports every config)
            last = failure(err)
            records.append(
                {"name": name, "sample": SAMPLE[label], "overrides": overrides, "failed": last}
            )
            print(f"| {name} | failed: {last} | | |", flush=True)
            if on_record:
                on_record(label, records)
            continue
        error = predicted["growth"] / measured["growth"] - 1
        record = {
            "name": name,
            "sample": SAMPLE[label],
            "network": predicted["network"],
            "overrides": overrides,
            "batch_size": predicted["batch_size"],
            "patch_size": predicted["patch_size"],
            "precision": predicted["precision"],
            "num_parameters": predicted["num_parameters"],
            "estimated_bytes": int(predicted["growth"]),
            "measured_bytes": int(measured["growth"]),
            "error": error,
            "measured_rises_bytes": [int(r) for r in measured["rises"]],
            "estimated_process_total_bytes": int(predicted["process_total"]),
            "run_seconds": round(measured["seconds"], 1),
        }
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
            check = plan_under_budget(
                overrides, device, work_dir, f"{label}_{index}", predicted, malloc_default
            )
            if check["answer"] is None:
                record["planner"] = {
                    "budget_bytes": check["budget"],
                    "answer": None,
                    "message": check["message"],
                }
                row += f" {check['budget'] / MIB:,.0f} | nothing fits | |"
                records.append(record)
                print(row, flush=True)
                if on_record:
                    on_record(label, records)
                continue
            record["planner"] = {
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
            row += (
                f" {check['budget'] / MIB:,.0f} | {' '.join(check['answer']) or 'unchanged'} "
                f"| {check['measured_peak'] / MIB:,.1f} "
                f"({'under' if check['under_budget'] else 'OVER'}) |"
            )
        records.append(record)
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


def summary_line(records: list[dict]) -> str:
    """Mean and largest |error| over a grid's configs, and how many failed."""
    absolute = [abs(r["error"]) for r in records if "error" in r]
    failed = len(records) - len(absolute)
    tail = f", {failed} failed" if failed else ""
    if not absolute:
        return f"no config measured ({len(records)} configs{tail})"
    return (
        f"mean |error| {100 * sum(absolute) / len(absolute):.1f}%, "
        f"max |error| {100 * max(absolute):.1f}% ({len(absolute)} configs{tail})"
    )


def _mib(nbytes: float) -> str:
    return f"{nbytes / MIB:,.1f}"


def networks_table(results: dict) -> str:
    """docs/networks.md's table (the lines between its markers) from a ``--json-out`` file of
    the networks grid: a sentence naming the CPU and the date, then one row per network."""
    rows = results["grids"]["networks"]
    lines = [
        f"Measured on {results['cpu']}, {results['date']} (torch {results['torch']}, MONAI "
        f"{results['monai']}; `{results['command']}`, then `--write-docs`): each row a real "
        f"`python train.py` run of {results['steps']} optimizer steps on the embedded dataset, "
        f"the steady step's peak RSS rise (`{results['malloc']}`) against "
        "`estimate(cfg).step_peak_growth`; then a budget of "
        f"{100 * results['budget_fraction']:.0f}% of the configured step's estimated total given "
        "to `python plan.py <overrides> memory.budget=X`, and the plan trained with `python "
        "train.py plan=plan.yaml`: its peak counted as the CPU estimate counts a total (tensor "
        "bytes: parameters, gradients and optimizer state held at the step's start, plus the "
        "step's measured rise).",
        "",
        "| network | override | patch / batch | estimated MiB | measured MiB | error "
        "| budget MiB: the planner's answer | planned run: measured peak / budget MiB |",
        "| --- | --- | --- | ---: | ---: | ---: | --- | --- |",
    ]
    for row in rows:
        override = " ".join(
            o for o in row["overrides"] if o.startswith(("model/net=", "model.net."))
        )
        patch = "×".join(str(p) for p in row["patch_size"])
        line = (
            f"| `{row['network']}` | `{override}` | {patch} / {row['batch_size']} "
            f"| {_mib(row['estimated_bytes'])} | {_mib(row['measured_bytes'])} "
            f"| {100 * row['error']:+.1f}% |"
        )
        check = row.get("planner")
        if check is None:
            line += " not run | not run |"
        elif check["answer"] is None:
            line += f" {check['budget_bytes'] / MIB:,.0f}: nothing fits | not trained |"
        else:
            answer = " ".join(f"`{a}`" for a in check["answer"]) or "unchanged"
            verdict = "under" if check["under_budget"] else "**over**"
            line += (
                f" {check['budget_bytes'] / MIB:,.0f}: {answer} "
                f"| {_mib(check['measured_peak_bytes'])} / {check['budget_bytes'] / MIB:,.0f} "
                f"({verdict}) |"
            )
        lines.append(line)
    return "\n".join(lines) + "\n"


def write_docs(results_path: Path, docs: Path = DOCS) -> bool:
    """Replace what lies between the markers of ``docs`` with :func:`networks_table` of the
    results file; returns whether the file changed."""
    results = json.loads(results_path.read_text())
    text = docs.read_text()
    head, found, rest = text.partition(TABLE_START + "\n")
    _, found_end, tail = rest.partition(TABLE_END)
    if not found or not found_end:
        raise SystemExit(f"{docs}: no '{TABLE_START}' ... '{TABLE_END}' markers")
    updated = head + TABLE_START + "\n" + networks_table(results) + TABLE_END + tail
    if updated != text:
        docs.write_text(updated)
    return updated != text


#: the results file of ``--grid networks`` that ``--write-docs`` reads by default
NETWORKS_RESULTS = REPO / "benchmarks" / "results" / "cpu" / "estimator_networks.json"


def main(argv: list[str] | None = None) -> None:
    global RUN_TIMEOUT_S  # --timeout, for every child of this run
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--grid", default="all", choices=["all", *GRIDS])
    parser.add_argument(
        "--malloc-default",
        action="store_true",
        help="CPU: run train.py without MALLOC_MMAP_THRESHOLD_ (glibc reuses freed heap memory)",
    )
    parser.add_argument(
        "--work-dir",
        type=Path,
        default=None,
        help="where the data and run dirs go (default: a temporary folder, removed after)",
    )
    parser.add_argument(
        "--snapshot-dir",
        type=Path,
        default=None,
        help="CUDA: write each run's allocator snapshot here (<grid>_<i>.pickle)",
    )
    parser.add_argument(
        "--shared-cpu",
        action="store_true",
        help="other work ran on the CPU meanwhile: the results file says that its run_seconds "
        "are no speed figure (the memory figures do not depend on it)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=RUN_TIMEOUT_S,
        help=f"seconds a train.py child may run before its config is recorded as failed "
        f"(default {RUN_TIMEOUT_S}; raise it for bf16 configs on a CPU without native bf16)",
    )
    results_io.add_json_out(parser, "estimator_accuracy")
    parser.add_argument(
        "--resume",
        type=Path,
        default=None,
        metavar="RESULTS",
        help="an earlier, incomplete results file of the same grid: its measured configs are "
        "kept, the others run, and the file is rewritten in place",
    )
    parser.add_argument(
        "--write-docs",
        nargs="?",
        type=Path,
        const=NETWORKS_RESULTS,
        default=None,
        metavar="RESULTS",
        help="regenerate docs/networks.md's table from a --grid networks results file "
        f"(default {NETWORKS_RESULTS.relative_to(REPO)}) and run nothing else",
    )
    args = parser.parse_args(argv)
    if args.write_docs is not None:
        changed = write_docs(args.write_docs)
        print(f"{DOCS.relative_to(REPO)}: {'rewritten' if changed else 'unchanged'}")
        return
    if args.snapshot_dir:
        args.snapshot_dir.mkdir(parents=True, exist_ok=True)
    RUN_TIMEOUT_S = args.timeout

    today = datetime.date.today().isoformat()
    print(f"# estimator accuracy against python train.py on {args.device}, {today}")
    print()
    print(f"CPU: {cpu_description()}; torch {torch.__version__}")
    if args.device == "cuda" and torch.cuda.is_available():
        print(f"GPU: {torch.cuda.get_device_name()}")
    malloc = "glibc default" if args.malloc_default else "MALLOC_MMAP_THRESHOLD_=65536"
    print(
        f"child processes: python train.py ... trainer.max_steps={STEPS}"
        + (f"; {malloc}" if args.device == "cpu" else "")
    )
    print()
    grids = GRIDS if args.grid == "all" else {args.grid: GRIDS[args.grid]}
    import monai

    records: dict[str, list[dict]] = {}
    written: list[Path | None] = []
    done: dict[str, dict[str, dict]] = {}
    if args.resume is not None:
        earlier = results_io.load(args.resume)
        if earlier.get("benchmark") != "estimator_accuracy":
            parser.error(f"--resume {args.resume}: not an estimator_accuracy results file")
        for row in earlier["rows"]:
            done.setdefault(row["grid"], {})[row["name"]] = row
        written.append(args.resume)

    def save(
        label: str | None = None, rows: list[dict] | None = None, complete: bool = False
    ) -> None:
        """The results file of the grids so far (rewritten after each config)."""
        if label is not None:
            records[label] = list(rows or [])
        doc = results_io.result(
            "estimator_accuracy",
            [{"grid": g, **r} for g, grid_rows in records.items() for r in grid_rows],
            script=__file__,
            argv=argv,
            device=args.device,
            cpu_description=cpu_description(),
            monai=monai.__version__,
            python=sys.version.split()[0],
            malloc=malloc if args.device == "cpu" else None,
            steps=STEPS,
            budget_fraction=BUDGET_FRACTION,
            timeout_s=RUN_TIMEOUT_S,
            complete=complete,
            run_seconds=(
                "wall time on a CPU shared with other work: not a speed figure"
                if args.shared_cpu
                else "wall time, nothing else running"
            ),
            samples={
                g: {"sample": SAMPLE[g], "frozen_in": frozen_in(g)} for g in (*records, *grids)
            },
            grids=records,
        )
        target = written[0] if written else args.json_out
        path = results_io.write(doc, target, device=args.device)
        if not written:
            written.append(path)

    with tempfile.TemporaryDirectory(prefix="volseg-estimator-") as tmp:
        work_dir = args.work_dir or Path(tmp)
        work_dir.mkdir(parents=True, exist_ok=True)
        for label, grid in grids.items():
            rows = run_grid(
                grid,
                label,
                args.device,
                work_dir,
                args.malloc_default,
                args.snapshot_dir,
                planner=label == "networks" and args.device == "cpu",
                on_record=save,
                done=done.get(label),
            )
            records[label] = rows
    for label, rows in records.items():
        print(f"{label}: {summary_line(rows)}")
    save(complete=True)
    seed = predict(SEED, "cuda", Path(tempfile.gettempdir()))
    print(
        f"reference config (unet_large, batch 2, 1x26x150x320, 16-true) estimated for CUDA in "
        f"{seed['seconds']:.1f} s: peak allocated {seed['peak_allocated'] / MIB:,.0f} MiB, "
        f"reserved {seed['peak_reserved'] / MIB:,.0f} MiB"
    )


if __name__ == "__main__":
    main()
