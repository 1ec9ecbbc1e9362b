"""The largest run that fits a budget, each answer a
:class:`~volseg.memory.estimate.candidate.Candidate`: ``step_fit.fit_step`` the training step's,
``step_fit.largest_batch`` ``data.batch_size=auto``'s, ``inference_fit.fit_validation``
validation's and ``inference_fit.plan_stitching`` prediction's, through the searches in
``search``; ``lever_prices`` prices each lever. Every candidate is answered by
:mod:`volseg.memory.estimate`. Outside memory/, these names come from :mod:`volseg.memory`."""
