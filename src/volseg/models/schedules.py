"""Learning-rate schedules that follow the run's budget: steps or wall-clock time."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.optim.lr_scheduler import LRScheduler


@dataclass
class RunBudget:
    """What bounds a run: ``total_steps`` (optimizer steps; ``inf``: none) and ``max_time_s`` with
    ``elapsed_s()`` (seconds trained so far; ``None``: no time bound)."""

    total_steps: float = math.inf
    max_time_s: float | None = None
    elapsed_s: Callable[[], float] | None = None
    _count_steps: Callable[[], float] | None = field(default=None, repr=False)

    @classmethod
    def from_trainer(cls, trainer: Any) -> RunBudget:
        """From a trainer: its step count and its ``Timer``'s ``max_time``."""

        def count_steps() -> float:
            try:
                return float(trainer.estimated_stepping_batches)
            except Exception:  # e.g. a loader without a length: no step bound known
                return math.inf

        timer = next((c for c in trainer.callbacks if type(c).__name__ == "Timer"), None)
        remaining = None if timer is None else timer.time_remaining()
        if remaining is None:  # no Timer, or one without a duration
            return cls(_count_steps=count_steps)
        duration = remaining + timer.time_elapsed()  # what is left plus what has run: max_time
        return cls(max_time_s=duration, elapsed_s=timer.time_elapsed, _count_steps=count_steps)

    def _steps(self) -> float:
        # counted on first use: counting sets up the train loader, which inside
        # configure_optimizers would miss the sampler state a resumed run restores afterwards
        if self._count_steps is not None:
            self.total_steps, self._count_steps = self._count_steps(), None
        return self.total_steps

    def progress(self, step: int) -> float:
        """Budget used after ``step`` steps, ``[0, 1]``: the step or time fraction."""
        if step <= 0:
            return 0.0
        total = self._steps()
        done = step / total if math.isfinite(total) else 0.0
        if self.max_time_s and self.elapsed_s is not None:
            done = max(done, self.elapsed_s() / self.max_time_s)
        return min(max(done, 0.0), 1.0)


class BudgetCosineLR(LRScheduler):
    """Cosine decay from each group's initial LR to ``eta_min`` over the run's budget, stepped every
    optimizer step: ``eta_min + (lr0 - eta_min) * (1 + cos(pi * p)) / 2`` with ``p =
    budget.progress(t)`` (the step or the elapsed time fraction, whichever is further: no estimate
    of the step rate is needed). Without a bound the LR stays constant; ``warmup_steps``: linear
    warm-up from 0."""

    #: the LightningModule passes ``budget=RunBudget.from_trainer(trainer)`` to such schedulers
    follows_budget = True

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        budget: RunBudget | None = None,
        eta_min: float = 0.0,
        warmup_steps: int = 0,
        last_epoch: int = -1,
    ) -> None:
        self.budget = budget or RunBudget()
        self.eta_min = eta_min
        self.warmup_steps = warmup_steps
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        step = max(self.last_epoch, 0)
        factor = 0.5 * (1.0 + math.cos(math.pi * self.budget.progress(step)))
        warm = min(1.0, (step + 1) / self.warmup_steps) if self.warmup_steps else 1.0
        return [warm * (self.eta_min + (lr - self.eta_min) * factor) for lr in self.base_lrs]

    def state_dict(self) -> dict[str, Any]:
        # the budget holds the trainer's clock; it is rebuilt from the trainer on resume
        return {k: v for k, v in super().state_dict().items() if k != "budget"}
