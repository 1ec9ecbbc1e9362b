"""The shape of a volume after ``data.spacing``, asked of MONAI's ``Spacing`` (which loading
uses) from a header, so checks, fingerprint and plan never disagree with the loaded volume."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from monai.data.utils import compute_shape_offset, zoom_affine


def resampled_shape(
    shape_zyx: Sequence[int], affine: np.ndarray, spacing_zyx: Sequence[float] | None
) -> list[int]:
    """``[D, H, W]`` of a volume ``shape_zyx`` (after orientation) with a 4x4 ``affine`` (file
    axes ``x, y, z``) after MONAI's ``Spacing`` to ``spacing_zyx`` ``[z, y, x]`` (the affine's
    units), through ``Spacing``'s own ``zoom_affine`` and ``compute_shape_offset``;
    ``spacing_zyx=None`` (``data.spacing=null``): not resampled."""
    if spacing_zyx is None:
        return [int(s) for s in shape_zyx]
    shape_xyz = [int(s) for s in shape_zyx][::-1]
    target = zoom_affine(
        np.asarray(affine, dtype=float), [float(s) for s in spacing_zyx][::-1], diagonal=False
    )
    out_xyz, _ = compute_shape_offset(shape_xyz, np.asarray(affine, dtype=float), target)
    return [max(1, int(s)) for s in out_xyz[::-1]]
