"""``data.patch_size=auto``: the training patch from the dataset's fingerprint, like nnU-Net.

nnU-Net starts from the median (resampled) shape of the training cases and shrinks the patch
until it fits its memory target; the network then pools each axis while it keeps at least 4
voxels, so the bottleneck sees a few voxels and the receptive field covers the structures. Here
the target is a voxel budget (``data.patch_voxels``); the pooling is ``model.net.pooling=auto``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import hydra
import numpy as np
from omegaconf import DictConfig, OmegaConf, open_dict

from volseg.data.cases import resampled_shape
from volseg.data.io import read_geometry
from volseg.data.orientation import oriented_geometry
from volseg.models.unet import pooling_factors, total_pooling
from volseg.utils.errors import UserInputError

log = logging.getLogger(__name__)

#: the smallest patch side ``auto`` chooses (voxels)
MIN_SIDE = 8


def median_shape(shapes_zyx: Sequence[Sequence[int]]) -> list[int]:
    """Per-axis median of the cases' ``[D, H, W]`` shapes (voxels, rounded down)."""
    return [int(v) for v in np.median(np.asarray(shapes_zyx), axis=0)]


def plan_patch(median_zyx: Sequence[int], max_voxels: int, multiple: int = 8) -> list[int]:
    """The patch ``[D, H, W]`` for a median case shape and a voxel budget.

    Each side starts at the median shape rounded up to ``multiple`` (so the U-Net's poolings
    divide it); while the patch holds more than ``max_voxels`` voxels, the longest side (then
    the one largest relative to the median shape) shrinks by ``multiple``, down to ``MIN_SIDE``;
    then sides that fit grow back by ``multiple`` (most shrunk first). A dataset smaller than
    the budget is taken whole (padded to the multiple).
    """
    median = [max(int(m), 1) for m in median_zyx]
    cap = [max(MIN_SIDE, multiple * math.ceil(m / multiple)) for m in median]
    patch = list(cap)
    while math.prod(patch) > max_voxels:
        shrinkable = [a for a in range(3) if patch[a] - multiple >= MIN_SIDE]
        if not shrinkable:
            break
        # the longest side first: thin axes (few slices) are kept, the patch tends to a cube
        axis = max(shrinkable, key=lambda a: (patch[a], patch[a] / median[a]))
        patch[axis] -= multiple
    # a step down may overshoot: give voxels back where they fit, the most shrunk side first
    for axis in sorted(range(3), key=lambda a: patch[a] / median[a]):
        while (
            patch[axis] + multiple <= cap[axis]
            and math.prod(patch) // patch[axis] * (patch[axis] + multiple) <= max_voxels
        ):
            patch[axis] += multiple
    return patch


def case_shapes(data_cfg: DictConfig) -> list[list[int]]:
    """``[D, H, W]`` of every case's image (headers only) of the dataset ``data_cfg`` describes
    (any layout: its datamodule finds the cases; an embedded dataset is generated first), on the
    resampled grid when ``data.spacing`` is set."""
    options = OmegaConf.to_container(data_cfg, resolve=True)
    options["patch_size"] = [MIN_SIDE] * 3  # a placeholder: finding cases does not use it
    datamodule = hydra.utils.instantiate(options)
    datamodule.prepare_data()
    cases, _ = datamodule.find()
    spacing = options.get("spacing")
    shapes = []
    for case in cases:
        geometry = read_geometry(case.image_files[0], case.image_key)
        try:
            geometry = oriented_geometry(geometry, options.get("orientation"))
        except ValueError:  # an affine that cannot be reoriented: the check names it
            continue
        shape = list(geometry["shape_zyx"])[:3]
        if spacing is not None:
            shape = resampled_shape(shape, geometry["affine"], spacing)
        shapes.append(shape)
    return shapes


def resolve_auto_patch(cfg: DictConfig) -> list[int] | None:
    """Replace ``data.patch_size=auto`` in ``cfg`` by a patch planned from the data (before
    anything interpolates it: ``model.net.patch_size`` and ``model.inferer.roi_size`` follow
    ``${data.patch_size}``). An explicit patch is left as it is. Logs one line saying what was
    chosen and why; returns the patch (``None`` when nothing was auto)."""
    data = cfg.get("data")
    if data is None or str(data.get("patch_size")) != "auto":
        return None
    max_voxels = int(data.get("patch_voxels") or 0)
    if max_voxels < MIN_SIDE**3:
        raise UserInputError(
            f"data.patch_voxels={data.get('patch_voxels')}: data.patch_size=auto needs a voxel "
            f"budget >= {MIN_SIDE**3}"
        )
    spacing = data.get("spacing")
    shapes = case_shapes(data)
    if not shapes:
        raise UserInputError(
            f"data.patch_size=auto: no cases found in data.root={data.get('root')} to plan from"
        )
    net = cfg.get("model", {}).get("net") or {}
    widths = list(net.get("widths") or [0, 0, 0, 0])
    pooling = net.get("pooling")
    # the patch must divide by what the network pools: 2^(levels - 1) per axis at most
    multiple = 2 ** (len(widths) - 1)
    median = median_shape(shapes)
    patch = plan_patch(median, max_voxels, multiple=max(multiple, 2))
    factors = pooling_factors(widths, pooling if pooling is not None else None, patch)
    bottleneck = [p // f for p, f in zip(patch, total_pooling(factors), strict=True)]
    log.info(
        "data.patch_size=auto -> %s: median case shape %s (%d cases%s), at most "
        "data.patch_voxels=%d voxels, sides multiples of %d; bottleneck %s voxels after "
        "model.net.pooling=%s",
        patch,
        median,
        len(shapes),
        f", resampled to data.spacing={list(spacing)}" if spacing is not None else "",
        max_voxels,
        multiple,
        bottleneck,
        pooling if pooling is not None else "null",
    )
    with open_dict(cfg):
        cfg.data.patch_size = patch
    return patch
