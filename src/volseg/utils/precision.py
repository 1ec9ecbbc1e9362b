"""``trainer.precision``: ``auto`` and the CPU rules (Lightning runs ``16-mixed`` as bf16 autocast
on a CPU, emulated without AVX512_BF16/AMX), resolved once, the reason logged."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from volseg.utils.cpu import cpu_bf16_native

log = logging.getLogger(__name__)

#: the default network's training step, bf16 autocast against float32 with oneDNN held to its AVX2
#: kernels, rounded: the range of ``python -m benchmarks cpu_precision``'s results files
EMULATED_BF16_STEP_SLOWDOWN = (60, 65)
EMULATED_BF16_SLOWDOWN = (
    f"{EMULATED_BF16_STEP_SLOWDOWN[0]}x to {EMULATED_BF16_STEP_SLOWDOWN[1]}x slower per training "
    "step than float32 with AVX2 kernels"
)

BF16 = ("bf16-mixed", "bf16-true", "bf16")
FP16_MIXED = ("16-mixed", "16")
#: every precision whose convolutions run in 16 bits (bfloat16 or float16)
HALF = (*BF16, *FP16_MIXED, "16-true")


@dataclass(frozen=True)
class PrecisionChoice:
    """What ``trainer.precision`` asked for, what runs, on which device kind, and why."""

    requested: str
    precision: str
    device: str
    reason: str


def cuda_bf16_supported() -> bool:
    """Whether the CUDA device runs bfloat16 (Ampere or newer)."""
    return torch.cuda.is_available() and torch.cuda.is_bf16_supported()


def resolve_precision(
    requested: Any, device: str, bf16_native: bool | None = None, cuda_bf16: bool | None = None
) -> PrecisionChoice:
    """The precision that runs for ``requested`` on ``device``: ``auto`` is ``bf16-mixed`` on a GPU
    with bfloat16 (else ``16-mixed``) and on a CPU with native bf16 (else ``32``); on a CPU
    ``16-mixed`` runs as ``bf16-mixed`` or ``32`` likewise. ``bf16_native``/``cuda_bf16``: default
    this machine's."""
    asked = str(requested)
    runs, why = asked, "as configured"
    if device == "cuda":
        if asked == "auto" and (cuda_bf16_supported() if cuda_bf16 is None else cuda_bf16):
            runs, why = "bf16-mixed", "the GPU supports bfloat16"
        elif asked == "auto":
            runs, why = "16-mixed", "the GPU has no bfloat16 (older than Ampere): float16 AMP"
        return PrecisionChoice(asked, runs, device, why)
    native = cpu_bf16_native() if bf16_native is None else bf16_native
    if asked == "auto" and native:
        runs, why = "bf16-mixed", "this CPU runs bf16 natively (AVX512_BF16/AMX)"
    elif asked == "auto":
        runs, why = "32", "no native bf16 on this CPU (no AVX512_BF16/AMX): float32"
    elif asked in FP16_MIXED and native:
        runs, why = "bf16-mixed", "fp16 autocast needs CUDA; bf16 is native here"
    elif asked in FP16_MIXED:
        runs = "32"
        why = (
            "fp16 autocast needs CUDA and this CPU has no native bf16 (bf16 autocast measured "
            f"{EMULATED_BF16_SLOWDOWN}): float32"
        )
    elif asked in BF16 and not native:
        why = (
            "as configured, but this CPU has no native bf16 (no AVX512_BF16/AMX): measured "
            f"{EMULATED_BF16_SLOWDOWN} (trainer.precision=auto picks 32)"
        )
    return PrecisionChoice(asked, runs, device, why)


def log_choice(choice: PrecisionChoice) -> None:
    """One log line: what runs and why; a warning where an explicit value will run slowly."""
    line = (
        f"trainer.precision={choice.requested} runs as {choice.precision} on "
        f"{choice.device}: {choice.reason}"
    )
    slow = choice.requested in BF16 and "no native bf16" in choice.reason
    log.log(logging.WARNING if slow else logging.INFO, line)
