"""The CPU in front of us: its model, ISA flags, and whether it runs bf16 natively."""

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


def _onednn_max_isa() -> str:
    """``ONEDNN_MAX_CPU_ISA`` upper-cased (``ALL``, oneDNN's default, when unset)."""
    return os.environ.get("ONEDNN_MAX_CPU_ISA", "ALL").upper()


def onednn_uses_amx() -> bool:
    """Whether oneDNN runs bf16 convolutions on AMX."""
    cap = _onednn_max_isa()
    return cpu_flags()["amx_bf16"] and ("ALL" in cap or "AMX" in cap)


def cpu_bf16_native() -> bool:
    """Whether this CPU runs bfloat16 convolutions natively: oneDNN has bf16 kernels and the CPU
    their instructions (AVX512_BF16 or AMX on x86; Arm's BF16). Without them oneDNN converts in
    software (``python -m benchmarks cpu_precision``); ``ONEDNN_MAX_CPU_ISA=AVX2`` behaves as a CPU
    without AVX-512."""
    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    if check is not None and not check():
        return False
    if platform.machine().lower() in ("aarch64", "arm64"):
        return check is not None  # oneDNN's answer is the Arm BF16 extension itself
    # a cap such as AVX2 or AVX512_CORE_VNNI keeps oneDNN off its bf16 instructions
    if not any(word in _onednn_max_isa() for word in ("ALL", "BF16", "AMX", "AVX10", "FP16")):
        return False
    flags = cpu_flags()
    return flags["avx512_bf16"] or flags["amx_bf16"]


def cpu_description() -> str:
    """One line for logs and benchmark tables: model, cores, ISA flags, bf16 native or not."""
    flags = " ".join(f"{k}={'yes' if v else 'no'}" for k, v in cpu_flags().items())
    capped = os.environ.get("ONEDNN_MAX_CPU_ISA")
    cap = f", oneDNN capped at {capped}" if capped else ""
    native = "native" if cpu_bf16_native() else "emulated"
    return f"{cpu_model()} ({os.cpu_count()} cores; {flags}; bf16 {native}{cap})"


#: ISA flag -> the kind of CPU it makes, first match (a CPU with none of them and AVX2: ``AVX2``)
CPU_KINDS = (("amx_bf16", "AMX"), ("avx512_bf16", "AVX512_BF16"), ("avx512f", "AVX-512"))


def kind_of(
    flags: dict[str, bool] | None,
    onednn_max_cpu_isa: str | None = None,
    aten_cpu_capability: str | None = None,
) -> str:
    """A CPU's kind by its instructions (``AMX``, ``AVX512_BF16``, ``AVX-512``, ``AVX2``,
    ``other``), with the ISA its kernels were held to (other kernels, other memory)."""
    flags = flags or {}
    kind = next(
        (name for flag, name in CPU_KINDS if flags.get(flag)),
        "AVX2" if flags.get("avx2") else "other",
    )
    if onednn_max_cpu_isa:
        kind += f", held to {onednn_max_cpu_isa}"
    if aten_cpu_capability:
        kind += f", ATen held to {aten_cpu_capability}"
    return kind


def cpu_kind() -> str:
    """:func:`kind_of` this CPU, as the CPU margins name it."""
    return kind_of(
        cpu_flags(),
        os.environ.get("ONEDNN_MAX_CPU_ISA") or None,
        os.environ.get("ATEN_CPU_CAPABILITY") or None,
    )
