"""What a run needs: :func:`~volseg.memory.estimate.engine.estimate_run` traces a planned run, as
one :class:`~volseg.memory.estimate.candidate.Candidate` changes it, once under fake tensors and
answers its training step (peak by category, per module, reserved, FLOPs) and its validation;
``inference_pass.estimate_prediction`` answers ``predict.py``. Outside memory/, these names come
from :mod:`volseg.memory`.
"""
