"""``python -m benchmarks <name> [args]``: see :mod:`benchmarks.runner`."""

from benchmarks.runner import main

raise SystemExit(main())
