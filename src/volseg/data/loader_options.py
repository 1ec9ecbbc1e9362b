"""DataLoader settings that follow the device (``data.num_workers``/``pin_memory``/
``persistent_workers`` may be ``auto``), and what every loader worker does first."""

from __future__ import annotations

import gc
import multiprocessing
import os
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from lightning.fabric.utilities.seed import pl_worker_init_function
from monai.data import list_data_collate

from volseg.utils.errors import UserInputError

#: more workers than this rarely feed one GPU faster, and each holds its own copy of the batch
MAX_AUTO_WORKERS = 8


def init_loader_worker(worker_id: int) -> None:
    """``worker_init_fn`` of volseg's loaders: ``gc.freeze()`` the heap a forked worker
    inherits (cached volumes, an earlier run's leftovers), so the worker neither frees the
    parent's objects (a CUDA tensor freed in a forked child calls into CUDA) nor copies their
    pages; then Lightning's worker seeding, which it adds only to loaders without a
    ``worker_init_fn``."""
    gc.freeze()
    if int(os.environ.get("PL_SEED_WORKERS", 0)):
        pl_worker_init_function(worker_id)


@dataclass(frozen=True)
class LoaderOptions:
    num_workers: int
    pin_memory: bool
    persistent_workers: bool
    #: how the workers start: ``None`` (the platform's default, fork on Linux) or
    #: ``forkserver`` (see :func:`worker_context`)
    multiprocessing_context: str | None = None
    #: where ``num_workers=auto`` took its cores from, for the log
    cores_from: str = field(default="", compare=False)

    def loader_kwargs(self) -> dict[str, Any]:
        """``DataLoader`` arguments of every volseg loader: these, collation and worker init."""
        kwargs = asdict(self)
        del kwargs["cores_from"]  # for the log, not the loader
        return {**kwargs, "collate_fn": list_data_collate, "worker_init_fn": init_loader_worker}


def available_cores() -> int:
    """CPU cores this process may run on (its affinity mask, as a job scheduler sets it)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _leading_int(value: str | None) -> int | None:
    """``4`` of SLURM's ``"4"``, ``"4(x2)"`` or ``"4,2"``; ``None`` for a missing value."""
    found = re.match(r"\s*(\d+)", value or "")
    return int(found.group(1)) if found else None


def cores_per_process(devices_per_node: int = 1) -> tuple[int, str]:
    """The CPU cores one training process may give its loader workers, and whence (for the
    log): under SLURM the task's ``SLURM_CPUS_PER_TASK`` (at most its affinity mask), shared
    only when a task holds several processes (fewer ``SLURM_NTASKS_PER_NODE`` than devices);
    under torchrun the mask shared by ``LOCAL_WORLD_SIZE``; else by ``devices_per_node``."""
    mask = available_cores()
    devices = max(1, devices_per_node)
    slurm_cpus = _leading_int(os.environ.get("SLURM_CPUS_PER_TASK"))
    if slurm_cpus:
        tasks = _leading_int(
            os.environ.get("SLURM_NTASKS_PER_NODE") or os.environ.get("SLURM_TASKS_PER_NODE")
        )
        per_task = max(1, devices // max(1, tasks or devices))
        cores = min(mask, slurm_cpus) // per_task
        return max(1, cores), f"SLURM_CPUS_PER_TASK={slurm_cpus}, {per_task} process(es) per task"
    local = _leading_int(os.environ.get("LOCAL_WORLD_SIZE"))
    if local:
        return max(1, mask // local), f"{mask} cores shared by LOCAL_WORLD_SIZE={local}"
    return max(1, mask // devices), f"{mask} cores shared by {devices} device process(es)"


def worker_context(cuda_initialized: bool) -> str | None:
    """``forkserver`` when CUDA was initialised before the data were built (an earlier run of a
    sweep, a notebook): a forked worker freeing a tensor of it fails ("CUDA error:
    initialization error"). Otherwise ``None``: fork, which shares the cached volumes."""
    if cuda_initialized and "forkserver" in multiprocessing.get_all_start_methods():
        return "forkserver"
    return "spawn" if cuda_initialized else None


def check_loader_options(num_workers: Any, pin_memory: Any, persistent_workers: Any) -> None:
    """One clear error naming the key, before any work, for a value that is not allowed."""
    if num_workers != "auto" and not (isinstance(num_workers, int) and num_workers >= 0):
        raise UserInputError(f"data.num_workers={num_workers}: expected auto or a number >= 0")
    for key, value in (("pin_memory", pin_memory), ("persistent_workers", persistent_workers)):
        if value != "auto" and not isinstance(value, bool):
            raise UserInputError(f"data.{key}={value}: expected auto, true or false")


def resolve_loader_options(
    num_workers: int | str,
    pin_memory: bool | str,
    persistent_workers: bool | str,
    device: str,
    devices_per_node: int = 1,
    cuda_initialized: bool = False,
) -> LoaderOptions:
    """The loader settings for ``device`` (``cuda`` or ``cpu``); explicit values win. ``auto``
    on CUDA: a worker per core of this process's share (:func:`cores_per_process`) less one
    (1 to :data:`MAX_AUTO_WORKERS`), pinned, persistent; on a CPU the step uses every core, so
    loading stays in the training process (0 workers)."""
    check_loader_options(num_workers, pin_memory, persistent_workers)
    on_cuda = device == "cuda"
    cores_from = ""
    if num_workers == "auto":
        cores, cores_from = cores_per_process(devices_per_node)
        num_workers = max(1, min(MAX_AUTO_WORKERS, cores - 1)) if on_cuda else 0
    pin = on_cuda if pin_memory == "auto" else bool(pin_memory)
    persistent = num_workers > 0 if persistent_workers == "auto" else bool(persistent_workers)
    context = worker_context(cuda_initialized) if num_workers > 0 else None
    return LoaderOptions(int(num_workers), pin, persistent and num_workers > 0, context, cores_from)
