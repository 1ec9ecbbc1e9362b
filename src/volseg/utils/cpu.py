"""The CPU in front of us: its model, ISA flags, and whether oneDNN runs bf16 natively."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import torch

#: ISA flags (``/proc/cpuinfo`` names) that decide how fast bf16 and fp32 kernels run
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def _cpuinfo() -> dict[str, str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    info: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        info.setdefault(key.strip(), value.strip())
    return info


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), or the platform's processor string."""
    return _cpuinfo().get("model name") or platform.processor() or "unknown CPU"


def cpu_flags() -> dict[str, bool]:
    """``{flag: present}`` for :data:`ISA_FLAGS`."""
    flags = set(_cpuinfo().get("flags", "").split())
    return {flag: flag in flags for flag in ISA_FLAGS}


def onednn_bf16_native() -> bool:
    """Whether oneDNN has bfloat16 kernels for this CPU (AVX-512 core or newer, AMX, Arm bf16).

    Without them (e.g. an AVX2-only CPU) bf16 convolutions fall back to emulation: a Conv3d
    forward+backward took 14-15x as long as in float32 (``benchmarks/cpu_precision.py``).
    ``ONEDNN_MAX_CPU_ISA=AVX2`` makes oneDNN (and this check) behave as on such a CPU.
    """
    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    if check is not None:
        return bool(check())
    return torch.backends.cpu.get_cpu_capability().startswith("AVX512")


def cpu_description() -> str:
    """One line for logs and benchmark tables: model, cores, ISA flags, oneDNN's bf16 answer."""
    flags = " ".join(f"{k}={'yes' if v else 'no'}" for k, v in cpu_flags().items())
    capped = os.environ.get("ONEDNN_MAX_CPU_ISA")
    cap = f", oneDNN capped at {capped}" if capped else ""
    native = "native" if onednn_bf16_native() else "emulated"
    return f"{cpu_model()} ({os.cpu_count()} cores; {flags}; oneDNN bf16 {native}{cap})"
