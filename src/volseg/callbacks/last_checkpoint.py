"""``checkpoints/last.ckpt``, saved often and replaced atomically, so that a run killed at any
moment resumes from a whole checkpoint."""

from __future__ import annotations

import logging
import os
import shutil
import time
from typing import Any
from weakref import proxy

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint

from volseg.utils.checkpoint_io import TMP_SUFFIX, BackgroundCheckpointIO
from volseg.utils.signals import StopRequest, TrainingInterrupted

log = logging.getLogger(__name__)

#: the private names of Lightning's :class:`ModelCheckpoint` that :class:`LastCheckpoint` relies on
#: (no public ones do their work); tests/callbacks/test_last_checkpoint.py checks each
LIGHTNING_PRIVATE = (
    "_save_checkpoint",  # overridden: how the file is written (.tmp renamed, or a link)
    "_save_topk_checkpoint",  # called with _monitor_candidates: a save within an epoch
    "_monitor_candidates",
    "_should_skip_saving_checkpoint",  # called: whether Lightning would save here
    "_last_global_step_saved",  # read of other callbacks (last_save), set after a link
    "_last_checkpoint_saved",  # read of other callbacks (last_save), set to the file renamed to
)


def last_save(callback: ModelCheckpoint) -> tuple[int, str]:
    """The optimizer step and file of ``callback``'s last save, as Lightning records them: its
    public ``best_model_path`` and ``last_model_path`` name files, not which was saved last, nor
    at which step."""
    return callback._last_global_step_saved, callback._last_checkpoint_saved


class LastCheckpoint(ModelCheckpoint):
    """A :class:`ModelCheckpoint` (``monitor=None``: one file) that also saves within an epoch,
    every ``save_every_n_steps`` optimizer steps and/or ``save_every_minutes`` (at the next
    optimizer-step boundary), writing ``<file>.tmp`` and renaming it over the previous one. Such a
    checkpoint holds the loader's position (:class:`volseg.data.sampling.ResumableLoader`): the
    resumed run ends with the weights of an uninterrupted one.

    ``max_time_share``: an epoch-end save is skipped while the previous save held the loop longer
    than this share of the time trained since (``None``: every epoch end). With
    :class:`~volseg.utils.checkpoint_io.BackgroundCheckpointIO`, a save of the state another
    checkpoint callback saved at the same step links to that file. ``stop_on_signal``: a first
    SIGINT or SIGTERM saves and ends the run at the next optimizer-step boundary
    (:class:`~volseg.utils.signals.TrainingInterrupted`); ``False``: Lightning's own handling.

    Lightning has no public hook for how a checkpoint file is written nor for when and to which
    file a :class:`ModelCheckpoint` saved last: the private names this class extends, calls and
    keeps up to date are :data:`LIGHTNING_PRIVATE` (tested where Lightning has them).
    """

    def __init__(
        self,
        *args: Any,
        save_every_n_steps: int | None = None,
        save_every_minutes: float | None = None,
        max_time_share: float | None = None,
        stop_on_signal: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        for key, value, most in (
            ("save_every_n_steps", save_every_n_steps, None),
            ("save_every_minutes", save_every_minutes, None),
            ("max_time_share", max_time_share, 1),
        ):
            if value is not None and (
                isinstance(value, bool) or value <= 0 or (most is not None and value > most)
            ):
                bound = "in (0, 1]" if most is not None else "> 0"
                raise ValueError(
                    f"callbacks.last_checkpoint.{key}={value}: expected a number {bound}, or null"
                )
        self.save_every_n_steps = save_every_n_steps
        self.save_every_minutes = save_every_minutes
        self.max_time_share = max_time_share
        self.stop_on_signal = stop_on_signal
        self._stop: StopRequest | None = None
        self._write_seconds = 0.0  # how long the last save held the training loop
        self._last_save_time = time.monotonic()
        # (optimizer step, batches trained) at the last full checkpoint saved (by any callback)
        self._dumped_at: tuple[int, int] | None = None
        # the optimizer step and file of this callback's last save (as Lightning's, no save is
        # due before a first step)
        self._saved_step = 0
        self._saved_file: str | None = None

    @staticmethod
    def _position(trainer: L.Trainer) -> tuple[int, int]:
        """(optimizer step, batches trained in the run): equal for two saves of the same state."""
        return trainer.global_step, trainer.fit_loop.epoch_loop.batch_progress.total.processed

    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        """Called for every full checkpoint the trainer saves, this callback's own too."""
        super().on_save_checkpoint(trainer, pl_module, checkpoint)
        self._dumped_at = self._position(trainer)

    def _same_state_file(self, trainer: L.Trainer, filepath: str) -> str | None:
        """The file another checkpoint callback saved the current state to, if one did last,
        it holds the full state (as this callback's would) and both are on a local file system."""
        if (
            self._dumped_at != self._position(trainer)
            or self.save_weights_only
            or "://" in filepath
        ):
            return None
        for callback in trainer.checkpoint_callbacks:
            if callback is self or not isinstance(callback, ModelCheckpoint):
                continue
            step, file = last_save(callback)
            if (
                step == trainer.global_step
                and file
                and not callback.save_weights_only
                and "://" not in str(file)
            ):
                return str(file)
        return None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Handle SIGINT and SIGTERM before the loaders fork their workers (they inherit the
        handlers, so a terminal's Ctrl-C does not stop them under the main process)."""
        super().setup(trainer, pl_module, stage)
        if stage == "fit" and self.stop_on_signal:
            self._stop = StopRequest()
            self._stop.install()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self._last_save_time = time.monotonic()
        if self._stop is not None:
            # Lightning's own SIGTERM handler (set after setup) stops at an epoch's end or inside
            # a validation, without a checkpoint: from here on SIGTERM is ours, as SIGINT is
            self._stop.install()

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().teardown(trainer, pl_module, stage)
        if self._stop is not None:
            self._stop.restore()

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        if self._stop is not None:
            self._stop.restore()

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
        steps = trainer.global_step - self._saved_step
        due = self.save_every_n_steps is not None and steps >= self.save_every_n_steps
        if self.save_every_minutes is not None:
            due |= time.monotonic() - self._last_save_time >= 60 * self.save_every_minutes
            due = bool(trainer.strategy.broadcast(due))
        return due

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Saves unless the last save's time exceeds ``max_time_share`` (rank 0's, for every
        rank)."""
        if self.max_time_share is not None:
            trained = time.monotonic() - self._last_save_time
            affordable = self._write_seconds <= self.max_time_share * trained
            if not trainer.strategy.broadcast(affordable):
                return
        super().on_train_epoch_end(trainer, pl_module)

    def _save_now(self, trainer: L.Trainer) -> None:
        """Save here, unless Lightning would not (sanity check, already saved at this step)."""
        if not self._should_skip_saving_checkpoint(trainer):
            self._save_topk_checkpoint(trainer, self._monitor_candidates(trainer))

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """The final weights, when the last epoch end's save was skipped."""
        super().on_train_end(trainer, pl_module)
        if trainer.global_step != self._saved_step:
            self._save_now(trainer)

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if self._due(trainer):
            self._save_now(trainer)
        if self._stop is None or not self.at_step_boundary(trainer):
            return
        # rank 0's signal, for every rank (as a save is: see _due)
        signum = int(trainer.strategy.broadcast(self._stop.signum or 0))
        if not signum:
            return
        self._save_now(trainer)
        saved = self._saved_step == trainer.global_step
        raise TrainingInterrupted(signum, self._saved_file if saved else None, trainer.global_step)

    def _save_checkpoint(self, trainer: L.Trainer, filepath: str) -> None:
        started = time.monotonic()
        checkpoint_io = trainer.strategy.checkpoint_io
        background = isinstance(checkpoint_io, BackgroundCheckpointIO)
        same = self._same_state_file(trainer, filepath) if background else None
        if same is not None:
            self._link(trainer, checkpoint_io, same, filepath)
        elif background:
            # the plugin copies the state now, writes <file>.tmp, renames it and logs it later
            super()._save_checkpoint(trainer, filepath)
        else:
            self._write_and_rename(trainer, filepath)
        self._last_checkpoint_saved = filepath  # Lightning's record of it (not the .tmp written)
        self._saved_step, self._saved_file = trainer.global_step, filepath
        self._last_save_time = time.monotonic()
        if same is None:  # after a link, the next save costs what the last write did
            self._write_seconds = self._last_save_time - started

    def _write_and_rename(self, trainer: L.Trainer, filepath: str) -> None:
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

    def _link(
        self, trainer: L.Trainer, checkpoint_io: BackgroundCheckpointIO, source: str, path: str
    ) -> None:
        """``path`` as a second name of ``source``, made by the writer after ``source``'s write;
        what :meth:`ModelCheckpoint._save_checkpoint` records and notifies, without a write."""
        if trainer.is_global_zero:
            checkpoint_io.link_checkpoint(source, path)
        trainer.strategy.barrier("LastCheckpoint.link")
        self._last_global_step_saved = trainer.global_step  # Lightning's: not saved again here
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.after_save_checkpoint(proxy(self))
