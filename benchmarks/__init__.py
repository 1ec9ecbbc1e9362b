"""volseg's benchmarks: a suite of small functions, each writing a results file, run by name.

    python -m benchmarks --list            # maintained benchmarks, tools, retired studies
    python -m benchmarks <name> [args]     # e.g. python -m benchmarks estimator_accuracy --help

Maintained benchmarks guard a figure the product states and are rerun when it may change (the
estimator against real runs, the GPU runs, the margins). A finished study's script leaves the
tree and its results files stay: :data:`benchmarks.runner.RETIRED` gives the commit and path
that bring it back (``git show COMMIT:PATH``). Every benchmark writes through
:mod:`benchmarks.results_io` (machine, versions, command and the code: commit, dirty flag,
source hash) into ``benchmarks/results/``; :mod:`benchmarks.tables`, the one reader of results
files into docs' tables, writes them; :mod:`benchmarks.restamp` keeps cited estimates current.
Nothing here is imported at package import: a benchmark's own imports happen when it runs.
"""
