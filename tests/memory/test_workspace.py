"""The CPU kernels' scratch memory: which convolutions torch runs natively, and what they hold."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from volseg.memory.workspace import runs_on_onednn


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
from volseg.memory.readers import HostMemoryReader
from volseg.memory.workspace import cpu_workspace
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
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    out = subprocess.run(
        [sys.executable, "-c", MEASURE, json.dumps([shape, out_channels, kernel])],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    measured, predicted = json.loads(out.stdout.strip().splitlines()[-1])
    assert predicted == pytest.approx(measured, rel=0.15)


@pytest.mark.parametrize(("amx", "expected_mib"), [(True, 16), (False, 8)])
def test_a_bf16_convolutions_scratch_follows_the_kernel_onednn_picks(
    monkeypatch, amx, expected_mib
):
    """bf16 3x3x3, 16 -> 16 channels, batch 2 of 32x64x64 (8 MiB in, 8 MiB out). On AMX: the
    larger of the input and the output in float32 elements (16 MiB). Without AMX, blocked
    operands as in float32: the input's blocked copy + the blocked output - the output (8 MiB),
    as measured on an AMD EPYC with AVX512_BF16."""
    from volseg.memory import workspace

    monkeypatch.setattr(workspace, "runs_on_onednn", lambda *args: True)
    monkeypatch.setattr(workspace, "onednn_channel_block", lambda: 16)
    monkeypatch.setattr(workspace, "onednn_uses_amx", lambda: amx)
    x = torch.empty(2, 16, 32, 64, 64, dtype=torch.bfloat16, device="meta")
    w = torch.empty(16, 16, 3, 3, 3, dtype=torch.bfloat16, device="meta")
    out = torch.empty(2, 16, 32, 64, 64, dtype=torch.bfloat16, device="meta")
    args = (x, w, None, [1, 1, 1], [1, 1, 1], [1, 1, 1], False, [0, 0, 0], 1)
    scratch = workspace.cpu_workspace(torch.ops.aten.convolution.default, args, out)
    assert scratch == expected_mib * 2**20
