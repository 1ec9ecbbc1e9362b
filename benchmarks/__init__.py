"""volseg's benchmarks: scripts that measure, each run by name from the repository's root.

    python -m benchmarks --list            # the maintained benchmarks, the studies, the tools
    python -m benchmarks <name> [args]     # e.g. python -m benchmarks estimator_accuracy --help

Maintained benchmarks guard a figure the product states (loader, overheads, estimator accuracy,
levers, validation memory, GPU checks); :mod:`benchmarks.studies` keeps finished one-off
studies. Each writes its raw output through :mod:`benchmarks.results_io` into
``benchmarks/results/``, and :mod:`benchmarks.tables` builds docs' tables from those files.
Nothing here is imported at package import: a benchmark's own imports happen when it runs.
"""
