"""Options that contradict each other, reconciled before anything is built: a progress bar with
``trainer.enable_progress_bar=false``; monitor options without a monitor; ``async_checkpoint``
(checkpoints written in the background) and a strategy that writes its own."""

from __future__ import annotations

import logging
from typing import Any

import hydra
from lightning.pytorch.callbacks import ProgressBar
from omegaconf import DictConfig

from volseg.memory import MemoryMonitor
from volseg.plan.run_plan import Decision
from volseg.utils.errors import UserInputError

log = logging.getLogger(__name__)

#: the memory monitor's options (configs/memory/default.yaml) and their values when unused
MONITOR_OPTIONS: dict[str, Any] = {
    "every_n_steps": 1,
    "trace_step": None,
    "snapshot_steps": 0,
    "host_mmap_threshold": None,
}
#: strategies that save through Lightning's CheckpointIO (DeepSpeed and FSDP write their own)
IO_STRATEGIES = ("auto", "single_device", "ddp")
IO_STRATEGY_CLASSES = ("SingleDeviceStrategy", "DDPStrategy")


def _class_of(entry: Any) -> type | None:
    """The class a callbacks entry builds; ``None`` where it names none (building it says why)."""
    if not (isinstance(entry, DictConfig) and "_target_" in entry):
        return None
    try:
        return hydra.utils.get_class(str(entry._target_))  # a class, else ValueError
    except Exception:
        return None


def reconcile_callbacks(
    callbacks: DictConfig | None, trainer: DictConfig, memory: DictConfig | None
) -> tuple[list[str], list[str]]:
    """The ``callbacks`` entries to leave out, and one logged line per reconciliation."""
    notes: list[str] = []
    bars_off = trainer.get("enable_progress_bar") is False
    classes = {n: c for n, e in (callbacks or {}).items() if (c := _class_of(e)) is not None}
    dropped = [str(n) for n, c in classes.items() if bars_off and issubclass(c, ProgressBar)]
    if dropped:
        line = (
            f"trainer.enable_progress_bar=false: callbacks.{', callbacks.'.join(dropped)} "
            "left out (no progress bar)"
        )
        log.info(line)
        notes.append(line)
    if memory is not None and not any(issubclass(c, MemoryMonitor) for c in classes.values()):
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


def plan_async_checkpoint(value: Any, strategy: Any) -> Decision:
    """``async_checkpoint`` (``auto``, ``true``, ``false``) for ``trainer.strategy``; one error for
    another value, or ``true`` where the strategy writes its own."""
    name = str(strategy if strategy is not None else "auto")
    if isinstance(strategy, DictConfig | dict) and "_target_" in strategy:
        name = str(strategy["_target_"]).rsplit(".", 1)[-1]  # the class a node builds
    lowered = name.lower()
    supported = name in IO_STRATEGY_CLASSES or any(
        lowered == s or lowered.startswith(f"{s}_") for s in IO_STRATEGIES
    )
    if value == "auto":
        if supported:
            return Decision(True, "planned", f"trainer.strategy={name} saves through CheckpointIO")
        return Decision(False, "planned", f"trainer.strategy={name} writes its checkpoints itself")
    if not isinstance(value, bool):
        raise UserInputError(f"async_checkpoint={value}: expected auto, true or false")
    if value and not supported:
        raise UserInputError(
            f"async_checkpoint=true: trainer.strategy={name} writes its checkpoints itself, not "
            "through Lightning's CheckpointIO; use async_checkpoint=auto or false"
        )
    return Decision(value, "configured")
