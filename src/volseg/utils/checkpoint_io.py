"""Checkpoints written in a background thread from a host copy (``async_checkpoint=true``): the
loop pays for the copy, not the write. Lightning's :class:`AsyncCheckpointIO`, with:

- the state copied to host memory before the next optimizer step can change it (no GPU memory
  held while writing, nothing written half-new);
- each file written to ``<file>.tmp`` and renamed (a kill leaves the previous file whole);
- a removal (the previous best) queued behind the writes before it: never no best checkpoint;
- at most :data:`MAX_PENDING` writes in flight (host copies of the state);
- a checkpoint of the state another file was just saved from (``last.ckpt`` beside the best)
  made a second name of that file (:meth:`BackgroundCheckpointIO.link_checkpoint`)."""

from __future__ import annotations

import copy
import logging
import os
import shutil
import threading
import time
from collections import deque
from concurrent.futures import Future
from typing import Any

import torch
from lightning.fabric.plugins import CheckpointIO
from lightning.pytorch.plugins.io import AsyncCheckpointIO
from lightning_utilities.core.apply_func import apply_to_collection

log = logging.getLogger(__name__)

# suffix of the file a checkpoint is written to before it replaces the previous one
TMP_SUFFIX = ".tmp"
#: writes (and removals) queued or being written before a save waits for the oldest
MAX_PENDING = 2


class HostBuffers:
    """Host tensors reused from one snapshot to the next (no page-in on each save), by
    ``(shape, dtype, pinned)``."""

    def __init__(self) -> None:
        self._free: dict[tuple[tuple[int, ...], torch.dtype, bool], list[torch.Tensor]] = {}
        self._lock = threading.Lock()

    def take(self, like: torch.Tensor) -> torch.Tensor:
        """A contiguous host tensor of ``like``'s shape and dtype (values undefined)."""
        pinned = like.is_cuda
        with self._lock:
            free = self._free.get((tuple(like.shape), like.dtype, pinned))
            if free:
                return free.pop()
        return torch.empty(like.shape, dtype=like.dtype, device="cpu", pin_memory=pinned)

    def give_back(self, tensors: list[torch.Tensor]) -> None:
        with self._lock:
            for tensor in tensors:
                key = (tuple(tensor.shape), tensor.dtype, tensor.is_pinned())
                self._free.setdefault(key, []).append(tensor)


def host_snapshot(
    checkpoint: dict[str, Any], buffers: HostBuffers | None = None
) -> tuple[dict[str, Any], list[torch.Tensor]]:
    """A copy of ``checkpoint`` nothing in the loop shares (every tensor copied to the host, the
    rest deep-copied), and the host tensors taken from ``buffers`` for it."""
    copies: dict[int, torch.Tensor] = {}
    taken: list[torch.Tensor] = []

    def to_host(tensor: torch.Tensor) -> torch.Tensor:
        tensor = tensor.detach()
        if buffers is not None and tensor.layout == torch.strided:
            copied = buffers.take(tensor)
            copied.copy_(tensor)
            taken.append(copied)
        else:
            copied = tensor.to("cpu", copy=True)
        copies[id(copied)] = copied
        return copied

    on_host = apply_to_collection(checkpoint, torch.Tensor, to_host)
    # the host copies are this snapshot's own already: deepcopy keeps them (memo), copies the rest
    return copy.deepcopy(on_host, memo=dict(copies)), taken


def link_checkpoint(source: str, path: str) -> None:
    """``path`` as a second name of the written ``source`` (a hard link, else a copy), made as
    ``<path>.tmp`` and renamed; both stay whole as long as no file is rewritten in place."""
    tmp = path + TMP_SUFFIX
    if os.path.lexists(tmp):
        os.remove(tmp)
    try:
        os.link(source, tmp)
    except OSError:  # no hard links here (e.g. FAT, some network file systems), or across them
        shutil.copyfile(source, tmp)
    os.replace(tmp, path)
    log.info("Saved %s: the file of %s (the same state)", path, source)


class BackgroundCheckpointIO(AsyncCheckpointIO):
    """:class:`AsyncCheckpointIO` writing host snapshots (the module docstring)."""

    def __init__(self, checkpoint_io: CheckpointIO | None = None) -> None:
        super().__init__(checkpoint_io)
        self._pending: deque[Future] = deque()  # the writes, oldest first
        self._buffers = HostBuffers()
        self.blocked_seconds = 0.0  # saves and teardown waiting (a link or removal never waits)
        self.written_seconds = 0.0
        self.writes = 0
        self.links = 0
        self._logged_writes = 0  # teardown follows every stage: say each write once

    def _wait_for_writes(self, most: int) -> None:
        """Until at most ``most`` writes are queued or running."""
        while self._pending and self._pending[0].done():
            self._pending.popleft()
        while len(self._pending) > most:
            self._pending.popleft().result()  # a task stores its error in self._error

    def _submit(self, task: Any, *args: Any) -> Future:
        def run() -> None:
            started = time.monotonic()
            try:
                task(*args)
            except BaseException as err:  # raised on the caller's thread at the next call
                self._error = err
            finally:
                self.written_seconds += time.monotonic() - started

        self._ensure_setup()
        assert self._executor is not None
        return self._executor.submit(run)

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        started = time.monotonic()
        self._wait_for_writes(MAX_PENDING - 1)
        if self._error:
            raise self._error
        snapshot, taken = host_snapshot(checkpoint, self._buffers)
        self._pending.append(self._submit(self._write, snapshot, taken, str(path), storage_options))
        self.writes += 1
        self.blocked_seconds += time.monotonic() - started

    def _write(
        self,
        checkpoint: dict[str, Any],
        taken: list[torch.Tensor],
        path: str,
        storage_options: Any | None,
    ) -> None:
        assert self.checkpoint_io is not None
        # a remote file system writes in its own transaction; a local file is renamed when whole
        tmp = path if "://" in path else path + TMP_SUFFIX
        try:
            self.checkpoint_io.save_checkpoint(checkpoint, tmp, storage_options=storage_options)
            if tmp != path:
                os.replace(tmp, path)  # atomic on one file system
            progress = checkpoint.get("loops", {}).get("fit_loop", {})
            batch = progress.get("epoch_loop.batch_progress", {}).get("current", {})
            log.info(
                "Saved %s: step %s, epoch %s, batch %s of the epoch",
                path,
                checkpoint.get("global_step", 0),
                checkpoint.get("epoch", 0),
                batch.get("processed", 0),
            )
        finally:
            self._buffers.give_back(taken)

    def link_checkpoint(self, source: str, path: str) -> None:
        """``path`` as a second name of ``source`` once the writes before it are done; no wait."""
        if self._error:
            raise self._error
        self._submit(link_checkpoint, str(source), str(path))
        self.links += 1

    def remove_checkpoint(self, path: Any) -> None:
        assert self.checkpoint_io is not None
        self._submit(self.checkpoint_io.remove_checkpoint, path)  # after the writes before it

    def teardown(self) -> None:
        """Waits for the writes in flight."""
        started = time.monotonic()
        try:
            super().teardown()
        finally:
            self._pending.clear()
            self._buffers = HostBuffers()  # the host copies are not kept past the run
            self.blocked_seconds += time.monotonic() - started
        if self.writes > self._logged_writes:
            self._logged_writes = self.writes
            log.info(
                "Checkpoints: %d written in the background in %.1f s (and %d saved as a second "
                "name of one written at the same step); the loop and the end of fit waited %.1f s "
                "for them (copies to host memory, writes in flight)",
                self.writes,
                self.written_seconds,
                self.links,
                self.blocked_seconds,
            )
