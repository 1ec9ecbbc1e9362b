"""Encoder and decoder on two devices (both the CPU here): autograd flows, Lightning keeps it."""

from __future__ import annotations

import copy

import pytest
import torch
from monai.losses import DiceCELoss

from tests.conftest import compose_config, tiny_train_overrides
from volseg.models.segmentation_module import SegmentationModule
from volseg.models.unet import UNet3D
from volseg.tasks.train import train


def test_split_network_has_the_unsplit_gradients():
    torch.manual_seed(0)
    net = UNet3D(1, 5, [8, 16, 32])
    split = copy.deepcopy(net)
    split.place("cpu", "cpu")
    assert split.encoder_device == split.decoder_device == torch.device("cpu")
    x = torch.randn(2, 1, 12, 20, 18)
    y = torch.randint(0, 5, (2, 1, 12, 20, 18)).float()
    loss = DiceCELoss(to_onehot_y=True, softmax=True)
    loss(net(x), y).backward()
    loss(split(x), y).backward()
    for (name, p), q in zip(net.named_parameters(), split.parameters(), strict=True):
        assert torch.allclose(p.grad, q.grad, rtol=1e-5, atol=1e-7), name


def test_placement_is_applied_after_lightning_moves_the_module(
    small_dataset, tmp_path, monkeypatch
):
    calls = []
    original = UNet3D.place

    def spy(self, encoder, decoder):
        calls.append((str(encoder), str(decoder)))
        original(self, encoder, decoder)

    monkeypatch.setattr(UNet3D, "place", spy)
    overrides = [
        *tiny_train_overrides(small_dataset),
        "model.placement={encoder: cpu, decoder: cpu}",
        "trainer.max_epochs=1",
    ]
    metrics = train(compose_config("train", tmp_path, overrides))
    assert torch.isfinite(torch.tensor(metrics["train/loss"]))
    # at fit start and at each validation start (sanity check and epoch end)
    assert calls and set(calls) == {("cpu", "cpu")} and len(calls) >= 2


def test_bad_placement_names_the_key():
    with pytest.raises(ValueError, match="model.placement must be"):
        SegmentationModule(
            UNet3D(1, 5, [4, 8]),
            DiceCELoss(),
            torch.optim.SGD,
            placement={"a": 1},
            nonfinite_check_every_n_steps=1,
        )
