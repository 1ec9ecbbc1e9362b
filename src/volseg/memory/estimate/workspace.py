"""Memory that kernels hold while they run, beyond their inputs and outputs: on the CPU
(:func:`cpu_workspace`) and cuDNN's on CUDA (:class:`CudnnWorkspace`). Each rule, its kernel and
what it was measured against: ``docs/kernel-memory.md``; each has a name in :data:`RULES`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

import torch

from volseg.utils.cpu import onednn_uses_amx

#: ``(func, args, out)`` to scratch bytes outside any allocator (an int, the CPU's) or to the
#: sizes of buffers taken one after the other from the caching allocator (a tuple, CUDA's)
Workspace = Callable[[Any, tuple, Any], "int | tuple[int, ...]"]

_FLOAT32_BYTES = 4

#: the estimator's rules by name (``docs/memory.md``), each on unless set False (a report's
#: estimate without it: ``python -m benchmarks rule_effects``)
RULES: dict[str, bool] = dict.fromkeys(
    (
        "native_conv_columns",
        "onednn_blocked",
        "trilinear_backward_copy",
        "cudnn_workspace",
        "gemm_float32_buffer",
        "true_default_dtype",
        "channels_last_conv",
        "avx2_gemm_scratchpad",
        "softmax_copy",
        "max_pool_layout",
    ),
    True,
)


def _rule(name: str, nbytes: int) -> int:
    return nbytes if RULES[name] else 0


def _bytes(value: Any) -> int:
    return value.numel() * value.element_size() if isinstance(value, torch.Tensor) else 0


#: ``ConvParams::use_mkldnn``: a float32 convolution of no more than this ``N x C x D x H`` (and
#: no other reason for oneDNN) runs on torch's native kernels ("for some case, native is faster")
_NATIVE_MAX_SLICE = 20480


def _half_on_onednn(dtype: torch.dtype) -> bool:
    """Whether oneDNN takes bfloat16/float16 convolutions on this CPU."""
    name = {torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]
    supported = getattr(torch.ops.mkldnn, f"_is_mkldnn_{name}_supported", None)
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
    """The im2col buffer of torch's native 3D convolution (``slow_conv3d``: ``C_in x k^3`` by the
    output's voxels, the batch's; transposed: ``C_out x k^3`` by one sample's input voxels)."""
    kernel = math.prod(weight.shape[2:])
    if kernel == 1:
        return 0
    size = inputs.element_size()
    if transposed:
        return weight.shape[1] * kernel * math.prod(inputs.shape[2:]) * size
    return inputs.shape[0] * inputs.shape[1] * kernel * math.prod(outputs.shape[2:]) * size


#: aten::convolution_backward's output_mask: which of grad_input, grad_weight, grad_bias it makes
_OUTPUT_MASK = 10
#: aten::convolution_backward's padding
_PADDING = 5
#: aten::convolution's input, weight, stride, dilation, transposed, groups
_CONVOLUTION_ARGS = itemgetter(0, 1, 3, 5, 6, 8)
#: aten::convolution_backward's grad_output, input, weight, stride, dilation, transposed, groups
_BACKWARD_ARGS = itemgetter(0, 1, 2, 4, 6, 7, 9)


def _gemm_in_float32(dtype: torch.dtype) -> bool:
    """Whether torch's own GEMM runs this dtype's products in float32 (16-bit, no oneDNN)."""
    return dtype in (torch.bfloat16, torch.float16) and not _half_on_onednn(dtype)


def _column_major(matrix: Any) -> bool:
    """Whether a matrix (the last two dims) is stored column-major."""
    return matrix.dim() >= 2 and matrix.stride(-2) == 1 and matrix.stride(-1) != 1


def _product_buffer(a: Any, b: Any, out: Any) -> int:
    """The float32 buffer of one matrix of ``a @ b`` where torch's own 16-bit GEMM takes one."""
    if not _gemm_in_float32(a.dtype) or not _column_major(a) or _column_major(b):
        return 0
    return out.shape[-2] * out.shape[-1] * _FLOAT32_BYTES


def _columns_in_float32(inputs: Any, weight: Any, outputs: Any, transposed: bool) -> int:
    """The float32 buffer of one sample's columns a native 16-bit convolution computes as a GEMM
    product (forward of a transposed one, backward of a plain one)."""
    kernel = math.prod(weight.shape[2:])
    if transposed:
        return weight.shape[1] * kernel * math.prod(inputs.shape[2:]) * _FLOAT32_BYTES
    return inputs.shape[1] * kernel * math.prod(outputs.shape[2:]) * _FLOAT32_BYTES


#: each matrix product's two operands among its arguments
_MATRIX_PRODUCTS = {
    torch.ops.aten.mm.default: itemgetter(0, 1),
    torch.ops.aten.bmm.default: itemgetter(0, 1),
    torch.ops.aten.addmm.default: itemgetter(1, 2),
    torch.ops.aten.baddbmm.default: itemgetter(1, 2),
}


def gemm_float32_buffer(func: Any, args: tuple, out: Any) -> int:
    """Bytes of the float32 product buffer torch's own 16-bit GEMM mallocs outside its
    allocator."""
    operands = _MATRIX_PRODUCTS.get(func)
    if operands is not None:
        return _product_buffer(*operands(args), out)
    if func is torch.ops.aten.convolution.default:
        inputs, weight, stride, dilation, transposed, groups = _CONVOLUTION_ARGS(args)
        takes_none = not transposed or inputs.dim() != 5 or not _gemm_in_float32(inputs.dtype)
        if takes_none or runs_on_onednn(inputs, weight, stride, dilation, groups):
            return 0
        return _columns_in_float32(inputs, weight, out, transposed)
    if func is torch.ops.aten.convolution_backward.default:
        grad, inputs, weight, stride, dilation, transposed, groups = _BACKWARD_ARGS(args)
        takes_none = transposed or inputs.dim() != 5 or not _gemm_in_float32(inputs.dtype)
        if takes_none or not args[_OUTPUT_MASK][0]:
            return 0
        if runs_on_onednn(inputs, weight, stride, dilation, groups):
            return 0
        return _columns_in_float32(inputs, weight, grad, transposed)
    return 0


def onednn_channel_block() -> int:
    """oneDNN's channel block on this CPU: 16 for AVX-512 kernels, 8 for AVX2's."""
    return 16 if torch.backends.cpu.get_cpu_capability().startswith("AVX512") else 8


def _blocked_numel(value: Any, block: int) -> int:
    """Elements of ``value`` in a blocked layout: its channels (dim 1) rounded up to ``block``."""
    if not isinstance(value, torch.Tensor) or value.dim() < 2 or value.shape[1] == 0:
        return value.numel() if isinstance(value, torch.Tensor) else 0
    channels = value.shape[1]
    return value.numel() // channels * (-(-channels // block) * block)


def _float32_forward(inputs: Any, weight: Any, out: Any, block: int) -> int:
    """A float32 (or, without AMX, bfloat16) oneDNN convolution's scratch beyond its output: the
    blocked output with the blocked input (held together), or with the output it becomes."""
    size = inputs.element_size()
    blocked_out = _blocked_numel(out, block) * size
    first_layer = math.prod(weight.shape[2:]) > 1 and inputs.shape[1] < block
    blocked_in = 0 if first_layer else _blocked_numel(inputs, block) * size
    return max(blocked_in + blocked_out - _bytes(out), blocked_out)


def cpu_workspace(func: Any, args: tuple, out: Any) -> int:
    """Scratch bytes of one op on the CPU: the kernel's own buffers and a 16-bit GEMM's float32
    product, held together."""
    gemm_buffer = _rule("gemm_float32_buffer", gemm_float32_buffer(func, args, out))
    return _kernel_scratch(func, args, out) + gemm_buffer


def _kernel_scratch(func: Any, args: tuple, out: Any) -> int:
    """The buffers a CPU kernel holds while it runs."""
    if func is torch.ops.aten.convolution.default:
        inputs, weight, stride, dilation, transposed, groups = _CONVOLUTION_ARGS(args)
        if inputs.dim() == 5 and not runs_on_onednn(inputs, weight, stride, dilation, groups):
            return _rule("native_conv_columns", _native_columns(inputs, weight, out, transposed))
        channels_last = _runs_channels_last(inputs, weight)
        if channels_last and _copies_to_channels_last(inputs.dtype):
            return _rule("channels_last_conv", _channels_last_copy(inputs))
        if not RULES["onednn_blocked"] or not (inputs.is_contiguous() or channels_last):
            return 0
        block = onednn_channel_block()
        if not transposed and (inputs.dtype == torch.float32 or not onednn_uses_amx()):
            return _float32_forward(inputs, weight, out, block)
        # the output accumulates in float32 elements (a bfloat16 convolution's too)
        accumulated = _blocked_numel(out, block) * max(_FLOAT32_BYTES, out.element_size())
        return max(_blocked_numel(inputs, block) * inputs.element_size(), accumulated)
    if func is torch.ops.aten.convolution_backward.default:
        grad, inputs, weight, stride, dilation, transposed, groups = _BACKWARD_ARGS(args)
        if inputs.dim() == 5 and not runs_on_onednn(inputs, weight, stride, dilation, groups):
            return _rule("native_conv_columns", _native_columns(inputs, weight, grad, transposed))
        channels_last = _runs_channels_last(inputs, weight)
        if channels_last and _copies_to_channels_last(inputs.dtype):
            weight_gradient = bool(args[_OUTPUT_MASK][1])
            padded = any(p != 0 for p in args[_PADDING])
            return _rule(
                "channels_last_conv",
                _channels_last_backward(grad, inputs, weight, weight_gradient, padded, transposed),
            )
        if not RULES["onednn_blocked"] or not (grad.is_contiguous() or channels_last):
            return 0
        block = onednn_channel_block()
        return (_blocked_numel(grad, block) + _blocked_numel(inputs, block)) * _FLOAT32_BYTES
    if func is torch.ops.aten.upsample_trilinear3d_backward.default:
        grad = args[0]
        return 0 if grad.is_contiguous() or not RULES["trilinear_backward_copy"] else _bytes(grad)
    if func in _SOFTMAXES:
        inputs = args[0]
        return 0 if inputs.is_contiguous() or not RULES["softmax_copy"] else _bytes(inputs)
    if func is torch.ops.aten.max_pool3d_with_indices_backward.default:
        grad, inputs, indices = args[0], args[1], args[_POOL_INDICES]
        if _same_layout(grad, inputs) or not RULES["max_pool_layout"]:
            return 0
        return _bytes(out) + _bytes(indices)
    return 0


#: softmax and log-softmax: a CPU kernel runs them on a contiguous copy of a non-contiguous input
_SOFTMAXES = (torch.ops.aten._softmax.default, torch.ops.aten._log_softmax.default)
#: aten::max_pool3d_with_indices_backward's indices
_POOL_INDICES = 7


def _same_layout(a: Any, b: Any) -> bool:
    """Whether two tensors are both NCDHW or both channels-last."""
    return any(
        a.is_contiguous(memory_format=f) and b.is_contiguous(memory_format=f)
        for f in (torch.contiguous_format, torch.channels_last_3d)
    )


def _strides_channels_last(tensor: Any) -> bool:
    """Whether torch suggests ``channels_last_3d`` for a 5-D tensor (c10's
    ``is_channels_last_strides_3d``: strides rising from C through W, H and D to N)."""
    if not isinstance(tensor, torch.Tensor) or tensor.dim() != 5 or tensor.stride(1) == 0:
        return False
    least = 0
    for dim in (1, 4, 3, 2, 0):
        if least > tensor.stride(dim) or (dim == 0 and least == tensor.stride(1)):
            return False
        least = tensor.stride(dim) * (tensor.shape[dim] if tensor.shape[dim] > 1 else 1)
    return True


def _runs_channels_last(inputs: Any, weight: Any) -> bool:
    """Whether torch runs a oneDNN convolution in channels-last
    (``mkldnn_conv_use_channels_last``)."""
    return _strides_channels_last(inputs) or _strides_channels_last(weight)


def _channels_last_copy(tensor: Any) -> int:
    """Bytes of the channels-last copy torch makes of an operand that is not channels-last."""
    return 0 if tensor.is_contiguous(memory_format=torch.channels_last_3d) else _bytes(tensor)


def _copies_to_channels_last(dtype: torch.dtype) -> bool:
    """Whether a channels-last oneDNN convolution of this dtype takes channels-last copies:
    float32, and bfloat16 without AMX (AMX's 16-bit kernels keep the blocked rule)."""
    return dtype == torch.float32 or not onednn_uses_amx()


def _channels_last_backward(
    grad: Any, inputs: Any, weight: Any, weight_gradient: bool, padded: bool, transposed: bool
) -> int:
    """A channels-last convolution's backward beyond its outputs: channels-last copies of the
    gradient and the input; for the weight's gradient, a float32 one per thread and (AVX2) the
    GEMM scratchpad, or for 16-bit, the two reordered once more into oneDNN's blocks."""
    copies = _channels_last_copy(grad) + _channels_last_copy(inputs)
    if not weight_gradient:
        return copies
    if inputs.dtype != torch.float32:
        block = onednn_channel_block()
        blocked = _blocked_numel(grad, block) + _blocked_numel(inputs, block)
        return copies + blocked * inputs.element_size()
    partial_sums = torch.get_num_threads() * weight.numel() * _FLOAT32_BYTES
    if padded and not transposed:
        return copies + partial_sums + _gemm_weight_gradient(inputs, weight, grad)
    return copies + partial_sums


#: below this many output voxels of a depth slice a thread, oneDNN's GEMM convolution splits a
#: weight gradient over the batch, one buffer a thread (``gemm_convolution_utils.cpp``)
_GEMM_OUTER_THREADING_VOXELS = 256


def _gemm_weight_gradient(inputs: Any, weight: Any, grad: Any) -> int:
    """oneDNN's GEMM convolution scratchpad for a channels-last float32 weight gradient on AVX2
    (0 elsewhere): per thread used, one output depth slice's columns and one sample's input."""
    if onednn_channel_block() != 8 or not RULES["avx2_gemm_scratchpad"]:
        return 0
    batch, channels = inputs.shape[:2]
    slice_voxels = grad.shape[3] * grad.shape[4]
    threads = torch.get_num_threads()
    split = batch > 1 and slice_voxels // threads < _GEMM_OUTER_THREADING_VOXELS
    buffers = threads if split else 1
    columns = channels * math.prod(weight.shape[2:]) * slice_voxels
    sample = channels * math.prod(inputs.shape[2:])
    return buffers * (columns + sample) * _FLOAT32_BYTES


def _channels_last(tensor: Any) -> bool:
    """Whether a 5-D tensor is in ``channels_last_3d`` (NDHWC) layout and not also NCDHW."""
    return tensor.is_contiguous(memory_format=torch.channels_last_3d) and not tensor.is_contiguous()


@dataclass(frozen=True)
class CudnnWorkspace:
    """cuDNN's convolution workspaces (and the trilinear backward's copies), the sizes taken one
    after the other; ``limit``: ``CUDNN_CONV_WSCAP_DBG`` in bytes (``None``: no cap)."""

    limit: int | None = None
    channels_last: bool = False

    def _capped(self, sizes: tuple[int, ...]) -> tuple[int, ...]:
        if not RULES["cudnn_workspace"]:
            return ()
        if self.limit is None:
            return sizes
        return tuple(min(size, self.limit) for size in sizes if min(size, self.limit) > 0)

    def _trilinear_backward(self, grad: Any, grad_input: Any) -> tuple[tuple[int, ...], ...]:
        """``upsample_trilinear3d_backward`` runs on contiguous copies of the gradient (a
        concatenation's channel slice) and, channels-last, of the input's gradient."""
        copies = []
        if self.channels_last or not grad.is_contiguous():
            copies.append(_bytes(grad))
        if self.channels_last and grad_input.shape[1] > 1:
            copies.append(_bytes(grad_input))
        return (tuple(copies),) if copies and RULES["trilinear_backward_copy"] else ()

    def __call__(self, func: Any, args: tuple, out: Any) -> tuple[int | tuple[int, ...], ...]:
        if func is torch.ops.aten.upsample_trilinear3d_backward.default:
            return self._trilinear_backward(args[0], out)
        if func is torch.ops.aten.convolution.default:
            inputs = args[0]
            if inputs.dim() != 5 or self.channels_last or _channels_last(out):
                return ()
            return self._capped((_bytes(inputs) + _bytes(out),))
        if func is torch.ops.aten.convolution_backward.default:
            grad, inputs = args[0], args[1]
            if inputs.dim() != 5 or self.channels_last or _channels_last(grad):
                return ()
            mask = args[_OUTPUT_MASK]
            passes = int(bool(mask[0])) + int(bool(mask[1]))
            return self._capped((_bytes(grad) + _bytes(inputs),) * passes)
        return ()
