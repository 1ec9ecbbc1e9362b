"""What a run needs: :func:`estimate_run` traces a planned run, as one :class:`Candidate` changes
it, once under fake tensors and answers its training step (peak by category, per module,
reserved, FLOPs) and its validation; :func:`estimate_prediction` answers ``predict.py``.
"""

from volseg.memory.estimate.candidate import Candidate
from volseg.memory.estimate.cuda_context import resolve_cuda_context
from volseg.memory.estimate.engine import RunEstimate, estimate_run
from volseg.memory.estimate.inference_pass import (
    InferenceEstimate,
    estimate_prediction,
    validation_shape,
)
from volseg.memory.estimate.margins import planned_total
from volseg.memory.estimate.training_step import MemoryEstimate, planned_device

__all__ = [
    "Candidate",
    "InferenceEstimate",
    "MemoryEstimate",
    "RunEstimate",
    "estimate_prediction",
    "estimate_run",
    "planned_device",
    "planned_total",
    "resolve_cuda_context",
    "validation_shape",
]
