"""MONAI dictionary transforms for training patches and whole validation volumes.

Items are ``{"image": path, "label": path}``; after loading, ``image`` is float32
``(C, D, H, W)`` z-scored per volume and ``label`` is ``(1, D, H, W)`` class indices.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from monai.data.utils import compute_shape_offset, zoom_affine
from monai.transforms import (
    ClassesToIndicesd,
    Compose,
    EnsureChannelFirstd,
    EnsureTyped,
    LoadImaged,
    MapTransform,
    NormalizeIntensityd,
    RandAffined,
    RandCropByLabelClassesd,
    RandFlipd,
    Randomizable,
    RandRotate90d,
    RandScaleIntensityd,
    RandShiftIntensityd,
    Resize,
    Spacing,
    SpatialPadd,
    Transposed,
)
from monai.utils import convert_to_tensor

from volseg.data.io import NiftiReader, StackReader
from volseg.data.orientation import Reorientd
from volseg.utils.errors import UserInputError


class Resampled(MapTransform):
    """MONAI ``Spacing`` to ``spacing_zyx`` ``[z, y, x]`` of each key's ``(C, x, y, z)``
    MetaTensor, with its own interpolation mode. Not ``Spacingd``: it treats every ``<key>_*``
    entry as a metadata dict, and ``image_path`` (read by the prediction writers) is a string."""

    def __init__(
        self, keys: Sequence[str], spacing_zyx: Sequence[float], modes: Sequence[str]
    ) -> None:
        super().__init__(keys)
        self.spacing = Spacing(pixdim=[float(v) for v in spacing_zyx][::-1])
        self.modes = dict(zip(keys, modes, strict=True))

    def __call__(self, data: Mapping[str, Any]) -> dict[str, Any]:
        d = dict(data)
        for key in self.key_iterator(d):
            d[key] = self.spacing(d[key], mode=self.modes[key])
        return d


def resampled_shape(
    shape_zyx: Sequence[int], affine: np.ndarray, spacing_zyx: Sequence[float] | None
) -> list[int]:
    """``[D, H, W]`` of a volume ``shape_zyx`` (after orientation) with a 4x4 ``affine`` (file
    axes ``x, y, z``) after :class:`Resampled` to ``spacing_zyx`` ``[z, y, x]`` (the affine's
    units), from a header through ``Spacing``'s own ``zoom_affine`` and ``compute_shape_offset``,
    so checks, fingerprint and plan never disagree with the loaded volume; ``spacing_zyx=None``
    (``data.spacing=null``): not resampled."""
    if spacing_zyx is None:
        return [int(s) for s in shape_zyx]
    shape_xyz = [int(s) for s in shape_zyx][::-1]
    target = zoom_affine(
        np.asarray(affine, dtype=float), [float(s) for s in spacing_zyx][::-1], diagonal=False
    )
    out_xyz, _ = compute_shape_offset(shape_xyz, np.asarray(affine, dtype=float), target)
    return [max(1, int(s)) for s in out_xyz[::-1]]


def load_transforms(
    keys: Sequence[str],
    hdf5_keys: Mapping[str, str] | None = None,
    spacing: Sequence[float] | None = None,
    orientation: str | None = None,
) -> list[MapTransform]:
    """Read the files (NIfTI or TIFF by suffix; HDF5 datasets ``hdf5_keys[key]``; a list of
    files: one per channel), reorient NIfTI volumes to ``orientation``, resample to ``spacing``
    ``[z, y, x]`` (labels by nearest neighbour), reorder to ``(C, D, H, W)``, z-score the image
    per channel."""
    if hdf5_keys is not None:
        loaders = [LoadImaged(k, reader=StackReader(hdf5_keys[k]), image_only=True) for k in keys]
    else:
        loader = LoadImaged(keys, image_only=True)
        # registered readers are tried first, by file suffix
        loader.register(NiftiReader())
        loader.register(StackReader())
        loaders = [loader]
    modes = ["nearest" if k == "label" else "bilinear" for k in keys]
    return [
        *loaders,
        # a 3D file gets a channel axis; channel files of one case are stacked by the reader
        EnsureChannelFirstd(keys),
        # before resampling: data.spacing [z, y, x] names the axes of the reoriented grid
        *([Reorientd(keys, orientation)] if orientation is not None else []),
        # the arrays are still in file axis order (x, y, z) here
        *([Resampled(keys, spacing, modes)] if spacing is not None else []),
        # readers return file axis order (x, y, z); the network works on (z, y, x) = (D, H, W)
        Transposed(keys, indices=(0, 3, 2, 1)),
        NormalizeIntensityd("image", channel_wise=True),
        # plain tensors from here on: MONAI metadata would ride along into logits and metrics
        EnsureTyped(keys, track_meta=False),
    ]


#: the keys of ``data.augment`` (``configs/data/folder.yaml`` explains each, with its default)
AUGMENT_KEYS = (
    "flip_axes",
    "rotate90_planes",
    "rotate_degrees",
    "scale",
    "intensity_scale",
    "intensity_shift",
    "prob",
)


#: where :func:`class_locations` stores each class's voxel locations in an item
LOCATIONS_KEY = "label_cls_indices"


def class_locations(num_classes: int, max_per_class: int | None) -> ClassesToIndicesd:
    """Each class's voxel locations in ``label`` ``(1, D, H, W)``: ``num_classes`` int64
    tensors of flat indices under :data:`LOCATIONS_KEY`, at most ``max_per_class`` each (evenly
    spaced; ``None``: all). Deterministic, so a cached volume keeps them: found once per volume,
    not per sample, like nnU-Net's ``class_locations``."""
    return ClassesToIndicesd(
        "label",
        num_classes=num_classes,
        indices_postfix=LOCATIONS_KEY.removeprefix("label"),
        max_samples_per_class=max_per_class,
    )


def class_balanced_crop(
    keys: Sequence[str],
    patch_size: Sequence[int],
    num_classes: int,
    ratios: Sequence[float] | None = None,
) -> RandCropByLabelClassesd:
    """One ``patch_size`` patch centred on a location (:func:`class_locations`, taken from
    :data:`LOCATIONS_KEY`) of a class drawn with ``ratios`` (equal when None)."""
    return RandCropByLabelClassesd(
        keys,
        label_key="label",
        spatial_size=list(patch_size),
        num_classes=num_classes,
        ratios=list(ratios) if ratios is not None else None,
        num_samples=1,
        indices_key=LOCATIONS_KEY,
        warn=False,
    )


class OwnPatchd(MapTransform):
    """A copy of each key's patch: a crop is a view into the volume, and with the cache used in
    place (``CacheDataset(copy_cache=False)``) no later transform may write into it. A plain
    tensor: cloning a ``MetaTensor`` would deep-copy its volume's metadata for every sample."""

    def __call__(self, data: Mapping[str, Any]) -> dict[str, Any]:
        d = dict(data)
        for key in self.key_iterator(d):
            d[key] = convert_to_tensor(d[key], track_meta=False).clone()
        return d


class RandCropWithContextd(Randomizable, MapTransform):
    """A class-balanced ``patch_size`` patch (its centre drawn as ``RandCropByLabelClassesd``
    draws it, so patches reach every part of the volume) cut out of ``(C, D, H, W)`` volumes
    with ``context`` ``[d, h, w]`` extra voxels on each side, for a later ``RandAffined`` to
    resample from without padding its corners. Only the window's part beyond the volume is
    zero-padded, so the cached volumes keep their size."""

    def __init__(
        self,
        keys: Sequence[str],
        patch_size: Sequence[int],
        context: Sequence[int],
        num_classes: int,
        ratios: Sequence[float] | None = None,
    ) -> None:
        MapTransform.__init__(self, keys)
        self.chooser = class_balanced_crop(keys, patch_size, num_classes, ratios)
        self.patch_size = [int(p) for p in patch_size]
        self.context = [int(c) for c in context]

    def set_random_state(self, seed: int | None = None, state: Any = None) -> RandCropWithContextd:
        self.chooser.set_random_state(seed, state)
        return self

    def __call__(self, data: Mapping[str, Any]) -> list[dict[str, Any]]:
        """One item, in a list as ``RandCropByLabelClassesd`` returns it."""
        out = dict(data)
        self.chooser.randomize(label=out["label"], indices=out.pop(LOCATIONS_KEY, None))
        centre = [int(c) for c in self.chooser.cropper.centers[0]]
        # the window in the volume's coordinates; only its part beyond the volume is padded, so
        # a large volume is never copied whole
        lows = [
            c - p // 2 - m for c, p, m in zip(centre, self.patch_size, self.context, strict=True)
        ]
        sizes = [p + 2 * m for p, m in zip(self.patch_size, self.context, strict=True)]
        for key in self.key_iterator(out):
            volume = torch.as_tensor(out[key])
            window = list(zip(lows, sizes, volume.shape[1:], strict=True))
            inside = [slice(max(lo, 0), min(lo + n, dim)) for lo, n, dim in window]
            # F.pad: last axis first
            pad = [v for lo, n, dim in window[::-1] for v in (max(-lo, 0), max(lo + n - dim, 0))]
            out[key] = torch.nn.functional.pad(volume[(slice(None), *inside)], pad)
        return [out]


def augment_options(augment: Mapping[str, Any]) -> dict[str, Any]:
    """``data.augment`` checked: every key of :data:`AUGMENT_KEYS`, rotation and zoom in range."""
    options = dict(augment)
    for problem, keys in (
        ("unknown", set(options) - set(AUGMENT_KEYS)),
        ("missing", set(AUGMENT_KEYS) - set(options)),
    ):
        if keys:
            raise UserInputError(
                f"data.augment: {problem} key(s) {sorted(keys)}; expected {list(AUGMENT_KEYS)}"
            )
    for key in AUGMENT_KEYS[2:]:  # the numbers
        if not isinstance(options[key], int | float):
            raise UserInputError(f"data.augment.{key}={options[key]}: expected a number")
    for key, limit in (("rotate_degrees", 90.0), ("scale", 1.0)):
        if not 0.0 <= float(options[key]) < limit:
            raise UserInputError(
                f"data.augment.{key}={options[key]}: need a value in [0, {limit:g})"
            )
    return options


def affine_crop_size(patch_size: Sequence[int], degrees: float, scale: float) -> list[int]:
    """The crop ``[D, H, W]`` from which a ``patch_size`` patch rotated by up to ``degrees``
    about each axis and zoomed by up to 1 ± ``scale`` is resampled without padding: each side
    grows by what a rotation turns into it (sin of the angle) and by the zoom, evenly, so the
    patch sits on the crop's grid when no affine is drawn."""
    spread = math.sin(math.radians(degrees))
    total = sum(patch_size)
    needed = [math.ceil((1.0 + scale) * (side + spread * (total - side))) for side in patch_size]
    return [s + 2 * math.ceil((n - s) / 2) for s, n in zip(patch_size, needed, strict=True)]


def augment_transforms(patch_size: Sequence[int], augment: Mapping[str, Any]) -> list[MapTransform]:
    """Random augmentations of a training patch, from ``data.augment`` (:func:`augment_options`;
    null ``flip_axes``/``rotate90_planes``: none). Rotation and zoom resample from a crop
    enlarged by :func:`affine_crop_size`."""
    options = augment_options(augment)
    keys = ["image", "label"]
    prob = float(options["prob"])
    out: list[MapTransform] = []
    degrees, scale = float(options["rotate_degrees"]), float(options["scale"])
    if degrees or scale:
        out.append(
            RandAffined(
                keys,
                spatial_size=list(patch_size),
                prob=prob,
                rotate_range=[math.radians(degrees)] * 3,
                scale_range=[scale] * 3,
                mode=["bilinear", "nearest"],
                padding_mode="zeros",
                cache_grid=True,
            )
        )
    for axis in options["flip_axes"] or []:
        if int(axis) not in (0, 1, 2):
            raise UserInputError(f"data.augment.flip_axes: {axis} is not a patch axis (0, 1, 2)")
        out.append(RandFlipd(keys, prob=prob, spatial_axis=int(axis)))
    for plane in options["rotate90_planes"] or []:
        a, b = (int(v) for v in plane)
        if {a, b} - {0, 1, 2} or a == b or patch_size[a] != patch_size[b]:
            raise UserInputError(
                f"data.augment.rotate90_planes: {list(plane)} needs two different axes of equal "
                f"size in data.patch_size={list(patch_size)} (a 90° turn keeps the shape)"
            )
        out.append(RandRotate90d(keys, prob=prob, max_k=3, spatial_axes=(a, b)))
    factor, offset = float(options["intensity_scale"]), float(options["intensity_shift"])
    if factor:
        out.append(RandScaleIntensityd("image", factors=factor, prob=prob))
    if offset:
        out.append(RandShiftIntensityd("image", offsets=offset, prob=prob))
    return out


def train_transforms(
    patch_size: Sequence[int],
    num_classes: int,
    class_ratios: Sequence[float] | None,
    augment: Mapping[str, Any],
    max_locations_per_class: int | None,
    **load_options: Any,
) -> Compose:
    """Loading (:func:`load_transforms`), zero-padding to the patch, then a patch centred on a
    voxel of a class drawn with ``class_ratios`` (equal by default, so small classes are seen as
    often as background, like nnU-Net's foreground oversampling) and its augmentations. All
    before the crop is deterministic: a cached volume holds its padding and class locations."""
    keys = ["image", "label"]
    options = augment_options(augment)
    crop = affine_crop_size(patch_size, float(options["rotate_degrees"]), float(options["scale"]))
    sampler: MapTransform = class_balanced_crop(keys, patch_size, num_classes, class_ratios)
    if crop != list(patch_size):
        context = [(c - p) // 2 for c, p in zip(crop, patch_size, strict=True)]
        sampler = RandCropWithContextd(keys, patch_size, context, num_classes, class_ratios)
    return Compose(
        [
            *load_transforms(keys, **load_options),
            SpatialPadd(keys, spatial_size=list(patch_size)),
            class_locations(num_classes, max_locations_per_class),
            sampler,
            OwnPatchd(keys),
            *augment_transforms(patch_size, options),
            # plain tensors: MONAI metadata of patches from different volumes does not collate
            EnsureTyped(keys, track_meta=False),
        ]
    )


def eval_transforms(with_label: bool = True, **load_options: Any) -> Compose:
    """Loading only (:func:`load_transforms`): whole volumes for sliding-window inference."""
    keys = ["image", "label"] if with_label else ["image"]
    return Compose(load_transforms(keys, **load_options))


def to_shape(probs: torch.Tensor, shape_zyx: Sequence[int]) -> torch.Tensor:
    """Probabilities ``(K, D', H', W')`` on a resampled grid, interpolated back to the input's
    ``(D, H, W)`` grid (same field of view; corner voxel centres aligned, as MONAI ``Spacing``
    keeps the first voxel's position)."""
    resize = Resize(list(shape_zyx), mode="trilinear", align_corners=True)
    return convert_to_tensor(resize(probs), track_meta=False).clamp_(0.0, 1.0)


def labels_to_shape(
    labels: torch.Tensor, num_classes: int, shape_zyx: Sequence[int]
) -> torch.Tensor:
    """Class indices ``(D', H', W')`` on a resampled grid back on the input's ``(D, H, W)`` grid,
    through the same interpolation as :func:`to_shape` (of their one-hot encoding)."""
    one_hot = torch.nn.functional.one_hot(labels.long(), num_classes).permute(3, 0, 1, 2).float()
    return to_shape(one_hot, shape_zyx).argmax(dim=0)
