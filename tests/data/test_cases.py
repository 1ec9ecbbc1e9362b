"""Bad dataset input: one clear error that names the file and the problem."""

import json
import shutil

import numpy as np
import pytest

from tests.conftest import check_cases
from volseg.data.cases import find_cases, split_cases
from volseg.data.io import write_volume
from volseg.utils.errors import UserInputError


def _dataset(root, n=3, shape=(4, 8, 8), suffix=".nii.gz"):
    for i in range(n):
        write_volume(root / "images" / f"c{i}{suffix}", np.zeros(shape, np.float32), (1, 1, 1))
        write_volume(root / "labels" / f"c{i}{suffix}", np.zeros(shape, np.uint8), (1, 1, 1))
    return root


@pytest.fixture
def root(tmp_path):
    (tmp_path / "ds" / "images").mkdir(parents=True)
    (tmp_path / "ds" / "labels").mkdir(parents=True)
    return _dataset(tmp_path / "ds")


def test_missing_root_names_the_key(tmp_path):
    with pytest.raises(UserInputError, match=r"data.root=.*nowhere: folder does not exist"):
        find_cases(tmp_path / "nowhere")


def test_unpaired_files_are_all_named(root):
    (root / "labels" / "c0.nii.gz").unlink()
    (root / "images" / "c1.nii.gz").unlink()
    with pytest.raises(UserInputError) as err:
        find_cases(root)
    text = str(err.value)
    assert "c0.nii.gz: image has no label" in text
    assert "c1.nii.gz: label has no image" in text


def test_shape_mismatch_and_label_range_and_patch(root):
    write_volume(root / "labels" / "c0.nii.gz", np.zeros((4, 8, 9), np.uint8))
    write_volume(root / "labels" / "c1.nii.gz", np.full((4, 8, 8), 7, np.uint8))
    with pytest.raises(UserInputError) as err:
        check_cases(find_cases(root), num_classes=5, patch_size=[2, 4, 4])
    text = str(err.value)
    assert "2 problem(s)" in text
    # the shape as nibabel reads the file (x, y, z) and as the network sees it (D, H, W)
    assert (
        "labels/c0.nii.gz: label shape (9, 8, 4) as stored (x, y, z), [D, H, W] = [4, 8, 9] "
        "(the file's z, y, x) differs from the image's (8, 8, 4) as stored (x, y, z), "
        "[D, H, W] = [4, 8, 8] (the file's z, y, x)"
    ) in text
    assert "labels/c1.nii.gz: label values [7] outside [0, 5)" in text


def test_patch_larger_than_volume_in_every_axis(root):
    check_cases(find_cases(root), 5, patch_size=[8, 4, 4])  # larger in one axis only: padded
    with pytest.raises(UserInputError, match=r"c0.nii.gz: data.patch_size=\[8, 16, 16\] is larger"):
        check_cases(find_cases(root), 5, patch_size=[8, 16, 16])


def test_non_integer_labels_and_unreadable_files(root):
    write_volume(root / "labels" / "c0.nii.gz", np.full((4, 8, 8), 0.5, np.float32))
    (root / "images" / "c2.nii.gz").write_bytes(b"not a nifti file")
    with pytest.raises(UserInputError) as err:
        check_cases(find_cases(root), 5, [2, 4, 4])
    assert "labels/c0.nii.gz: label values must be integers" in str(err.value)
    assert "images/c2.nii.gz: cannot read" in str(err.value)


def test_splits_json_fixes_the_split_and_is_checked(root):
    cases = find_cases(root)
    train, val = split_cases(cases, root, val_fraction=0.34, seed=0)
    assert len(val) == 1 and len(train) == 2
    assert split_cases(cases, root, 0.34, 0) == (train, val)  # seeded
    (root / "splits.json").write_text(json.dumps({"train": ["c0.nii.gz"], "val": ["c2.nii.gz"]}))
    train, val = split_cases(cases, root, 0.34, 0)
    assert [c.name for c in train] == ["c0.nii.gz"] and [c.name for c in val] == ["c2.nii.gz"]
    (root / "splits.json").write_text(json.dumps({"train": ["zz.nii.gz"], "val": []}))
    with pytest.raises(UserInputError, match="splits.json: names not found among"):
        split_cases(cases, root, 0.34, 0)


def test_splits_json_takes_case_ids_as_nnunet_users_write_them(root):
    cases = find_cases(root)
    (root / "splits.json").write_text(json.dumps({"train": ["c0", "c1.nii.gz"], "val": ["c2"]}))
    train, val = split_cases(cases, root, 0.34, 0)
    assert [c.name for c in train] == ["c0.nii.gz", "c1.nii.gz"]
    assert [c.name for c in val] == ["c2.nii.gz"]


def test_nnunet_splits_final_is_read_by_fold(root):
    cases = find_cases(root)
    folds = [{"train": ["c0", "c1"], "val": ["c2"]}, {"train": ["c1", "c2"], "val": ["c0"]}]
    (root / "splits_final.json").write_text(json.dumps(folds))
    assert [c.name for c in split_cases(cases, root, 0.34, 0)[1]] == ["c2.nii.gz"]  # fold 0
    train, val = split_cases(cases, root, 0.34, 0, fold=1)
    assert [c.name for c in train] == ["c1.nii.gz", "c2.nii.gz"]
    assert [c.name for c in val] == ["c0.nii.gz"]
    # an explicit fold wins over a splits.json beside it
    (root / "splits.json").write_text(json.dumps({"train": ["c0"], "val": ["c1"]}))
    assert [c.name for c in split_cases(cases, root, 0.34, 0, fold=1)[1]] == ["c0.nii.gz"]


def test_bad_fold_is_one_clear_error(root):
    cases = find_cases(root)
    with pytest.raises(UserInputError, match="data.fold=0: needs nnU-Net's splits_final.json"):
        split_cases(cases, root, 0.34, 0, fold=0)
    (root / "splits_final.json").write_text(json.dumps([{"train": ["c0"], "val": ["c1"]}]))
    with pytest.raises(UserInputError, match=r"data.fold=5: .* has 1 folds \(0 to 0\)"):
        split_cases(cases, root, 0.34, 0, fold=5)


def test_tiff_datasets_are_found(tmp_path):
    root = tmp_path / "tif"
    _dataset(root, suffix=".tif")
    assert [c.name for c in find_cases(root)] == ["c0.tif", "c1.tif", "c2.tif"]
    shutil.rmtree(root / "labels")
    with pytest.raises(UserInputError, match="labels: folder is missing"):
        find_cases(root)


def test_nan_images_affine_mismatch_and_4d_files_are_named(root):
    image = np.zeros((4, 8, 8), np.float32)
    image[0, 0, :3] = np.nan
    write_volume(root / "images" / "c0.nii.gz", image, (1, 1, 1))
    write_volume(root / "labels" / "c1.nii.gz", np.zeros((4, 8, 8), np.uint8), (2, 1, 1))
    import nibabel as nib

    nib.save(
        nib.Nifti1Image(np.zeros((8, 8, 4, 2), np.float32), np.eye(4)),
        root / "images" / "c2.nii.gz",
    )
    with pytest.raises(UserInputError) as err:
        check_cases(find_cases(root), 5, [2, 4, 4])
    text = str(err.value)
    assert "images/c0.nii.gz: 3 voxels are NaN or Inf" in text
    assert "labels/c1.nii.gz: affine (voxel spacing/orientation) differs from the image's" in text
    # a 4-D NIfTI file holds channels on its last axis: the message names the fix
    assert (
        "images/c2.nii.gz: 2 image channel(s) (c2.nii.gz: (8, 8, 4, 2) as stored (x, y, z, "
        "channels), [D, H, W] = [4, 8, 8] (the file's z, y, x)), but in_channels=1: set "
        "in_channels=2"
    ) in text
    four_d = [c for c in find_cases(root) if c.name == "c2.nii.gz"]
    check_cases(four_d, 5, [2, 4, 4], in_channels=2)  # the fix the line names: no problem left


def test_truncated_file_is_named(root):
    path = root / "images" / "c1.nii.gz"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(UserInputError, match=r"images/c1.nii.gz: cannot read"):
        check_cases(find_cases(root), 5, [2, 4, 4])
