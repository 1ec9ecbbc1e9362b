"""The shape of a volume after ``data.spacing``: the one rule checks, fingerprint and plan use.

Loading resamples with MONAI's ``Spacing`` (:class:`volseg.data.transforms.Resampled`);
:func:`resampled_shape` asks MONAI the same question from a header, so a check, a fingerprint
or a plan never disagrees with the volume the loader produces.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from monai.data.utils import compute_shape_offset, zoom_affine


def resampled_shape(
    shape_zyx: Sequence[int], affine: np.ndarray, spacing_zyx: Sequence[float]
) -> list[int]:
    """``[D, H, W]`` of a volume after MONAI's ``Spacing`` to ``spacing_zyx``.

    Args:
        shape_zyx: the volume's ``[D, H, W]`` (voxels; after orientation, as loading sees it).
        affine: its 4x4 affine in file axis order ``x, y, z`` (after the same orientation).
        spacing_zyx: the target voxel size ``[z, y, x]`` (the affine's units, e.g. mm).

    MONAI keeps the first and last voxel centres' extent and adds one voxel, rounded half to
    even (``compute_shape_offset`` with ``scale_extent=False``, ``Spacing``'s default), on the
    grid ``zoom_affine`` builds (``Spacing``'s ``diagonal=False``: rotation kept).
    """
    shape_xyz = [int(s) for s in shape_zyx][::-1]
    target = zoom_affine(
        np.asarray(affine, dtype=float), [float(s) for s in spacing_zyx][::-1], diagonal=False
    )
    out_xyz, _ = compute_shape_offset(shape_xyz, np.asarray(affine, dtype=float), target)
    return [max(1, int(s)) for s in out_xyz[::-1]]
