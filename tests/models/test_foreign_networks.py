"""Other projects' U-Nets (the networks extra): nnU-Net's PlainConvUNet and ResidualEncoderUNet
(dynamic-network-architectures) and pytorch-3dunet's UNet3D and ResidualUNet3D, from their
shipped configs and from ``model/net=custom``: their adapters' divisibility, deep supervision,
blocks and logits, and their mistakes as one line."""

from __future__ import annotations

import copy
import sys

import pytest
import torch
from omegaconf import OmegaConf

from tests.conftest import PLAIN_CONV_UNET_CUSTOM, compose_config, tiny_train_overrides
from tests.estimates import estimate
from volseg.models.build import build_model
from volseg.models.levers import MemoryLevers
from volseg.models.networks import NetworkAdapter, adapter_for
from volseg.models.networks.foreign import DynamicUNetAdapter, Pytorch3DUNetAdapter
from volseg.models.networks.probe import channel_names
from volseg.plan import make_plan, planned_config
from volseg.tasks.train import train
from volseg.utils.entry import run_task

unet = pytest.importorskip("dynamic_network_architectures.architectures.unet")
p3d = pytest.importorskip("pytorch3dunet.unet3d.model")

SHIPPED = {
    "plain_conv_unet": unet.PlainConvUNet,
    "residual_encoder_unet": unet.ResidualEncoderUNet,
    "pytorch3dunet_unet3d": p3d.UNet3D,
    "pytorch3dunet_residual_unet3d": p3d.ResidualUNet3D,
}

#: the documented PlainConvUNet override with per-axis strides (z pooled once, y and x twice)
PLAIN_CUSTOM = [
    "+model.net.strides=[1,[1,2,2],2]" if o.startswith("+model.net.strides=") else o
    for o in PLAIN_CONV_UNET_CUSTOM
]


def _same_gradients(plain, wrapped) -> torch.Tensor:
    """Backward through both networks (every deep-supervision output) on one input; assert
    each parameter's gradient is the same; return the input."""
    x = torch.randn(2, 1, 16, 32, 32)
    for net in (plain, wrapped):
        sum(h.square().mean() for h in net(x)).backward()
    for a, b in zip(plain.parameters(), wrapped.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad)
    return x


def _planned(tmp_path, overrides):
    return make_plan(compose_config("train", tmp_path, overrides), estimate_step=False)


@pytest.mark.parametrize("net", SHIPPED)
def test_each_shipped_config_builds_its_class_with_the_channels_under_its_names(tmp_path, net):
    plan = _planned(tmp_path, [f"model/net={net}", "num_classes=3"])
    module = build_model(plan.run_config())
    assert type(module.net) is SHIPPED[net]
    x = torch.randn(1, 1, 16, 32, 32)
    out = module.eval()(x)  # validation's output: full-resolution logits, a tensor
    assert isinstance(out, torch.Tensor) and out.shape == (1, 3, 16, 32, 32)


def test_pytorch3dunet_takes_the_classes_as_out_channels_though_it_takes_kwargs():
    assert channel_names(p3d.UNet3D) == {
        "in_channels": "in_channels",
        "num_classes": "out_channels",
    }
    assert channel_names(unet.PlainConvUNet) == {
        "in_channels": "input_channels",
        "num_classes": "num_classes",
    }


def test_the_adapters_are_found_by_class():
    assert isinstance(adapter_for(unet.PlainConvUNet), DynamicUNetAdapter)
    assert isinstance(adapter_for(unet.ResidualEncoderUNet), DynamicUNetAdapter)
    assert isinstance(adapter_for(p3d.UNet3D), Pytorch3DUNetAdapter)
    assert isinstance(adapter_for(p3d.ResidualUNet3D), Pytorch3DUNetAdapter)
    assert type(adapter_for(torch.nn.Conv3d)) is NetworkAdapter


def test_the_custom_plain_conv_unet_divides_by_its_strides_and_trains_deep_supervision(tmp_path):
    plan = _planned(tmp_path, [*PLAIN_CUSTOM, "data.patch_size=[16,32,32]"])
    # strides 1, [1,2,2], 2: z halved once, y and x twice
    assert plan.value("model.divisible_by") == [2, 4, 4]
    assert plan.decisions["model.loss._target_"].source == "planned"
    module = build_model(plan.run_config())
    x = torch.randn(2, 1, 16, 32, 32)
    heads = module.train()(x)  # one output per decoder level, full resolution first
    assert [tuple(h.shape) for h in heads] == [(2, 5, 16, 32, 32), (2, 5, 16, 16, 16)]
    label = torch.randint(0, 5, (2, 1, 16, 32, 32)).float()
    loss = module.compute_loss(heads, label)
    inner = module.loss.loss  # the configured Dice+CE, on each head, weighed 1, 1/2
    small = torch.nn.functional.interpolate(label, size=(16, 16, 16), mode=module.loss.interp_mode)
    by_hand = inner(heads[0], label) + 0.5 * inner(heads[1], small)
    assert loss.item() == pytest.approx(by_hand.item(), rel=1e-5)
    assert module.eval()(x).shape == (2, 5, 16, 32, 32)


def test_checkpointing_all_wraps_the_stages_one_level_down_with_the_same_gradients(tmp_path):
    cfg = _planned(tmp_path, [*PLAIN_CUSTOM, "data.patch_size=[16,32,32]"]).run_config()
    torch.manual_seed(0)
    plain = build_model(cfg).net.train()
    names = [n for n, _ in adapter_for(plain).blocks(plain)]
    # the decoder holds the encoder: its own lists are the blocks, not the decoder as one
    assert names == [
        "encoder.stages.0",
        "encoder.stages.1",
        "encoder.stages.2",
        "decoder.transpconvs.0",
        "decoder.transpconvs.1",
        "decoder.stages.0",
        "decoder.stages.1",
        "decoder.seg_layers.0",
        "decoder.seg_layers.1",
    ]
    wrapped = MemoryLevers(activation_checkpointing="all").apply(copy.deepcopy(plain), "build")
    assert sum("CheckpointWrapper" in type(m).__name__ for m in wrapped.modules()) == len(names)
    assert list(wrapped.state_dict()) == list(plain.state_dict())
    _same_gradients(plain, wrapped)


def test_selective_reaches_the_conv_units_and_keeps_the_gradients_and_outputs(tmp_path):
    """``selective`` on PlainConvUNet: each encoder stage is a chain of its conv units' layers
    (cut after each kept convolution), the decoder concatenates inside its stages' segments
    (its own forward replaced, its transposed convolutions and heads not wrapped), and the
    gradients and the evaluation output are those without checkpointing."""
    cfg = _planned(tmp_path, [*PLAIN_CUSTOM, "data.patch_size=[16,32,32]"]).run_config()
    torch.manual_seed(0)
    plain = build_model(cfg).net.train()
    adapter = adapter_for(plain)
    layers = [type(m).__name__ for m in adapter.chain(plain.encoder.stages[1])]
    assert layers == ["Conv3d", "InstanceNorm3d", "LeakyReLU"] * 2
    wrapped = MemoryLevers(activation_checkpointing="selective").apply(
        copy.deepcopy(plain), "build"
    )
    names = [n for n, m in wrapped.named_modules() if "CheckpointWrapper" in type(m).__name__]
    assert names == ["encoder.stages.0", "encoder.stages.1", "encoder.stages.2"]
    assert "forward" in vars(wrapped.decoder)
    assert list(wrapped.state_dict()) == list(plain.state_dict())
    x = _same_gradients(plain, wrapped)
    with torch.no_grad():
        torch.testing.assert_close(plain.eval()(x), wrapped.eval()(x))


def test_selective_cuts_plain_conv_unets_estimated_step(tmp_path):
    """The estimate runs the same selective segments: PlainConvUNet's step grows by at most
    0.75x of what it grows without checkpointing (about 0.6x; 0.91x when its stages were one
    segment each and its decoder kept every concatenation)."""
    overrides = ["model/net=plain_conv_unet", "data.batch_size=2", "data.patch_size=[16,32,32]"]
    overrides += ["trainer.precision=32", "memory.plan_device=cpu"]
    cfg = planned_config(compose_config("train", tmp_path, overrides))
    none = estimate(cfg, activation_checkpointing="none").step_peak_growth
    selective = estimate(cfg, activation_checkpointing="selective").step_peak_growth
    assert selective < 0.75 * none


def test_pytorch3dunet_returns_logits_in_training(tmp_path):
    overrides = ["model/net=custom", "model.net._target_=pytorch3dunet.unet3d.model.UNet3D"]
    overrides += ["+model.net.f_maps=8", "+model.net.num_levels=3"]
    plan = _planned(tmp_path, [*overrides, "data.patch_size=[16,32,32]"])
    assert plan.decisions["model.net.is_segmentation"].value is False
    net = build_model(plan.run_config()).net.train()
    out = net(torch.randn(1, 1, 16, 32, 32))
    # not a sigmoid's or softmax's output: values outside [0, 1]
    assert out.shape == (1, 5, 16, 32, 32) and (out.min() < 0 or out.max() > 1)
    assert net.final_activation is None


def _tiny(root, overrides):
    """The tests' tiny run (its UNet3D settings left out) with ``overrides``."""
    base = [o for o in tiny_train_overrides(root) if not o.startswith("model.net.")]
    return [*base, *overrides]


def _one_line(cfg, capsys) -> str:
    with pytest.raises(SystemExit) as stopped:
        run_task(train, cfg)
    err = capsys.readouterr().err
    assert stopped.value.code == 2, err
    assert "Traceback" not in err and err.startswith("error: ") and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["model/net=plain_conv_unet", "+model.net.n_stagez=4"], "model.net.n_stagez: "),
        (
            ["model/net=plain_conv_unet", "model.net.conv_op.path=torch.nn.Conv3dd"],
            "model.net.conv_op.path=torch.nn.Conv3dd: does not import (torch.nn has no 'Conv3dd')",
        ),
        (
            [
                "model/net=custom",
                "model.net._target_=dynamic_network_architectures.architectures.unet.PlainUNet",
            ],
            "model.net._target_=dynamic_network_architectures.architectures.unet.PlainUNet: "
            "does not import (dynamic_network_architectures.architectures.unet has no 'PlainUNet')",
        ),
        (["model/net=pytorch3dunet_unet3d", "+model.net.fmaps=8"], "model.net.fmaps: UNet3D "),
        (  # its constructor's own assertion: 4 + 8 concatenated channels in 8 groups
            ["model/net=pytorch3dunet_unet3d", "model.net.f_maps=4"],
            "model.net.num_groups=8: Expected number of channels in input to be divisible by",
        ),
        (
            ["model/net=plain_conv_unet", "model.net.n_conv_per_stage=[2,2]"],
            "model.net.n_conv_per_stage=[2, 2]: n_conv_per_stage must have as many entries",
        ),
        (
            ["model/net=pytorch3dunet_residual_unet3d", "model.net.is_segmentation=true"],
            "set model.net.is_segmentation=false",
        ),
    ],
    ids=lambda v: str(v),
)
def test_a_mistake_is_one_line_naming_the_key(small_dataset, tmp_path, capsys, overrides, expected):
    cfg = compose_config("train", tmp_path / "run", _tiny(small_dataset, overrides))
    assert expected in _one_line(cfg, capsys)
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_network_whose_package_is_not_installed_names_the_extra(
    small_dataset, tmp_path, capsys, monkeypatch
):
    for name in [m for m in sys.modules if m.startswith("pytorch3dunet")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "pytorch3dunet", None)  # import pytorch3dunet fails
    overrides = _tiny(small_dataset, ["model/net=pytorch3dunet_unet3d"])
    err = _one_line(compose_config("train", tmp_path / "run", overrides), capsys)
    assert "model.net._target_=pytorch3dunet.unet3d.model.UNet3D needs the pytorch3dunet " in err
    assert '-e ".[networks]"' in err and f"torch=={torch.__version__.split('+')[0]}" in err


def test_the_plan_of_a_shipped_config_records_its_class_paths(tmp_path):
    cfg = _planned(tmp_path, ["model/net=residual_encoder_unet"]).run_config()
    net = OmegaConf.to_container(cfg.model.net, resolve=True)
    assert net["conv_op"] == {"_target_": "hydra.utils.get_class", "path": "torch.nn.Conv3d"}
    assert net["input_channels"] == 1 and net["num_classes"] == 5
