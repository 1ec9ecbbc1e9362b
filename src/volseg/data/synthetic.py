"""The embedded default dataset: deterministic synthetic microscopy-like stacks
(``docs/data.md``): four object classes that differ by shape and texture, not by intensity
alone, anisotropic (z spacing 2x in-plane), blurred and noisy.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from monai.transforms import GaussianSmooth

from volseg.data.dataset_defaults import EMBEDDED_DEFAULTS
from volseg.data.io import write_dataset, write_volume

CLASS_NAMES: tuple[str, ...] = ("background", "blob", "tube", "shell", "granule")
SPACING_ZYX: tuple[float, float, float] = (1.0, 0.5, 0.5)
_Z_SCALE = SPACING_ZYX[1] / SPACING_ZYX[0]  # object radii in z voxels = in-plane radii * this


def _grid(shape: Sequence[int], center: np.ndarray, radius: float) -> tuple[tuple, tuple]:
    """Anisotropy-corrected offsets (in in-plane voxel units) inside a bounding box."""
    half = np.array([radius * _Z_SCALE + 2, radius + 2, radius + 2])
    lo = np.maximum(np.floor(center - half).astype(int), 0)
    hi = np.minimum(np.ceil(center + half).astype(int) + 1, shape)
    zz, yy, xx = np.meshgrid(*(np.arange(a, b) for a, b in zip(lo, hi, strict=True)), indexing="ij")
    offsets = ((zz - center[0]) / _Z_SCALE, yy - center[1], xx - center[2])
    return tuple(slice(a, b) for a, b in zip(lo, hi, strict=True)), offsets


def _random_center(shape: Sequence[int], rng: np.random.Generator) -> np.ndarray:
    return np.array([rng.uniform(1, s - 2) for s in shape])


def _paint_ellipsoid(
    image: np.ndarray,
    label: np.ndarray,
    cls: int,
    rng: np.random.Generator,
    radius_range: tuple[float, float],
    intensity: float,
    wall: float = 0.0,
    texture: float = 0.0,
) -> None:
    r = rng.uniform(*radius_range)
    axes = r * rng.uniform(0.8, 1.2, size=3)
    box, (dz, dy, dx) = _grid(image.shape, _random_center(image.shape, rng), axes.max())
    dist = np.sqrt((dz / axes[0]) ** 2 + (dy / axes[1]) ** 2 + (dx / axes[2]) ** 2)
    mask = dist <= 1.0
    if wall > 0:
        mask &= dist >= 1.0 - wall / r
    values = np.full(mask.shape, intensity, dtype=np.float32)
    if texture > 0:
        # granular texture: bright and dark 2-voxel speckles (they survive the blur) around
        # the same mean
        coarse = rng.choice([-1.0, 1.0], size=[(s + 1) // 2 for s in mask.shape])
        speckle = coarse.repeat(2, 0).repeat(2, 1).repeat(2, 2)
        values += texture * speckle[tuple(slice(0, s) for s in mask.shape)].astype(np.float32)
    image[box][mask] = values[mask]
    label[box][mask] = cls


def _paint_tube(
    image: np.ndarray,
    label: np.ndarray,
    cls: int,
    rng: np.random.Generator,
    radius: float,
    intensity: float,
) -> None:
    length = rng.uniform(20, 40)
    direction = rng.normal(size=3) * np.array([0.25, 1.0, 1.0])  # mostly in-plane, like neurites
    direction /= np.linalg.norm(direction)
    center = _random_center(image.shape, rng)
    box, (dz, dy, dx) = _grid(image.shape, center, length / 2 + radius)
    pts = np.stack([dz, dy, dx], axis=-1)
    along = np.clip(pts @ direction, -length / 2, length / 2)
    mask = np.linalg.norm(pts - along[..., None] * direction, axis=-1) <= radius
    image[box][mask] = intensity
    label[box][mask] = cls


def make_volume(
    shape: Sequence[int], seed: int, objects_per_class: int = 6
) -> tuple[np.ndarray, np.ndarray]:
    """One synthetic stack.

    Returns ``(image, label)``: float32 ``(D, H, W)`` intensities (roughly zero-mean background,
    objects around 0.6-1.0, Gaussian noise) and uint8 ``(D, H, W)`` labels in ``[0, 5)``.
    """
    rng = np.random.default_rng(seed)
    image = np.zeros(shape, dtype=np.float32)
    label = np.zeros(shape, dtype=np.uint8)
    painters = [
        lambda: _paint_ellipsoid(image, label, 1, rng, (5.0, 8.0), intensity=1.0),
        lambda: _paint_tube(image, label, 2, rng, rng.uniform(2.0, 3.0), intensity=1.0),
        lambda: _paint_ellipsoid(image, label, 3, rng, (7.0, 10.0), intensity=0.7, wall=2.5),
        lambda: _paint_ellipsoid(image, label, 4, rng, (6.0, 9.0), intensity=0.7, texture=0.35),
    ]
    order = [c for c in range(4) for _ in range(objects_per_class)]
    for c in rng.permutation(order):
        painters[c]()
    # optics: anisotropic blur (less in z, where voxels are larger), uneven illumination, noise
    blurred = GaussianSmooth(sigma=(0.5, 0.9, 0.9))(torch.from_numpy(image)[None])[0].numpy()
    zz, yy, xx = np.meshgrid(*(np.linspace(-1, 1, s) for s in shape), indexing="ij")
    illumination = 1.0 + 0.15 * np.sin(2.0 * xx + rng.uniform(0, 6)) * np.cos(1.5 * yy)
    noisy = blurred * illumination + rng.normal(0.0, 0.12, size=shape)
    return noisy.astype(np.float32), label


def generate_synthetic_dataset(
    root: str | Path,
    num_volumes: int = 24,
    num_val: int = 4,
    shape: Sequence[int] = (32, 96, 96),
    seed: int = 0,
    file_format: str = "nii.gz",
) -> Path:
    """Write ``num_volumes`` stacks (the last ``num_val``: validation) and the folder's defaults."""

    def write_case(i: int, image_path: Path, label_path: Path) -> None:
        image, label = make_volume(shape, seed=seed * 100_003 + i)
        write_volume(image_path, image, spacing_zyx=SPACING_ZYX)
        write_volume(label_path, label, spacing_zyx=SPACING_ZYX)

    names = [f"case_{i:03d}.{file_format}" for i in range(num_volumes)]
    return write_dataset(root, names, write_case, num_val, CLASS_NAMES, EMBEDDED_DEFAULTS)
