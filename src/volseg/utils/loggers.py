"""The run's loggers of one kind."""

from __future__ import annotations

from lightning.pytorch import Trainer
from lightning.pytorch.loggers import Logger


def loggers_of(trainer: Trainer, kind: type[Logger]) -> list[Logger]:
    """The trainer's loggers that are ``kind`` (e.g. ``TensorBoardLogger``)."""
    return [logger for logger in trainer.loggers if isinstance(logger, kind)]
