"""Memory that kernels hold while they run, beyond their inputs and outputs.

MemTracker sees tensors; a kernel's scratch memory is invisible to it. On the CPU, oneDNN
convolutions reorder their operands into blocked layouts, and these copies dominate: measured
here (torch 2.13 CPU, 3D convolutions of a U-Net, float32 and bfloat16 autocast, by reading the
process's peak resident memory around each op):

- forward convolution: about the larger of input and output, in the op's dtype;
- backward convolution: about grad-output plus input, in float32 elements;
- none of these for channels-last (``channels_last_3d``) tensors, oneDNN's own layout;
- backward trilinear upsampling of a non-contiguous gradient (a slice of the concat's gradient):
  a contiguous copy of it.

Not every CPU convolution runs on oneDNN: torch takes its native 3D convolution (``slow_conv3d``,
im2col) for a float32 batch of one whose ``N x C x D x H`` is at most 20,480 (its rule in
``ConvParams::use_mkldnn``, ``aten/src/ATen/native/Convolution.cpp``). That path unfolds the
input into a column buffer of ``C_in x k^3`` rows by the output's voxels (27 times a 3x3x3
convolution's input), in forward and again in backward: the deep levels of a batch of one, and
every level's first convolution of a single-channel image.

On CUDA the workspace of cuDNN's algorithms depends on the algorithm cuDNN picks for the GPU and
is not modelled (see the estimator's docs).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from operator import itemgetter
from typing import Any

import torch

Workspace = Callable[[Any, tuple, Any], int]

_FLOAT32_BYTES = 4


def _numel(value: Any) -> int:
    return value.numel() if isinstance(value, torch.Tensor) else 0


def _bytes(value: Any) -> int:
    return value.numel() * value.element_size() if isinstance(value, torch.Tensor) else 0


#: ``ConvParams::use_mkldnn``: a float32 convolution of no more than this ``N x C x D x H`` (and
#: no other reason for oneDNN) runs on torch's native kernels ("for some case, native is faster")
_NATIVE_MAX_SLICE = 20480


def _half_on_onednn(dtype: torch.dtype) -> bool:
    """Whether oneDNN takes bfloat16/float16 convolutions on this CPU (else torch's native ones)."""
    check = {
        torch.bfloat16: "_is_mkldnn_bf16_supported",
        torch.float16: "_is_mkldnn_fp16_supported",
    }[dtype]
    supported = getattr(torch.ops.mkldnn, check, None)
    return bool(supported()) if supported is not None else False


def runs_on_onednn(inputs: Any, weight: Any, stride: Any, dilation: Any, groups: int) -> bool:
    """Whether torch runs this CPU convolution on oneDNN or on its native kernels, by torch's
    own rule (``ConvParams::use_mkldnn``)."""
    if not torch.backends.mkldnn.is_available() or not torch.backends.mkldnn.enabled:
        return False
    if inputs.dtype in (torch.bfloat16, torch.float16):
        return _half_on_onednn(inputs.dtype)
    if inputs.dtype != torch.float32:
        return False
    n = inputs.shape[0]
    kernel = weight.shape[2:]
    special = any(s != 1 for s in stride) or any(d != 1 for d in dilation)
    big_or_threaded = (
        special or n >= 16 or kernel[-1] != 1 or kernel[-2] != 1 or torch.get_num_threads() > 1
    )
    slice_numel = (
        n * inputs.shape[1] * inputs.shape[2] * (inputs.shape[3] if inputs.dim() > 4 else 1)
    )
    worth_it = (
        groups > 1
        or (kernel[-1] > 3 and kernel[-2] > 3)
        or n > 1
        or slice_numel > _NATIVE_MAX_SLICE
    )
    return big_or_threaded and worth_it


def _native_columns(inputs: Any, weight: Any, outputs: Any, transposed: bool) -> int:
    """The im2col buffer of torch's native 3D convolution (``slow_conv3d``: ``C_in x k^3`` rows by
    the output's voxels, for the batch; ``slow_conv_transpose3d``: ``C_out x k^3`` rows by the
    input's voxels, one sample at a time); none for a 1x1x1 kernel."""
    kernel = math.prod(weight.shape[2:])
    if kernel == 1:
        return 0
    size = inputs.element_size()
    if transposed:
        return weight.shape[1] * kernel * math.prod(inputs.shape[2:]) * size
    return inputs.shape[0] * inputs.shape[1] * kernel * math.prod(outputs.shape[2:]) * size


#: aten::convolution's input, weight, stride, dilation, transposed, groups
_CONVOLUTION_ARGS = itemgetter(0, 1, 3, 5, 6, 8)
#: aten::convolution_backward's grad_output, input, weight, stride, dilation, transposed, groups
_BACKWARD_ARGS = itemgetter(0, 1, 2, 4, 6, 7, 9)


def cpu_workspace(func: Any, args: tuple, out: Any) -> int:
    """Scratch bytes of one op on the CPU (0 where none is known)."""
    if func is torch.ops.aten.convolution.default:
        inputs, weight, stride, dilation, transposed, groups = _CONVOLUTION_ARGS(args)
        if inputs.dim() == 5 and not runs_on_onednn(inputs, weight, stride, dilation, groups):
            return _native_columns(inputs, weight, out, transposed)
        return max(_bytes(inputs), _bytes(out)) if inputs.is_contiguous() else 0
    if func is torch.ops.aten.convolution_backward.default:
        grad, inputs, weight, stride, dilation, transposed, groups = _BACKWARD_ARGS(args)
        if inputs.dim() == 5 and not runs_on_onednn(inputs, weight, stride, dilation, groups):
            return _native_columns(inputs, weight, grad, transposed)
        if not grad.is_contiguous():
            return 0
        return (_numel(grad) + _numel(inputs)) * _FLOAT32_BYTES
    if func is torch.ops.aten.upsample_trilinear3d_backward.default:
        grad = args[0]
        return 0 if grad.is_contiguous() else _bytes(grad)
    return 0
