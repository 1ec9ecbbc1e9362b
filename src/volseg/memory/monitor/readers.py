"""Reading memory counters in bytes: the CUDA caching allocator's, or on a CPU the process's
resident memory (``allocated`` and ``reserved`` alike).
"""

from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass
from pathlib import Path

import torch

_M_MMAP_THRESHOLD = -3  # glibc mallopt parameter


@dataclass(frozen=True)
class MemoryReading:
    """One reading, in bytes."""

    allocated: int
    reserved: int
    peak_allocated: int
    peak_reserved: int
    alloc_retries: int = 0
    ooms: int = 0


class CudaMemoryReader:
    """``torch.cuda`` allocator statistics of one device."""

    kind = "cuda"

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def read(self) -> MemoryReading:
        stats = torch.cuda.memory_stats(self.device)
        return MemoryReading(
            allocated=torch.cuda.memory_allocated(self.device),
            reserved=torch.cuda.memory_reserved(self.device),
            peak_allocated=torch.cuda.max_memory_allocated(self.device),
            peak_reserved=torch.cuda.max_memory_reserved(self.device),
            alloc_retries=int(stats.get("num_alloc_retries", 0)),
            ooms=int(stats.get("num_ooms", 0)),
        )

    def reset_peak(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)


def _status_bytes(*fields: str) -> dict[str, int]:
    """Fields of /proc/self/status (reported in kB), in bytes, from one read of the file."""
    text = Path("/proc/self/status").read_text()
    found = {name: re.search(rf"^{name}:\s+(\d+) kB", text, re.M) for name in fields}
    return {name: int(m.group(1)) * 1024 if m else 0 for name, m in found.items()}


def set_mmap_threshold(threshold_bytes: int) -> bool:
    """Make glibc serve allocations above ``threshold_bytes`` with mmap, so that resident memory
    follows tensor allocations; whether it took effect."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, int(threshold_bytes)))
    except OSError:
        return False


class HostMemoryReader:
    """The process's resident memory from /proc (Linux): VmRSS, and VmHWM for the peak (reset
    by writing ``5`` to ``/proc/self/clear_refs``); ``reserved`` equals ``allocated``."""

    kind = "host"

    def __init__(self) -> None:
        self._can_reset = Path("/proc/self/clear_refs").exists()
        self._peak_floor = 0  # where clear_refs is missing, peaks are tracked from readings

    @staticmethod
    def available() -> bool:
        return Path("/proc/self/status").exists()

    def read(self) -> MemoryReading:
        status = _status_bytes("VmRSS", "VmHWM")
        rss = status["VmRSS"]
        peak = status["VmHWM"] if self._can_reset else max(self._peak_floor, rss)
        self._peak_floor = max(self._peak_floor, rss)
        return MemoryReading(allocated=rss, reserved=rss, peak_allocated=peak, peak_reserved=peak)

    def reset_peak(self) -> None:
        if self._can_reset:
            try:
                Path("/proc/self/clear_refs").write_text("5")
                return
            except OSError:
                self._can_reset = False
        self._peak_floor = _status_bytes("VmRSS")["VmRSS"]


def make_reader(device: torch.device) -> CudaMemoryReader | HostMemoryReader | None:
    """The reader for a training device, or ``None`` where nothing can be read."""
    if device.type == "cuda":
        return CudaMemoryReader(device)
    if HostMemoryReader.available():
        return HostMemoryReader()
    return None
