"""Volume file IO: NIfTI, TIFF stacks and HDF5 datasets (``(Z, Y, X)`` or ``(C, Z, Y, X)``,
voxel size in ``element_size_um`` as ilastik and pytorch-3dunet write it).

Readers return spatial axes in file order (NIfTI ``x, y, z``), as MONAI's do, so one transpose
(:mod:`volseg.data.transforms`) gives the network's ``(C, D, H, W)`` for every format; writers
take ``(D, H, W)`` arrays and undo it, so predictions land with the input's geometry.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np
import tifffile
from monai.data import ImageReader, NibabelReader
from monai.data.utils import is_supported_format
from monai.utils import MetaKeys, SpaceKeys

from volseg.utils.extras import require

NIFTI_SUFFIXES = (".nii.gz", ".nii")
TIFF_SUFFIXES = (".tif", ".tiff")
# one volume per file (the folder and msd layouts)
VOLUME_SUFFIXES = NIFTI_SUFFIXES + TIFF_SUFFIXES
HDF5_SUFFIXES = (".h5", ".hdf5")
HDF5_SPACING_ATTR = "element_size_um"
# datasets predict.py writes into an HDF5 output file
HDF5_PREDICTION_KEY = "predictions"
HDF5_PROBABILITIES_KEY = "probabilities"


def volume_format(path: str | Path) -> str | None:
    """``"nifti"``, ``"tiff"``, ``"hdf5"`` or ``None`` for an unsupported file name."""
    formats = {"nifti": NIFTI_SUFFIXES, "tiff": TIFF_SUFFIXES, "hdf5": HDF5_SUFFIXES}
    return next((fmt for fmt, ends in formats.items() if match_suffix(str(path), ends)), None)


def require_h5py():
    """h5py, or one clear error saying how to install it."""
    return require("h5py", "HDF5 files")


def _unsupported(path: Path) -> ValueError:
    return ValueError(
        f"{path}: unsupported file type (expected one of {', '.join(VOLUME_SUFFIXES)})"
    )


def _affine(spacing_zyx: Sequence[float]) -> np.ndarray:
    """The 4x4 affine (file axes ``x, y, z``) of a grid of voxel size ``[z, y, x]``."""
    sz, sy, sx = (float(v) for v in spacing_zyx)
    return np.diag([sx, sy, sz, 1.0])


def _hdf5_spacing_zyx(dataset: Any) -> tuple[float, ...]:
    """``element_size_um`` of the dataset or its file (last three entries: z, y, x); else 1."""
    size = dataset.attrs.get(HDF5_SPACING_ATTR, dataset.file.attrs.get(HDF5_SPACING_ATTR))
    return (1.0, 1.0, 1.0) if size is None or len(size) < 3 else tuple(size[-3:])


def _hdf5_dataset(file: Any, key: str | None, path: Path) -> Any:
    """Dataset ``key``; ``None``: the file's first dataset (for its geometry: the datasets of a
    volume file share one grid)."""
    if key is None:
        names = [k for k in sorted(file.keys()) if hasattr(file[k], "shape")]
        if not names:
            raise KeyError(f"{path}: no dataset in the file")
        key = names[0]
    if key not in file:
        raise KeyError(f"no dataset '{key}' (it has: {', '.join(file.keys()) or 'none'})")
    return file[key]


def _tiff_spacing_zyx(tif: tifffile.TiffFile) -> tuple[float, float, float]:
    """Voxel spacing from ImageJ metadata and resolution tags; 1.0 where absent."""

    def per_pixel(tag_name: str) -> float:
        tag = tif.pages[0].tags.get(tag_name)
        num, den = tag.value if tag is not None else (0, 1)
        return den / num if num else 1.0

    sz = float((tif.imagej_metadata or {}).get("spacing", 1.0))
    return sz, per_pixel("YResolution"), per_pixel("XResolution")


class StackReader(ImageReader):
    """A MONAI reader of TIFF stacks (``key=None``) or of dataset ``key`` of HDF5 files (only
    that dataset is read), stored ``(Z, Y, X)`` or (HDF5) ``(C, Z, Y, X)`` with a voxel size:
    arrays in file axis order ``(X, Y, Z)`` (channels first) like MONAI's NIfTI reader, with an
    affine from the voxel size. The files of a case's channels are joined on the channel axis,
    with the first file's header (the case checks compared their shapes and affines)."""

    def __init__(self, key: str | None = None) -> None:
        super().__init__()
        self.key = key

    def verify_suffix(self, filename: Sequence[str] | str) -> bool:
        return is_supported_format(filename, ["h5", "hdf5"] if self.key else ["tif", "tiff"])

    def read(self, data: Sequence[str] | str, **kwargs: Any):
        names = [data] if isinstance(data, str | Path) else list(data)
        return [self._read_one(str(name)) for name in names]

    def _read_one(self, name: str) -> tuple[np.ndarray, Sequence[float]]:
        """The array of the file ``name`` as stored, and its voxel size ``[z, y, x]``."""
        if self.key is not None:
            with require_h5py().File(name, "r") as f:
                dataset = _hdf5_dataset(f, self.key, Path(name))
                return dataset[()], _hdf5_spacing_zyx(dataset)
        with tifffile.TiffFile(name) as tif:
            array, spacing = tif.asarray(), _tiff_spacing_zyx(tif)
        if array.ndim != 3:
            raise ValueError(f"{name}: expected a 3D (Z, Y, X) TIFF stack, got shape {array.shape}")
        return array, spacing

    def get_data(self, img) -> tuple[np.ndarray, dict]:
        arrays, meta = [], {}
        for array, spacing in img:
            channels = array.ndim == 4
            if not meta:
                meta = {
                    MetaKeys.AFFINE: _affine(spacing),
                    MetaKeys.ORIGINAL_AFFINE: _affine(spacing),
                    MetaKeys.SPATIAL_SHAPE: np.asarray(array.shape[-3:][::-1]),
                    MetaKeys.SPACE: SpaceKeys.RAS,
                    MetaKeys.ORIGINAL_CHANNEL_DIM: 0 if channels else float("nan"),
                }
            axes = (0, 3, 2, 1) if channels else (2, 1, 0)
            arrays.append(np.ascontiguousarray(array.transpose(axes)))
        if len(arrays) == 1:
            return arrays[0], meta
        if meta[MetaKeys.ORIGINAL_CHANNEL_DIM] == 0:  # files with a channel axis of their own
            return np.concatenate(arrays, axis=0), meta
        meta[MetaKeys.ORIGINAL_CHANNEL_DIM] = 0
        return np.stack(arrays, axis=0), meta


class NiftiReader(NibabelReader):
    """MONAI's ``NibabelReader`` with its file names kept per thread (``CacheDataset`` loads in a
    thread pool: a label read by another thread between ``read`` and ``get_data`` truncated a
    multi-channel image to its first channel)."""

    _local = threading.local()

    @property
    def filenames(self) -> Sequence[str]:
        return self._local.filenames

    @filenames.setter
    def filenames(self, value: Sequence[str]) -> None:
        self._local.filenames = value


def read_geometry(path: str | Path, key: str | None = None) -> dict[str, Any]:
    """Geometry of a volume file (HDF5: dataset ``key``) without loading its voxels:
    ``{"format", "shape_zyx", "affine", "channels", "stored_shape"}``, ``shape_zyx`` the
    ``[D, H, W]`` loading sees before reorientation (more entries for a file of more axes),
    ``affine`` 4x4 in file axes ``x, y, z``, ``channels`` those of a 4-D NIfTI file (its last
    axis: the Decathlon's modalities) or an HDF5 dataset (its first)."""
    path = Path(path)
    fmt = volume_format(path)
    if fmt == "nifti":
        img = nib.load(str(path))
        stored = tuple(int(s) for s in img.shape)  # x, y, z (, channels)
        channels = stored[3] if len(stored) == 4 else 1
        spatial, affine = (stored[:3] if len(stored) == 4 else stored)[::-1], img.affine
    elif fmt == "tiff":
        with tifffile.TiffFile(path) as tif:
            stored = tuple(int(s) for s in tif.series[0].shape)
            spatial, channels, affine = stored, 1, _affine(_tiff_spacing_zyx(tif))
    elif fmt == "hdf5":
        with require_h5py().File(path, "r") as f:
            dataset = _hdf5_dataset(f, key, path)
            stored = tuple(int(s) for s in dataset.shape)
            affine = _affine(_hdf5_spacing_zyx(dataset))
        channels = stored[0] if len(stored) == 4 else 1
        spatial = stored[1:] if len(stored) == 4 else stored
    else:
        raise _unsupported(path)
    return {
        "format": fmt,
        "shape_zyx": spatial,
        "affine": affine,
        "channels": channels,
        "stored_shape": stored,
    }


def read_array(path: str | Path, key: str | None = None) -> np.ndarray:
    """All voxels of a volume file, ``(D, H, W)`` or ``(C, D, H, W)`` as :func:`write_volume`'s."""
    path = Path(path)
    if volume_format(path) == "hdf5":
        with require_h5py().File(path, "r") as f:
            return _hdf5_dataset(f, key, path)[()]
    if volume_format(path) == "nifti":
        return np.asarray(nib.load(str(path)).dataobj).T  # x, y, z (, channels) reversed
    array = tifffile.imread(path)
    return array.transpose(1, 0, 2, 3) if array.ndim == 4 else array


def match_suffix(name: str, suffixes: Sequence[str] = VOLUME_SUFFIXES) -> tuple[str, str] | None:
    """``("case_000", ".nii.gz")`` for ``"case_000.nii.gz"``: the stem and the first of
    ``suffixes`` the name ends with (any case); ``None`` when it ends with none of them."""
    for suffix in suffixes:
        if name.lower().endswith(suffix.lower()):
            return name[: -len(suffix)], name[-len(suffix) :]
    return None


def split_suffix(name: str) -> tuple[str, str]:
    """The stem and the volume suffix (:func:`match_suffix`), else the last dot's suffix."""
    return match_suffix(name) or (Path(name).stem, Path(name).suffix)


def label_dtype(num_classes: int) -> np.dtype:
    """The smallest unsigned integer type that holds class ids ``0 .. num_classes - 1``."""
    return np.min_scalar_type(num_classes - 1)


def write_volume(
    path: str | Path,
    array_zyx: np.ndarray,
    spacing_zyx: Sequence[float] | None = None,
    affine: np.ndarray | None = None,
    key: str | None = None,
) -> Path:
    """Write a ``(D, H, W)`` or ``(C, D, H, W)`` array as NIfTI (channels last), TIFF (an ImageJ
    ``ZCYX`` hyperstack) or HDF5 (dataset ``key``, default ``predictions``, replaced if present)
    by the suffix, with ``affine`` (4x4, file axes ``x, y, z``), else ``spacing_zyx``."""
    path = Path(path)
    fmt = volume_format(path)
    if fmt is None:
        raise _unsupported(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if affine is None:
        affine = _affine(spacing_zyx if spacing_zyx is not None else (1.0, 1.0, 1.0))
    sz, sy, sx = (float(np.linalg.norm(affine[:3, i])) for i in (2, 1, 0))
    channels = array_zyx.ndim == 4
    if fmt == "nifti":
        nib.save(nib.Nifti1Image(np.ascontiguousarray(array_zyx.T), affine), path)
    elif fmt == "hdf5":
        key = key or HDF5_PREDICTION_KEY
        with require_h5py().File(path, "a") as f:
            if key in f:
                del f[key]
            dataset = f.create_dataset(key, data=array_zyx, compression="gzip")
            dataset.attrs[HDF5_SPACING_ATTR] = [sz, sy, sx]
    else:
        tifffile.imwrite(
            path,
            array_zyx.transpose(1, 0, 2, 3) if channels else array_zyx,
            imagej=True,
            resolution=(1.0 / sx, 1.0 / sy),
            metadata={"spacing": sz, "axes": "ZCYX" if channels else "ZYX"},
        )
    return path


def write_dataset(
    root: str | Path,
    names: Sequence[str],
    write_case: Callable[[int, Path, Path], None],
    num_val: int,
    class_names: Sequence[str],
    defaults: Mapping[str, Any] | None = None,
) -> Path:
    """Write a folder-layout dataset: ``write_case(i, image_path, label_path)`` for each of
    ``names``, ``splits.json`` (the last ``num_val``: validation), ``classes.json`` and
    ``defaults`` (``dataset_defaults.json``). Written beside ``root`` and renamed into place, so
    no half-written dataset is left, and of processes writing it at once the first rename wins.
    """
    root = Path(root)
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=root.name + ".partial-", dir=root.parent))
    try:
        for sub in ("images", "labels"):
            (tmp / sub).mkdir()
        for i, name in enumerate(names):
            write_case(i, tmp / "images" / name, tmp / "labels" / name)
        train = len(names) - num_val
        splits = {"train": list(names[:train]), "val": list(names[train:])}
        (tmp / "splits.json").write_text(json.dumps(splits, indent=2))
        (tmp / "classes.json").write_text(json.dumps(list(class_names)))
        if defaults is not None:
            (tmp / "dataset_defaults.json").write_text(json.dumps(dict(defaults), indent=2))
        try:
            tmp.rename(root)
        except OSError:
            if not (root / "splits.json").is_file():  # not another process's whole copy
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone after a rename; else this copy's files
    return root
