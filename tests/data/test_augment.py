"""data.augment: the composed configs decide which flips and turns the training patches get."""

from __future__ import annotations

import pytest
import torch
from monai.transforms import Compose

from tests.conftest import compose_config
from volseg.data.transforms import augment_transforms
from volseg.utils.errors import UserInputError

PATCH = [8, 12, 12]


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
    assert list(cfg.data.augment.flip_axes) == [] and list(cfg.data.augment.rotate90_planes) == []
    flipped, turned = _views(PATCH, cfg.data.augment)
    assert flipped == set() and not turned


def test_enabled_axes_flip_and_disabled_axes_never_do(tmp_path):
    cfg = compose_config("train", tmp_path, ["data=mni152", "data.augment.flip_axes=[2]"])
    flipped, turned = _views(PATCH, cfg.data.augment)
    assert flipped == {2} and not turned  # axis 2 mirrored alone sometimes; 0 and 1 never


def test_synthetic_config_keeps_all_flips_and_turns(tmp_path):
    cfg = compose_config("train", tmp_path, [])
    patch = [12, 12, 12]  # equal sides, so that a mirroring alone is recognisable in any axis
    flipped, turned = _views(patch, cfg.data.augment)
    assert flipped == {0, 1, 2} and turned


def test_bad_augment_keys_name_the_key():
    with pytest.raises(UserInputError, match="data.augment.rotate90_planes"):
        augment_transforms([8, 12, 16], {"rotate90_planes": [[1, 2]]})  # 12 != 16
    with pytest.raises(UserInputError, match="data.augment: unknown key"):
        augment_transforms(PATCH, {"flip_axis": [0]})
