"""Building callbacks and loggers from their config groups."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from lightning.pytorch import Callback
from lightning.pytorch.loggers import Logger
from omegaconf import DictConfig

from volseg.utils.sweep import in_multirun

log = logging.getLogger(__name__)


def _instantiate_group(cfg: DictConfig | None, kind: str) -> list:
    objects = []
    for name, entry in (cfg or {}).items():
        if isinstance(entry, DictConfig) and "_target_" in entry:
            log.info("Instantiating %s %s <%s>", kind, name, entry._target_)
            objects.append(hydra.utils.instantiate(entry, **_logger_defaults(kind, entry)))
    return objects


def sweep_group() -> str | None:
    """In a Hydra multirun, the sweep's name (its folder's name, e.g. ``2026-01-31_12-00-00``)."""
    return Path(HydraConfig.get().sweep.dir).name if in_multirun() else None


def _logger_defaults(kind: str, entry: DictConfig) -> dict[str, Any]:
    # every job of a multirun is its own W&B run; grouping them by sweep keeps them together
    is_wandb = kind == "logger" and str(entry._target_).endswith("WandbLogger")
    if is_wandb and not entry.get("group") and (group := sweep_group()) is not None:
        return {"group": group}
    return {}


def instantiate_callbacks(cfg: DictConfig | None) -> list[Callback]:
    """One callback per entry of the ``callbacks`` group that has a ``_target_``."""
    return _instantiate_group(cfg, "callback")


def instantiate_loggers(cfg: DictConfig | None) -> list[Logger]:
    """One logger per entry of the ``logger`` group that has a ``_target_``; a W&B logger without
    a ``group`` gets the sweep's name as its group in a multirun."""
    return _instantiate_group(cfg, "logger")
