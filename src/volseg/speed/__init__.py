"""Everything about seconds: a training step's predicted time on its device, from the ops one
trace of it dispatches (:mod:`volseg.memory.estimate` records them) and that device's costs,
measured on it. The lever table's time factors are its public answer:
:func:`~volseg.speed.step_time.measure_speed` and :meth:`~volseg.speed.step_time.StepWork.seconds`.
"""
