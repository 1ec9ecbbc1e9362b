"""``trainer.log_every_n_steps`` no larger than an epoch: a short epoch (a small dataset, a
``limit_train_batches``) would otherwise log no ``train/loss`` at all."""

from __future__ import annotations

import logging
import warnings

from lightning.pytorch import Callback, LightningModule, Trainer

log = logging.getLogger(__name__)

# Lightning's warning about the same thing, answered here by lowering the interval
LIGHTNING_WARNING = r"The number of training batches \(\d+\) is smaller than the logging interval"


class LogInterval(Callback):
    """At the start of training, lowers ``trainer.log_every_n_steps`` to the epoch's training
    batches where it is larger (one log line says so), so that every epoch logs ``train/*``."""

    def __init__(self) -> None:
        warnings.filterwarnings("ignore", message=LIGHTNING_WARNING)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        batches = trainer.num_training_batches
        every = trainer.log_every_n_steps
        if not isinstance(batches, int) or not 0 < batches < every:  # inf: a float
            return
        trainer.log_every_n_steps = batches
        log.info(
            "trainer.log_every_n_steps=%d is more than the %d training batches of an epoch: "
            "train/* logged every %d",
            every,
            batches,
            batches,
        )
