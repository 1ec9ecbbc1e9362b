"""What the archived op-by-op memory studies (``cpu_bf16_memory``, ``cpu_channels_last_memory``)
share: one process's resident peak of a call, with every large allocation mmap-ed."""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

from volseg.memory.monitor.readers import HostMemoryReader

#: ``MALLOC_MMAP_THRESHOLD_`` (bytes) of the op-by-op memory studies: every allocation of 64 KiB
#: or more is mmap-ed and goes back to the system when freed
MMAP_THRESHOLD = 65536


def op_memory_reader(threads: int) -> HostMemoryReader | None:
    """The op-by-op memory studies' setting: ``threads`` torch threads, every allocation of
    :data:`MMAP_THRESHOLD` or more mmap-ed (``mallopt``); the process's memory reader, or
    ``None`` (said in one line) where glibc's ``mallopt`` or ``/proc`` is missing."""
    import torch

    from volseg.memory.monitor.readers import set_mmap_threshold

    torch.set_num_threads(threads)
    if not set_mmap_threshold(MMAP_THRESHOLD) or not HostMemoryReader.available():
        print("error: needs glibc's mallopt and /proc (Linux)")
        return None
    return HostMemoryReader()


def largest_per_call(count: Callable[[Any, tuple, Any], int], fn: Callable[[], object]) -> int:
    """The largest ``count(func, args, out)`` over the aten calls ``fn`` makes (an estimator
    rule asked of each op of a measured call, with the real tensors)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Largest(TorchDispatchMode):
        largest = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
            out = func(*args, **(kwargs or {}))
            self.largest = max(self.largest, count(func, args, out))
            return out

    mode = Largest()
    with mode:
        fn()
    return mode.largest


def resident_peak(fn: Callable[[], object], reader: HostMemoryReader) -> int:
    """Peak rise of the process's resident memory while ``fn`` runs (bytes)."""
    gc.collect()
    start = reader.read().allocated
    reader.reset_peak()
    fn()
    return reader.read().peak_allocated - start
