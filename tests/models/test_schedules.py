"""BudgetCosineLR: the LR decays over the run's real horizon, steps or time."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from tests.conftest import compose_config, tiny_train_overrides
from volseg.models.schedules import BudgetCosineLR, RunBudget
from volseg.tasks.train import train

LR = 0.01


def _optimizer() -> torch.optim.Optimizer:
    return torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=LR)


def _run(scheduler: BudgetCosineLR, steps: int) -> list[float]:
    lrs = []
    for _ in range(steps):
        scheduler.optimizer.step()
        scheduler.step()
        lrs.append(scheduler.get_last_lr()[0])
    return lrs


def test_step_budget_ends_at_eta_min():
    scheduler = BudgetCosineLR(_optimizer(), RunBudget(total_steps=20), eta_min=1e-4)
    lrs = _run(scheduler, 20)
    assert lrs[-1] == pytest.approx(1e-4)
    assert lrs[9] == pytest.approx(1e-4 + (LR - 1e-4) * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert all(a > b for a, b in zip(lrs, lrs[1:], strict=False))


def test_time_budget_follows_elapsed_time():
    """With only max_time, the LR follows the elapsed share of it, however fast steps run."""
    clock = {"now": 0.0}
    budget = RunBudget(max_time_s=100.0, elapsed_s=lambda: clock["now"])
    scheduler = BudgetCosineLR(_optimizer(), budget)
    clock["now"] = 50.0
    assert _run(scheduler, 1)[0] == pytest.approx(LR / 2)
    clock["now"] = 99.9
    assert _run(scheduler, 1)[0] < 1e-3 * LR
    # the step bound wins when it comes first
    both = RunBudget(total_steps=4, max_time_s=1e9, elapsed_s=lambda: 0.0)
    assert _run(BudgetCosineLR(_optimizer(), both), 4)[-1] == pytest.approx(0.0)


def test_the_state_dict_leaves_the_clock_out():
    budget = RunBudget(max_time_s=10.0, elapsed_s=lambda: 1.0)
    state = BudgetCosineLR(_optimizer(), budget).state_dict()
    assert "budget" not in state and torch.save(state, Path("/dev/null")) is None


def _final_and_initial_lr(cfg) -> tuple[float, float]:
    """The LR of the run's last step and the one it started from (the planned LR)."""
    train(cfg)
    ckpt = torch.load(Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt", weights_only=True)
    group = ckpt["optimizer_states"][0]["param_groups"][0]
    return group["lr"], group["initial_lr"]


def test_trained_with_max_steps_the_lr_ends_near_eta_min(small_dataset, tmp_path):
    overrides = [
        *tiny_train_overrides(small_dataset),
        "++trainer.max_steps=6",
        "trainer.max_epochs=-1",
    ]
    cfg = compose_config("train", tmp_path, overrides)
    final, initial = _final_and_initial_lr(cfg)
    assert initial == 0.003  # model.optimizer.lr=auto for the embedded data's 4 classes
    assert final < 0.02 * initial  # was constant before: T_max=epochs


def test_trained_with_max_time_the_lr_decays(small_dataset, tmp_path):
    """A run bounded by time alone (no step or epoch bound) still decays its LR."""
    overrides = [
        *tiny_train_overrides(small_dataset),
        "trainer.max_epochs=-1",
        "trainer.max_time=00:00:00:08",
        "callbacks.validation_budget=null",  # the trainer's Timer alone ends the run
    ]
    cfg = compose_config("train", tmp_path, overrides)
    # a constant LR (the epoch cosine of a run without max_epochs) would end at 1.0 x the start;
    # how far below depends on how much of the 8 s the last step saw on a loaded machine
    final, initial = _final_and_initial_lr(cfg)
    assert final < 0.9 * initial
