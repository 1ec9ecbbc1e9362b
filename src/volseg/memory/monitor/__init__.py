"""What a training run measures: :class:`MemoryMonitor`, the callback that logs allocated and
reserved bytes per step and phase, the per-layer table, snapshots and the OOM report.

``readers`` reads a CUDA device's or the host's counters; ``oom_report`` says what to change
after an out-of-memory; ``charts`` draws the charts.
"""

from volseg.memory.monitor.callback import MemoryMonitor

__all__ = ["MemoryMonitor"]
