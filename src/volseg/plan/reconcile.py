"""Options that contradict each other, reconciled once before anything is built.

- ``trainer.enable_progress_bar=false`` with a progress-bar callback in ``callbacks``: Lightning
  refuses the pair; the user's ``false`` wins and the callback is left out.
- ``memory.*`` monitor options (``trace_step``, ``snapshot_steps``, ...) set while no memory
  monitor is among the callbacks (``callbacks=none``): nothing would read them; one warning says so.
"""

from __future__ import annotations

import logging
from typing import Any

import hydra
from lightning.pytorch.callbacks import ProgressBar
from omegaconf import DictConfig

log = logging.getLogger(__name__)

#: the memory monitor's options (configs/memory/default.yaml) and their values when unused
MONITOR_OPTIONS: dict[str, Any] = {
    "every_n_steps": 1,
    "trace_step": None,
    "snapshot_steps": 0,
    "host_mmap_threshold": None,
}
MONITOR_TARGET = "volseg.memory.monitor.callback.MemoryMonitor"


def _callback_class(entry: Any) -> type | None:
    if not isinstance(entry, DictConfig) or "_target_" not in entry:
        return None
    try:
        found = hydra.utils.get_class(str(entry._target_))
    except Exception:
        return None  # building it names the bad _target_
    return found if isinstance(found, type) else None


def progress_bar_entries(callbacks: DictConfig | None) -> list[str]:
    """Names of the ``callbacks`` entries that are Lightning progress bars."""
    return [
        str(name)
        for name, entry in (callbacks or {}).items()
        if (cls := _callback_class(entry)) is not None and issubclass(cls, ProgressBar)
    ]


def reconcile_callbacks(
    callbacks: DictConfig | None, trainer: DictConfig, memory: DictConfig | None
) -> tuple[list[str], list[str]]:
    """The ``callbacks`` entries to leave out, and one line per reconciliation made (logged:
    an info line for a left-out callback, a warning for options nothing reads)."""
    dropped: list[str] = []
    notes: list[str] = []
    if trainer.get("enable_progress_bar") is False:
        dropped = progress_bar_entries(callbacks)
        if dropped:
            line = (
                f"trainer.enable_progress_bar=false: callbacks.{', callbacks.'.join(dropped)} "
                "left out (no progress bar)"
            )
            log.info(line)
            notes.append(line)
    monitor = any(
        isinstance(entry, DictConfig) and str(entry.get("_target_")) == MONITOR_TARGET
        for entry in (callbacks or {}).values()
    )
    if memory is not None and not monitor:
        unused = [
            f"memory.{key}={memory.get(key)}"
            for key, off in MONITOR_OPTIONS.items()
            if key in memory and memory.get(key) != off
        ]
        if unused:
            line = (
                f"{', '.join(unused)}: no memory monitor among the callbacks (callbacks.memory_"
                "monitor), so nothing traces or logs memory; callbacks=default or "
                "'callbacks=[memory]' adds it"
            )
            log.warning(line)
            notes.append(line)
    return dropped, notes
