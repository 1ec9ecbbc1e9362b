"""data.augment: the composed configs decide which flips and turns the training patches get."""

from __future__ import annotations

import shutil

import pytest
import torch
from monai.transforms import Compose
from omegaconf import OmegaConf

from tests.conftest import CONFIGS, compose_config
from volseg.data.dataset_defaults import DEFAULTS_FILE, resolve_augment
from volseg.data.transforms import (
    RandCropWithContextd,
    affine_crop_size,
    augment_transforms,
    train_transforms,
)
from volseg.utils.errors import UserInputError

PATCH = [8, 12, 12]
#: data=folder's data.augment, as the YAML gives it
FOLDER_AUGMENT = OmegaConf.to_container(OmegaConf.load(CONFIGS / "data" / "folder.yaml").augment)


def _views(patch, augment, n=64):
    """Which axes each of ``n`` randomly augmented copies of a patch came out mirrored in, and
    whether any came out turned in the H-W plane."""
    image = torch.arange(torch.tensor(patch).prod().item(), dtype=torch.float32).reshape(1, *patch)
    flipped, turned = set(), False
    transform = Compose(augment_transforms(patch, augment))
    for seed in range(n):
        transform.set_random_state(seed)
        out = transform({"image": image.clone(), "label": image.clone()})
        label = torch.as_tensor(out["label"])
        # the label carries no intensity jitter: compare it with mirrorings of the input
        flipped |= {axis for axis in range(3) if torch.equal(label, image.flip(1 + axis))}
        mirrorings = [[], [1], [2], [3], [1, 2], [1, 3], [2, 3], [1, 2, 3]]
        turned |= not any(torch.equal(label, image.flip(dims)) for dims in mirrorings)
    return flipped, turned


def test_default_anatomy_config_never_mirrors_or_turns(tmp_path):
    cfg = compose_config("train", tmp_path, ["data=mni152"])
    augment = _augment(cfg)
    assert augment["flip_axes"] == [] and augment["rotate90_planes"] == []
    # small rotations and zooms are opt-in (they paid off only in long runs)
    assert cfg.data.augment.rotate_degrees == 0 and cfg.data.augment.scale == 0
    flipped, turned = _views(PATCH, augment)
    assert flipped == set() and not turned


def test_enabled_axes_flip_and_disabled_axes_never_do(tmp_path):
    cfg = compose_config("train", tmp_path, ["data=mni152", "data.augment.flip_axes=[2]"])
    flipped, turned = _views(PATCH, _augment(cfg))
    assert flipped == {2} and not turned  # axis 2 mirrored alone sometimes; 0 and 1 never


def _augment(cfg):
    """``data.augment`` as the run uses it: null keys from the data folder's own defaults."""
    return resolve_augment(cfg.data.augment, cfg.data.root)[0]


def test_embedded_folder_keeps_all_flips_and_turns(tmp_path, small_dataset):
    """The generated folder carries its own defaults, so the default config gets them."""
    cfg = compose_config("train", tmp_path, [f"data.root={small_dataset}"])
    patch = [12, 12, 12]  # equal sides, so that a mirroring alone is recognisable in any axis
    flipped, turned = _views(patch, _augment(cfg))
    assert flipped == {0, 1, 2} and turned


def test_a_copy_or_symlink_of_the_embedded_folder_keeps_its_defaults(tmp_path, small_dataset):
    copy = tmp_path / "copy"
    shutil.copytree(small_dataset, copy)
    link = tmp_path / "link"
    link.symlink_to(small_dataset, target_is_directory=True)
    for root in (copy, link):
        cfg = compose_config("train", tmp_path / root.name, [f"data.root={root}"])
        augment, sources = resolve_augment(cfg.data.augment, cfg.data.root)
        assert augment["flip_axes"] == [0, 1, 2] and augment["rotate90_planes"] == [[1, 2]]
        assert DEFAULTS_FILE in sources["flip_axes"]


def test_own_data_root_gets_the_anatomy_defaults_not_the_embedded_ones(tmp_path, small_dataset):
    """``python train.py data.root=DIR`` keeps data=synthetic's config but gets data=folder's
    flips, turns and patch: the embedded data's suit its rotation-free objects only."""
    brains = tmp_path / "brains"
    shutil.copytree(small_dataset, brains)
    (brains / DEFAULTS_FILE).unlink()  # the same files without the embedded data's defaults
    folder = compose_config("train", tmp_path / "f", ["data=folder", f"data.root={brains}"])
    own = compose_config("train", tmp_path / "o", [f"data.root={brains}"])
    for key in ("flip_axes", "rotate90_planes", "rotate_degrees", "scale"):
        assert _augment(own)[key] == _augment(folder)[key], key
    assert own.data.patch_size == folder.data.patch_size
    flipped, turned = _views([12, 12, 12], _augment(own))
    assert flipped == set() and not turned
    # a value given on the command line wins over the folder's own
    given = compose_config(
        "train", tmp_path / "g", [f"data.root={small_dataset}", "data.augment.flip_axes=[]"]
    )
    assert _augment(given)["flip_axes"] == [] and _augment(given)["rotate90_planes"] == [[1, 2]]


def test_bad_augment_keys_name_the_key():
    with pytest.raises(UserInputError, match="data.augment.rotate90_planes"):
        augment_transforms([8, 12, 16], {**FOLDER_AUGMENT, "rotate90_planes": [[1, 2]]})  # 12 != 16
    with pytest.raises(UserInputError, match="data.augment: unknown key"):
        augment_transforms(PATCH, {"flip_axis": [0]})


def test_a_null_or_missing_number_names_the_key():
    """The YAML gives every key a value: a number left null or out is named, not guessed."""
    with pytest.raises(UserInputError, match=r"data.augment.prob=None: expected a number"):
        augment_transforms(PATCH, {**FOLDER_AUGMENT, "prob": None})
    with pytest.raises(UserInputError, match=r"data.augment: missing key\(s\) \['scale'\]"):
        augment_transforms(PATCH, {k: v for k, v in FOLDER_AUGMENT.items() if k != "scale"})


def test_affine_crop_grows_evenly_and_only_when_asked():
    assert affine_crop_size([32, 64, 64], 0.0, 0.0) == [32, 64, 64]
    crop = affine_crop_size([32, 64, 64], 15.0, 0.15)
    # a 15° turn about y moves a quarter of x's 64 voxels into z, and the zoom adds 15%
    assert all(c > p and (c - p) % 2 == 0 for c, p in zip(crop, [32, 64, 64], strict=True))
    assert crop[0] >= round(1.15 * (32 + 0.25 * 128))


def _patches(augment, seeds=range(8)):
    """(patch, centre of the enlarged crop) of a ramp image, for each seed."""
    patch = [8, 16, 16]
    options = {**FOLDER_AUGMENT, **augment, "intensity_scale": 0.0, "intensity_shift": 0.0}
    crop = affine_crop_size(patch, options.get("rotate_degrees", 0.0), options.get("scale", 0.0))
    image = torch.arange(torch.tensor(crop).prod().item(), dtype=torch.float32).reshape(1, *crop)
    label = (image.remainder(5)).floor()
    lo = [(c - p) // 2 for c, p in zip(crop, patch, strict=True)]
    centre = image[:, lo[0] : lo[0] + 8, lo[1] : lo[1] + 16, lo[2] : lo[2] + 16]
    transform = Compose(augment_transforms(patch, options))
    out = []
    for seed in seeds:
        transform.set_random_state(seed)
        item = transform({"image": image.clone(), "label": label.clone()})
        out.append((torch.as_tensor(item["image"]), torch.as_tensor(item["label"]), centre))
    return out


def test_rotation_and_zoom_resample_the_patch_from_the_enlarged_crop():
    views = _patches({"rotate_degrees": 15.0, "scale": 0.15, "prob": 1.0})
    for image, label, centre in views:
        assert image.shape == centre.shape
        assert not torch.equal(image, centre)  # turned or zoomed
        assert set(label.unique().tolist()) <= {0.0, 1.0, 2.0, 3.0, 4.0}  # nearest: no blends
        assert image.min() > 0  # every voxel from inside the crop (the ramp starts at 0)


def test_an_affine_not_drawn_leaves_the_centre_of_the_crop_exactly():
    for image, _, centre in _patches({"rotate_degrees": 15.0, "scale": 0.15, "prob": 0.0}):
        assert torch.equal(image, centre)


def test_bad_rotation_or_zoom_names_the_key():
    with pytest.raises(UserInputError, match=r"data.augment.rotate_degrees=120"):
        augment_transforms(PATCH, {**FOLDER_AUGMENT, "rotate_degrees": 120})
    with pytest.raises(UserInputError, match=r"data.augment.scale=-0.1"):
        augment_transforms(PATCH, {**FOLDER_AUGMENT, "scale": -0.1})


def test_patches_with_context_still_reach_the_corners_of_the_volume():
    # classes 1 and 2 only at two opposite corners: every patch must contain one of them
    label = torch.zeros(1, 20, 30, 30)
    label[0, 0, 0, 0], label[0, -1, -1, -1] = 1, 2
    image = torch.arange(1, 1 + 20 * 30 * 30, dtype=torch.float32).reshape(1, 20, 30, 30)
    sampler = RandCropWithContextd(["image", "label"], [8, 12, 12], [4, 6, 6], 3, [0, 1, 1])
    for seed in range(10):
        sampler.set_random_state(seed)
        (item,) = sampler({"image": image, "label": label})
        assert item["image"].shape == (1, 16, 24, 24)
        patch = (slice(None), slice(4, 12), slice(6, 18), slice(6, 18))
        assert item["image"][patch].min() > 0  # the patch itself lies inside the volume
        assert set(item["label"][patch].unique().tolist()) & {1.0, 2.0}
        assert item["image"].min() == 0  # its context reaches beyond the corner: padding


def test_rotations_and_zooms_are_one_plain_override_away(tmp_path):
    overrides = ["data=mni152", "data.augment.rotate_degrees=15", "data.augment.scale=0.15"]
    cfg = compose_config("train", tmp_path, overrides)
    locations = cfg.data.max_locations_per_class
    transform = train_transforms([32, 64, 64], 5, None, _augment(cfg), locations)
    names = [type(t).__name__ for t in transform.transforms]
    assert "RandCropWithContextd" in names and "RandAffined" in names
    plain = train_transforms(
        [32, 64, 64], 5, None, compose_config("train", tmp_path, []).data.augment, locations
    )
    assert "RandCropByLabelClassesd" in [type(t).__name__ for t in plain.transforms]


def test_a_patch_is_copied_out_of_its_cached_volume_without_the_volumes_metadata():
    from monai.data import MetaTensor

    from volseg.data.transforms import OwnPatchd

    volume = MetaTensor(torch.arange(24.0).reshape(1, 2, 3, 4), meta={"filename": "a.nii.gz"})
    view = volume[:, :1]  # a crop: a view into the cached volume
    patch = OwnPatchd(["image"])({"image": view})["image"]
    assert type(patch) is torch.Tensor and torch.equal(patch, view.as_tensor())
    patch.add_(100)  # a later transform writing into its patch
    assert volume.max() == 23 and volume.meta["filename"] == "a.nii.gz"
