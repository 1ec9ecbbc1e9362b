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

On CUDA the workspace of cuDNN's algorithms depends on the algorithm cuDNN picks for the GPU and
is not modelled (see the estimator's docs).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

Workspace = Callable[[Any, tuple, Any], int]

_FLOAT32_BYTES = 4


def _numel(value: Any) -> int:
    return value.numel() if isinstance(value, torch.Tensor) else 0


def _bytes(value: Any) -> int:
    return value.numel() * value.element_size() if isinstance(value, torch.Tensor) else 0


def cpu_workspace(func: Any, args: tuple, out: Any) -> int:
    """Scratch bytes of one op on the CPU (0 where none is known)."""
    if func is torch.ops.aten.convolution.default:
        return max(_bytes(args[0]), _bytes(out)) if args[0].is_contiguous() else 0
    if func is torch.ops.aten.convolution_backward.default:
        grad, inputs = args[0], args[1]
        if not grad.is_contiguous():
            return 0
        return (_numel(grad) + _numel(inputs)) * _FLOAT32_BYTES
    if func is torch.ops.aten.upsample_trilinear3d_backward.default:
        grad = args[0]
        return 0 if grad.is_contiguous() else _bytes(grad)
    return 0
