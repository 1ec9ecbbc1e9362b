"""What a training run measures: :class:`MemoryMonitor`, the callback that logs allocated and
reserved bytes per step and phase, the per-layer table, snapshots and the OOM report.
"""

from volseg.memory.monitor.callback import MemoryMonitor

__all__ = ["MemoryMonitor"]
