"""Memory readers: the CUDA path against a stand-in allocator, the host path against /proc."""

from __future__ import annotations

import subprocess
import sys

import torch

from volseg.memory.monitor.readers import CudaMemoryReader, make_reader
from volseg.utils.units import MIB


class _FakeAllocator:
    """Counters as torch.cuda reports them; reset_peak_memory_stats lowers the peaks to now."""

    def __init__(self) -> None:
        self.allocated, self.reserved = 100 * MIB, 160 * MIB
        self.peak_allocated, self.peak_reserved = 300 * MIB, 320 * MIB

    def install(self, monkeypatch) -> None:
        cuda = torch.cuda
        monkeypatch.setattr(cuda, "memory_allocated", lambda device=None: self.allocated)
        monkeypatch.setattr(cuda, "memory_reserved", lambda device=None: self.reserved)
        monkeypatch.setattr(cuda, "max_memory_allocated", lambda device=None: self.peak_allocated)
        monkeypatch.setattr(cuda, "max_memory_reserved", lambda device=None: self.peak_reserved)
        monkeypatch.setattr(
            cuda, "memory_stats", lambda device=None: {"num_alloc_retries": 3, "num_ooms": 1}
        )
        monkeypatch.setattr(cuda, "reset_peak_memory_stats", self.reset)

    def reset(self, device=None) -> None:
        self.peak_allocated, self.peak_reserved = self.allocated, self.reserved


def test_cuda_reader_maps_the_allocator_counters(monkeypatch):
    fake = _FakeAllocator()
    fake.install(monkeypatch)
    reader = make_reader(torch.device("cuda", 0))
    assert isinstance(reader, CudaMemoryReader)
    reading = reader.read()
    assert (reading.allocated, reading.reserved) == (100 * MIB, 160 * MIB)
    assert (reading.peak_allocated, reading.peak_reserved) == (300 * MIB, 320 * MIB)
    assert (reading.alloc_retries, reading.ooms) == (3, 1)
    reader.reset_peak()
    assert reader.read().peak_allocated == 100 * MIB


_HOST_CHECK = """
import torch
from volseg.memory.monitor.readers import HostMemoryReader, make_reader
from volseg.utils.units import MIB
reader = make_reader(torch.device("cpu"))
assert isinstance(reader, HostMemoryReader)
reader.reset_peak()
before = reader.read()
block = torch.ones(64 * MIB // 4)  # 64 MiB, touched
during = reader.read()
assert during.allocated - before.allocated > 60 * MIB, (before, during)
del block
reader.reset_peak()
after = reader.read()
assert after.peak_allocated < during.peak_allocated, (during, after)  # the peak was reset
assert after.reserved == after.allocated
print("ok")
"""


def test_host_reader_follows_a_large_allocation_and_resets_its_peak():
    # a fresh process: in a long test process, freed memory may be reused without new pages
    result = subprocess.run([sys.executable, "-c", _HOST_CHECK], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
