"""The U-Net's 3D convolution: :class:`torch.nn.Conv3d`, with its weight gradient kept right on
a CPU in bfloat16.

oneDNN, which computes PyTorch's CPU convolutions (torch 2.13.0+cpu bundles oneDNN 3.12),
returns a wrong weight gradient in bfloat16 from its AVX-512 kernels (with or without the
AVX512_BF16 instructions; its AVX2 kernels are right) for a kernel deeper than 1 over an input
of depth exactly 2: relative errors of 1e30 up to inf and NaN, under bf16 autocast and with bf16
tensors alike, at every channel count and in-plane size tried; the forward pass and the input's
gradient are right, as are depths 1 and 3 to 8 and transposed convolutions
(``python -m benchmarks cpu_bf16_conv`` checks each case on the CPU it runs on). A U-Net level
of depth 2 is common: with ``[2, 2, 2]`` pooling a patch of depth 16-23 has it at the fourth
level, 32-47 at the fifth, and training can diverge (docs/benchmarks.md, "Precision on a
CPU"). Such a call runs in float32 here; every other one is a plain ``nn.Conv3d`` call.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

#: the input depth whose bf16 weight gradient oneDNN gets wrong (kernel depth > 1)
BROKEN_BF16_DEPTH = 2

# True while the memory estimator traces a CUDA step on (fake) CPU tensors: CUDA has no such
# call. A module global, not a ContextVar: torch.compile reads a global without a graph break
_traced_for_cuda = False


@contextlib.contextmanager
def traced_for_cuda() -> Iterator[None]:
    """CPU tensors stand for CUDA ones here (the estimator's trace of a CUDA step): every
    convolution runs as a plain ``nn.Conv3d`` call, as on CUDA."""
    global _traced_for_cuda
    previous, _traced_for_cuda = _traced_for_cuda, True
    try:
        yield
    finally:
        _traced_for_cuda = previous


def runs_in_cpu_bf16(x: torch.Tensor) -> bool:
    """Whether a convolution of ``x`` would run in bfloat16 on the CPU (bf16 input, or CPU
    autocast to bf16)."""
    if x.device.type != "cpu" or _traced_for_cuda:
        return False
    if x.dtype == torch.bfloat16:
        return True
    return torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16


class Conv3d(nn.Conv3d):
    """:class:`torch.nn.Conv3d` (same parameters, same state dict) that runs in float32 where a
    CPU bf16 call would get its weight gradient wrong (see the module docstring): input
    ``(B, C_in, 2, H, W)`` with a kernel deeper than 1. The output keeps the dtype the bf16
    call would have given, so the layers after it are unchanged."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-3] != BROKEN_BF16_DEPTH or self.kernel_size[0] == 1 or not runs_in_cpu_bf16(x):
            return super().forward(x)
        with torch.autocast("cpu", enabled=False):
            bias = self.bias.float() if self.bias is not None else None
            y = self._conv_forward(x.float(), self.weight.float(), bias)
        return y.to(torch.bfloat16)
