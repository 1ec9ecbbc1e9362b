"""volseg: a Lightning + Hydra template for 3D segmentation that knows its memory."""

from volseg.utils.run_bounds import register_run_bounds_resolver
from volseg.utils.run_dirs import register_run_dir_resolver

# the configs' own resolvers, known wherever volseg is imported, so any code that composes and
# resolves the configs (entry points, benchmarks, tests) can: ${unique_dir:...} in
# configs/hydra/default.yaml, ${epochs_unless_timed:...} in configs/trainer/default.yaml
register_run_dir_resolver()
register_run_bounds_resolver()
