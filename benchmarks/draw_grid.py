"""Draw a held-out grid of configs for ``benchmarks/estimator_accuracy.py``.

A held-out grid is drawn by a seeded generator from the ranges below, written to
``benchmarks/grids/<name>.json`` and committed before any of its configs is run. The commit that
adds the file freezes it: ``estimator_accuracy.py --grid <name>`` records that commit in its
results file, and a grid whose file has changed since is no longer held out. Once a change to the
estimator has been judged on a grid's results, the grid is in sample, and the next check draws a
new one (another seed, another name).

    python -m benchmarks draw_grid --seed 20261203 --name held-out-2026-12-03-b

The ranges (:data:`RANGES`): the network, one of ``configs/model/net`` (volseg's ``unet3d`` with
drawn widths, depth and norm, its presets, a MONAI network at its config's own size, or another
project's U-Net at its shipped config: nnU-Net's and pytorch-3dunet's, the networks extra); the
precision; batch; patch (each side a multiple of the network's divisor, within the embedded
dataset's 32×96×96 volumes, square in y and x, small enough that an emulated-bf16 step on an
AVX2 CPU takes seconds to minutes); the number of classes; and, for volseg's U-Net, the memory
levers that act on a CPU (activation checkpointing, loss checkpointing, ``channels_last``,
gradient accumulation).
Activation offload is left out: it moves nothing on a CPU. MONAI's and other projects' networks
get no lever (their checkpointing is their own constructor argument).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

GRIDS_DIR = Path(__file__).resolve().parent / "grids"

#: what the generator draws from, uniformly unless a list repeats a value
RANGES: dict[str, Any] = {
    # configs/model/net choices; unet3d three times: its widths, depth and norm are drawn too
    "network": [
        "unet3d",
        "unet3d",
        "unet3d",
        "unet_tiny",
        "unet_small_gn",
        "basic_unet",
        "dynunet",
        "segresnet",
        "swin_unetr",
        # other projects' U-Nets at their shipped configs (the networks extra)
        "plain_conv_unet",
        "residual_encoder_unet",
        "pytorch3dunet_unet3d",
        "pytorch3dunet_residual_unet3d",
    ],
    "precision": ["32", "bf16-mixed", "bf16-true", "16-mixed"],
    "batch_size": [1, 2, 3],
    "num_classes": [2, 3, 5, 8, 13, 21],
    # patch sides before rounding to the network's divisor (the embedded volumes: 32x96x96); y
    # and x one side: the embedded dataset turns patches by 90° in the y-x plane
    "patch_z": [16, 24, 32],
    "patch_yx": [32, 48, 64],
    # unet3d only
    "first_width": [8, 12, 16, 24],
    "depth": [3, 4, 5],
    "norm": ["batch", "instance", "group"],
    "upsampling": ["trilinear", "transposed"],
    # volseg's U-Net only (unet3d, unet_tiny, unet_small_gn)
    "activation_checkpointing": ["none", "none", "encoder", "decoder", "all"],
    "checkpoint_loss": [False, False, True],
    "channels_last": [False, False, True],
    "accumulate_grad_batches": [1, 1, 2],
}

#: each patch side must divide by this (``configs/model/net/*.yaml``); volseg's U-Net plans its
#: pooling from the patch (``pooling=auto``), so any even side works there
DIVISOR = {
    "basic_unet": 16,
    "dynunet": 16,
    "segresnet": 8,
    "swin_unetr": 32,
    "plain_conv_unet": 16,
    "residual_encoder_unet": 16,
    "pytorch3dunet_unet3d": 8,
    "pytorch3dunet_residual_unet3d": 16,
}
#: SwinUNETR's deepest level (the patch / 32) needs more than one voxel: one side of 64 or more
MIN_SIDE = {"swin_unetr": 64}
VOLUME = (32, 96, 96)
UNET = ("unet3d", "unet_tiny", "unet_small_gn")


def _side(rng: random.Random, choices: list[int], divisor: int, limit: int, least: int = 0) -> int:
    """A drawn side rounded up to a multiple of ``divisor``, at least ``least``, at most
    ``limit``."""
    side = max(rng.choice(choices), least)
    return min(-(-side // divisor) * divisor, limit // divisor * divisor)


def draw_config(
    rng: random.Random, ranges: dict[str, Any] = RANGES, divisors: dict[str, int] = DIVISOR
) -> tuple[str, list[str]]:
    """One config from ``ranges``: its name and its ``train.py`` overrides."""
    network = rng.choice(ranges["network"])
    precision = rng.choice(ranges["precision"])
    batch = rng.choice(ranges["batch_size"])
    classes = rng.choice(ranges["num_classes"])
    divisor = divisors.get(network, 2)
    side = _side(rng, ranges["patch_yx"], divisor, min(VOLUME[1:]), MIN_SIDE.get(network, 0))
    patch = [_side(rng, ranges["patch_z"], divisor, VOLUME[0]), side, side]
    overrides = [f"model/net={network}"]
    name = [network]
    if network == "unet3d":
        first = rng.choice(ranges["first_width"])
        depth = rng.choice(ranges["depth"])
        widths = [min(first * 2**i, 256) for i in range(depth)]
        norm = rng.choice(ranges["norm"])
        upsampling = rng.choice(ranges["upsampling"])
        overrides += [
            f"model.net.widths=[{','.join(map(str, widths))}]",
            f"model.net.norm={norm}",
            f"model.net.upsampling={upsampling}",
            "model.net.pooling=auto",
        ]
        name = [f"[{','.join(map(str, widths))}] {norm}-norm {upsampling}"]
    levers = []
    if network in UNET:
        checkpointing = rng.choice(ranges["activation_checkpointing"])
        loss = rng.choice(ranges["checkpoint_loss"])
        channels_last = rng.choice(ranges["channels_last"])
        accumulate = rng.choice(ranges["accumulate_grad_batches"])
        if checkpointing != "none":
            overrides.append(f"model.activation_checkpointing={checkpointing}")
            levers.append(f"checkpointing={checkpointing}")
        if loss:
            overrides.append("model.checkpoint_loss=true")
            levers.append("loss checkpointed")
        if channels_last:
            overrides.append("model.channels_last=true")
            levers.append("channels_last")
        if accumulate > 1:
            overrides.append(f"trainer.accumulate_grad_batches={accumulate}")
            levers.append(f"x{accumulate} accumulation")
    overrides += [
        f"num_classes={classes}",
        f"data.batch_size={batch}",
        f"data.patch_size=[{','.join(map(str, patch))}]",
        f"trainer.precision={precision}",
    ]
    name += [*levers, precision, f"b{batch}", "x".join(map(str, patch)), f"{classes} classes"]
    return " ".join(name[:-1]) + f", {name[-1]}", overrides


def draw(
    seed: int, count: int, ranges: dict[str, Any] = RANGES, divisors: dict[str, int] = DIVISOR
) -> list[tuple[str, list[str]]]:
    """``count`` configs from ``random.Random(seed)`` and ``ranges``, no two alike (a frozen
    grid's file states the ranges and divisors it was drawn from)."""
    rng = random.Random(seed)
    grid: list[tuple[str, list[str]]] = []
    while len(grid) < count:
        config = draw_config(rng, ranges, divisors)
        if all(config[1] != other for _, other in grid):
            grid.append(config)
    return grid


def grid_document(name: str, seed: int, count: int) -> dict[str, Any]:
    """The grid file's contents: how it was drawn, then its configs."""
    return {
        "name": name,
        "sample": "held out",
        "drawn_by": f"python -m benchmarks draw_grid --seed {seed} --count {count} --name {name}",
        "seed": seed,
        "ranges": RANGES,
        "divisor": DIVISOR,
        "configs": [{"name": n, "overrides": o} for n, o in draw(seed, count)],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--count", type=int, default=12)
    parser.add_argument("--name", required=True, help="the grid's name: benchmarks/grids/NAME.json")
    args = parser.parse_args(argv)
    path = GRIDS_DIR / f"{args.name}.json"
    if path.exists():
        print(f"error: {path} exists: a frozen grid is never redrawn; pick another name")
        return 2
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(grid_document(args.name, args.seed, args.count), indent=2) + "\n")
    print(f"Wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
