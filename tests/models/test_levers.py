"""The memory levers: validated where they are built, naming the config key; one list of them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from monai.losses import DiceCELoss
from omegaconf import OmegaConf

from tests.conftest import compose_config
from volseg.memory.monitor.oom_report import INFERENCE_LEVERS, LEVERS
from volseg.models.checkpointing import CHECKPOINTING_CHOICES
from volseg.models.levers import LEVERS as ALL_LEVERS
from volseg.models.levers import MemoryLevers
from volseg.models.segmentation_module import SegmentationModule
from volseg.models.unet import UNet3D


@pytest.mark.parametrize(
    ("levers", "key"),
    [
        ({"activation_checkpointing": 3}, "model.activation_checkpointing must be"),
        ({"activation_checkpointing": [1.5]}, "model.activation_checkpointing must be"),
        ({"offload_activations": "yes"}, "model.offload_activations must be true, false or"),
        ({"cudnn_workspace_mib": -1}, "model.cudnn_workspace_mib must be null or MiB"),
        ({"checkpoint_loss": 1}, "model.checkpoint_loss must be"),
        ({"channels_last": None}, "model.channels_last must be"),
        ({"placement": {"a": 0}}, "model.placement must be"),
    ],
)
def test_a_bad_lever_names_its_key(levers, key):
    with pytest.raises(ValueError, match=key):
        MemoryLevers(**levers)


def test_levels_beyond_the_network_name_the_key():
    with pytest.raises(ValueError, match=r"model.activation_checkpointing=\[3\].*0..1"):
        SegmentationModule(
            UNet3D(1, 5, [4, 8]),
            DiceCELoss(),
            torch.optim.SGD,
            activation_checkpointing=[3],
            nonfinite_check_every_n_steps=1,
        )


@pytest.mark.parametrize(
    ("net", "levers", "message"),
    [
        (
            UNet3D(1, 5, [4, 8]),
            {"activation_checkpointing": "some"},
            "model.activation_checkpointing: UNet3D .volseg UNet3D. takes none, selective, "
            "decoder, encoder",
        ),
        (
            UNet3D(1, 5, [4, 8]),
            {"activation_checkpointing": {"encoder": "selective", "middle": "full"}},
            "model.activation_checkpointing: 'middle' is not a part; a mapping names encoder, "
            "decoder",
        ),
        (
            UNet3D(1, 5, [4, 8]),
            {"activation_checkpointing": {"encoder": "some"}},
            "model.activation_checkpointing: encoder='some'; each part is checkpointed full or "
            "selective",
        ),
        (
            torch.nn.Sequential(torch.nn.Conv3d(1, 1, 1)),
            {"activation_checkpointing": {"1": "selective"}},
            "model.activation_checkpointing: Sequential has no submodule '1'",
        ),
        (
            UNet3D(1, 5, [4, 8]),
            {"activation_checkpointing": [-1]},
            "model.activation_checkpointing: UNet3D .volseg UNet3D. takes",
        ),
        (
            UNet3D(1, 5, [4, 8]),
            {"placement": {"a": "cpu"}},
            "model.placement: UNet3D is split as {encoder: DEVICE, decoder: DEVICE}",
        ),
        (
            torch.nn.Conv3d(1, 1, 1),
            {"placement": {"encoder": "cpu", "decoder": "cpu"}},
            "model.placement: Conv3d has no submodule 'encoder'",
        ),
        (
            torch.nn.Conv3d(1, 1, 1),
            {"activation_checkpointing": "decoder"},
            "model.activation_checkpointing: Conv3d .any nn.Module. takes none, selective, all, a "
            "list of submodule names or a mapping of submodule names to full/selective",
        ),
    ],
)
def test_a_lever_the_network_cannot_take_names_the_key(net, levers, message):
    with pytest.raises(ValueError, match=message):
        MemoryLevers(**levers).apply(net, "build")


def test_checkpointing_marks_the_chosen_blocks():
    net = MemoryLevers(activation_checkpointing="decoder").apply(UNet3D(1, 5, [4, 8, 16]), "build")
    assert [up.checkpointed for up in net.ups] == ["full", "full"]
    assert not net.inc.checkpointed
    spec = {"encoder": "selective", "decoder": "full"}
    net = MemoryLevers(activation_checkpointing=spec).apply(UNet3D(1, 5, [4, 8, 16]), "build")
    assert [up.checkpointed for up in net.ups] == ["full", "full"]
    assert net.inc.checkpointed == "selective" and net.downs[1][1].checkpointed == "selective"


def test_the_oom_report_lists_every_lever_once():
    named = [
        line for line in (*LEVERS, *INFERENCE_LEVERS) if line.startswith("  ") and ". " in line
    ]
    assert len(named) == len(ALL_LEVERS)
    for lever in ALL_LEVERS:
        assert sum(lever.setting in line for line in named) == 1, lever.name


def test_the_docs_lever_table_is_the_levers_list():
    rows = ["| lever | config | what it does |", "| --- | --- | --- |"]
    for lever in ALL_LEVERS:
        setting = lever.setting.replace("|", "\\|")
        rows.append(f"| {lever.name} | `{setting}` | {lever.does} |")
    docs = (Path(__file__).parents[2] / "docs" / "memory.md").read_text()
    assert "\n".join(rows) in docs


def test_the_planner_tries_the_checkpointing_choices_the_network_knows(tmp_path):
    from volseg.memory.fit.step_fit import checkpointing_choices

    options = OmegaConf.load(Path(__file__).parents[2] / "configs/memory/default.yaml")
    assert options.checkpointing_options == "auto"
    cfg = compose_config("train", tmp_path, [])
    assert checkpointing_choices(cfg, "auto") == list(CHECKPOINTING_CHOICES)
    cfg = compose_config("train", tmp_path, ["model/net=basic_unet"])
    assert checkpointing_choices(cfg, "auto") == ["none", "selective", "all"]
    # SegResNet's residual blocks add onto a kept convolution output in place: no selective
    cfg = compose_config("train", tmp_path, ["model/net=segresnet"])
    assert checkpointing_choices(cfg, "auto") == ["none", "all"]


def test_cudnn_workspace_cap_is_set_for_cudnn_at_fit_setup(monkeypatch):
    from volseg.models.levers import CUDNN_WORKSPACE_CAP_ENV

    monkeypatch.delenv(CUDNN_WORKSPACE_CAP_ENV, raising=False)
    levers = MemoryLevers(cudnn_workspace_mib=64)
    net = UNet3D(1, 2, widths=[4, 8])
    levers.apply(net, "build")
    assert CUDNN_WORKSPACE_CAP_ENV not in os.environ  # not before set-up
    levers.apply(net, "setup", "fit")
    assert os.environ[CUDNN_WORKSPACE_CAP_ENV] == "64"


def test_full_resolution_offload_keeps_the_smaller_maps():
    from volseg.models.offload import worth_offloading

    full, half = torch.empty(1, 4, 8, 16, 16), torch.empty(1, 8, 4, 8, 8)
    assert worth_offloading(full, 8 * 16 * 16) and not worth_offloading(half, 8 * 16 * 16)
    assert worth_offloading(half, 0)
