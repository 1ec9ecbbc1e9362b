"""The network contract: one override swaps a network or a loss, the adapters' divisibility,
checkpointing, placement and deep supervision, and the generic adapter on a network volseg did
not write."""

from __future__ import annotations

import copy

import pytest
import torch
from monai.losses import DeepSupervisionLoss, DiceCELoss
from omegaconf import OmegaConf
from torch import nn

from tests.conftest import compose_config
from volseg.models.build import build_model
from volseg.models.levers import MemoryLevers
from volseg.models.networks import NetworkAdapter, adapter_for
from volseg.models.networks.contract import child_blocks
from volseg.models.networks.probe import channel_names, probe_divisibility
from volseg.plan import make_plan

#: what only UNet3D takes: none may reach another network's constructor
UNET3D_KEYS = {"widths", "decoder_widths", "pooling", "depth", "patch_size", "upsampling", "norm"}


class DoubleConv(nn.Sequential):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__(
            nn.Conv3d(cin, cout, 3, padding=1, bias=False),
            nn.BatchNorm3d(cout),
            nn.ReLU(),
            nn.Conv3d(cout, cout, 3, padding=1, bias=False),
            nn.BatchNorm3d(cout),
            nn.ReLU(),
        )


class Up(nn.Module):
    def __init__(self, cin: int, cout: int, kernel: tuple[int, int, int]) -> None:
        super().__init__()
        self.up = nn.ConvTranspose3d(cin, cin // 2, kernel, stride=kernel)
        self.conv = DoubleConv(cin, cout)

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        return self.conv(torch.cat([skip, self.up(x)], dim=1))


class NetU(nn.Module):
    """A user's U-Net of the widely copied parts (no padding to the skip: sides must divide by
    what it pools), pooling z once and y, x twice: it needs D % 2 == 0 and H, W % 4 == 0."""

    def __init__(self, n_channels: int, n_classes: int, base: int = 4) -> None:
        super().__init__()
        self.inc = DoubleConv(n_channels, base)
        self.down1 = nn.Sequential(nn.MaxPool3d((2, 2, 2)), DoubleConv(base, 2 * base))
        self.down2 = nn.Sequential(nn.MaxPool3d((1, 2, 2)), DoubleConv(2 * base, 4 * base))
        self.up1 = Up(4 * base, 2 * base, (1, 2, 2))
        self.up2 = Up(2 * base, base, (2, 2, 2))
        self.outc = nn.Conv3d(base, n_classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x1 = self.inc(x)
        x2 = self.down1(x1)
        x3 = self.down2(x2)
        return self.outc(self.up2(self.up1(x3, x2), x1))


def test_model_net_replaces_the_network_and_passes_it_none_of_unet3ds_keys(tmp_path):
    cfg = compose_config("train", tmp_path, ["model/net=segresnet"])
    assert not UNET3D_KEYS & set(cfg.model.net)
    planned = make_plan(cfg, estimate_step=False).run_config()
    assert planned.model.net._target_ == "monai.networks.nets.SegResNet"
    assert not UNET3D_KEYS & set(planned.model.net)
    module = build_model(planned)
    assert type(module.net).__name__ == "SegResNet"
    assert module.net.conv_final[-1].conv.out_channels == 5  # num_classes, as out_channels


def test_a_preset_keeps_its_options_with_another_network(tmp_path):
    cfg = compose_config("train", tmp_path, ["model=unet_small", "model/net=basic_unet"])
    assert cfg.model.channels_last is True  # unet_small's module option
    assert cfg.model.net._target_ == "monai.networks.nets.BasicUNet"
    assert "widths" not in cfg.model.net


def test_model_loss_replaces_the_loss(tmp_path):
    # unet_tiny's loss weighs cross-entropy 0.25; another loss is not merged into it
    assert compose_config("train", tmp_path).model.loss.lambda_ce == 0.25
    cfg = compose_config("train", tmp_path, ["model/loss=dice_ce"])
    assert cfg.model.loss.lambda_ce == 1.0
    cfg = compose_config("train", tmp_path, ["model/loss=deep_supervision"])
    assert cfg.model.loss._target_ == "monai.losses.DeepSupervisionLoss"
    assert "lambda_ce" not in cfg.model.loss and cfg.model.loss.loss.lambda_ce == 1.0


@pytest.mark.parametrize(
    ("net", "multiple"),
    [("dynunet", 16), ("segresnet", 8), ("swin_unetr", 32), ("basic_unet", 16)],
)
def test_the_auto_patch_is_a_multiple_of_the_networks_divisibility(
    small_dataset, tmp_path, net, multiple
):
    overrides = [f"data.root={small_dataset}", "data.patch_size=auto", f"model/net={net}"]
    plan = make_plan(compose_config("train", tmp_path, overrides), estimate_step=False)
    patch = plan.value("data.patch_size")
    assert all(side % multiple == 0 for side in patch), patch
    assert plan.value("model.divisible_by") == [multiple] * 3


def test_deep_supervision_outputs_train_with_monais_deep_supervision_loss(tmp_path):
    plan = make_plan(compose_config("train", tmp_path, ["model/net=dynunet"]), estimate_step=False)
    assert plan.decisions["model.loss._target_"].source == "planned"
    module = build_model(plan.run_config())
    torch.manual_seed(0)
    stacked = torch.randn(2, 3, 5, 8, 16, 16)  # (B, 1 + deep_supr_num, K, D, H, W)
    label = torch.randint(0, 5, (2, 1, 8, 16, 16)).float()
    # the configured loss (unet_tiny's: cross-entropy weighed 0.25) on each output
    dice_ce = DiceCELoss(to_onehot_y=True, softmax=True, include_background=False, lambda_ce=0.25)
    expected = DeepSupervisionLoss(dice_ce, weight_mode="exp")(list(stacked.unbind(1)), label)
    assert module.compute_loss(stacked, label).item() == pytest.approx(expected.item(), rel=1e-6)
    # the weights 1, 1/2, 1/4 by hand
    by_hand = sum(w * dice_ce(stacked[:, i], label) for i, w in enumerate([1, 0.5, 0.25]))
    assert module.compute_loss(stacked, label).item() == pytest.approx(by_hand.item(), rel=1e-6)
    # in training the network returns the stack, for validation one full-resolution output
    x = torch.randn(1, 1, 16, 32, 32)
    assert module.net.train()(x).shape == (1, 3, 5, 16, 32, 32)
    assert module.net.eval()(x).shape == (1, 5, 16, 32, 32)


def test_divisibility_is_probed_for_a_network_without_an_adapter():
    cfg = OmegaConf.create({"_target_": f"{__name__}.NetU", "n_channels": 1, "n_classes": 3})
    assert adapter_for(NetU) is adapter_for(nn.Module)  # the generic one
    # pooled [2,2,2] then [1,2,2], no padding: D by 2, H and W by 4
    assert probe_divisibility(cfg, 1) == [2, 4, 4]


def test_channel_counts_are_passed_by_the_constructors_names():
    assert channel_names(NetU) == {"in_channels": "n_channels", "num_classes": "n_classes"}
    assert channel_names(nn.Conv3d) == {"in_channels": "in_channels", "num_classes": "out_channels"}

    class ImageOnly(nn.Module):
        def __init__(self, in_ch: int, width: int) -> None:
            super().__init__()

    assert channel_names(ImageOnly) == {"in_channels": "in_ch"}  # classes: by no known name


def _grads_and_stats(net: nn.Module, x: torch.Tensor) -> tuple[list, list]:
    net(x).square().mean().backward()
    grads = [p.grad.clone() for p in net.parameters()]
    stats = [b.clone() for name, b in net.named_buffers() if "running" in name]
    return grads, stats


def test_generic_checkpointing_keeps_gradients_statistics_and_state_dict_keys():
    torch.manual_seed(0)
    plain_net = NetU(1, 3)
    wrapped = MemoryLevers(activation_checkpointing="all").apply(copy.deepcopy(plain_net), "build")
    assert [n for n, _ in child_blocks(plain_net)] == [
        "inc",
        "down1",
        "down2",
        "up1",
        "up2",
        "outc",
    ]
    assert sum("CheckpointWrapper" in type(m).__name__ for m in wrapped.modules()) == 6
    assert list(wrapped.state_dict()) == list(plain_net.state_dict())
    x = torch.randn(2, 1, 4, 8, 8)
    grads, stats = _grads_and_stats(plain_net, x)
    grads_ckpt, stats_ckpt = _grads_and_stats(wrapped, x)
    for a, b in zip(grads, grads_ckpt, strict=True):
        torch.testing.assert_close(a, b)
    # the recomputation in backward does not update BatchNorm's running statistics again
    for a, b in zip(stats, stats_ckpt, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("spec", ["selective", {"inc": "selective", "up2": "full"}])
def test_generic_selective_checkpointing_keeps_gradients_and_statistics(spec):
    torch.manual_seed(0)
    plain_net = NetU(1, 3)
    wrapped = MemoryLevers(activation_checkpointing=spec).apply(copy.deepcopy(plain_net), "build")
    wrappers = [m for m in wrapped.modules() if "CheckpointWrapper" in type(m).__name__]
    # selective: every block but outc, a lone convolution (a segment would keep its output)
    assert len(wrappers) == (5 if spec == "selective" else 2)
    assert list(wrapped.state_dict()) == list(plain_net.state_dict())
    x = torch.randn(2, 1, 4, 8, 8)
    grads, stats = _grads_and_stats(plain_net, x)
    grads_ckpt, stats_ckpt = _grads_and_stats(wrapped, x)
    for a, b in zip(grads, grads_ckpt, strict=True):
        torch.testing.assert_close(a, b)
    for a, b in zip(stats, stats_ckpt, strict=True):
        torch.testing.assert_close(a, b)


def test_named_submodules_are_checkpointed_and_an_unknown_name_is_one_error():
    net = MemoryLevers(activation_checkpointing=["inc", "up2"]).apply(NetU(1, 3), "build")
    wrapped = [n for n, m in net.named_children() if "CheckpointWrapper" in type(m).__name__]
    assert wrapped == ["inc", "up2"]
    with pytest.raises(ValueError, match="model.activation_checkpointing: NetU has no submodule"):
        MemoryLevers(activation_checkpointing=["encoder"]).apply(NetU(1, 3), "build")


def test_swin_unetr_checkpointing_is_its_own_flag(tmp_path):
    cfg = make_plan(
        compose_config(
            "train", tmp_path, ["model/net=swin_unetr", "model.activation_checkpointing=all"]
        ),
        estimate_step=False,
    ).run_config()
    net = build_model(cfg).net
    flags = [m.use_checkpoint for m in net.modules() if hasattr(m, "use_checkpoint")]
    assert flags and all(flags)
    assert not any("CheckpointWrapper" in type(m).__name__ for m in net.modules())


def test_placement_by_submodule_name_moves_inputs_once_per_submodule():
    adapter = NetworkAdapter()
    net = NetU(1, 3)
    adapter.place(net, {"inc": "cpu", "up2": "cpu"})
    adapter.place(net, {"inc": "cpu", "up2": "cpu"})  # again at the next stage's start
    assert len(net.inc._forward_pre_hooks) == 1 and len(net.up2._forward_pre_hooks) == 1
    assert net(torch.randn(1, 1, 4, 8, 8)).shape == (1, 3, 4, 8, 8)
    with pytest.raises(ValueError, match="placement: NetU has no submodule 'encoder'"):
        adapter.check_placement(net, {"encoder": "cpu"})


def test_the_estimate_counts_the_deep_supervision_outputs(tmp_path):
    from tests.estimates import estimate

    base = ["model/net=dynunet", "data.batch_size=2", "data.patch_size=[16,32,32]"]
    base += ["trainer.accelerator=cpu", "trainer.precision=32"]
    steps = {}
    for deep in ("true", "false"):
        overrides = [*base, f"model.net.deep_supervision={deep}"]
        cfg = make_plan(compose_config("train", tmp_path, overrides), estimate_step=False)
        steps[deep] = estimate(cfg.run_config()).step_peak_growth
    # two more full-resolution outputs of 2 x 5 classes x 16x32x32 float32 voxels, each with its
    # softmax and gradient, at least the outputs themselves
    outputs = 2 * (2 * 5 * 16 * 32 * 32 * 4)
    assert steps["true"] - steps["false"] >= outputs


def test_a_swin_unetr_patch_with_one_voxel_at_the_bottleneck_is_one_error(tmp_path):
    from volseg.utils.errors import UserInputError

    overrides = ["model/net=swin_unetr", "data.patch_size=[32,32,32]"]
    with pytest.raises(UserInputError, match=r"data.patch_size=\[32, 32, 32\]: SwinUNETR"):
        make_plan(compose_config("train", tmp_path, overrides), estimate_step=False)
    overrides = ["model/net=swin_unetr", "data.patch_size=[32,64,64]"]
    make_plan(compose_config("train", tmp_path, overrides), estimate_step=False)  # 1x2x2: fine


def test_segresnet_takes_no_selective_checkpointing_which_its_in_place_skips_would_break():
    from monai.networks.nets import SegResNet

    torch.manual_seed(0)
    net = SegResNet(3, 8, 1, 3).train()
    with pytest.raises(ValueError, match=r"SegResNet .MONAI SegResNet. takes none, all, a list"):
        MemoryLevers(activation_checkpointing="selective").apply(copy.deepcopy(net), "build")
    # why: its residual blocks add the skip onto a kept convolution output in place
    NetworkAdapter().apply_checkpointing(net, "selective")
    with pytest.raises(RuntimeError, match="selective activation checkpoint has been mutated"):
        net(torch.randn(1, 1, 16, 16, 16)).sum().backward()
