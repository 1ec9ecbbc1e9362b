"""The planner's margin on CUDA: how far the estimate has fallen short of recorded GPU runs.

``benchmarks/results/cuda/*.json`` keeps real runs; ``tests/memory/test_recorded_cuda.py``
estimates each and checks that the margin below covers its measured peak reserved. Until the
estimate is within its bounds everywhere, the planner plans with ``reserved x (1 + margin)``: the
largest ratio of measured to estimated peak reserved among the recorded runs that use the same
kind of lever, named here with the run it came from.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Margin:
    """``fraction`` added to the estimated peak reserved; ``source``: the run it came from."""

    fraction: float
    source: str


#: NVIDIA H200, 2026-11-30 (benchmarks/results/cuda/2026-11-30_nvidia-h200.json), against the
#: estimate of 2026-12-01 (each run estimated with its own loop's ``estimate.zero_grad``):
#: measured / estimated peak reserved, the largest per kind of step
OFFLOAD = Margin(
    0.57, "levers: micro-batch 1 + offload (reserved 4,306 MiB measured, 2,748 estimated)"
)
ACCUMULATION = Margin(
    0.47, "levers: micro-batch 1 (x2 accumulation) (reserved 5,420 MiB measured, 3,692 estimated)"
)
OTHER = Margin(
    0.29,
    "estimator step: depth 3 [8,16,32] fp32 b4 16x64x64 (reserved 268 MiB measured, 208 estimated)",
)


def cuda_margin(offload: object, accumulate_grad_batches: int) -> Margin:
    """The margin for a step with activation offload set or not and that many micro-batches."""
    if offload:
        return OFFLOAD
    if accumulate_grad_batches > 1:
        return ACCUMULATION
    return OTHER
