"""Where a bfloat16 step holds memory that torch's allocator does not see, op by op, on this CPU.

For each case (a matrix product in each orientation, a batched product, a linear layer's
backward, native 3D convolutions' backward and transposed convolutions' forward and backward),
the op runs once to warm up, then once with the process's peak resident memory reset
(``MALLOC_MMAP_THRESHOLD_=65536``, set here with ``mallopt``, so that freed buffers go back to
the system), then once under ``torch.profiler`` (``profile_memory``), whose allocation events
give the peak of torch's own allocator. ``beyond_allocator`` is the first minus the second: what
the op's kernels took with ``malloc``. ``predicted_gemm_buffer`` is the estimator's count of
that memory (:func:`volseg.memory.estimate.workspace.gemm_float32_buffer`, the largest over the
op's aten
calls, asked of the same tensors); ``allocator_peak + predicted_gemm_buffer`` is what the
estimate holds for the op beyond what is live before it.

Without oneDNN's bf16 kernels (``torch.ops.mkldnn._is_mkldnn_bf16_supported()`` false: AVX2-only
CPUs, or ``ONEDNN_MAX_CPU_ISA=AVX2``), torch's own GEMM runs these ops; with them, none of these
buffers is taken, and the rows say so (``gemm_on_onednn``).

    python -m benchmarks cpu_bf16_memory
    ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 python -m benchmarks cpu_bf16_memory

The rows go to ``benchmarks/results/cpu/<date>_cpu_bf16_memory.json`` (``--json-out``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

from benchmarks import results_io
from benchmarks.archive.op_memory import (
    MMAP_THRESHOLD,
    largest_per_call,
    op_memory_reader,
    resident_peak,
)
from benchmarks.results_io import cpu_description
from volseg.memory.estimate.workspace import gemm_float32_buffer
from volseg.memory.monitor.readers import HostMemoryReader

BF16 = torch.bfloat16


def allocator_peak(fn: Callable[[], object]) -> int:
    """Peak bytes live in torch's CPU allocator while ``fn`` runs, beyond what was live before
    (from the profiler's allocation events, in time order)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = prof.profiler.kineto_results.events()
    cpu = torch.autograd.DeviceType.CPU
    allocations = sorted(
        (e for e in events if e.name() == "[memory]" and e.device_type() == cpu),
        key=lambda e: e.start_ns(),
    )
    live = peak = 0
    for event in allocations:
        live += event.nbytes()
        peak = max(peak, live)
    return peak


def predicted_buffer(fn: Callable[[], object]) -> int:
    """The estimator's float32 GEMM buffer of each aten call ``fn`` makes, the largest (bytes)."""
    return largest_per_call(gemm_float32_buffer, fn)


def _matrix(rows: int, cols: int, column_major: bool) -> torch.Tensor:
    if column_major:
        return torch.randn(cols, rows, dtype=BF16).t()
    return torch.randn(rows, cols, dtype=BF16)


def cases() -> dict[str, Callable[[], object]]:
    """Each case's name and the call it measures (its tensors made here, outside the call)."""
    out: dict[str, Callable[[], object]] = {}
    m, n = 1024, 4096
    for k in (64, 512):
        for a_t, b_t in ((False, False), (True, False), (False, True), (True, True)):
            a, b = _matrix(m, k, a_t), _matrix(k, n, b_t)
            name = f"mm {m}x{k}{' (column-major)' if a_t else ''} @ {k}x{n}"
            out[name + (" (column-major)" if b_t else "")] = lambda a=a, b=b: a @ b
    xt = torch.randn(16, 512, 1024, dtype=BF16).transpose(1, 2)
    y = torch.randn(16, 512, 1024, dtype=BF16)
    out["bmm 16 x (1024x512 (column-major) @ 512x1024)"] = lambda: torch.bmm(xt, y)
    linear = nn.Linear(512, 1024).to(BF16)
    x = torch.randn(4096, 512, dtype=BF16, requires_grad=True)
    h = linear(x)
    g = torch.ones_like(h)
    out["linear 512->1024 on 4096 rows, backward"] = lambda: torch.autograd.grad(
        h, [x, linear.weight], g, retain_graph=True
    )
    for shape in ((2, 32, 16, 32, 32), (1, 64, 16, 32, 32)):
        image = torch.randn(shape, dtype=BF16, requires_grad=True)
        label = "x".join(map(str, shape))
        for kernel, stride in ((3, 1), (1, 1), (2, 2), (3, 2)):
            conv = nn.Conv3d(shape[1], 32, kernel, stride, kernel // 2 if stride == 1 else 0)
            conv = conv.to(BF16)
            z = conv(image)
            gz = torch.ones_like(z)
            out[f"conv3d k{kernel} s{stride} {label}, backward"] = (
                lambda z=z, gz=gz, image=image, conv=conv: torch.autograd.grad(
                    z, [image, conv.weight], gz, retain_graph=True
                )
            )
        for kernel, stride in ((3, 1), (2, 2)):
            up = nn.ConvTranspose3d(shape[1], 32, kernel, stride, kernel // 2 if stride == 1 else 0)
            up = up.to(BF16)

            def forward(up=up, image=image) -> None:
                with torch.no_grad():
                    up(image)

            out[f"conv_transpose3d k{kernel} s{stride} {label}, forward"] = forward
            z = up(image)
            gz = torch.ones_like(z)
            out[f"conv_transpose3d k{kernel} s{stride} {label}, backward"] = (
                lambda z=z, gz=gz, image=image, up=up: torch.autograd.grad(
                    z, [image, up.weight], gz, retain_graph=True
                )
            )
    return out


def measure(name: str, fn: Callable[[], object], reader: HostMemoryReader) -> dict:
    fn()  # warm-up: first-call caches and lazily created state
    resident = resident_peak(fn, reader)
    allocated = allocator_peak(fn)
    predicted = predicted_buffer(fn)
    row = {
        "case": name,
        "resident_peak_bytes": resident,
        "allocator_peak_bytes": allocated,
        "beyond_allocator_bytes": resident - allocated,
        "predicted_gemm_buffer_bytes": predicted,
        "predicted_peak_bytes": allocated + predicted,
    }
    print(
        f"{name:55s} resident {resident / 2**20:8.2f} MiB  allocator {allocated / 2**20:8.2f}"
        f"  beyond {(resident - allocated) / 2**20:8.2f}  predicted buffer"
        f" {predicted / 2**20:8.2f}"
    )
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    results_io.add_json_out(parser, "cpu_bf16_memory")
    args = parser.parse_args(argv)
    reader = op_memory_reader(args.threads)
    if reader is None:
        return 2
    on_onednn = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    print(cpu_description(), f"bf16 GEMM on oneDNN: {on_onednn}")
    rows = [measure(name, fn, reader) for name, fn in cases().items()]
    doc = results_io.result(
        "cpu_bf16_memory",
        rows,
        script=__file__,
        argv=argv,
        threads=args.threads,
        malloc=f"MALLOC_MMAP_THRESHOLD_={MMAP_THRESHOLD} (mallopt)",
        gemm_on_onednn=on_onednn,
    )
    results_io.write(doc, args.json_out)
    return 0
