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

from volseg.utils.cpu import cpu_bf16_native, onednn_uses_amx

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
        "bf16_weight_gradient",
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
            weight_pass = _bf16_weight_pass(args, nxc=True)
            if weight_pass is not None:
                # the weight too, where the input alone is channels-last; the input's gradient
                # reorders the weight into oneDNN's blocks
                copies = sum(_channels_last_copy(t) for t in (grad, inputs, weight))
                data_pass = _bytes(weight) if args[_OUTPUT_MASK][0] else 0
                return _rule("channels_last_conv", copies + max(data_pass, weight_pass))
            return _rule(
                "channels_last_conv",
                _channels_last_backward(grad, inputs, weight, weight_gradient, padded, transposed),
            )
        if not RULES["onednn_blocked"] or not (grad.is_contiguous() or channels_last):
            return 0
        block = onednn_channel_block()
        blocked = (_blocked_numel(grad, block) + _blocked_numel(inputs, block)) * _FLOAT32_BYTES
        weight_pass = _bf16_weight_pass(args, nxc=False)
        if weight_pass is None:
            return blocked
        # the input's gradient, computed blocked and reordered back (a strided or transposed
        # one through other kernels: the count above)
        data_pass = blocked // 2 if args[_OUTPUT_MASK][0] else 0
        if transposed or any(s != 1 for s in stride):
            data_pass = blocked if args[_OUTPUT_MASK][0] else 0
        return max(data_pass, weight_pass)
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


#: oneDNN's bf16 backward-weights kernels' channel block, on AVX512_BF16
_BF16_BLOCK = 16
#: bytes of a bfloat16 element
_BF16_BYTES = 2
#: per-core L2 cache oneDNN sizes its first-convolution blocking by, taken as the largest of
#: current x86 cores (2 MiB), which keeps the kernel on its larger, global transposition
_L2_BYTES = 2 * 2**20


def _balance211(work: int, team: int, member: int) -> tuple[int, int]:
    """oneDNN's ``balance211``: the ``[start, end)`` of ``work`` items a team member takes."""
    if team <= 1 or work == 0:
        return 0, work
    big = -(-work // team)
    with_big = work - (big - 1) * team
    start = member * big if member <= with_big else with_big * big + (member - with_big) * (big - 1)
    return start, start + (big if member < with_big else big - 1)


@dataclass(frozen=True)
class _Bf16WeightGradient:
    """A 3-D convolution's weight gradient as oneDNN's AVX512_BF16 kernel
    (``jit_avx512_core_bf16_convolution_bwd_weights_t``, oneDNN 3.x) takes it: ``src`` the
    convolution's input (a transposed one's: its output gradient), ``dst`` its output gradient
    (a transposed one's: its input), ``ic``/``oc`` their channels a group."""

    batch: int
    ic: int
    oc: int
    src: tuple[int, int, int]
    dst: tuple[int, int, int]
    kernel: tuple[int, int, int]
    stride: tuple[int, int, int]
    padding: tuple[int, int, int]
    groups: int
    nxc: bool
    bias: bool

    @property
    def first(self) -> bool:
        """oneDNN's "first convolution": fewer input channels than a block, one group."""
        return self.ic < _BF16_BLOCK and self.groups == 1

    @property
    def ic_block(self) -> int:
        return self.ic if self.first else _BF16_BLOCK

    @property
    def nb_ic(self) -> int:
        return -(-self.ic // self.ic_block)

    @property
    def nb_oc(self) -> int:
        return -(-self.oc // _BF16_BLOCK)

    @property
    def transposes_src(self) -> bool:
        return not (self.first and (self.ic == 1 or not self.nxc))

    @property
    def tr_pad(self) -> int:
        """Padding a transposed row of the input carries: ``max(l_pad, r_pad + 1)``, even."""
        left, width, out_width, stride = self.padding[2], self.src[2], self.dst[2], self.stride[2]
        right = max(0, (out_width - 1) * stride + self.kernel[2] - width - left)
        return -(-max(left, right + 1) // 2) * 2

    @property
    def tr_iw(self) -> int:
        """A transposed input row's width: the strided width and padding, rounded up to even."""
        if not self.transposes_src:
            return self.src[2]
        stride = self.stride[2]
        return -(-(-(-self.src[2] // stride) + self.tr_pad) // 2) * 2 * stride

    @property
    def tr_ow(self) -> int:
        return -(-self.dst[2] // 2) * 2

    @property
    def global_transpose(self) -> bool:
        """Whether the kernel transposes whole samples once per thread group (else a depth slice
        a thread: a first convolution of a large output's wide slices, ``use_spatial_blocking``)."""
        od, oh, ow = self.dst
        volume = self.oc * od * oh * ow * _FLOAT32_BYTES
        nt_stores = self.nxc and volume >= 2 * _L2_BYTES and min(self.kernel) >= 6
        blocking = volume >= _L2_BYTES and ow * oh >= 64 * 124 and od > 1
        return not (self.first and not nt_stores and blocking)

    def balance(self, threads: int) -> tuple[int, int, int]:
        """oneDNN's ``balance``: threads over the batch's depth slices (each group of them with
        its own transposed samples and weight-gradient buffer), output- and input-channel
        blocks, the split whose memory traffic a thread is least; ``(nthr_mb, nthr_oc_b,
        nthr_ic_b)`` (groups: one thread each)."""
        if threads < self.groups:
            return 1, 1, 1
        nthr = threads // self.groups
        work = self.batch * self.dst[0]
        (sd, sh, sw), (kd, kh, kw) = self.stride, self.kernel
        # blocked operands' channels count padded to the block
        padded = not self.nxc and not self.first and self.groups == 1
        ic = self.nb_ic * _BF16_BLOCK if padded else self.ic
        oc = self.nb_oc * _BF16_BLOCK if padded else self.oc
        src_size = self.batch * ic * math.prod(self.src[:2]) * self.tr_iw * _BF16_BYTES
        dst_size = self.batch * oc * math.prod(self.dst[:2]) * self.tr_ow * _BF16_BYTES
        wei_size = oc * ic * kd * kh * kw * _FLOAT32_BYTES
        wei_scale = 0.5 * (dst_size + src_size) / wei_size
        ratio = self.nb_oc / self.nb_ic
        src_coef = max(1 / ratio, 1.0) * (4.0 if wei_scale < 1 else 1.0)
        dst_coef, wei_coef = max(ratio, 1.0), max(wei_scale, 1.0)
        src_sample = self.ic_block * math.prod(self.src[:2]) * self.tr_iw / (sd * sh * sw)
        dst_sample = _BF16_BLOCK * math.prod(self.dst[:2]) * self.tr_ow

        def cost(mb: int, oc_b: int, ic_b: int) -> float:
            slices = -(-work // mb) * self.batch / work
            ic_blocks, oc_blocks = -(-self.nb_ic // ic_b), -(-self.nb_oc // oc_b)
            return (
                src_coef * slices * ic_blocks * src_sample
                + wei_coef * oc_blocks * ic_blocks * kd * kh * kw * self.ic_block * _BF16_BLOCK
                + dst_coef * slices * oc_blocks * dst_sample
            )

        best, split = cost(1, 1, 1), (1, 1, 1)
        for mb in range(1, min(nthr, work) + 1):
            for oc_b in range(1, min(nthr // mb, self.nb_oc) + 1):
                ic_b = min(nthr // mb // oc_b, self.nb_ic)
                if cost(mb, oc_b, ic_b) <= best:
                    best, split = cost(mb, oc_b, ic_b), (mb, oc_b, ic_b)
        mb, oc_b, ic_b = split
        if nthr // 2 < mb < nthr:
            mb = min(work, nthr)
        return mb, oc_b, ic_b

    def _touched_slices(self, mb_groups: int) -> tuple[int, int]:
        """Depth slices of the transposed input and output gradient that the thread groups
        write (a group reuses one sample's buffer for each of its samples; the input's slices
        of a run of output slices are written at the buffer's end)."""
        od, depth = self.dst[0], self.src[0]
        src, dst = 0, 0
        for group in range(mb_groups):
            start, end = _balance211(self.batch * od, mb_groups, group)
            written, span = set(), 0
            while start < end:
                first = start % od
                last = min(od, first + end - start)
                written.update(range(first, last))
                low = max(0, first * self.stride[0] - self.padding[0])
                high = min(depth, (last - 1) * self.stride[0] - self.padding[0] + self.kernel[0])
                span = max(span, high - low)
                start += last - first
            src, dst = src + span, dst + len(written)
        return src, dst

    def scratchpad(self, threads: int) -> int:
        """Bytes of the scratchpad the kernel writes: per thread group the input and the output
        gradient transposed into channel blocks (bf16, the depth slices it writes), and its
        partial weight (and bias) gradient in float32, reduced into the bf16 gradient at the
        end."""
        mb_groups = self.balance(threads)[0]
        weight = self.groups * self.nb_oc * _BF16_BLOCK * self.nb_ic * self.ic_block
        weight *= math.prod(self.kernel)
        bias = self.groups * self.nb_oc * _BF16_BLOCK if self.bias else 0
        partial_sums = mb_groups * (weight + bias) * _FLOAT32_BYTES
        if not self.global_transpose:  # a thread transposes one output slice at a time
            src_slices, dst_slices = threads * self.kernel[0], threads
        else:
            src_slices, dst_slices = self._touched_slices(mb_groups)
        src_slice = self.groups * self.nb_ic * self.ic_block * self.src[1] * self.tr_iw
        dst_slice = self.groups * self.nb_oc * _BF16_BLOCK * self.dst[1] * self.tr_ow
        transposed = dst_slices * dst_slice
        if self.transposes_src:
            transposed += src_slices * src_slice
        return partial_sums + transposed * _BF16_BYTES


def _bf16_weight_pass(args: tuple, nxc: bool) -> int | None:
    """What a bfloat16 convolution's weight gradient holds beyond its outputs where oneDNN runs
    it natively on AVX512_BF16 (``bf16_weight_gradient``; ``None`` elsewhere, and where another
    of its kernels takes it: a first convolution of 2-15 channels in NCDHW, on its GEMM).

    oneDNN's kernel splits the batch's depth slices over groups of threads by its ``balance``
    (ported in :class:`_Bf16WeightGradient`), and each group transposes its samples into its
    own buffers in the scratchpad and sums its own float32 partial weight gradient there: the
    scratchpad grows with the thread groups, not with the batch. A 1x1x1 kernel
    (``jit_avx512_core_bf16_1x1``) transposes a few rows at a time: its partial sums, one a
    thread at most. In NCDHW, torch first reorders the output gradient and the input (not a
    first convolution's) into the blocked layout, the whole batch, held through the kernel.
    Measured against ``aten.convolution_backward``'s rise beyond its outputs on an AMD EPYC with
    AVX512_BF16 (torch 2.13, oneDNN 3.12; 1 and 2 threads; batches 1-3; 1-256 channels; 3x3x3,
    1x1x1, strided 3x3x3 and 2x2x2 and transposed 2x2x2 kernels; channels-last and NCDHW;
    SwinUNETR's convolutions): at or above each, by at most 0.4 MiB
    (``tests/memory/test_bf16_weight_gradient_rule.py``)."""
    grad, inputs, weight, stride, dilation, transposed, groups = _BACKWARD_ARGS(args)
    applies = (
        RULES["bf16_weight_gradient"]
        and args[_OUTPUT_MASK][1]
        and inputs.dtype == torch.bfloat16
        and inputs.dim() == 5
        and all(d == 1 for d in dilation)
        and cpu_bf16_native()
        and not onednn_uses_amx()
    )
    if not applies:
        return None
    src, dst = (grad, inputs) if transposed else (inputs, grad)
    gradient = _Bf16WeightGradient(
        batch=inputs.shape[0],
        ic=src.shape[1] // groups,
        oc=dst.shape[1] // groups,
        src=tuple(src.shape[2:]),
        dst=tuple(dst.shape[2:]),
        kernel=tuple(weight.shape[2:]),
        stride=tuple(stride),
        padding=tuple(args[_PADDING]),
        groups=groups,
        nxc=nxc and src.shape[1] > 1,
        bias=bool(args[_OUTPUT_MASK][2]),
    )
    pointwise = math.prod(gradient.kernel) == 1 and not any(gradient.padding)
    if not (gradient.nxc or pointwise) and gradient.first and gradient.oc % _BF16_BLOCK:
        return None  # unblockable: oneDNN's GEMM convolution
    threads = torch.get_num_threads()
    if pointwise:
        weight_elements = gradient.groups * gradient.nb_oc * gradient.nb_ic * _BF16_BLOCK**2
        scratch = threads * weight_elements * _FLOAT32_BYTES
    else:
        scratch = gradient.scratchpad(threads)
    if gradient.nxc:
        return scratch
    # a first convolution's kernel reads the input as it is
    block = onednn_channel_block()
    plain_src = gradient.first and not pointwise
    reordered = _blocked_numel(dst, block) + (0 if plain_src else _blocked_numel(src, block))
    return reordered * _BF16_BYTES + scratch


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
