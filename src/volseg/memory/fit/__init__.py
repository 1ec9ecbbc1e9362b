"""The largest run that fits a budget: :func:`fit_step` the training step's, ``inference``
validation's and prediction's, both through the searches in ``search``; ``levers`` prices each
lever. Every candidate is answered by :mod:`volseg.memory.estimate`."""

from volseg.memory.fit.step import fit_step

__all__ = ["fit_step"]
