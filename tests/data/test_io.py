import numpy as np
import pytest
import torch

from volseg.data.io import read_array, read_geometry, write_volume
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
