"""Activation offload keeps the saved tensors' memory format and the gradients."""

from __future__ import annotations

import torch

from volseg.models.offload import OffloadToHost, host_copy


def test_host_copy_keeps_channels_last_strides():
    """save_on_cpu's pinned buffer is torch.empty(size): contiguous NCDHW, not channels-last."""
    x = torch.randn(2, 8, 4, 6, 6).contiguous(memory_format=torch.channels_last_3d)
    copy = host_copy(x)
    assert copy.stride() == x.stride() and torch.equal(copy, x)
    assert torch.empty(x.size()).stride() != x.stride()  # what a contiguous buffer would give


def test_offload_gives_the_same_gradients_as_no_offload():
    torch.manual_seed(0)
    conv = torch.nn.Conv3d(2, 4, 3, padding=1).to(memory_format=torch.channels_last_3d)
    x = torch.randn(1, 2, 6, 8, 8).contiguous(memory_format=torch.channels_last_3d)
    conv(x).square().sum().backward()
    expected = conv.weight.grad.clone()
    conv.weight.grad = None
    with OffloadToHost():
        out = conv(x)
    out.square().sum().backward()
    assert torch.allclose(conv.weight.grad, expected)
