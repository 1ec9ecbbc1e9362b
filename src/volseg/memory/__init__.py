"""Everything about bytes, in three rooms:

- :mod:`~volseg.memory.estimate`: what a run needs. One build and one fake-tensor trace of a
  planned run give one ledger of allocations and frees (``events``); every figure is read off
  it: peak by category and per module, the allocator's reserved bytes, FLOPs, validation.
  Public call: :func:`~volseg.memory.estimate.estimate_run` of a :class:`Candidate`.
- :mod:`~volseg.memory.fit`: the largest run that fits a budget. One search
  (``fit.search``) serves the step's planner and the validation planner.
  Public call: :func:`~volseg.memory.fit.fit_step`.
- :mod:`~volseg.memory.monitor`: what a training run measures (allocated, reserved, peaks,
  per layer, snapshots, the OOM report, charts). Public call:
  :class:`~volseg.memory.monitor.MemoryMonitor`.

Imports point one way inside: monitor and fit read estimate; estimate reads neither. The levers
that cut memory are applied by the model: :mod:`volseg.models.levers`. Outside memory/, code
imports these names from here or from a room's ``__init__``, never a room's modules.
"""

from volseg.memory.estimate import *  # noqa: F403
from volseg.memory.estimate import __all__ as _estimate
from volseg.memory.fit import *  # noqa: F403
from volseg.memory.fit import __all__ as _fit
from volseg.memory.monitor import MemoryMonitor

__all__ = [*_estimate, *_fit, "MemoryMonitor"]
