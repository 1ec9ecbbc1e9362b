"""What a run needs: :func:`estimate_run` traces a planned run once under fake tensors and
answers its training step (peak by category, per module, reserved, FLOPs) and its validation.

``step`` builds and traces a training step, ``inference`` a validation or prediction;
``events`` is the ledger they record and every figure is read from; ``allocator``,
``autocast``, ``workspace`` and ``cuda_context`` model the device; ``margins`` adds the
planning margin (CPU, CUDA and validation alike); ``torch_private`` holds the one use of torch's
private ``MemTracker`` and fake-tensor APIs.
"""

from volseg.memory.estimate.engine import estimate_run

__all__ = ["estimate_run"]
