"""What a convolution in channels-last holds beyond its outputs, op by op, on this CPU.

A network moved to ``channels_last_3d`` (``model.channels_last=true``) runs every convolution in
channels-last (torch's ``mkldnn_conv_use_channels_last``: the weight's strides are), whatever
layout its input arrives in. For each case (a U-Net's convolutions: 3x3x3 at full and at deep
resolution, the first one of a single-channel image, a 1x1x1 head, a strided 2x2x2 and a
transposed 2x2x2 one; an NCDHW input, as an instance norm returns it, or a channels-last one;
and the loss's log-softmax and a max pooling's backward, :func:`layout_copies`),
the op runs once to warm up, then once with the process's peak resident memory reset
(``MALLOC_MMAP_THRESHOLD_=65536``, set here with ``mallopt``, so that freed buffers go back to
the system). ``beyond_outputs`` is that peak's rise minus the bytes the op returns: the operands'
channels-last copies and oneDNN's scratchpad. ``predicted_workspace`` is the estimator's count
of it (:func:`volseg.memory.estimate.workspace.cpu_workspace`, the largest over the op's aten
calls, asked
of the same tensors). Float32 by default; ``--dtype bfloat16`` runs the same cases in bfloat16
(on a CPU whose oneDNN has bfloat16 kernels: elsewhere torch's native ones run them).

oneDNN picks its kernels by the CPU's ISA; ``ONEDNN_MAX_CPU_ISA=AVX2
ATEN_CPU_CAPABILITY=avx2`` holds any CPU to an AVX2-only CPU's kernels:

    python -m benchmarks cpu_channels_last_memory
    python -m benchmarks cpu_channels_last_memory --dtype bfloat16
    ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 python -m benchmarks cpu_channels_last_memory

The rows go to ``benchmarks/results/cpu/<date>_cpu_channels_last_memory.json`` (``--json-out``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
from torch import nn

from benchmarks import results_io
from benchmarks.archive.op_memory import (
    MMAP_THRESHOLD,
    largest_per_call,
    op_memory_reader,
    resident_peak,
)
from benchmarks.results_io import cpu_description
from volseg.memory.estimate.workspace import cpu_workspace
from volseg.memory.monitor.readers import HostMemoryReader

CHANNELS_LAST = torch.channels_last_3d

#: (name, batch, input channels, output channels, input's D x H x W, kernel, stride, transposed,
#: input in channels-last)
CASES: list[tuple[str, int, int, int, tuple[int, int, int], int, int, bool, bool]] = [
    ("3x3x3 16->16, NCDHW input", 3, 16, 16, (16, 48, 48), 3, 1, False, False),
    ("3x3x3 16->16, channels-last input", 3, 16, 16, (16, 48, 48), 3, 1, False, True),
    ("3x3x3 32->16 (a decoder's concatenation)", 3, 32, 16, (16, 48, 48), 3, 1, False, False),
    ("3x3x3 1->16 (a single-channel image)", 3, 1, 16, (16, 48, 48), 3, 1, False, False),
    ("3x3x3 8->8, batch 2 of 32x64x64", 2, 8, 8, (32, 64, 64), 3, 1, False, False),
    ("3x3x3 16->16, batch 1 of 32x64x64", 1, 16, 16, (32, 64, 64), 3, 1, False, False),
    ("3x3x3 32->32 at 8x24x24", 3, 32, 32, (8, 24, 24), 3, 1, False, False),
    ("3x3x3 64->64 at 4x6x6 (split over threads)", 3, 64, 64, (4, 6, 6), 3, 1, False, False),
    ("3x3x3 5->5, batch 2 of 16x32x32", 2, 5, 5, (16, 32, 32), 3, 1, False, False),
    ("3x3x3 stride 2, 16->32", 3, 16, 32, (16, 48, 48), 3, 2, False, False),
    ("1x1x1 16->5 (a head)", 3, 16, 5, (16, 48, 48), 1, 1, False, False),
    ("2x2x2 stride 2, 16->32", 2, 16, 32, (16, 48, 48), 2, 2, False, False),
    ("transposed 2x2x2 stride 2, 32->16", 3, 32, 16, (8, 24, 24), 2, 2, True, False),
]


def _returned_bytes(value: object) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (tuple, list)):
        return sum(_returned_bytes(v) for v in value)
    return 0


def calls(case: tuple, dtype: torch.dtype) -> dict[str, Callable[[], object]]:
    """A case's forward (no grad) and backward (the input's gradient where it has more than one
    channel, and the weight's), their tensors made here, outside the calls."""
    _, batch, c_in, c_out, size, kernel, stride, transposed, input_last = case
    padding = kernel // 2 if stride == 1 else 0
    layer = (nn.ConvTranspose3d if transposed else nn.Conv3d)(c_in, c_out, kernel, stride, padding)
    layer = layer.to(dtype).to(memory_format=CHANNELS_LAST)
    image = torch.randn(batch, c_in, *size, dtype=dtype)
    if input_last:
        image = image.contiguous(memory_format=CHANNELS_LAST)
    image.requires_grad_(c_in > 1)
    out = layer(image)
    grad = torch.randn_like(out).contiguous(
        memory_format=CHANNELS_LAST if input_last else torch.contiguous_format
    )
    wrt = [image, layer.weight] if c_in > 1 else [layer.weight]

    def forward() -> torch.Tensor:
        with torch.no_grad():
            return layer(image)

    def backward() -> tuple[torch.Tensor, ...]:
        return torch.autograd.grad(out, wrt, grad, retain_graph=True)

    return {"forward": forward, "backward": backward}


def layout_copies(dtype: torch.dtype) -> dict[str, Callable[[], object]]:
    """The other ops of a channels-last network that copy an operand: (log-)softmax of its
    channels-last logits (a batch of 3, 13 classes of 24x48x48) and a 2x2x2 max pooling's
    backward of a channels-last gradient into NCDHW maps (16 of 24x48x48, as after an
    instance norm)."""
    logits = torch.randn(3, 13, 24, 48, 48, dtype=dtype).contiguous(memory_format=CHANNELS_LAST)
    maps = torch.randn(3, 16, 24, 48, 48, dtype=dtype)
    pooled, indices = torch.ops.aten.max_pool3d_with_indices(maps, [2, 2, 2], [2, 2, 2])
    grad = torch.randn_like(pooled).contiguous(memory_format=CHANNELS_LAST)
    return {
        "log-softmax of channels-last logits": lambda: torch.log_softmax(logits, 1),
        "max pooling's backward, channels-last gradient into NCDHW maps": lambda: (
            torch.ops.aten.max_pool3d_with_indices_backward(
                grad, maps, [2, 2, 2], [2, 2, 2], [0, 0, 0], [1, 1, 1], False, indices
            )
        ),
    }


def measure(name: str, fn: Callable[[], object], reader: HostMemoryReader) -> dict:
    fn()  # warm-up: first-call caches and lazily created state
    returned = _returned_bytes(fn())
    resident = resident_peak(fn, reader)
    predicted = largest_per_call(cpu_workspace, fn)
    row = {
        "case": name,
        "resident_peak_bytes": resident,
        "returned_bytes": returned,
        "beyond_outputs_bytes": resident - returned,
        "predicted_workspace_bytes": predicted,
    }
    print(
        f"{name:60s} beyond outputs {(resident - returned) / 2**20:7.2f} MiB"
        f"  predicted {predicted / 2**20:7.2f}"
    )
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    results_io.add_json_out(parser, "cpu_channels_last_memory")
    args = parser.parse_args(argv)
    reader = op_memory_reader(args.threads)
    if reader is None:
        return 2
    print(cpu_description(), f"ATen kernels: {torch.backends.cpu.get_cpu_capability()}")
    dtype = getattr(torch, args.dtype)
    rows = []
    for case in CASES:
        for direction, fn in calls(case, dtype).items():
            rows.append(measure(f"{case[0]}, {direction}", fn, reader))
    rows += [measure(name, fn, reader) for name, fn in layout_copies(dtype).items()]
    doc = results_io.result(
        "cpu_channels_last_memory",
        rows,
        script=__file__,
        argv=argv,
        threads=args.threads,
        dtype=args.dtype,
        malloc=f"MALLOC_MMAP_THRESHOLD_={MMAP_THRESHOLD} (mallopt)",
    )
    results_io.write(doc, args.json_out)
    return 0
