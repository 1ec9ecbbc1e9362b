"""The benchmark callbacks: seconds per optimizer step, and one run at a time on a GPU."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import torch

from volseg.callbacks.step_timer import GpuTurn, StepTimer


class _Module:
    device = torch.device("cpu")

    def __init__(self) -> None:
        self.logged: list[float] = []

    def log(self, name: str, value: float, on_step: bool) -> None:
        assert name == "time/step_s" and on_step
        self.logged.append(value)


def test_step_timer_logs_once_per_optimizer_step_spanning_its_micro_batches():
    timer, module, trainer = StepTimer(), _Module(), SimpleNamespace(global_step=0)
    for step in range(2):  # two optimizer steps of 3 micro-batches each
        for micro in range(3):
            timer.on_train_batch_start(trainer, module, None, 3 * step + micro)
            time.sleep(0.01)
            if micro == 2:
                trainer.global_step += 1  # the update, in the last micro-batch
            timer.on_train_batch_end(trainer, module, None, None, 3 * step + micro)
    assert len(module.logged) == 2
    assert all(seconds >= 0.03 for seconds in module.logged)


def test_gpu_turn_lets_one_holder_at_a_time(tmp_path):
    lock = tmp_path / "gpu.lock"
    first, second = GpuTurn(lock), GpuTurn(lock)
    first.on_train_start(None, None)
    got = threading.Event()

    def take() -> None:
        second.on_predict_start(None, None)
        got.set()

    waiter = threading.Thread(target=take)
    waiter.start()
    assert not got.wait(0.3)  # blocked while the first holds the GPU
    first.on_train_end(None, None)
    assert got.wait(5)
    waiter.join()
    second.on_exception(None, None, RuntimeError())  # an error gives the turn back
    first.on_train_start(None, None)
    first.on_train_end(None, None)
