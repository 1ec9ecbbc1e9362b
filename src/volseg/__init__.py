"""volseg: a Lightning + Hydra template for 3D segmentation that knows its memory."""

from volseg.utils.run_bounds import register_run_bounds_resolver

# configs/trainer/default.yaml's ${epochs_unless_timed:...}: known wherever volseg is imported,
# so any code that composes and resolves the configs (entry points, benchmarks, tests) can
register_run_bounds_resolver()
