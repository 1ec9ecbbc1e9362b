"""The presets in configs/model/ build the exact networks they document."""

from pathlib import Path

import hydra
import pytest
import torch

from tests.conftest import compose_config
from volseg.models.networks.unet3d import auto_depth
from volseg.plan import make_plan


def _build(preset: str, tmp_path: Path) -> torch.nn.Module:
    cfg = compose_config("train", tmp_path, [f"model={preset}"])
    with torch.device("meta"):
        return hydra.utils.instantiate(cfg.model.net)


def _convs(block: torch.nn.Module) -> list[tuple[int, int]]:
    return [
        (m.in_channels, m.out_channels) for m in block.modules() if isinstance(m, torch.nn.Conv3d)
    ]


def test_unet_large_layout(tmp_path):
    net = _build("unet_large", tmp_path)
    assert sum(p.numel() for p in net.parameters()) == pytest.approx(40.2e6, rel=0.002)
    assert _convs(net.inc) == [(1, 64), (64, 64)]
    assert [_convs(d)[0] for d in net.downs] == [(64, 128), (128, 256), (256, 512), (512, 512)]
    # decoder listed bottom-up, as the classic ports print it
    assert [_convs(u)[0] for u in reversed(net.ups)] == [
        (1024, 256),
        (512, 128),
        (256, 64),
        (128, 64),
    ]
    assert _convs(net.head) == [(64, 5)]
    first = net.inc[0]
    assert first.kernel_size == (3, 3, 3) and first.padding == (1, 1, 1) and first.bias is not None
    assert isinstance(net.inc[1], torch.nn.BatchNorm3d)
    up = net.ups[0].up
    assert up.mode == "trilinear" and up.align_corners is True


def test_unet_small_layout(tmp_path):
    net = _build("unet_small", tmp_path)
    assert sum(p.numel() for p in net.parameters()) == pytest.approx(14.5e6, rel=0.002)
    assert [_convs(d)[0] for d in net.downs] == [(64, 128), (128, 256), (256, 256)]
    assert [_convs(u)[0] for u in reversed(net.ups)] == [(512, 256), (384, 128), (192, 64)]
    assert _convs(net.head) == [(64, 5)]


def test_unet_tiny_is_default_and_small(tmp_path):
    cfg = compose_config("train", tmp_path)
    assert cfg.model.net.widths == [16, 16, 32, 64, 128]
    net = hydra.utils.instantiate(make_plan(cfg, estimate_step=False).config.model.net)
    # what depth=auto plans for the 32x64x64 patch: 5 levels, pooling to a 4x4x4 bottleneck
    assert auto_depth(cfg.model.net.pooling, cfg.data.patch_size) == net.depth == 5
    assert net.pooling == [[2, 2, 2], [2, 2, 2], [2, 2, 2], [1, 2, 2]]
    assert sum(p.numel() for p in net.parameters()) < 2e6


def test_widths_override_and_top_level_classes(tmp_path):
    cfg = compose_config(
        "train", tmp_path, ["model.net.widths=[16,32,64]", "num_classes=3", "in_channels=2"]
    )
    net = hydra.utils.instantiate(cfg.model.net, pooling=None)  # 2 on every axis, 3 levels
    assert net.depth == 3
    assert net.inc[0].in_channels == 2 and net.head.out_channels == 3
    assert cfg.data.num_classes == 3 and cfg.model.num_classes == 3


@pytest.mark.parametrize("preset", ["unet_small", "unet_large"])
def test_group_norm_presets_keep_the_layout(tmp_path, preset):
    bn, gn = _build(preset, tmp_path), _build(f"{preset}_gn", tmp_path)
    assert sum(p.numel() for p in gn.parameters()) == sum(p.numel() for p in bn.parameters())
    assert not any(isinstance(m, torch.nn.BatchNorm3d) for m in gn.modules())
    groups = [m for m in gn.modules() if isinstance(m, torch.nn.GroupNorm)]
    assert groups and all(m.num_groups == 8 for m in groups)
