"""volseg: a Lightning + Hydra template for 3D segmentation that knows its memory."""

from volseg.utils.resolvers import register_resolvers

# the configs' own resolvers, known wherever volseg is imported, so any code that composes and
# resolves the configs (entry points, benchmarks, tests) can
register_resolvers()
