"""Validation cadence sized by its cost, and a last validation before a time budget runs out."""

from __future__ import annotations

import logging
import math
import time

from lightning.pytorch import Callback, LightningModule, Trainer

log = logging.getLogger(__name__)


class ValidationBudget(Callback):
    """Keep whole-volume validation to about ``max_fraction`` (0 < f < 1) of the run's time:
    ``trainer.check_val_every_n_epoch`` is raised (never below its configured value) to
    ``ceil(validation time / (max_fraction × epoch time))``. The last epoch is validated: with
    ``trainer.max_time``, the last whose training and validation fit (the run stops after it).
    """

    def __init__(self, max_fraction: float = 0.1) -> None:
        if not 0.0 < max_fraction < 1.0:
            raise ValueError(
                f"callbacks.validation_budget.max_fraction={max_fraction}: need (0, 1)"
            )
        self.max_fraction = max_fraction
        self._base_every: int | None = None
        self._epoch_start = 0.0
        self._epoch_times: list[float] = []
        self._val_start = 0.0
        self.last_validation_s: float | None = None
        self._final = False

    @staticmethod
    def _time_remaining(trainer: Trainer) -> float | None:
        """Seconds left of ``trainer.max_time`` (Lightning's ``Timer``); None without one."""
        timer = next((c for c in trainer.callbacks if type(c).__name__ == "Timer"), None)
        return None if timer is None else timer.time_remaining()

    def _epoch_s(self) -> float:
        """Mean seconds of the last three training epochs (call after one was timed)."""
        recent = self._epoch_times[-3:]
        return sum(recent) / len(recent)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._base_every = trainer.check_val_every_n_epoch

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._epoch_start = time.perf_counter()
        # decided before any epoch has been timed: a 1-epoch run validates its only epoch
        epochs = trainer.max_epochs
        final = epochs not in (None, -1) and trainer.current_epoch + 1 >= epochs
        remaining = self._time_remaining(trainer)
        if not final and remaining is not None and self._epoch_times:
            cycle_s = self._epoch_s() + (self.last_validation_s or 0.0)  # an epoch, its validation
            # after this epoch and its validation, another such cycle would not fit
            final = remaining < 2 * cycle_s
        # each rank timed itself: rank 0 decides for all (ranks that disagreed on whether to
        # validate would wait for each other in the validation's collectives forever)
        if trainer.strategy.broadcast(final):
            self._final = True
            trainer.check_val_every_n_epoch = 1

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._epoch_times.append(time.perf_counter() - self._epoch_start)

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._val_start = time.perf_counter()

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking or self._base_every is None:
            return
        self.last_validation_s = time.perf_counter() - self._val_start
        if self._final:
            if self._time_remaining(trainer) is not None:
                log.info("Last validation before trainer.max_time runs out; stopping")
                trainer.should_stop = True
            return
        if not self._epoch_times:
            return
        epoch_s = self._epoch_s()
        every = max(
            self._base_every,
            math.ceil(self.last_validation_s / (self.max_fraction * max(epoch_s, 1e-6))),
        )
        every = int(trainer.strategy.broadcast(every))  # rank 0's timing, as above
        if every != trainer.check_val_every_n_epoch:
            log.info(
                "Validation takes %.1f s, a training epoch %.1f s: validating every %d epochs "
                "keeps validation near %.0f%% of the time (callbacks.validation_budget)",
                self.last_validation_s,
                epoch_s,
                every,
                100 * self.max_fraction,
            )
            trainer.check_val_every_n_epoch = every
