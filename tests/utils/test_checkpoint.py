"""A checkpoint of another network: the error names the checkpoint's own network and the model
group that builds it (the fix), whether or not model.* overrides were given."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from tests.conftest import compose_config
from volseg.utils.checkpoint import check_weights_fit
from volseg.utils.errors import UserInputError


def _checkpoint_of(net_cfg) -> dict:
    """A checkpoint as train.py saves it (its config's network), with no weights: every tensor
    of the network it is checked against is missing."""
    saved = OmegaConf.to_container(net_cfg, resolve=True)
    return {"state_dict": {}, "volseg": {"config": {"model": {"net": saved}}}}


def test_a_checkpoint_of_another_model_group_names_that_group(tmp_path):
    small = compose_config("train", tmp_path / "small", ["model=unet_small"])
    checkpoint = _checkpoint_of(small.model.net)
    cfg = compose_config("train", tmp_path / "default", [])  # no model.* override at all
    with pytest.raises(UserInputError) as err:
        check_weights_fit(torch.nn.Conv3d(1, 4, 3), checkpoint, cfg.model, "run/last.ckpt")
    text = str(err.value)
    assert "they are of volseg.models.unet.UNet3D with" in text
    assert "widths=[64, 128, 256, 256] (the config: [16, 16, 32, 64, 128])" in text
    assert "pass model=unet_small (the network it was trained with)" in text
    assert "weight: in the network, not in the checkpoint" in text


def test_a_network_no_config_file_builds_is_named_without_a_group(tmp_path):
    odd = compose_config("train", tmp_path / "odd", ["model.net.widths=[4,8,16]"])
    checkpoint = _checkpoint_of(odd.model.net)
    cfg = compose_config("train", tmp_path / "default", [])
    with pytest.raises(UserInputError) as err:
        check_weights_fit(torch.nn.Conv3d(1, 4, 3), checkpoint, cfg.model, "run/last.ckpt")
    text = str(err.value)
    assert "widths=[4, 8, 16] (the config: [16, 16, 32, 64, 128])" in text
    assert "model=" not in text.split("\n")[0].split("widths")[0]
    assert "compose the network it was trained with" in text
