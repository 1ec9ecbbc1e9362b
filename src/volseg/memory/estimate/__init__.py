"""What a run needs: :func:`estimate_run` traces a planned run once under fake tensors and
answers its training step (peak by category, per module, reserved, FLOPs) and its validation.
"""

from volseg.memory.estimate.engine import estimate_run

__all__ = ["estimate_run"]
