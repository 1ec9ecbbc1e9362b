"""What the CUDA estimate models beyond tensors: cuDNN's workspaces, CUDA's trilinear backward's
contiguous copies, CUDA's autocast of upsampling, the CUDA context, offload of the full-resolution
maps only."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import REPO, planned_config
from tests.estimates import estimate
from volseg.memory.estimate.allocator import replay
from volseg.memory.estimate.autocast import CudaAutocast
from volseg.memory.estimate.cuda_context import TYPICAL_MIB, resolve_cuda_context
from volseg.memory.estimate.workspace import CudnnWorkspace
from volseg.utils.errors import UserInputError
from volseg.utils.units import MIB

RECORDED = REPO / "benchmarks" / "results" / "cuda"

CONV = torch.ops.aten.convolution.default
CONV_BACKWARD = torch.ops.aten.convolution_backward.default


def _conv(x: torch.Tensor, w: torch.Tensor):
    args = (x, w, None, [1, 1, 1], [1, 1, 1], [1, 1, 1], False, [0, 0, 0], 1)
    return args, CONV(*args)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def test_cudnn_takes_input_plus_output_forward_and_two_in_backward():
    x, w = torch.randn(1, 4, 4, 8, 8), torch.randn(8, 4, 3, 3, 3)
    args, y = _conv(x, w)
    assert CudnnWorkspace()(CONV, args, y) == (_nbytes(x) + _nbytes(y),)
    grad = torch.randn_like(y)
    backward = (grad, x, w, [8], [1, 1, 1], [1, 1, 1], [1, 1, 1], False, [0, 0, 0], 1)
    both = (*backward, [True, True, False])
    weight_only = (*backward, [False, True, False])  # the first layer: its input needs no grad
    outs = CONV_BACKWARD(*both)
    assert CudnnWorkspace()(CONV_BACKWARD, both, outs) == (_nbytes(grad) + _nbytes(x),) * 2
    assert CudnnWorkspace()(CONV_BACKWARD, weight_only, outs) == (_nbytes(grad) + _nbytes(x),)
    assert CudnnWorkspace(limit=1000)(CONV, args, y) == (1000,)
    assert CudnnWorkspace(channels_last=True)(CONV, args, y) == ()


def test_cuda_trilinear_backward_copies_a_sliced_or_channels_last_gradient():
    """UpSampleTrilinear3d.cu runs on contiguous grad_output and grad_input: the slice of a
    concatenation's gradient is copied (NCDHW: unless the batch is one), and a channels-last
    network's gradient and grad_input both, held together."""
    backward = torch.ops.aten.upsample_trilinear3d_backward.default
    low = torch.randn(2, 4, 2, 4, 4)
    up = F.interpolate(low, scale_factor=2.0, mode="trilinear")
    cat_grad = torch.randn(2, 8, *up.shape[2:])
    for batch, expected in ((2, ((_nbytes(up),),)), (1, ())):
        grad = cat_grad[:batch, 4:]  # the upsampled half of [skip, up]
        args = (grad, list(up.shape[2:]), [batch, *low.shape[1:]], False)
        out = backward(*args)
        assert CudnnWorkspace()(backward, args, out) == expected
        both = ((_nbytes(grad), _nbytes(out)),)
        assert CudnnWorkspace(channels_last=True)(backward, args, out) == both


def test_buffers_held_together_are_freed_after_both_are_taken():
    from volseg.memory.estimate.torch_private import RecordingMemTracker

    backward = torch.ops.aten.upsample_trilinear3d_backward.default
    grad = torch.randn(2, 8, 4, 8, 8)[:, 4:]
    tracker = RecordingMemTracker(CudnnWorkspace(channels_last=True))
    with tracker:
        out = backward(grad, [4, 8, 8], [2, 4, 2, 4, 4], False)
    kinds = [(kind, nbytes) for kind, handle, nbytes in tracker.events if handle < 0]
    assert kinds == [
        ("malloc", _nbytes(grad)),
        ("malloc", _nbytes(out)),
        ("free", 0),
        ("free", 0),
    ]


def test_a_workspace_makes_the_allocator_grow_a_segment():
    """A 30 MiB workspace between two held 20 MiB tensors: allocated and reserved rise by it."""
    events = [("malloc", 1, 20 * MIB), ("malloc", -1, 30 * MIB), ("free", -1, 0)]
    allocator = replay([*events, ("malloc", 2, 20 * MIB)])
    assert allocator.peak_allocated == 50 * MIB
    assert allocator.peak_reserved == 50 * MIB  # the second tensor reuses the workspace's block


def test_cuda_autocast_upsamples_in_float32_and_the_concat_follows():
    low, skip = torch.randn(1, 2, 2, 4, 4), torch.randn(1, 2, 4, 8, 8).half()
    with CudaAutocast(torch.float16):
        up = F.interpolate(low.half(), scale_factor=2.0, mode="trilinear")
        pooled = F.interpolate(skip, size=(2, 4, 4), mode="area")
        assert up.dtype == torch.float32 and pooled.dtype == torch.float16
        assert torch.cat([skip, up], dim=1).dtype == torch.float32


def test_cuda_context_by_gpu():
    """The H200's figure is the recorded file's ``cuda_context_mib``; the gap to nvidia-smi
    during the file's training runs is the one the constant's comment gives."""
    recorded = json.loads((RECORDED / "2026-11-30_nvidia-h200.json").read_text())
    context = recorded["cuda_context_mib"]
    assert resolve_cuda_context("auto", "NVIDIA H200").nbytes == context * MIB
    gaps = [
        r["measured"]["nvidia_smi_mib"] - r["measured"]["peak_reserved_mib"]
        for r in recorded["runs"]
        if r["measured"].get("nvidia_smi_mib") and r["measured"].get("peak_reserved_mib")
    ]
    assert (min(gaps), max(gaps)) == (639, 641)
    if not torch.cuda.is_available():
        assert resolve_cuda_context("auto", "NVIDIA L4").nbytes == TYPICAL_MIB * MIB
    assert resolve_cuda_context(300).nbytes == 300 * MIB
    with pytest.raises(UserInputError, match="memory.cuda_context_mib=-1"):
        resolve_cuda_context(-1)


def test_offload_of_full_resolution_maps_only(tmp_path):
    small = ["model.net.widths=[8,16,32]", "data.batch_size=2", "data.patch_size=[16,32,32]"]
    base = [*small, "trainer.precision=32", "memory.plan_device=cuda"]
    peaks = {
        value: estimate(
            planned_config("train", tmp_path, [*base, f"model.offload_activations={value}"])
        ).peak_allocated
        for value in ("false", "full_resolution", "true")
    }
    assert peaks["true"] < peaks["full_resolution"] < peaks["false"]
