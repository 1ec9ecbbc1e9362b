"""Finished one-off studies: each keeps its script (``python -m benchmarks <name>``) and its
results files where they were written (``benchmarks/results/``), out of the maintained path.
What two studies share lives in :mod:`benchmarks.studies.mni152_runs` and
:mod:`benchmarks.studies.nnunet_raw`."""
