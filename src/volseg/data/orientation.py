"""One orientation for every NIfTI case (``data.orientation``, MONAI ``Orientation`` from the
affine), so the network never sees mirrored anatomy, and predictions put back into each input's
own with the inverse of the same transform (nibabel's orientation arithmetic, which MONAI uses
too). TIFF stacks and HDF5 datasets carry no orientation and are read as stored.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from monai.transforms import MapTransform, Orientation
from nibabel import orientations

from volseg.data.io import volume_format
from volseg.utils.errors import UserInputError

#: MONAI's (and nibabel's) default meaning of the axis codes: RAS+ world coordinates
LABELS = (("L", "R"), ("P", "A"), ("I", "S"))


def _transform(affine: np.ndarray, axcodes: str) -> np.ndarray:
    """nibabel orientation transform from the file's voxel axes to ``axcodes`` (raises
    ``ValueError`` for an affine whose axes cannot be told apart)."""
    source = orientations.io_orientation(np.asarray(affine, dtype=float))
    if np.isnan(source).any():
        raise ValueError("an axis of its affine has no direction (a zero or collinear column)")
    return orientations.ornt_transform(source, orientations.axcodes2ornt(axcodes, LABELS))


def orientation_problem(geometry: Mapping[str, Any], axcodes: str | None) -> str | None:
    """Why a volume of this :func:`volseg.data.io.read_geometry` cannot be reoriented to
    ``axcodes``; ``None`` if it can (TIFF/HDF5 are read as stored)."""
    if axcodes is None or geometry.get("format") != "nifti":
        return None
    affine = np.asarray(geometry["affine"], dtype=float)
    if affine.shape != (4, 4) or not np.isfinite(affine).all():
        return f"its affine is not a finite 4x4 matrix, so data.orientation={axcodes} cannot apply"
    try:
        _transform(affine, axcodes)
    except ValueError as err:
        return f"cannot be reoriented to data.orientation={axcodes}: {err}"
    return None


def check_axcodes(axcodes: str | None) -> None:
    """One :class:`UserInputError` naming ``data.orientation`` unless it is three distinct axis
    codes (or ``None``)."""
    try:
        if axcodes is None or len(orientations.axcodes2ornt(str(axcodes), LABELS)) == 3:
            return
    except ValueError:  # a code nibabel does not know
        pass
    raise UserInputError(
        f"data.orientation={axcodes}: expected three axis codes, one of L/R, P/A, I/S each "
        "(e.g. RAS, LPS), or null to read volumes as stored"
    )


def oriented_geometry(geometry: Mapping[str, Any], axcodes: str | None) -> dict[str, Any]:
    """A :func:`volseg.data.io.read_geometry` result as loading sees it after reorienting to
    ``axcodes``: ``shape_zyx`` permuted, ``affine`` of the reoriented grid. TIFF/HDF5 (and
    ``axcodes=None``) unchanged."""
    out = dict(geometry)
    if axcodes is None or geometry.get("format") != "nifti":
        return out
    shape_xyz = list(geometry["shape_zyx"])[:3][::-1]
    transform = _transform(geometry["affine"], axcodes)
    order = transform[:, 0].astype(int)  # new axis i is old axis order[i]
    shape_new = [shape_xyz[i] for i in np.argsort(order)]
    out["shape_zyx"] = tuple(shape_new[::-1]) + tuple(geometry["shape_zyx"][3:])
    out["affine"] = geometry["affine"] @ orientations.inv_ornt_aff(transform, shape_xyz)
    return out


def to_input_orientation(
    array_zyx: np.ndarray | torch.Tensor, affine: np.ndarray, axcodes: str | None, fmt: str
) -> np.ndarray | torch.Tensor:
    """Undo the reorientation of a prediction: ``(..., D, H, W)`` on the grid loading produced
    for an input of ``affine`` (file axes) and format ``fmt`` back on the input's own grid."""
    if axcodes is None or fmt != "nifti":
        return array_zyx
    _transform(affine, axcodes)  # the same error as loading for an affine it cannot use
    back = orientations.ornt_transform(
        orientations.axcodes2ornt(axcodes, LABELS), orientations.io_orientation(affine)
    )
    is_tensor = isinstance(array_zyx, torch.Tensor)
    array = np.asarray(array_zyx.numpy() if is_tensor else array_zyx)
    # reversed, the array's axes are (x, y, z, ...): nibabel reorients its first three
    array = np.ascontiguousarray(orientations.apply_orientation(array.T, back).T)
    return torch.from_numpy(array) if is_tensor else array


class Reorientd(MapTransform):
    """MONAI ``Orientation`` to ``axcodes`` (e.g. ``RAS``) of each key's ``(C, x, y, z)``
    MetaTensor loaded from a NIfTI file; TIFF stacks and HDF5 datasets pass as stored."""

    def __init__(self, keys: Sequence[str], axcodes: str) -> None:
        super().__init__(keys)
        self.orientation = Orientation(axcodes=axcodes, labels=LABELS)

    def __call__(self, data: Mapping[str, Any]) -> dict[str, Any]:
        d = dict(data)
        for key in self.key_iterator(d):
            source = str(getattr(d[key], "meta", {}).get("filename_or_obj", ""))
            if volume_format(source) == "nifti":
                d[key] = self.orientation(d[key])
        return d
