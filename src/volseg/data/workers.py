"""What every loader worker of volseg does first."""

from __future__ import annotations

import gc
import os

from lightning.fabric.utilities.seed import pl_worker_init_function


def init_loader_worker(worker_id: int) -> None:
    """``worker_init_fn`` of volseg's data loaders: keep the parent's objects out of the worker's
    garbage collector, then seed the worker as Lightning does.

    A forked worker inherits the parent's whole heap, including unreachable CUDA tensors of an
    earlier run in the same process (Hydra multirun, a notebook, a test session). If the worker's
    collector frees one, torch calls into CUDA from a forked child and the worker dies
    ("DataLoader worker exited unexpectedly"). ``gc.freeze()`` moves everything inherited out of
    the collector's reach; it also stops the collector writing to, and so copying, the pages of
    the parent's cached volumes. Lightning adds its own seeding function only to loaders without
    one, so it is called here under ``seed_everything(workers=True)``.
    """
    gc.freeze()
    if int(os.environ.get("PL_SEED_WORKERS", 0)):
        pl_worker_init_function(worker_id)
