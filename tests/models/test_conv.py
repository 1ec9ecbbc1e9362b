"""volseg's Conv3d: a CPU bf16 call on an input of depth 2 runs in float32 (oneDNN's bf16 weight
gradient there is wrong on AVX-512 kernels), every other call is nn.Conv3d's own."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from volseg.models.conv import Conv3d, traced_for_cuda
from volseg.models.unet import UNet3D


def _weight_grad(conv: nn.Module, x: torch.Tensor, grad: torch.Tensor, bf16: bool):
    conv.weight.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        y = conv(x)
    y.backward(grad.to(y.dtype))
    return y, conv.weight.grad.clone()


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max() / b.abs().max())


def _layers() -> tuple[Conv3d, nn.Conv3d]:
    torch.manual_seed(0)
    ours = Conv3d(8, 8, kernel_size=3, padding=1)
    plain = nn.Conv3d(8, 8, kernel_size=3, padding=1)
    plain.load_state_dict(ours.state_dict())
    return ours, plain


def test_a_bf16_call_at_depth_2_is_a_float32_call_with_a_bf16_output():
    ours, plain = _layers()
    x = torch.randn(2, 8, 2, 6, 6, generator=torch.Generator().manual_seed(1))
    # the output gradient arrives in bf16: the float32 reference starts from the same values
    grad = torch.randn(2, 8, 2, 6, 6, generator=torch.Generator().manual_seed(2))
    grad = grad.to(torch.bfloat16).float()
    y, dw = _weight_grad(ours, x, grad, bf16=True)
    y32, dw32 = _weight_grad(plain, x, grad, bf16=False)
    assert y.dtype == torch.bfloat16  # the layers after it see what a bf16 call gives
    # float32 arithmetic: a bf16 call (inputs rounded to 8 bits) is off by ~4e-3 at best
    assert _relative(dw, dw32) < 1e-5
    assert _relative(y.float(), y32) < 1e-2  # only the output's rounding to bf16


@pytest.mark.parametrize("depth", [1, 3, 4])
def test_other_depths_are_the_plain_bf16_call(depth):
    ours, plain = _layers()
    x = torch.randn(2, 8, depth, 6, 6, generator=torch.Generator().manual_seed(1))
    grad = torch.randn(2, 8, depth, 6, 6, generator=torch.Generator().manual_seed(2))
    y, dw = _weight_grad(ours, x, grad, bf16=True)
    y_plain, dw_plain = _weight_grad(plain, x, grad, bf16=True)
    assert torch.equal(y, y_plain) and torch.equal(dw, dw_plain)


def test_a_traced_cuda_step_keeps_the_plain_call():
    """The estimator traces a CUDA step on CPU tensors: no float32 copy CUDA would not make."""
    ours, plain = _layers()
    x = torch.randn(2, 8, 2, 6, 6, dtype=torch.bfloat16)
    with traced_for_cuda(), torch.no_grad():
        assert torch.equal(ours.to(torch.bfloat16)(x), plain.to(torch.bfloat16)(x))


def test_every_unet_convolution_at_depth_2_is_volsegs():
    """5 levels at a 16x32x32 patch pool z to 2 at the fourth; each 3x3x3 convolution there
    (and at every other level) is volseg's Conv3d, whose float32 call the tests above check."""
    net = UNet3D(1, 3, widths=[4, 8, 8, 16, 16], norm="instance")
    depths: dict[str, tuple[type, int]] = {}
    for name, module in net.named_modules():
        if isinstance(module, nn.Conv3d) and module.kernel_size[0] > 1:
            module.register_forward_hook(
                lambda m, args, out, name=name: depths.update({name: (type(m), args[0].shape[2])})
            )
    with torch.no_grad():
        net(torch.zeros(1, 1, 16, 32, 32))
    assert sorted({depth for _, depth in depths.values()}) == [1, 2, 4, 8, 16]
    assert all(kind is Conv3d for kind, _ in depths.values()), depths


def test_torch_compile_traces_the_depth_2_call_without_a_graph_break():
    import torch._dynamo

    ours, _ = _layers()
    x = torch.randn(2, 8, 2, 6, 6)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(ours, backend="eager")  # dynamo's tracing, no code generation
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = compiled(x)
    assert y.dtype == torch.bfloat16
    assert not torch._dynamo.utils.counters["graph_break"], dict(
        torch._dynamo.utils.counters["graph_break"]
    )
