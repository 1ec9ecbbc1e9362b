"""``data.patch_size=auto``: the training patch from the dataset's fingerprint, like nnU-Net
(the median resampled case shape, shrunk to a target: here a voxel budget,
``data.patch_voxels``). The run plan (:mod:`volseg.plan.make`) calls :func:`plan_auto_patch`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import hydra
import numpy as np
from nibabel.affines import voxel_sizes
from omegaconf import DictConfig, OmegaConf

from volseg.data.io import read_geometry
from volseg.data.orientation import oriented_geometry
from volseg.data.transforms import resampled_shape
from volseg.utils.errors import UserInputError

#: the smallest patch side ``auto`` chooses (voxels)
MIN_SIDE = 8


def median_shape(shapes_zyx: Sequence[Sequence[int]]) -> list[int]:
    """Per-axis median of the cases' ``[D, H, W]`` shapes (voxels, rounded down)."""
    return [int(v) for v in np.median(np.asarray(shapes_zyx), axis=0)]


def plan_patch(median_zyx: Sequence[int], max_voxels: int, multiple: int = 8) -> list[int]:
    """The patch ``[D, H, W]`` for a median case shape and a voxel budget: the median rounded up
    to ``multiple`` (so the U-Net's poolings divide it), the longest side shrunk by ``multiple``
    (down to ``MIN_SIDE``) while over ``max_voxels``, then sides grown back where they fit."""
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


def dataset_fingerprint(data_cfg: DictConfig) -> dict[str, object]:
    """What the plan knows of the dataset, from the image headers of the cases that the
    datamodule of ``data_cfg`` finds (an embedded dataset built first): the number of cases, the
    median, smallest and largest ``[D, H, W]`` (resampled to ``data.spacing`` when set) and the
    median voxel spacing ``[z, y, x]`` of the files."""
    options = OmegaConf.to_container(data_cfg, resolve=True)
    options["patch_size"] = [MIN_SIDE] * 3  # a placeholder: finding cases does not use it
    options["batch_size"] = 1  # nor the batch (data.batch_size=auto is planned later)
    datamodule = hydra.utils.instantiate(options)
    datamodule.prepare_data()
    spacing = options.get("spacing")
    shapes, spacings = [], []
    for case in datamodule.find()[0]:
        geometry = read_geometry(case.image_files[0], case.image_key)
        try:
            geometry = oriented_geometry(geometry, options.get("orientation"))
        except ValueError:  # an affine that cannot be reoriented: the check names it
            continue
        shapes.append(resampled_shape(geometry["shape_zyx"][:3], geometry["affine"], spacing))
        spacings.append(voxel_sizes(geometry["affine"])[::-1])  # [z, y, x]
    if not shapes:
        raise UserInputError(f"data.root={data_cfg.get('root')}: no cases found to plan from")
    return {
        "cases": len(shapes),
        "median_shape": median_shape(shapes),
        "min_shape": np.min(shapes, axis=0).tolist(),
        "max_shape": np.max(shapes, axis=0).tolist(),
        "median_spacing": [round(float(v), 6) for v in np.median(spacings, axis=0)],
        "shapes_resampled_to": list(spacing) if spacing is not None else None,
    }


def plan_auto_patch(
    data_cfg: DictConfig, multiple: int, median: Sequence[int]
) -> tuple[list[int], str]:
    """``data.patch_size=auto`` for the ``median`` case shape, sides multiples of ``multiple``,
    within ``data.patch_voxels``; and why, in words."""
    max_voxels = int(data_cfg.get("patch_voxels") or 0)
    if max_voxels < MIN_SIDE**3:
        raise UserInputError(
            f"data.patch_voxels={data_cfg.get('patch_voxels')}: data.patch_size=auto needs a "
            f"voxel budget >= {MIN_SIDE**3}"
        )
    patch = plan_patch(median, max_voxels, multiple=max(multiple, 2))
    return patch, (
        f"median case shape {list(median)}, at most data.patch_voxels={max_voxels} voxels, "
        f"sides multiples of {multiple}"
    )
