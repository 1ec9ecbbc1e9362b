"""data.orientation: a case stored LPS (or with permuted axes) loads as the same RAS case, so
it trains on the same patches; an affine that cannot be reoriented is one clear error."""

from __future__ import annotations

import shutil
from pathlib import Path

import hydra
import nibabel as nib
import numpy as np
import pytest
import torch
from nibabel import orientations

from tests.conftest import compose_config, tiny_train_overrides
from volseg.tasks.train import train
from volseg.utils.entry import run_task


def reoriented_copy(source: Path, target: Path, axcodes: str) -> Path:
    """``source`` (a NIfTI file) stored in ``axcodes``: the same voxels at the same world
    positions, its data flipped/transposed and its affine changed to match."""
    img = nib.load(str(source))
    now = orientations.io_orientation(img.affine)
    img = img.as_reoriented(orientations.ornt_transform(now, orientations.axcodes2ornt(axcodes)))
    target.parent.mkdir(parents=True, exist_ok=True)
    nib.save(img, target)
    return target


def stored_as(small_dataset: Path, root: Path, axcodes: str) -> Path:
    """The small dataset with every image and label stored in ``axcodes``."""
    for sub in ("images", "labels"):
        for path in sorted((small_dataset / sub).iterdir()):
            reoriented_copy(path, root / sub / path.name, axcodes)
    for name in ("splits.json", "classes.json"):
        shutil.copy(small_dataset / name, root / name)
    return root


def test_lps_and_permuted_cases_train_on_the_same_patches_as_ras(small_dataset, tmp_path):
    patches = {}
    for axcodes in ("RAS", "LPS", "SPL"):
        root = stored_as(small_dataset, tmp_path / axcodes, axcodes)
        assert "".join(orientations.aff2axcodes(nib.load(next(root.glob("images/*"))).affine)) == (
            axcodes
        )
        cfg = compose_config("train", tmp_path / f"run-{axcodes}", tiny_train_overrides(root))
        dm = hydra.utils.instantiate(cfg.data)
        dm.setup("fit")
        patches[axcodes] = [dm._train_ds[(p, 99 + p)][0] for p in range(4)]
        patches[axcodes].append(dm._val_ds[0])
    for axcodes in ("LPS", "SPL"):
        for mine, ras in zip(patches[axcodes], patches["RAS"], strict=True):
            # the z-score sums voxels in another order on a permuted grid: equal to float error
            assert torch.allclose(mine["image"], ras["image"], atol=1e-5), axcodes
            assert torch.equal(mine["label"], ras["label"]), axcodes
    # as stored, the LPS case is mirrored: its patches differ
    cfg = compose_config(
        "train",
        tmp_path / "as-stored",
        [*tiny_train_overrides(tmp_path / "LPS"), "data.orientation=null"],
    )
    dm = hydra.utils.instantiate(cfg.data)
    dm.setup("fit")
    assert not torch.equal(dm._val_ds[0]["image"], patches["RAS"][-1]["image"])


def test_an_affine_that_cannot_be_reoriented_is_one_clear_error(small_dataset, tmp_path, capsys):
    root = stored_as(small_dataset, tmp_path / "data", "RAS")
    bad = sorted((root / "images").iterdir())[0]
    img = nib.load(str(bad))
    affine = img.affine.copy()
    affine[:3, 1] = affine[:3, 0]  # the y axis points along x: no orientation
    nib.save(nib.Nifti1Image(np.asarray(img.dataobj), affine), bad)
    cfg = compose_config("train", tmp_path / "run", tiny_train_overrides(root))
    with pytest.raises(SystemExit) as stopped:
        run_task(train, cfg)
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and "Traceback" not in err
    assert f"{bad}: cannot be reoriented to data.orientation=RAS" in err


def test_bad_orientation_code_is_named(small_dataset, tmp_path, capsys):
    cfg = compose_config(
        "train", tmp_path / "run", [*tiny_train_overrides(small_dataset), "data.orientation=RAX"]
    )
    with pytest.raises(SystemExit) as stopped:
        run_task(train, cfg)
    assert stopped.value.code == 2 and "data.orientation=RAX" in capsys.readouterr().err
