"""volseg's benchmarks: a suite of small functions, each writing a results file, run by name.

    python -m benchmarks --list            # the maintained benchmarks, the archived studies, tools
    python -m benchmarks <name> [args]     # e.g. python -m benchmarks estimator_accuracy --help

Maintained benchmarks guard a figure the product states and are rerun when it may change (the
estimator against real runs, the GPU runs, the margins); :mod:`benchmarks.archive` keeps the
finished studies, unmaintained, so that the command each of their results files records still
runs. Every benchmark writes through :mod:`benchmarks.results_io` (machine, versions, command and
the code: commit, dirty flag, source hash) into ``benchmarks/results/``; :mod:`benchmarks.tables`
is the one writer of docs' tables; :mod:`benchmarks.restamp` keeps cited estimates current.
Nothing here is imported at package import: a benchmark's own imports happen when it runs.
"""
