"""CUDA's autocast rules on a machine without CUDA: ``torch.autocast("cpu")`` follows the CPU's
op lists (``max_pool3d`` in float32, ``group_norm`` in the lower precision), so
:class:`CudaAutocast` applies CUDA's documented lists ("CUDA Ops that can autocast to float16 /
to float32" in the torch.amp docs) to torch functions. In-place ops and calls with an explicit
``dtype`` are left alone.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from volseg.memory.estimate.torch_private import engine_run_backward, tree_map

LOWER_PRECISION = frozenset(
    {
        "__matmul__",
        "addbmm",
        "addmm",
        "addmv",
        "addr",
        "baddbmm",
        "bmm",
        "chain_matmul",
        "multi_dot",
        "conv1d",
        "conv2d",
        "conv3d",
        "conv_transpose1d",
        "conv_transpose2d",
        "conv_transpose3d",
        "linear",
        "matmul",
        "mm",
        "mv",
        "prelu",
    }
)
FLOAT32 = frozenset(
    {
        "__pow__",
        "__rdiv__",
        "__rpow__",
        "__rtruediv__",
        "acos",
        "asin",
        "binary_cross_entropy_with_logits",
        "cosh",
        "cosine_embedding_loss",
        "cdist",
        "cosine_similarity",
        "cross_entropy",
        "cumprod",
        "cumsum",
        "dist",
        "erfinv",
        "exp",
        "expm1",
        "group_norm",
        "hinge_embedding_loss",
        "kl_div",
        "l1_loss",
        "layer_norm",
        "log",
        "log_softmax",
        "log10",
        "log1p",
        "log2",
        "margin_ranking_loss",
        "mse_loss",
        "multilabel_margin_loss",
        "multi_margin_loss",
        "nll_loss",
        "norm",
        "normalize",
        "pdist",
        "poisson_nll_loss",
        "pow",
        "prod",
        "reciprocal",
        "rsqrt",
        "sinh",
        "smooth_l1_loss",
        "soft_margin_loss",
        "softmax",
        "softmin",
        "softplus",
        "sum",
        "renorm",
        "tan",
        "triplet_margin_loss",
    }
)
#: ``F.interpolate`` reaches CUDA's float32 list (``upsample_*``) in every mode but ``area``;
#: ``torch.cat`` of its float32 output and a lower-precision skip is then float32 too
INTERPOLATE_NOT_FLOAT32 = frozenset({"area"})
_ELIGIBLE = (torch.float32, torch.float16, torch.bfloat16)


def _cast(dtype: torch.dtype) -> Any:
    def cast(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.dtype in _ELIGIBLE and value.dtype != dtype:
            return value.to(dtype)
        return value

    return cast


def _interpolates_in_float32(args: tuple, kwargs: dict) -> bool:
    """Whether ``F.interpolate(input, size, scale_factor, mode, ...)`` hits CUDA's float32 list."""
    mode = kwargs.get("mode", args[3] if len(args) > 3 else "nearest")
    return mode not in INTERPOLATE_NOT_FLOAT32


class CudaAutocast(TorchFunctionMode):
    """``torch.autocast("cuda", dtype)`` as a torch-function mode that runs on any device.
    Keep it active over ``loss.backward()`` too, so that activation checkpointing recomputes
    under the same rules (a mode is off while it handles a call, hence ``backward``'s own
    branch)."""

    def __init__(self, dtype: torch.dtype = torch.float16) -> None:
        super().__init__()
        self.dtype = dtype

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        if func is torch.Tensor.backward and len(args) == 1 and not any(kwargs.values()):
            loss = args[0]
            with self:
                engine_run_backward(
                    (loss,),
                    (torch.ones_like(loss),),
                    False,
                    False,
                    (),
                    allow_unreachable=True,
                    accumulate_grad=True,
                )
            return None
        name = getattr(func, "__name__", "")
        in_place = name.endswith("_") and not name.startswith("__")
        if kwargs.get("dtype") is None and not in_place:
            if name in LOWER_PRECISION:
                args, kwargs = tree_map(_cast(self.dtype), (args, kwargs))
            elif name in FLOAT32 or (
                name == "interpolate" and _interpolates_in_float32(args, kwargs)
            ):
                args, kwargs = tree_map(_cast(torch.float32), (args, kwargs))
        return func(*args, **kwargs)
