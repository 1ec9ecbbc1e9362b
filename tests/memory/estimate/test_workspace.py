"""The CPU kernels' scratch memory: which convolutions torch runs natively, and what they hold."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from volseg.memory.estimate.workspace import runs_on_onednn


def _onednn(shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> bool:
    inputs = torch.empty(shape, dtype=dtype, device="meta")
    weight = torch.empty((16, shape[1], 3, 3, 3), dtype=dtype, device="meta")
    return runs_on_onednn(inputs, weight, (1, 1, 1), (1, 1, 1), 1)


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")
def test_torch_runs_a_small_float32_batch_of_one_natively():
    # N x C x D x H: 1 x 16 x 20 x 64 = 20,480 is native, one slice more is oneDNN's
    assert not _onednn((1, 16, 20, 64, 64))
    assert _onednn((1, 16, 21, 64, 64))
    assert _onednn((2, 16, 20, 64, 64))  # a batch of two always goes to oneDNN
    bf16 = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    assert _onednn((1, 16, 20, 64, 64), torch.bfloat16) == bf16


MEASURE = """
import json, sys, torch
from volseg.memory.monitor.readers import HostMemoryReader
from volseg.memory.estimate.workspace import cpu_workspace
torch.set_num_threads(2)
shape, out_channels, kernel = json.loads(sys.argv[1])
conv = torch.nn.Conv3d(shape[1], out_channels, kernel, padding=kernel // 2)
x = torch.randn(shape)
reader = HostMemoryReader()
with torch.no_grad():
    for _ in range(2):  # the first call also creates oneDNN's primitive
        start = reader.read().allocated
        reader.reset_peak()
        y = conv(x)
        measured = reader.read().peak_allocated - start - y.numel() * y.element_size()
        padding = list(conv.padding)
        args = (x, conv.weight, conv.bias, [1, 1, 1], padding, [1, 1, 1], False, [0, 0, 0], 1)
        predicted = cpu_workspace(torch.ops.aten.convolution.default, args, y)
        del y
print(json.dumps([measured, predicted]))
"""


def _measure(script: str, argument: str, **env: str) -> tuple[int, int]:
    """``[measured, predicted]`` as ``script`` prints them, run in a fresh process whose freed
    memory goes back to the system."""
    out = subprocess.run(
        [sys.executable, "-c", script, argument],
        env=dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", **env),
        capture_output=True,
        text=True,
        check=True,
    )
    return tuple(json.loads(out.stdout.strip().splitlines()[-1]))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize(
    "shape, out_channels, kernel",
    [
        ([1, 16, 16, 32, 32], 16, 3),
        ([1, 16, 16, 96, 96], 16, 3),
        ([2, 8, 16, 64, 64], 8, 3),
        ([4, 24, 16, 64, 64], 8, 3),
        ([4, 8, 16, 64, 64], 5, 1),
    ],
    ids=["native", "onednn", "onednn-8-channels", "onednn-concat", "onednn-1x1-head"],
)
def test_a_convolutions_scratch_memory_is_what_it_holds(shape, out_channels, kernel):
    """Native (im2col, 27x the input) and oneDNN (the blocked output, and the input's blocked
    copy where the kernel takes one, its channels padded to oneDNN's block: 8 channels take what
    16 take on AVX-512) alike, measured in a fresh process with freed memory returned to the
    system. The last two are a U-Net decoder's concatenation (24 channels in: the input's copy
    and the blocked output held together) and its 1x1x1 head (whose kernel always takes a
    blocked input)."""
    measured, predicted = _measure(MEASURE, json.dumps([shape, out_channels, kernel]))
    assert predicted == pytest.approx(measured, rel=0.15)


@pytest.mark.parametrize(("amx", "expected_mib"), [(True, 16), (False, 8)])
def test_a_bf16_convolutions_scratch_follows_the_kernel_onednn_picks(
    monkeypatch, amx, expected_mib
):
    """bf16 3x3x3, 16 -> 16 channels, batch 2 of 32x64x64 (8 MiB in, 8 MiB out). On AMX: the
    larger of the input and the output in float32 elements (16 MiB). Without AMX, blocked
    operands as in float32: the input's blocked copy + the blocked output - the output (8 MiB),
    as measured on an AMD EPYC with AVX512_BF16."""
    from volseg.memory.estimate import workspace

    monkeypatch.setattr(workspace, "runs_on_onednn", lambda *args: True)
    monkeypatch.setattr(workspace, "onednn_channel_block", lambda: 16)
    monkeypatch.setattr(workspace, "onednn_uses_amx", lambda: amx)
    x = torch.empty(2, 16, 32, 64, 64, dtype=torch.bfloat16, device="meta")
    w = torch.empty(16, 16, 3, 3, 3, dtype=torch.bfloat16, device="meta")
    out = torch.empty(2, 16, 32, 64, 64, dtype=torch.bfloat16, device="meta")
    args = (x, w, None, [1, 1, 1], [1, 1, 1], [1, 1, 1], False, [0, 0, 0], 1)
    scratch = workspace.cpu_workspace(torch.ops.aten.convolution.default, args, out)
    assert scratch == expected_mib * 2**20


MIB = 2**20


def _meta(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


@pytest.fixture
def torchs_own_gemm(monkeypatch):
    """bf16 products on torch's own GEMM, as on a CPU where oneDNN has no bf16 kernels."""
    from volseg.memory.estimate import workspace

    monkeypatch.setattr(workspace, "_half_on_onednn", lambda dtype: False)
    return workspace


def test_torchs_own_bf16_gemm_holds_a_float32_product_for_a_column_major_first_operand(
    torchs_own_gemm,
):
    """1024x64 @ 64x4096: 16 MiB of float32 product, only with the first operand column-major
    and the second row-major; one matrix of a batched product; none in float32."""
    mm, addmm, bmm = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default,
                      torch.ops.aten.bmm.default)  # fmt: skip
    buffer = torchs_own_gemm.gemm_float32_buffer
    row_a, col_a = _meta(1024, 64), _meta(64, 1024).t()
    row_b, col_b = _meta(64, 4096), _meta(4096, 64).t()
    out = _meta(1024, 4096)
    assert buffer(mm, (col_a, row_b), out) == 16 * MIB
    assert buffer(mm, (row_a, row_b), out) == 0
    assert buffer(mm, (row_a, col_b), out) == 0
    assert buffer(mm, (col_a, col_b), out) == 0
    assert buffer(addmm, (_meta(4096), col_a, row_b), out) == 16 * MIB
    f32 = _meta(64, 1024, dtype=torch.float32).t(), _meta(64, 4096, dtype=torch.float32)
    assert buffer(mm, f32, _meta(1024, 4096, dtype=torch.float32)) == 0
    batched = _meta(16, 512, 1024).transpose(1, 2), _meta(16, 512, 1024)
    assert buffer(bmm, batched, _meta(16, 1024, 1024)) == 4 * MIB


def test_no_float32_product_where_onednn_runs_bf16(monkeypatch):
    from volseg.memory.estimate import workspace

    monkeypatch.setattr(workspace, "_half_on_onednn", lambda dtype: True)
    args = (_meta(64, 1024).t(), _meta(64, 4096))
    assert workspace.gemm_float32_buffer(torch.ops.aten.mm.default, args, _meta(1024, 4096)) == 0


def test_a_native_bf16_convolution_holds_one_samples_columns_in_float32(torchs_own_gemm):
    """Batch 2, 32 -> 32 channels of 16x32x32, 3x3x3: the backward's input-gradient columns of
    one sample, 32 x 27 x 16,384 x 4 bytes = 54 MiB, on top of the batch's bf16 columns (54 MiB);
    none without the input's gradient. A transposed convolution: its forward's columns of one
    sample in float32, 54 MiB; its backward none."""
    x, w, grad = _meta(2, 32, 16, 32, 32), _meta(32, 32, 3, 3, 3), _meta(2, 32, 16, 32, 32)
    backward = torch.ops.aten.convolution_backward.default

    def backward_args(mask: list[bool], transposed: bool = False) -> tuple:
        same = [1, 1, 1]
        return (grad, x, w, [32], same, same, same, transposed, [0, 0, 0], 1, mask)

    full = backward_args([True, True, True])
    assert torchs_own_gemm.gemm_float32_buffer(backward, full, None) == 54 * MIB
    assert torchs_own_gemm.cpu_workspace(backward, full, None) == 108 * MIB
    weight_only = backward_args([False, True, True])
    assert torchs_own_gemm.gemm_float32_buffer(backward, weight_only, None) == 0
    forward = torch.ops.aten.convolution.default
    same = [1, 1, 1]
    up = (x, w, None, same, same, same, True, [0, 0, 0], 1)
    assert torchs_own_gemm.gemm_float32_buffer(forward, up, _meta(2, 32, 16, 32, 32)) == 54 * MIB
    plain = (x, w, None, same, same, same, False, [0, 0, 0], 1)
    assert torchs_own_gemm.gemm_float32_buffer(forward, plain, _meta(2, 32, 16, 32, 32)) == 0
    up_backward = backward_args([True, True, True], transposed=True)
    assert torchs_own_gemm.gemm_float32_buffer(backward, up_backward, None) == 0


MEASURE_GEMM = """
import gc, json, sys, torch
from volseg.memory.monitor.readers import HostMemoryReader, set_mmap_threshold
from volseg.memory.estimate.workspace import cpu_workspace
set_mmap_threshold(65536)
torch.set_num_threads(2)
case = sys.argv[1]
if case == "mm":
    a = torch.randn(64, 1024, dtype=torch.bfloat16).t()
    b = torch.randn(64, 4096, dtype=torch.bfloat16)
    run = lambda: a @ b
    predict = lambda out: out.numel() * 2 + cpu_workspace(torch.ops.aten.mm.default, (a, b), out)
else:
    x = torch.randn(1, 16, 8, 32, 32, dtype=torch.bfloat16, requires_grad=True)
    conv = torch.nn.Conv3d(16, 16, 3, padding=1).to(torch.bfloat16)
    y = conv(x)
    g = torch.ones_like(y)
    run = lambda: torch.autograd.grad(y, [x, conv.weight], g, retain_graph=True)
    args = (g, x, conv.weight, [16], [1, 1, 1], [1, 1, 1], [1, 1, 1], False, [0, 0, 0], 1,
            [True, True, False])
    grads = x.numel() * 2 + conv.weight.numel() * 2
    predict = lambda out: grads + cpu_workspace(torch.ops.aten.convolution_backward.default,
                                                args, None)
reader = HostMemoryReader()
for _ in range(2):  # the first call also warms up
    gc.collect()
    start = reader.read().allocated
    reader.reset_peak()
    out = run()
    measured = reader.read().peak_allocated - start
    predicted = predict(out)
    del out
print(json.dumps([measured, predicted]))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("case", ["mm", "conv-backward"])
def test_torchs_own_bf16_gemm_buffer_is_what_the_process_holds(case):
    """Held to oneDNN's AVX2 kernels (no bf16 ones on any x86 CPU), a bf16 product with a
    column-major first operand, and a native bf16 convolution's backward (batch 1, 16 -> 16
    channels of 8x32x32): the process's peak resident rise against the output plus the
    estimated scratch (without the float32 buffer they are 8 of 24 MiB and about 7 of 21)."""
    measured, predicted = _measure(MEASURE_GEMM, case, ONEDNN_MAX_CPU_ISA="AVX2")
    assert predicted == pytest.approx(measured, rel=0.1)


CHANNELS_LAST = torch.channels_last_3d


def _channels_last_backward_args(
    batch: int, channels: int, size: tuple[int, int, int], input_last: bool
) -> tuple:
    """aten::convolution_backward's arguments for a 3x3x3, ``channels`` -> ``channels``
    convolution (padding 1) whose weight is channels-last, float32, on meta tensors; the input
    and the gradient both NCDHW or both channels-last."""
    x = torch.empty(batch, channels, *size, device="meta")
    g = torch.empty(batch, channels, *size, device="meta")
    if input_last:
        x = x.contiguous(memory_format=CHANNELS_LAST)
        g = g.contiguous(memory_format=CHANNELS_LAST)
    w = torch.empty(channels, channels, 3, 3, 3, device="meta").to(memory_format=CHANNELS_LAST)
    return (g, x, w, [channels], [1, 1, 1], [1, 1, 1], [1, 1, 1], False, [0, 0, 0], 1,
            [True, True, True])  # fmt: skip


def test_torchs_channels_last_rule_reads_strides_even_where_contiguity_cannot_tell():
    """torch runs a convolution in channels-last when its input's or its weight's strides are
    (``suggest_memory_format``): a single-channel 3x3x3 weight moved to channels-last is
    contiguous both ways, and so is a 1x1x1 head's weight; their strides still tell."""
    from volseg.memory.estimate.workspace import _runs_channels_last

    image = torch.empty(3, 1, 16, 48, 48, device="meta")  # NCDHW, one channel
    first = torch.empty(16, 1, 3, 3, 3, device="meta")
    assert not _runs_channels_last(image, first)
    assert _runs_channels_last(image, first.to(memory_format=CHANNELS_LAST))
    maps = torch.empty(3, 16, 16, 48, 48, device="meta")
    head = torch.empty(5, 16, 1, 1, 1, device="meta")
    assert not _runs_channels_last(maps, head)
    assert _runs_channels_last(maps, head.to(memory_format=CHANNELS_LAST))
    assert _runs_channels_last(maps.contiguous(memory_format=CHANNELS_LAST), head)


def test_a_channels_last_convolution_copies_an_ncdhw_input_and_takes_no_blocked_layout(
    monkeypatch,
):
    """A float32 3x3x3 16 -> 16 convolution of a batch of 3 of 16x48x48 (6.75 MiB maps) with a
    channels-last weight: forward copies an NCDHW input to channels-last (6.75 MiB; the blocked
    rule would count the blocked output beside it), a channels-last input not at all. Backward
    on AVX-512 kernels: the gradient's and the input's copies where they are NCDHW, and a
    float32 weight gradient for each of 2 threads (2 x 16 x 16 x 27 x 4 bytes)."""
    from volseg.memory.estimate import workspace

    monkeypatch.setattr(workspace, "runs_on_onednn", lambda *args: True)
    monkeypatch.setattr(workspace, "onednn_channel_block", lambda: 16)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    w = torch.empty(16, 16, 3, 3, 3, device="meta").to(memory_format=CHANNELS_LAST)
    out = torch.empty(3, 16, 16, 48, 48, device="meta").contiguous(memory_format=CHANNELS_LAST)
    maps = 3 * 16 * 16 * 48 * 48 * 4
    for input_last, copied in ((False, maps), (True, 0)):
        x = torch.empty(3, 16, 16, 48, 48, device="meta")
        if input_last:
            x = x.contiguous(memory_format=CHANNELS_LAST)
        args = (x, w, None, [1, 1, 1], [1, 1, 1], [1, 1, 1], False, [0, 0, 0], 1)
        assert workspace.cpu_workspace(torch.ops.aten.convolution.default, args, out) == copied
    partial_sums = 2 * 16 * 16 * 27 * 4
    backward = torch.ops.aten.convolution_backward.default
    args = _channels_last_backward_args(3, 16, (16, 48, 48), input_last=False)
    assert workspace.cpu_workspace(backward, args, None) == 2 * maps + partial_sums
    args = _channels_last_backward_args(3, 16, (16, 48, 48), input_last=True)
    assert workspace.cpu_workspace(backward, args, None) == partial_sums


@pytest.mark.parametrize(
    ("batch", "size", "threads_used"),
    [(3, (16, 48, 48), 1), (3, (4, 6, 6), 2), (1, (4, 6, 6), 1)],
    ids=["large-slices", "small-slices", "one-sample"],
)
def test_avx2s_channels_last_weight_gradient_holds_gemm_columns_and_a_sample(
    monkeypatch, batch, size, threads_used
):
    """On AVX2 kernels oneDNN's GEMM convolution computes a padded channels-last weight
    gradient: per thread it uses, one output depth slice's im2col columns (16 x 27 x H x W) and
    one sample's input in NCDHW (16 x D x H x W), float32. It uses both threads where a slice
    has fewer than 256 voxels a thread and the batch more than one sample (48 x 48 = 2,304
    voxels: one thread; 6 x 6: both; a batch of one: one)."""
    from volseg.memory.estimate import workspace

    monkeypatch.setattr(workspace, "runs_on_onednn", lambda *args: True)
    monkeypatch.setattr(workspace, "onednn_channel_block", lambda: 8)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    d, h, w = size
    args = _channels_last_backward_args(batch, 16, size, input_last=True)
    columns = 16 * 27 * h * w * 4
    sample = 16 * d * h * w * 4
    partial_sums = 2 * 16 * 16 * 27 * 4
    expected = partial_sums + threads_used * (columns + sample)
    scratch = workspace.cpu_workspace(torch.ops.aten.convolution_backward.default, args, None)
    assert scratch == expected
    # the same gradient on AVX-512 kernels takes no GEMM scratch
    monkeypatch.setattr(workspace, "onednn_channel_block", lambda: 16)
    scratch = workspace.cpu_workspace(torch.ops.aten.convolution_backward.default, args, None)
    assert scratch == partial_sums


MEASURE_CHANNELS_LAST = """
import gc, json, sys, torch
from volseg.memory.monitor.readers import HostMemoryReader
from volseg.memory.estimate.workspace import cpu_workspace
torch.set_num_threads(2)
input_last = sys.argv[1] == "channels-last"
cl = torch.channels_last_3d
conv = torch.nn.Conv3d(16, 16, 3, padding=1).to(memory_format=cl)
x = torch.randn(3, 16, 16, 48, 48)
x = (x.contiguous(memory_format=cl) if input_last else x).requires_grad_()
y = conv(x)
g = torch.randn_like(y)
args = (g, x, conv.weight, [16], [1, 1, 1], [1, 1, 1], [1, 1, 1], False, [0, 0, 0], 1,
        [True, True, False])
reader = HostMemoryReader()
for _ in range(2):  # the first call also creates oneDNN's primitives
    gc.collect()
    start = reader.read().allocated
    reader.reset_peak()
    grads = torch.autograd.grad(y, [x, conv.weight], g, retain_graph=True)
    returned = sum(t.numel() * t.element_size() for t in grads)
    measured = reader.read().peak_allocated - start - returned
    predicted = cpu_workspace(torch.ops.aten.convolution_backward.default, args, grads)
    del grads
print(json.dumps([measured, predicted]))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")
@pytest.mark.parametrize("layout", ["ncdhw", "channels-last"])
def test_a_channels_last_backward_on_avx2_holds_what_is_counted(layout):
    """Held to oneDNN's and ATen's AVX2 kernels, the backward of a channels-last 3x3x3
    16 -> 16 convolution of a batch of 3 of 16x48x48: from an NCDHW input and gradient, their
    copies and the GEMM's scratch (about 19.4 MiB beyond the returned gradients), from
    channels-last ones, the GEMM's scratch alone (about 5.8 MiB; without it the count is
    0.05)."""
    measured, predicted = _measure(
        MEASURE_CHANNELS_LAST, layout, ONEDNN_MAX_CPU_ISA="AVX2", ATEN_CPU_CAPABILITY="avx2"
    )
    assert predicted == pytest.approx(measured, rel=0.1)


def test_softmax_of_channels_last_logits_and_a_pooling_gradient_of_another_layout_copy():
    """Float32 logits of a batch of 3, 13 classes of 24x48x48 (8.1 MiB): (log-)softmax over the
    classes copies channels-last logits to NCDHW first, none of NCDHW ones. A 2x2x2 max
    pooling's backward to 16 maps of 24x48x48 (10.1 MiB of input gradient; its indices 2.5 MiB
    of int64): where its gradient and its input differ in layout, both once more."""
    from volseg.memory.estimate.workspace import cpu_workspace

    logits = torch.empty(3, 13, 24, 48, 48, device="meta")
    logits_bytes = 3 * 13 * 24 * 48 * 48 * 4
    for op in (torch.ops.aten._softmax.default, torch.ops.aten._log_softmax.default):
        assert cpu_workspace(op, (logits, 1, False), logits) == 0
        last = logits.contiguous(memory_format=CHANNELS_LAST)
        assert cpu_workspace(op, (last, 1, False), logits) == logits_bytes
    maps = torch.empty(3, 16, 24, 48, 48, device="meta")
    pooled = torch.empty(3, 16, 12, 24, 24, device="meta")
    indices = torch.empty(3, 16, 12, 24, 24, dtype=torch.int64, device="meta")
    backward = torch.ops.aten.max_pool3d_with_indices_backward.default

    def scratch(grad: torch.Tensor, inputs: torch.Tensor) -> int:
        args = (grad, inputs, [2, 2, 2], [2, 2, 2], [0, 0, 0], [1, 1, 1], False, indices)
        return cpu_workspace(backward, args, maps)

    grad_last = pooled.contiguous(memory_format=CHANNELS_LAST)
    maps_last = maps.contiguous(memory_format=CHANNELS_LAST)
    assert scratch(pooled, maps) == 0
    assert scratch(grad_last, maps_last) == 0
    expected = 3 * 16 * 24 * 48 * 48 * 4 + 3 * 16 * 12 * 24 * 24 * 8
    assert scratch(grad_last, maps) == expected
    assert scratch(pooled, maps_last) == expected


MEASURE_LAYOUT_COPIES = """
import gc, json, sys, torch
from volseg.memory.monitor.readers import HostMemoryReader
from volseg.memory.estimate.workspace import cpu_workspace
torch.set_num_threads(2)
cl = torch.channels_last_3d
if sys.argv[1] == "log-softmax":
    x = torch.randn(3, 13, 24, 48, 48).contiguous(memory_format=cl)
    op, args = torch.ops.aten._log_softmax.default, (x, 1, False)
else:
    x = torch.randn(3, 16, 24, 48, 48)
    y, idx = torch.ops.aten.max_pool3d_with_indices(x, [2, 2, 2], [2, 2, 2])
    g = torch.randn_like(y).contiguous(memory_format=cl)
    op = torch.ops.aten.max_pool3d_with_indices_backward.default
    args = (g, x, [2, 2, 2], [2, 2, 2], [0, 0, 0], [1, 1, 1], False, idx)
reader = HostMemoryReader()
for _ in range(2):
    gc.collect()
    start = reader.read().allocated
    reader.reset_peak()
    out = op(*args)
    measured = reader.read().peak_allocated - start - out.numel() * out.element_size()
    predicted = cpu_workspace(op, args, out)
    del out
print(json.dumps([measured, predicted]))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("case", ["log-softmax", "pool-backward"])
def test_layout_copies_are_what_the_process_holds(case):
    """The two copies above, measured beyond the op's output in a fresh process (8.1 MiB of
    logits; 12.5 MiB for the pooling's backward); without the rule the count is 0."""
    measured, predicted = _measure(MEASURE_LAYOUT_COPIES, case)
    assert predicted == pytest.approx(measured, rel=0.1)


def test_a_rule_set_off_counts_nothing_and_the_others_still_count():
    """Softmax of channels-last logits (2x3x4x5x6 float32: 2,880 bytes) counts a contiguous copy
    by ``softmax_copy``; with that rule off, nothing; NCDHW logits never take the rule."""
    from unittest import mock

    from volseg.memory.estimate.workspace import RULES, cpu_workspace

    softmax = torch.ops.aten._softmax.default
    logits = torch.empty(2, 3, 4, 5, 6, device="meta")
    last = logits.to(memory_format=torch.channels_last_3d)
    assert cpu_workspace(softmax, (last, 1, False), logits) == 2 * 3 * 4 * 5 * 6 * 4
    assert cpu_workspace(softmax, (logits, 1, False), logits) == 0
    with mock.patch.dict(RULES, {"softmax_copy": False}):
        assert cpu_workspace(softmax, (last, 1, False), logits) == 0
        pool_backward = torch.ops.aten.max_pool3d_with_indices_backward.default
        indices = torch.empty(2, 3, 4, 5, 6, dtype=torch.int64, device="meta")
        args = (last, logits, [2] * 3, [2] * 3, [0] * 3, [1] * 3, False, indices)
        # the pooling rule is still on: the input's gradient (2,880) and the indices (5,760)
        assert cpu_workspace(pool_backward, args, logits) == 2880 + 5760
    assert RULES["softmax_copy"] is True
