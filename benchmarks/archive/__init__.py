"""Archived studies: finished, not maintained, outside the maintained line count. Each made the
results files under ``benchmarks/results/`` whose ``command`` names it (the file also records the
machine, the versions and, from 2026-12-06, the code), and still runs by that command:
``python -m benchmarks <name>``. What two studies share lives in
:mod:`benchmarks.archive.mni152_runs`, :mod:`benchmarks.archive.nnunet_raw` and
:mod:`benchmarks.archive.steps`."""
