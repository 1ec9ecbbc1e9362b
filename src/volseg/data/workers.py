"""What every loader worker of volseg does first."""

from __future__ import annotations

import gc
import os

from lightning.fabric.utilities.seed import pl_worker_init_function


def init_loader_worker(worker_id: int) -> None:
    """``worker_init_fn`` of volseg's loaders: ``gc.freeze()`` the heap a forked worker
    inherits (cached volumes, an earlier run's leftovers), so the worker neither frees the
    parent's objects (a CUDA tensor freed in a forked child calls into CUDA) nor copies their
    pages; then Lightning's worker seeding, which it adds only to loaders without a
    ``worker_init_fn``."""
    gc.freeze()
    if int(os.environ.get("PL_SEED_WORKERS", 0)):
        pl_worker_init_function(worker_id)
