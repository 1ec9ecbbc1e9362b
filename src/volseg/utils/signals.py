"""Ctrl-C and SIGTERM during training: the run stops after its optimizer step with ``last.ckpt``
written and the command that resumes, exit 128 + the signal; a second Ctrl-C stops at once."""

from __future__ import annotations

import os
import shlex
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any


def signal_name(signum: int) -> str:
    """``Ctrl-C (SIGINT)`` or ``SIGTERM``."""
    return "Ctrl-C (SIGINT)" if signum == signal.SIGINT else signal.Signals(signum).name


class TrainingInterrupted(Exception):
    """The run stopped on a signal; ``checkpoint``: the file to resume from."""

    def __init__(self, signum: int, checkpoint: str | None = None, step: int = 0) -> None:
        self.signum = int(signum)
        self.checkpoint = checkpoint
        where = (
            f"at step {step}: saved {checkpoint}"
            if checkpoint
            else "before training: nothing to save"
        )
        super().__init__(f"stopped by {signal_name(self.signum)} {where}")

    @property
    def exit_code(self) -> int:
        """128 + the signal's number, as a shell reports a process the signal ended."""
        return 128 + self.signum


class StopRequest:
    """Handlers that record the first SIGINT/SIGTERM (the loop stops at a step boundary); a second
    SIGINT raises :class:`KeyboardInterrupt`. Forked loader workers ignore the signal."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._pid = os.getpid()
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        """Handle SIGINT and SIGTERM from now on (only the main thread may set handlers)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous = signal.signal(signum, self._handle)
            self._previous.setdefault(signum, previous)

    def restore(self) -> None:
        """The handlers from before the first :meth:`install`."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, previous in self._previous.items():
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self._pid:
            return  # a forked loader worker: the main process decides
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: stop now, without saving
        if self.signum is None:
            self.signum = signum
            # written straight to the terminal: a handler must not wait for logging's lock
            os.write(
                2,
                f"\n{signal_name(signum)}: stopping after this optimizer step, with "
                "checkpoints/last.ckpt written (Ctrl-C again: stop now, without saving)\n".encode(),
            )


def raise_on() -> Callable[[], None]:
    """Until training starts, SIGTERM stops as Ctrl-C; returns the restorer."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    pid = os.getpid()

    def handle(signum: int, frame: FrameType | None) -> None:
        if os.getpid() == pid:
            raise TrainingInterrupted(signum)

    previous = signal.signal(signal.SIGTERM, handle)

    def restore() -> None:
        if signal.getsignal(signal.SIGTERM) is handle:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)

    return restore


def resume_command(checkpoint: str) -> str:
    """The ``train.py`` command that resumes from ``checkpoint``: the same overrides."""
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        overrides = list(HydraConfig.get().overrides.task)
    else:
        overrides = [a for a in sys.argv[1:] if not a.startswith("-")]
    kept = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") != "ckpt_path"]
    words = ["python", "train.py", *kept, f"ckpt_path={Path(checkpoint).resolve()}"]
    return " ".join(shlex.quote(w) for w in words)
