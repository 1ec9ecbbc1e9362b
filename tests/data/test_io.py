import numpy as np
import pytest
import torch

from volseg.data.io import label_dtype, read_array, read_geometry, write_volume
from volseg.data.transforms import eval_transforms


@pytest.mark.parametrize("suffix", [".nii.gz", ".nii", ".tif", ".tiff"])
def test_round_trip_keeps_axes_values_and_spacing(tmp_path, suffix):
    rng = np.random.default_rng(0)
    image = rng.normal(size=(5, 7, 9)).astype(np.float32)  # (D, H, W)
    label = rng.integers(0, 4, size=(5, 7, 9)).astype(np.uint8)
    write_volume(tmp_path / f"image{suffix}", image, spacing_zyx=(2.0, 0.5, 0.25))
    write_volume(tmp_path / f"label{suffix}", label, spacing_zyx=(2.0, 0.5, 0.25))

    geometry = read_geometry(tmp_path / f"image{suffix}")
    assert geometry["shape_zyx"] == (5, 7, 9)
    assert np.allclose(np.diag(geometry["affine"])[:3], [0.25, 0.5, 2.0], rtol=1e-5)
    assert np.array_equal(read_array(tmp_path / f"label{suffix}"), label)

    # through MONAI's LoadImaged (our TIFF reader registered) and the axis transpose
    item = eval_transforms()(
        {"image": str(tmp_path / f"image{suffix}"), "label": str(tmp_path / f"label{suffix}")}
    )
    assert item["image"].shape == (1, 5, 7, 9)
    assert torch.equal(item["label"][0].to(torch.uint8), torch.from_numpy(label))
    normalized = (image - image.mean()) / image.std()
    assert np.allclose(item["image"][0].numpy(), normalized, atol=1e-4)


def test_unsupported_suffix_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"volume\.png: unsupported file type"):
        write_volume(tmp_path / "volume.png", np.zeros((2, 2, 2)))


def test_a_4d_nifti_holds_its_channels_on_the_last_axis(tmp_path):
    """The Decathlon stores a multi-modal case as one (x, y, z, modality) NIfTI file."""
    import nibabel as nib

    volume = np.random.default_rng(0).normal(size=(9, 7, 5, 4)).astype(np.float32)
    nib.save(nib.Nifti1Image(volume, np.diag([0.5, 0.5, 2.0, 1.0])), tmp_path / "brats.nii.gz")
    geometry = read_geometry(tmp_path / "brats.nii.gz")
    assert geometry["channels"] == 4 and geometry["shape_zyx"] == (5, 7, 9)
    assert geometry["stored_shape"] == (9, 7, 5, 4)
    item = eval_transforms(with_label=False)({"image": str(tmp_path / "brats.nii.gz")})
    assert item["image"].shape == (4, 5, 7, 9)  # (C, D, H, W): D is the file's z
    for c in range(4):  # each modality z-scored on its own, in the file's own voxel order
        modality = volume[..., c].transpose(2, 1, 0)
        normalized = (modality - modality.mean()) / modality.std()
        assert np.allclose(item["image"][c].numpy(), normalized, atol=1e-4)


def test_tiff_stacks_of_one_case_join_as_channels(tmp_path):
    stacks = [(np.full((3, 4, 5), v) + np.arange(5)).astype(np.float32) for v in (0.0, 10.0)]
    for i, stack in enumerate(stacks):
        write_volume(tmp_path / f"c_{i:04d}.tif", stack)
    files = [str(tmp_path / f"c_{i:04d}.tif") for i in range(2)]
    item = eval_transforms(with_label=False)({"image": files})
    assert item["image"].shape == (2, 3, 4, 5)
    assert torch.all(item["image"][:, :, :, 1:] > item["image"][:, :, :, :-1])


def test_a_label_volume_is_written_in_the_smallest_type_of_its_class_ids():
    # predict.py's label files and the validation writer's both take this type
    assert label_dtype(2) == np.uint8 and label_dtype(256) == np.uint8
    assert label_dtype(257) == np.uint16 and label_dtype(65_536) == np.uint16
