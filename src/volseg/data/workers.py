"""What every loader worker of volseg does first."""

from __future__ import annotations

import gc
import os

from lightning.fabric.utilities.seed import pl_worker_init_function


def init_loader_worker(worker_id: int) -> None:
    """``worker_init_fn`` of volseg's data loaders: keep the parent's objects out of the worker's
    garbage collector, then seed the worker as Lightning does.

    A forked worker inherits the parent's whole heap: the training process's cached volumes, and
    in a process that trained before (Hydra multirun, a notebook, a test session) that run's
    leftovers. ``gc.freeze()`` moves everything inherited out of the collector's reach, so the
    worker neither frees the parent's objects (a CUDA or pinned tensor freed in a forked child
    calls into CUDA there) nor writes to, and so copies, the pages that hold them. It does not
    cover objects released by other means; forked workers of a fit that followed other fits in
    one process have still died on a GPU ("CUDA error: initialization error" in a tensor
    destructor), while a fresh ``train.py`` process was fine. Lightning adds its own seeding
    function only to loaders without one, so it is called here under
    ``seed_everything(workers=True)``.
    """
    gc.freeze()
    if int(os.environ.get("PL_SEED_WORKERS", 0)):
        pl_worker_init_function(worker_id)
