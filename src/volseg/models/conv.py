"""The U-Net's 3D convolution: :class:`torch.nn.Conv3d`, but in float32 where oneDNN's AVX-512
kernels (torch 2.13.0+cpu) return a wrong bf16 weight gradient (up to inf and NaN): a kernel deeper
than 1 over an input of depth exactly 2, common at deep levels (``python -m benchmarks
cpu_bf16_conv``; docs/benchmarks.md, "Precision on a CPU")."""

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
    """CPU tensors stand for CUDA ones (the estimator's trace of a CUDA step): plain calls only."""
    global _traced_for_cuda
    previous, _traced_for_cuda = _traced_for_cuda, True
    try:
        yield
    finally:
        _traced_for_cuda = previous


def runs_in_cpu_bf16(x: torch.Tensor) -> bool:
    """Whether a convolution of ``x`` would run in bfloat16 on the CPU (bf16 input or autocast)."""
    if x.device.type != "cpu" or _traced_for_cuda:
        return False
    if x.dtype == torch.bfloat16:
        return True
    return torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16


class Conv3d(nn.Conv3d):
    """``nn.Conv3d`` that runs in float32 where CPU bf16 would get its weight gradient wrong."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-3] != BROKEN_BF16_DEPTH or self.kernel_size[0] == 1 or not runs_in_cpu_bf16(x):
            return super().forward(x)
        with torch.autocast("cpu", enabled=False):
            bias = self.bias.float() if self.bias is not None else None
            y = self._conv_forward(x.float(), self.weight.float(), bias)
        return y.to(torch.bfloat16)
