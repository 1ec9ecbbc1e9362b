"""Generated cases on disk in volseg's folder layout, for the loader and GPU speed benchmarks."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

#: classes of a generated case, background included
NUM_CLASSES = 5


def write_cases(
    root: Path, count: int, shape: Sequence[int], spacing: Sequence[float], seed: int = 0
) -> Path:
    """``count`` cases of ``shape`` [D, H, W] in the folder layout (``images/``, ``labels/``,
    ``splits.json``: the last case validates): ``NUM_CLASSES - 1`` classes of random spheres
    on background, image = class-dependent mean + noise; kept when ``root`` exists."""
    import nibabel as nib
    import numpy as np

    if (root / "splits.json").is_file():
        return root
    rng = np.random.default_rng(seed)
    names = [f"case_{i:03d}.nii.gz" for i in range(count)]
    for sub in ("images", "labels"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    grid = np.ogrid[tuple(slice(0, s) for s in shape)]
    for name in names:
        label = np.zeros(shape, dtype=np.uint8)
        for k in range(1, NUM_CLASSES):
            for _ in range(3):
                centre = [rng.uniform(0.2, 0.8) * s for s in shape]
                radius = rng.uniform(0.05, 0.15) * min(shape)
                dist = sum((g - c) ** 2 for g, c in zip(grid, centre, strict=True))
                label[dist < radius**2] = k
        image = label.astype(np.float32) * 0.7 + rng.standard_normal(shape, dtype=np.float32)
        affine = np.diag([spacing[2], spacing[1], spacing[0], 1.0])
        # NIfTI axes are (x, y, z): the network's (D, H, W) reversed
        nib.save(nib.Nifti1Image(image.transpose(2, 1, 0), affine), root / "images" / name)
        nib.save(nib.Nifti1Image(label.transpose(2, 1, 0), affine), root / "labels" / name)
    splits = {"train": names[:-1], "val": names[-1:]} if count > 1 else None
    if splits is None:
        raise ValueError("need at least 2 cases (one validates)")
    (root / "splits.json").write_text(json.dumps(splits))
    return root
