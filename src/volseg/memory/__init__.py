"""Everything about bytes: measured (monitor), estimated (estimator), planned (planner).

- ``monitor``: the ``MemoryMonitor`` callback: per-step allocated/reserved/peaks, per-layer trace,
  snapshots, the OOM report (``oom_report``) and the charts (``charts``, ``chart_logging``).
- ``readers``: allocator counters of a CUDA device or of the host process.
- ``events``: the ledger, a traced step's allocations and frees in order and the sums read off
  them; ``trackers`` (the one module on torch's private ``MemTracker`` API) records them,
  ``layers`` is the per-module view.
- ``engine``: ``estimate_run(plan, variant)``: one build and one fake-tensor trace of a planned
  run answer its step's memory, FLOPs and validation.
- ``estimator``: a training step's memory from fake tensors, before it runs; ``allocator``
  (CUDA's caching allocator replayed), ``autocast`` (CUDA's autocast rules), ``workspace``
  (oneDNN's scratch memory) model the device.
- ``planner``: the largest batch or patch that fits a budget; ``budget``: ``memory.budget``.

The levers that cut memory are applied by the model: :mod:`volseg.models.levers`.
"""

__all__ = [
    "allocator",
    "autocast",
    "budget",
    "chart_logging",
    "charts",
    "estimator",
    "events",
    "layers",
    "monitor",
    "oom_report",
    "planner",
    "readers",
    "trackers",
    "workspace",
]
