"""Finding the cases of a dataset folder, splitting them, and checking them before training."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from volseg.data.io import VOLUME_SUFFIXES, match_suffix, read_array, read_geometry, split_suffix
from volseg.data.orientation import orientation_problem, oriented_geometry
from volseg.data.transforms import resampled_shape
from volseg.utils.errors import UserInputError


@dataclass(frozen=True)
class Case:
    """One image/label pair; ``name`` names the case (and its prediction file). ``image`` is
    one file, or one file per channel (stacked as channels when loaded)."""

    name: str
    image: Path | tuple[Path, ...]
    label: Path | None
    # HDF5: the datasets of image and label inside their files (None for NIfTI/TIFF)
    image_key: str | None = None
    label_key: str | None = None

    @property
    def image_files(self) -> tuple[Path, ...]:
        return self.image if isinstance(self.image, tuple) else (self.image,)

    def as_dict(self) -> dict[str, Any]:
        files = [str(p) for p in self.image_files]
        image = files[0] if len(files) == 1 else files
        item = {"name": self.name, "image": image, "image_path": files[0]}
        if self.label is not None:
            item["label"] = str(self.label)
        return item


def volume_files(folder: Path, suffixes: Sequence[str] = VOLUME_SUFFIXES) -> dict[str, Path]:
    """``{name: path}`` of the files in ``folder`` ending with one of ``suffixes`` (any case),
    hidden ones left out (macOS writes ``._<name>`` metadata files beside each file it copies or
    archives, e.g. in the Decathlon's tar files)."""
    return {
        p.name: p
        for p in sorted(folder.iterdir())
        if match_suffix(p.name, suffixes) and p.is_file() and not p.name.startswith(".")
    }


def pairing_problems(
    images: dict[str, Path],
    labels: dict[str, Path],
    labels_dir: Path,
    images_dir: Path,
    note: str = "",
) -> list[str]:
    """An image without a label of its name and a label without an image (``images_dir/<name>``,
    ``note`` added), each named with the file expected."""
    return [
        f"{path}: image has no label (expected {labels_dir / name})"
        for name, path in images.items()
        if name not in labels
    ] + [
        f"{path}: label has no image (expected {images_dir / name}{note})"
        for name, path in labels.items()
        if name not in images
    ]


def find_cases(root: str | Path) -> list[Case]:
    """Pair ``root/images/NAME`` with ``root/labels/NAME`` (NIfTI or TIFF); one
    :class:`UserInputError` names every unpaired file, or a missing/empty folder."""
    root = Path(root)
    if not root.is_dir():
        raise UserInputError(
            f"data.root={root}: folder does not exist. Point data.root at a folder with images/ "
            "and labels/ (or leave data at its default to use the embedded synthetic dataset)."
        )
    folders = {sub: root / sub for sub in ("images", "labels")}
    missing = [f"{path}: folder is missing" for path in folders.values() if not path.is_dir()]
    if missing:
        raise UserInputError(f"data.root={root}: not a dataset folder", missing)
    images, labels = (volume_files(path) for path in folders.values())
    problems = pairing_problems(images, labels, folders["labels"], folders["images"])
    if problems:
        raise UserInputError(f"data.root={root}: images and labels do not pair up", problems)
    if not images:
        raise UserInputError(
            f"data.root={root}: no volumes found in {folders['images']} "
            f"(supported: {', '.join(VOLUME_SUFFIXES)})"
        )
    return [Case(n, images[n], labels[n]) for n in images]


def find_inputs(
    path: str | Path, suffixes: Sequence[str] = VOLUME_SUFFIXES, key: str | None = None
) -> list[Case]:
    """Images to predict: the file ``path``, or every volume file in the folder ``path`` (HDF5:
    their dataset ``key``)."""
    path = Path(path)
    if path.is_file():
        if not str(path).lower().endswith(tuple(suffixes)):
            raise UserInputError(
                f"input={path}: unsupported file type (expected one of {', '.join(suffixes)})"
            )
        files = [path]
    elif path.is_dir():
        files = list(volume_files(path, suffixes).values())
        if not files:
            raise UserInputError(
                f"input={path}: no volume files in this folder (supported: {', '.join(suffixes)})"
            )
    else:
        raise UserInputError(f"input={path}: no such file or folder")
    return [Case(p.name, p, None, image_key=key) for p in files]


def _read_splits(path: Path, expected: str) -> Any:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise UserInputError(f"{path}: not valid JSON, expected {expected} ({err})") from None


def _named_split(
    splits: Any, source: str, expected: str, by_key: dict[str, Case]
) -> tuple[list[Case], list[Case]]:
    """The cases of ``{"train": [...], "val": [...]}``; entries are file names or case ids."""
    try:
        names = {part: [str(n) for n in splits[part]] for part in ("train", "val")}
    except (KeyError, TypeError) as err:
        raise UserInputError(f"{source}: expected {expected} (missing {err})") from None
    unknown = [n for part in names.values() for n in part if n not in by_key]
    if unknown:
        raise UserInputError(
            f"{source}: names not found among the dataset's cases (file names or case ids, "
            f"e.g. {next(iter(by_key))})",
            unknown,
        )
    return [by_key[n] for n in names["train"]], [by_key[n] for n in names["val"]]


def split_cases(
    cases: Sequence[Case], root: str | Path, val_fraction: float, seed: int, fold: int | None = None
) -> tuple[list[Case], list[Case]]:
    """Train/val split from ``root/splits.json`` (``{"train": [...], "val": [...]}``), else
    fold ``fold`` (``None``: 0) of nnU-Net's ``root/splits_final.json`` (a list of such), else a
    seeded random ``val_fraction``; entries are file names or case ids (``case_000``)."""
    # case ids (case_000 of case_000.nii.gz) as nnU-Net's splits_final.json names cases
    by_key = {split_suffix(c.name)[0]: c for c in cases} | {c.name: c for c in cases}
    root = Path(root)
    splits_file, folds_file = root / "splits.json", root / "splits_final.json"
    if fold is not None and not folds_file.is_file():
        raise UserInputError(
            f"data.fold={fold}: needs nnU-Net's splits_final.json in {root} (not found)"
        )
    if splits_file.is_file() and fold is None:
        expected = '{"train": [names], "val": [names]}'
        return _named_split(_read_splits(splits_file, expected), str(splits_file), expected, by_key)
    if folds_file.is_file():
        expected = '[{"train": [ids], "val": [ids]}, ...] (one entry per fold)'
        folds = _read_splits(folds_file, expected)
        if not isinstance(folds, list) or not folds:
            raise UserInputError(f"{folds_file}: expected {expected}")
        index = 0 if fold is None else int(fold)
        if not 0 <= index < len(folds):
            raise UserInputError(
                f"data.fold={fold}: {folds_file} has {len(folds)} folds (0 to {len(folds) - 1})"
            )
        return _named_split(folds[index], f"{folds_file} fold {index}", expected, by_key)
    if not 0.0 < val_fraction < 1.0 or len(cases) < 2:
        raise UserInputError(
            f"data.val_fraction={val_fraction}: need 0 < val_fraction < 1 and at least 2 cases "
            f"(found {len(cases)}), or a splits.json in {root}"
        )
    order = np.random.default_rng(seed).permutation(len(cases))
    num_val = max(1, round(val_fraction * len(cases)))
    return [cases[i] for i in sorted(order[num_val:])], [cases[i] for i in sorted(order[:num_val])]


def _where(path: Path, key: str | None) -> str:
    """A volume in messages: the file, and the dataset inside it for HDF5."""
    return f"{path}" if key is None else f"{path} (dataset '{key}')"


def shape_in_words(geometry: dict[str, Any], orientation: str | None = None) -> str:
    """A volume's shape as stored and as loaded, for messages: ``(64, 64, 32) as stored (x, y,
    z), [D, H, W] = [32, 64, 64] after orientation to RAS`` (NIfTI)."""
    fmt = geometry.get("format")
    try:
        loaded = oriented_geometry(geometry, orientation)
    except ValueError:  # an affine that cannot be reoriented: named on its own line
        loaded, orientation = geometry, None
    dhw = [int(s) for s in loaded["shape_zyx"]]
    if fmt != "nifti":
        return f"[D, H, W] = {dhw} (Z, Y, X as stored)"
    stored = tuple(int(s) for s in geometry["stored_shape"])
    axes = "x, y, z" + (", channels" if len(stored) == 4 else "")
    after = f"after orientation to {orientation}" if orientation else "(the file's z, y, x)"
    return f"{stored} as stored ({axes}), [D, H, W] = {dhw} {after}"


def in_channels_fix(in_channels: int, channels: int) -> str:
    """The training run's fix for images of ``channels`` channels."""
    return f"in_channels={in_channels}: set in_channels={channels}"


def image_geometry(
    case: Case,
    in_channels: int | None,
    channels_fix: Callable[[int, int], str] = in_channels_fix,
    orientation: str | None = None,
) -> tuple[dict[str, Any] | None, list[str]]:
    """Geometry of the case's image (its first channel file; ``None`` where it has none), and
    the problems of its image files, from their headers: channel files must be readable 3D
    volumes (a 4-D NIfTI file: channels last) of one shape and affine, ``in_channels`` channels in
    all (``None``: any)."""
    geometries, problems = [], []
    for path in case.image_files:
        try:
            geometries.append(read_geometry(path, case.image_key))
        except Exception as err:  # any reader failure is a bad file, reported with its name
            problems.append(_read_problem(path, case.image_key, err))
    if len(geometries) < len(case.image_files):
        return None, problems
    first = geometries[0]
    for path, geometry in zip(case.image_files, geometries, strict=True):
        if len(geometry["shape_zyx"]) != 3:
            stored = list(geometry["stored_shape"])
            axes = "x, y, z[, channels]" if geometry["format"] == "nifti" else "Z, Y, X"
            problems.append(
                f"{_where(path, case.image_key)}: expected a 3D volume ({axes}), got shape "
                f"{stored} as stored"
            )
            return None, problems
        if geometry["shape_zyx"] != first["shape_zyx"]:
            problems.append(
                f"{path}: shape {shape_in_words(geometry, orientation)} differs from "
                f"{case.image_files[0].name}'s {shape_in_words(first, orientation)} (channels "
                "of one case)"
            )
            return None, problems
        if not np.allclose(geometry["affine"], first["affine"], atol=1e-3):
            problems.append(f"{path}: affine differs from {case.image_files[0].name}'s")
    channels = sum(g["channels"] for g in geometries)
    if in_channels is not None and channels != in_channels:
        files = ", ".join(p.name for p in case.image_files)
        held = f"{channels} image channel(s) ({files}: {shape_in_words(first, orientation)})"
        problems.append(
            f"{_where(case.image_files[0], case.image_key)}: {held}, but "
            f"{channels_fix(in_channels, channels)}"
        )
        return None, problems
    return first, problems


def _network_channels(in_channels: int, channels: int) -> str:
    return (
        f"the checkpoint's network takes in_channels={in_channels} (give each input "
        f"{in_channels} channel(s), as in training)"
    )


def input_problems(
    cases: Sequence[Case], in_channels: int, orientation: str | None = None
) -> list[str]:
    """Every problem of images to predict, one line each, from their headers."""
    problems: list[str] = []
    for case in cases:
        image, found = image_geometry(case, in_channels, _network_channels, orientation)
        problems += found
        if image is not None:
            problems += _orientation_problems(case, image, orientation)
    return problems


def _orientation_problems(case: Case, image: dict[str, Any], orientation: str | None) -> list[str]:
    """A NIfTI image whose affine cannot be reoriented to ``orientation``, named."""
    problem = orientation_problem(image, orientation)
    return [] if problem is None else [f"{case.image_files[0]}: {problem}"]


def _read_problem(path: Path, key: str | None, err: Exception) -> str:
    return f"{_where(path, key)}: cannot read ({type(err).__name__}: {err})"


def _voxel_problems(case: Case) -> list[str]:
    """Image files whose data do not read (a truncated file) or hold NaN/Inf voxels."""
    problems = []
    for path in case.image_files:
        try:
            voxels = read_array(path, case.image_key)
        except Exception as err:  # a header that reads but data that do not: truncated file
            problems.append(_read_problem(path, case.image_key, err))
            continue
        bad_voxels = int(np.size(voxels) - np.count_nonzero(np.isfinite(voxels)))
        if bad_voxels:
            problems.append(f"{_where(path, case.image_key)}: {bad_voxels} voxels are NaN or Inf")
    return problems


def _label_problems(
    case: Case,
    label: dict[str, Any],
    image: dict[str, Any],
    num_classes: int,
    classes_from: str,
    orientation: str | None = None,
) -> list[str]:
    """A label that disagrees with its image (shape, affine) or holds values outside
    ``[0, num_classes)`` or non-integer ones."""
    where = _where(case.label, case.label_key)
    if label["shape_zyx"] != image["shape_zyx"]:
        return [
            f"{where}: label shape {shape_in_words(label, orientation)} differs from the image's "
            f"{shape_in_words(image, orientation)}"
        ]
    problems = []
    if not np.allclose(label["affine"], image["affine"], atol=1e-3):
        problems.append(f"{where}: affine (voxel spacing/orientation) differs from the image's")
    try:
        values = np.unique(read_array(case.label, case.label_key))
    except Exception as err:
        return [*problems, _read_problem(case.label, case.label_key, err)]
    if not np.all(np.equal(np.mod(values, 1), 0)):
        problems.append(f"{where}: label values must be integers, found {values[:8]}")
    elif values.min() < 0 or values.max() >= num_classes:
        bad = [int(v) for v in values if v < 0 or v >= num_classes]
        problems.append(f"{where}: label values {bad} outside [0, {num_classes}) ({classes_from})")
    return problems


def case_problems(
    cases: Sequence[Case],
    num_classes: int,
    patch_size: Sequence[int],
    in_channels: int | None = None,
    classes_from: str = "num_classes",
    spacing: Sequence[float] | None = None,
    orientation: str | None = None,
    channels_fix: Callable[[int, int], str] = in_channels_fix,
    padded: dict[str, list[int]] | None = None,
) -> list[str]:
    """Every problem of every case, one line each, naming the file (files, channels, shapes,
    affines, voxels, labels, a patch larger than the volume at ``spacing`` in every axis).
    ``padded`` receives ``{case: [D, H, W]}`` of volumes smaller than the patch in some axis
    (loading pads them)."""
    problems: list[str] = []
    for case in cases:
        image, found = image_geometry(case, in_channels, channels_fix, orientation)
        problems += found
        label = None
        if case.label is not None:
            try:
                label = read_geometry(case.label, case.label_key)
            except Exception as err:
                problems.append(_read_problem(case.label, case.label_key, err))
        if image is None or (case.label is not None and label is None):
            continue
        problems += _voxel_problems(case)
        reorient = _orientation_problems(case, image, orientation)
        problems += reorient
        axcodes = None if reorient else orientation  # one it cannot apply: shapes as stored
        loaded = oriented_geometry(image, axcodes)
        sampled = resampled_shape(loaded["shape_zyx"], loaded["affine"], spacing)
        if all(p > s for p, s in zip(patch_size, sampled, strict=True)):
            volume = shape_in_words(image, axcodes)
            if spacing is not None:
                volume = f"[D, H, W] = {sampled} at data.spacing={list(spacing)}, from {volume}"
            problems.append(
                f"{_where(case.image_files[0], case.image_key)}: data.patch_size="
                f"{list(patch_size)} is larger than the volume in every axis: {volume}"
            )
        elif padded is not None and any(p > s for p, s in zip(patch_size, sampled, strict=True)):
            padded[case.name] = list(sampled)
        if label is not None:
            problems += _label_problems(case, label, image, num_classes, classes_from, axcodes)
    return problems
