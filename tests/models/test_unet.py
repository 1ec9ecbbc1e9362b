import pytest
import torch

from volseg.models.unet import UNet3D, pooling_factors, widths_for_depth


def _count(net: torch.nn.Module) -> int:
    return sum(p.numel() for p in net.parameters())


@pytest.mark.parametrize("shape", [(26, 150, 320), (33, 47, 65), (16, 17, 31)])
def test_odd_sizes_keep_shape_on_meta(shape):
    with torch.device("meta"):
        net = UNet3D(
            1, 5, [64, 128, 256, 512, 512], [64, 64, 128, 256], norm="batch", activation="relu"
        )
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


def test_leaky_relu_keeps_a_gradient_for_negative_inputs():
    relu = UNet3D(1, 2, widths=[4, 8], activation="relu")
    leaky = UNet3D(1, 2, widths=[4, 8], activation="leaky_relu")
    leaky.load_state_dict(relu.state_dict())  # same weights: only the nonlinearity differs
    acts = [m for m in leaky.modules() if isinstance(m, torch.nn.LeakyReLU)]
    assert len(acts) == 2 * (1 + 1 + 1)  # two per DoubleConv: inc, one down, one up
    assert not any(isinstance(m, torch.nn.ReLU) for m in leaky.modules())
    x = torch.randn(1, 1, 8, 8, 8)
    assert not torch.allclose(relu(x), leaky(x))


def test_bad_settings_name_the_parameter():
    with pytest.raises(ValueError, match="^decoder_widths needs"):
        UNet3D(1, 2, widths=[4, 8, 16], decoder_widths=[4])
    with pytest.raises(ValueError, match="^norm must"):
        UNet3D(1, 2, widths=[4, 8], norm="layer")
    with pytest.raises(ValueError, match="^widths needs"):
        UNet3D(1, 2, widths=[4])
    with pytest.raises(ValueError, match="^activation must"):
        UNet3D(1, 2, widths=[4, 8], activation="gelu")


THIN = [[2, 2, 2], [2, 2, 2], [1, 2, 2], [1, 2, 2]]  # auto for 26 x 150 x 320, 4 poolings


def _bottleneck_shape(net: UNet3D, x: torch.Tensor) -> tuple[int, ...]:
    seen = []
    net.downs[-1].register_forward_hook(lambda m, i, out: seen.append(tuple(out.shape[2:])))
    assert net(x).shape[2:] == x.shape[2:]  # the output keeps the input's grid
    return seen[0]


def test_auto_pooling_keeps_z_unpooled_on_a_26_slice_patch():
    assert pooling_factors([4, 8, 16, 32, 64], "auto", [26, 150, 320]) == THIN
    with torch.device("meta"):
        net = UNet3D(1, 5, [4, 8, 16, 32, 64], pooling=THIN, patch_size=[26, 150, 320])
        # z: 26 -> 13 -> 6, then kept (6 < 8); y, x pooled 4 times
        assert _bottleneck_shape(net, torch.empty(1, 1, 26, 150, 320)) == (6, 9, 20)
    assert [down[0].kernel_size for down in net.downs] == [tuple(k) for k in THIN]
    assert [up.up.scale_factor for up in net.ups] == [tuple(map(float, k)) for k in THIN]


@pytest.mark.parametrize("upsampling", ["trilinear", "transposed"])
def test_auto_pooling_trains_an_8_slice_patch_a_fixed_one_cannot(upsampling):
    widths = [4, 8, 16, 32, 64]
    with pytest.raises(ValueError, match=r"D=8 < 16.*pooling=auto"):
        UNet3D(1, 3, widths, patch_size=[8, 64, 64])
    pooling = pooling_factors(widths, "auto", [8, 64, 64])  # what the run plan passes
    net = UNet3D(1, 3, widths, upsampling=upsampling, pooling=pooling, patch_size=[8, 64, 64])
    x = torch.randn(1, 1, 8, 64, 64, requires_grad=True)
    assert _bottleneck_shape(net, x) == (4, 4, 4)
    net(x).sum().backward()
    assert torch.isfinite(x.grad).all() and all(p.grad is not None for p in net.parameters())


def test_explicit_pooling_list_odd_sizes_and_transposed_kernels():
    pooling = [[1, 2, 2], [1, 2, 2], [2, 2, 2]]
    net = UNet3D(1, 3, [4, 8, 8, 8], pooling=pooling, upsampling="transposed")
    assert [up.up.kernel_size for up in net.ups] == [(1, 2, 2), (1, 2, 2), (2, 2, 2)]
    assert [up.up.stride for up in net.ups] == [(1, 2, 2), (1, 2, 2), (2, 2, 2)]
    x = torch.randn(1, 1, 5, 17, 19)
    assert _bottleneck_shape(net, x) == (2, 2, 2)  # z pooled once, y and x three times


def test_default_pooling_is_2_everywhere_with_the_same_weights():
    default = UNet3D(1, 5, [4, 8, 16], upsampling="transposed")
    explicit = UNet3D(1, 5, [4, 8, 16], upsampling="transposed", pooling=[[2, 2, 2]] * 2)
    assert default.pooling == explicit.pooling == [[2, 2, 2], [2, 2, 2]]
    shapes = {k: v.shape for k, v in default.state_dict().items()}
    assert shapes == {k: v.shape for k, v in explicit.state_dict().items()}


@pytest.mark.parametrize(
    "pooling, patch_size",
    [
        ([[2, 2, 2]], None),  # one kernel for two poolings
        ([[2, 2, 2], [3, 2, 2]], None),  # a factor other than 1 or 2
        ([[2, 2], [2, 2, 2]], None),  # not [z, y, x]
        ("sometimes", None),
        (2, None),  # not a list of kernels
        ("auto", [8, 64, 64]),  # auto: the run plan's to decide, not the network's
    ],
)
def test_bad_pooling_names_the_parameter(pooling, patch_size):
    with pytest.raises(ValueError, match="^pooling"):
        UNet3D(1, 2, widths=[4, 8, 16], pooling=pooling, patch_size=patch_size)


def test_the_network_takes_explicit_depth_not_auto():
    with pytest.raises(ValueError, match="auto is planned by the run plan"):
        UNet3D(1, 3, [4, 8, 16], patch_size=[32, 64, 64], depth="auto")
    assert UNet3D(1, 3, [4, 8, 16], depth=5).widths == widths_for_depth([4, 8, 16], 5)


def test_widths_for_depth_doubles_up_to_320_or_cuts():
    assert widths_for_depth([16, 32], 5) == [16, 32, 64, 128, 256]
    assert widths_for_depth([64, 128, 256], 5) == [64, 128, 256, 320, 320]
    assert widths_for_depth([16, 32, 64, 128], 2) == [16, 32]
