"""DataLoader settings that follow the device: ``data.num_workers``/``pin_memory``/
``persistent_workers`` may be ``auto``."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from volseg.utils.errors import UserInputError

#: more workers than this rarely feed one GPU faster, and each holds its own copy of the batch
MAX_AUTO_WORKERS = 8


@dataclass(frozen=True)
class LoaderOptions:
    num_workers: int
    pin_memory: bool
    persistent_workers: bool


def available_cores() -> int:
    """CPU cores this process may run on (its affinity mask, as a job scheduler sets it)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


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
) -> LoaderOptions:
    """The loader settings for ``device`` (``cuda`` or ``cpu``); explicit values win.

    ``auto`` on CUDA: one worker per core this process may use, shared by the node's GPUs, less
    one core for the training process (at least 1, at most :data:`MAX_AUTO_WORKERS`); pinned
    batches; persistent workers. On a CPU the training step itself uses every core, so ``auto``
    loads in the training process (0 workers, see ``benchmarks/data_throughput.py``).
    """
    check_loader_options(num_workers, pin_memory, persistent_workers)
    on_cuda = device == "cuda"
    if num_workers == "auto":
        per_device = available_cores() // max(1, devices_per_node)
        num_workers = max(1, min(MAX_AUTO_WORKERS, per_device - 1)) if on_cuda else 0
    pin = on_cuda if pin_memory == "auto" else bool(pin_memory)
    persistent = num_workers > 0 if persistent_workers == "auto" else bool(persistent_workers)
    return LoaderOptions(int(num_workers), pin, persistent and num_workers > 0)
