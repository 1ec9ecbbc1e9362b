"""The CUDA context: device memory a process holds outside PyTorch's caching allocator (the
driver's context, kernels, cuBLAS/cuDNN handles). ``memory.cuda_context_mib``: a number of MiB,
or ``auto``: measured on a GPU, else :data:`MEASURED` by ``memory.gpu``, else
:data:`TYPICAL_MIB`.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass

import torch

from volseg.utils.errors import UserInputError
from volseg.utils.units import MIB

#: the context right after it is created, as ``auto`` measures it (the ``cuda_context_mib`` of
#: benchmarks/results/cuda/2026-11-30_nvidia-h200.json); kernels loaded later add more
MEASURED: dict[str, float] = {"H200": 610.0}
#: a recent GPU with lazy module loading, where no measurement is known (not measured)
TYPICAL_MIB = 500.0


@dataclass(frozen=True)
class CudaContext:
    """The context's size in bytes and where the figure came from."""

    nbytes: int
    source: str


def nvidia_smi(query: str) -> list[str]:
    """``nvidia-smi --query-<query>`` as CSV lines without header or units (``[]``: no GPU)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-{query}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def _smi_used_mib() -> float | None:
    """This process's memory on its GPUs as ``nvidia-smi`` reports it (MiB), or ``None``."""
    for line in nvidia_smi("compute-apps=pid,used_memory"):
        pid, _, used = line.partition(",")
        if pid.strip() == str(os.getpid()) and used.strip().isdigit():
            return float(used)
    return None


def _measured_here() -> float | None:
    """MiB of this process's context on the current GPU (NVML, else nvidia-smi), or ``None``."""
    torch.ones(1, device="cuda")  # creates the context
    torch.cuda.synchronize()
    try:
        import pynvml  # noqa: PLC0415  (optional: only where a GPU is present)
    except ImportError:
        used_mib = _smi_used_mib()
        return None if used_mib is None else used_mib - torch.cuda.memory_reserved() / MIB
    try:
        pynvml.nvmlInit()
        index = torch.cuda.current_device()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        used = [
            p.usedGpuMemory
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
            if p.pid == os.getpid() and p.usedGpuMemory
        ]
    except pynvml.NVMLError:
        return None
    return (used[0] - torch.cuda.memory_reserved()) / MIB if used else None


def resolve_cuda_context(value: object, gpu: object = None) -> CudaContext:
    """``memory.cuda_context_mib`` (a number or ``auto``) with ``memory.gpu`` as bytes."""
    if value is None or str(value) == "auto":
        if torch.cuda.is_available():
            measured = _measured_here()
            if measured is not None:
                return CudaContext(int(measured * MIB), "measured on this GPU")
            gpu = gpu or torch.cuda.get_device_name()
        for name, mib in MEASURED.items():
            if gpu is not None and name.lower() in str(gpu).lower():
                return CudaContext(int(mib * MIB), f"measured on an {name}")
        return CudaContext(int(TYPICAL_MIB * MIB), "typical, not measured for this GPU")
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise UserInputError(
            f"memory.cuda_context_mib={value}: must be auto or a number of MiB, 0 or more"
        )
    return CudaContext(int(float(value) * MIB), "memory.cuda_context_mib")
