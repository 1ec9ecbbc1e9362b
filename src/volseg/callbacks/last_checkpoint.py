"""``checkpoints/last.ckpt``: at epoch ends (as often as ``max_time_share`` of training time
allows), every few minutes or steps within an epoch and at the end of training, replaced
atomically, so that a run killed at any moment resumes from a whole checkpoint. With
``async_checkpoint=true`` the trainer's
:class:`~volseg.utils.checkpoint_io.BackgroundCheckpointIO` writes and renames it in the
background."""

from __future__ import annotations

import logging
import os
import shutil
import time
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint

from volseg.utils.checkpoint_io import TMP_SUFFIX, BackgroundCheckpointIO

log = logging.getLogger(__name__)


class LastCheckpoint(ModelCheckpoint):
    """A :class:`ModelCheckpoint` (``monitor=None``: one file, e.g. ``last.ckpt``) that also saves
    within an epoch, every ``save_every_n_steps`` optimizer steps and/or every
    ``save_every_minutes`` of training (at the next optimizer-step boundary), and writes each
    checkpoint to ``<file>.tmp`` first and renames it over the previous one (a kill while
    writing leaves the previous checkpoint whole).

    A checkpoint saved within an epoch holds the training loader's position (see
    :class:`volseg.data.sampling.ResumableLoader`): the resumed run draws the epoch's remaining
    patches, so it ends with the weights of an uninterrupted run.

    ``max_time_share``: the epoch-end save is skipped while writing would take more than this
    share of the training time: the seconds the previous save held the training loop (the
    whole write; in the background, the copy to host memory) must be at most
    ``max_time_share`` x the seconds trained since it ended (short epochs with a large
    checkpoint: every few epochs; long ones: every epoch). The end of training always saves.
    ``None``: every epoch end.
    """

    def __init__(
        self,
        *args: Any,
        save_every_n_steps: int | None = None,
        save_every_minutes: float | None = None,
        max_time_share: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        if max_time_share is not None and (
            isinstance(max_time_share, bool) or not 0 < max_time_share <= 1
        ):
            raise ValueError(
                f"callbacks.last_checkpoint.max_time_share={max_time_share}: expected a number "
                "in (0, 1], or null"
            )
        self.max_time_share = max_time_share
        self._write_seconds = 0.0  # how long the last save held the training loop
        for key, value in (
            ("save_every_n_steps", save_every_n_steps),
            ("save_every_minutes", save_every_minutes),
        ):
            if value is not None and (isinstance(value, bool) or value <= 0):
                raise ValueError(
                    f"callbacks.last_checkpoint.{key}={value}: expected a number > 0, or null"
                )
        self.save_every_n_steps = save_every_n_steps
        self.save_every_minutes = save_every_minutes
        self._last_save_time = time.monotonic()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self._last_save_time = time.monotonic()

    @staticmethod
    def at_step_boundary(trainer: L.Trainer) -> bool:
        """Whether the batch just trained on ended an optimizer step: with
        ``trainer.accumulate_grad_batches=k`` only every k-th batch (and the epoch's last) does.
        A checkpoint between the micro-batches of one step would hold neither their gradients
        (not saved) nor a loader position before them: the resumed run would skip them."""
        done = trainer.fit_loop.epoch_loop.batch_progress.current.ready
        return done % trainer.accumulate_grad_batches == 0 or done >= trainer.num_training_batches

    def _due(self, trainer: L.Trainer) -> bool:
        """Whether a mid-epoch save is due; with a time limit, rank 0 decides for every rank (a
        save is collective: ranks that disagreed would wait for each other forever). Only at
        an optimizer-step boundary (the same batch on every rank)."""
        if not self.at_step_boundary(trainer):
            return False
        steps = trainer.global_step - self._last_global_step_saved
        due = self.save_every_n_steps is not None and steps >= self.save_every_n_steps
        if self.save_every_minutes is not None:
            due |= time.monotonic() - self._last_save_time >= 60 * self.save_every_minutes
            due = bool(trainer.strategy.broadcast(due))
        return due

    def _epoch_save_affordable(self, trainer: L.Trainer) -> bool:
        """Whether an epoch-end save keeps writing within ``max_time_share`` of training time
        (rank 0 decides for every rank: a save is collective)."""
        if self.max_time_share is None:
            return True
        trained = time.monotonic() - self._last_save_time
        affordable = self._write_seconds <= self.max_time_share * trained
        return bool(trainer.strategy.broadcast(affordable))

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._epoch_save_affordable(trainer):
            super().on_train_epoch_end(trainer, pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """The final weights, when the last epoch end's save was skipped."""
        super().on_train_end(trainer, pl_module)
        if trainer.global_step != self._last_global_step_saved and not (
            self._should_skip_saving_checkpoint(trainer)
        ):
            self._save_topk_checkpoint(trainer, self._monitor_candidates(trainer))

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if not self._due(trainer) or self._should_skip_saving_checkpoint(trainer):
            return
        self._save_topk_checkpoint(trainer, self._monitor_candidates(trainer))

    def _save_checkpoint(self, trainer: L.Trainer, filepath: str) -> None:
        started = time.monotonic()
        if isinstance(trainer.strategy.checkpoint_io, BackgroundCheckpointIO):
            # the plugin copies the state now, writes <file>.tmp, renames it and logs it later
            super()._save_checkpoint(trainer, filepath)
            self._last_checkpoint_saved = filepath
            self._last_save_time = time.monotonic()
            self._write_seconds = self._last_save_time - started
            return
        tmp = filepath + TMP_SUFFIX
        super()._save_checkpoint(trainer, tmp)
        if trainer.is_global_zero:
            if os.path.isdir(tmp):  # a sharded checkpoint (DeepSpeed): a folder
                shutil.rmtree(filepath, ignore_errors=True)
            os.replace(tmp, filepath)  # atomic on one file system
            log.info(
                "Saved %s: step %d, epoch %d, batch %d of the epoch",
                filepath,
                trainer.global_step,
                trainer.current_epoch,
                trainer.fit_loop.epoch_loop.batch_progress.current.processed,
            )
        trainer.strategy.barrier("LastCheckpoint.rename")
        self._last_checkpoint_saved = filepath
        self._last_save_time = time.monotonic()
        self._write_seconds = self._last_save_time - started
