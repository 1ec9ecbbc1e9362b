"""The MNI152 brain dataset builder: a valid dataset in the folder layout, labels that mean what
the classes say."""

from __future__ import annotations

import json

import nibabel as nib
import numpy as np
import pytest

from tests.conftest import check_cases
from volseg.data.cases import find_cases
from volseg.data.mni152 import TASKS, build_mni152_dataset

pytest.importorskip("nilearn")


@pytest.mark.parametrize("task", sorted(TASKS))
def test_builder_writes_a_valid_dataset(tmp_path, task):
    root = build_mni152_dataset(tmp_path / task, task=task, spacing=6.0, num_cases=3, num_val=1)

    assert json.loads((root / "classes.json").read_text()) == list(TASKS[task])
    splits = json.loads((root / "splits.json").read_text())
    assert splits == {"train": ["mni_000.nii.gz", "mni_001.nii.gz"], "val": ["mni_002.nii.gz"]}
    cases = find_cases(root)
    assert len(cases) == 3
    check_cases(cases, num_classes=5, patch_size=[8, 8, 8])  # readable, paired, labels in range
    shapes, images = set(), []
    for case in cases:
        image = nib.load(case.image_files[0])
        label = np.asarray(nib.load(case.label).dataobj)
        # 6 mm voxels over the brain's bounding box (about 140 x 175 x 150 mm) + margins
        assert np.allclose(image.header.get_zooms(), 6.0)
        assert all(20 <= s <= 40 for s in image.shape)
        assert label.dtype == np.uint8 and set(np.unique(label)) == set(range(5))
        assert 0.2 < (label > 0).mean() < 0.6  # the brain fills part of its bounding box
        shapes.add(image.shape)
        images.append(np.asarray(image.dataobj))
    assert len(shapes) == 1  # one grid per dataset
    assert not np.allclose(images[0], images[1])  # every case is a different view


def test_labels_follow_the_anatomy(tmp_path):
    """hemispheres: left classes lie at x < 0 (RAS); lobes: anterior classes at larger y."""
    root = build_mni152_dataset(
        tmp_path / "h", task="hemispheres", spacing=4.0, num_cases=2, num_val=1
    )
    img = nib.load(root / "labels" / "mni_000.nii.gz")
    label = np.asarray(img.dataobj)
    world = nib.affines.apply_affine(img.affine, np.argwhere(label > 0))
    values = label[label > 0]
    left = np.isin(values, [1, 3])  # left_gm, left_wm
    assert (world[left, 0] < 5).mean() > 0.95 and (world[~left, 0] > -5).mean() > 0.95

    root = build_mni152_dataset(tmp_path / "l", task="lobes", spacing=4.0, num_cases=2, num_val=1)
    img = nib.load(root / "labels" / "mni_000.nii.gz")
    label = np.asarray(img.dataobj)
    world = nib.affines.apply_affine(img.affine, np.argwhere(label > 0))
    values = label[label > 0]
    anterior = np.isin(values, [1, 2])
    superior = np.isin(values, [1, 3])
    assert world[anterior, 1].mean() > world[~anterior, 1].mean() + 30
    assert world[superior, 2].mean() > world[~superior, 2].mean() + 30
