import pytest
import torch

from volseg.models import UNet3D


def _count(net: torch.nn.Module) -> int:
    return sum(p.numel() for p in net.parameters())


@pytest.mark.parametrize("shape", [(26, 150, 320), (33, 47, 65), (16, 17, 31)])
def test_odd_sizes_keep_shape_on_meta(shape):
    with torch.device("meta"):
        net = UNet3D(1, 5, widths=[64, 128, 256, 512, 512], decoder_widths=[64, 64, 128, 256])
        out = net(torch.empty(2, 1, *shape))
    assert out.shape == (2, 5, *shape)


@pytest.mark.parametrize("upsampling", ["trilinear", "transposed"])
@pytest.mark.parametrize("norm", ["batch", "instance", "group"])
def test_real_forward_backward_odd_size(norm, upsampling):
    net = UNet3D(2, 3, widths=[4, 8, 8], norm=norm, upsampling=upsampling, dropout=0.1)
    x = torch.randn(2, 2, 9, 13, 10, requires_grad=True)
    out = net(x)
    assert out.shape == (2, 3, 9, 13, 10)
    out.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    assert all(p.grad is not None for p in net.parameters())


def test_transposed_upsampling_uses_conv_transpose():
    net = UNet3D(1, 2, widths=[4, 8], upsampling="transposed")
    assert isinstance(net.ups[0].up, torch.nn.ConvTranspose3d)


def test_bias_flag_and_norm_types():
    net = UNet3D(1, 2, widths=[4, 8], bias=False, norm="group", num_groups=2)
    convs = [m for m in net.modules() if isinstance(m, torch.nn.Conv3d) and m is not net.head]
    assert convs and all(c.bias is None for c in convs)
    assert any(isinstance(m, torch.nn.GroupNorm) for m in net.modules())


def test_bad_settings_name_the_key():
    with pytest.raises(ValueError, match="model.net.decoder_widths"):
        UNet3D(1, 2, widths=[4, 8, 16], decoder_widths=[4])
    with pytest.raises(ValueError, match="model.net.norm"):
        UNet3D(1, 2, widths=[4, 8], norm="layer")
    with pytest.raises(ValueError, match="model.net.widths"):
        UNet3D(1, 2, widths=[4])
