"""Building callbacks and loggers from their config groups."""

from __future__ import annotations

import logging

import hydra
from lightning.pytorch import Callback
from lightning.pytorch.loggers import Logger
from omegaconf import DictConfig

log = logging.getLogger(__name__)


def _instantiate_group(cfg: DictConfig | None, kind: str) -> list:
    objects = []
    for name, entry in (cfg or {}).items():
        if isinstance(entry, DictConfig) and "_target_" in entry:
            log.info("Instantiating %s %s <%s>", kind, name, entry._target_)
            objects.append(hydra.utils.instantiate(entry))
    return objects


def instantiate_callbacks(cfg: DictConfig | None) -> list[Callback]:
    """One callback per entry of the ``callbacks`` group that has a ``_target_``."""
    return _instantiate_group(cfg, "callback")


def instantiate_loggers(cfg: DictConfig | None) -> list[Logger]:
    """One logger per entry of the ``logger`` group that has a ``_target_``."""
    return _instantiate_group(cfg, "logger")
