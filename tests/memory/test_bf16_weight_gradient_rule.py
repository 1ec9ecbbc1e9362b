"""The estimator's ``bf16_weight_gradient`` rule against bfloat16 convolution backwards measured
on an AVX512_BF16 CPU: what oneDNN's bf16 weight-gradient kernel holds follows its thread
groups, not the batch."""

from __future__ import annotations

import pytest
import torch

from volseg.memory.estimate import workspace
from volseg.utils.cpu import cpu_bf16_native, onednn_uses_amx

MIB = 2**20

pytestmark = pytest.mark.skipif(
    not (cpu_bf16_native() and not onednn_uses_amx()),
    reason="the rule models oneDNN's native AVX512_BF16 bf16 kernels (no AMX); elsewhere bf16 "
    "weight gradients run on other kernels (AMX's, emulated bf16 or torch's own), which it "
    "leaves to the other rules",
)

CL = torch.channels_last_3d

#: (threads, batch, in -> out channels, input D x H x W, kernel, channels-last, the rise beyond
#: its outputs measured (MiB), the estimate without the rule (MiB)): ``aten.convolution_backward``
#: of a bf16 3x3x3 convolution (padding 1, bias; the input's, weight's and bias' gradients), its
#: process's peak resident memory with every allocation of 64 KiB or more mmap-ed (as
#: ``python -m benchmarks cpu_channels_last_memory`` measures an op: ``resident_peak`` after a
#: warm-up call) minus the bytes it returns; an AMD EPYC (Zen 4, AVX512_BF16), torch 2.13.0+cpu
#: (oneDNN 3.12), 2026-12-07
MEASURED = [
    # a batch of 3 in 2 thread groups: two samples' transposed operands, not three
    (2, 3, 16, 16, (24, 64, 64), 3, True, 12.12, 18.00),
    # a batch of 1 split by depth over both threads: one sample's operands between them
    (2, 1, 16, 16, (24, 64, 64), 3, True, 6.20, 6.00),
    # one thread, whatever the batch: one sample's operands
    (1, 3, 16, 16, (24, 64, 64), 3, True, 6.00, 18.00),
    # a deep layer: its float32 partial weight gradient, 256 x 256 x 27 x 4 bytes
    (2, 2, 256, 256, (2, 4, 4), 3, True, 6.64, 0.06),
    # NCDHW: the batch's blocked output gradient and input (9 + 9 MiB), and two samples'
    (2, 3, 16, 16, (24, 64, 64), 3, False, 30.03, 36.00),
]


def _backward_args(batch, c_in, c_out, size, kernel, channels_last):
    def meta(*shape):
        tensor = torch.empty(*shape, dtype=torch.bfloat16, device="meta")
        return tensor.contiguous(memory_format=CL) if channels_last else tensor

    inputs = meta(batch, c_in, *size)
    weight = meta(c_out, c_in, *(kernel,) * 3)
    grad = meta(batch, c_out, *size)
    pad = [kernel // 2] * 3
    return (grad, inputs, weight, [c_out], [1] * 3, pad, [1] * 3, False, [0] * 3, 1, [True] * 3)


def _estimate(threads: int, args: tuple) -> int:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return workspace.cpu_workspace(torch.ops.aten.convolution_backward.default, args, None)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize(
    ("threads", "batch", "c_in", "c_out", "size", "kernel", "channels_last", "measured", "_"),
    MEASURED,
)
def test_the_estimate_covers_the_measured_rise_within_a_few_percent(
    threads, batch, c_in, c_out, size, kernel, channels_last, measured, _
):
    args = _backward_args(batch, c_in, c_out, size, kernel, channels_last)
    estimate = _estimate(threads, args) / MIB
    assert measured <= estimate <= measured * 1.04 + 0.1


@pytest.mark.parametrize(
    ("threads", "batch", "c_in", "c_out", "size", "kernel", "channels_last", "_", "without"),
    MEASURED,
)
def test_without_the_rule_the_estimate_is_the_earlier_count(
    monkeypatch, threads, batch, c_in, c_out, size, kernel, channels_last, _, without
):
    monkeypatch.setitem(workspace.RULES, "bf16_weight_gradient", False)
    args = _backward_args(batch, c_in, c_out, size, kernel, channels_last)
    assert _estimate(threads, args) / MIB == pytest.approx(without, abs=0.01)


def test_the_thread_groups_follow_onednns_balance():
    """oneDNN 3.12's ``balance`` on a shallow and a deep layer, 2 threads: the shallow one splits
    the batch's depth slices (two groups), the deep one its input-channel blocks (one group)."""
    shallow = workspace._Bf16WeightGradient(
        batch=2, ic=16, oc=16, src=(24, 64, 64), dst=(24, 64, 64), kernel=(3, 3, 3),
        stride=(1, 1, 1), padding=(1, 1, 1), groups=1, nxc=True, bias=False,
    )  # fmt: skip
    deep = workspace._Bf16WeightGradient(
        batch=2, ic=256, oc=256, src=(2, 4, 4), dst=(2, 4, 4), kernel=(3, 3, 3),
        stride=(1, 1, 1), padding=(1, 1, 1), groups=1, nxc=True, bias=False,
    )  # fmt: skip
    assert shallow.balance(2) == (2, 1, 1)
    assert deep.balance(2) == (1, 1, 2)
