"""Loader workers keep the parent's objects out of their garbage collector, and are seeded."""

from __future__ import annotations

import gc

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from volseg.data.loader_options import init_loader_worker


class _WorkerState(Dataset):
    """Item i: (objects frozen in this process, a numpy draw from its global generator)."""

    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int) -> tuple[int, float]:
        return gc.get_freeze_count(), float(np.random.random())


def _worker_states(num_workers: int) -> list[tuple[int, float]]:
    loader = DataLoader(
        _WorkerState(),
        num_workers=num_workers,
        worker_init_fn=init_loader_worker,
        batch_size=None,
        generator=torch.Generator().manual_seed(0),  # the same base seed for every loader
    )
    return [(int(frozen), float(draw)) for frozen, draw in loader]


def test_workers_freeze_what_they_inherit_and_the_parent_does_not(monkeypatch):
    monkeypatch.delenv("PL_SEED_WORKERS", raising=False)
    assert gc.get_freeze_count() == 0
    states = _worker_states(2)
    # every inherited object (the interpreter's, torch's: tens of thousands) is out of reach
    assert all(frozen > 10_000 for frozen, _ in states)
    assert gc.get_freeze_count() == 0


def test_workers_are_seeded_as_lightning_seeds_them(monkeypatch):
    """Under seed_everything(workers=True) Lightning reseeds numpy from (seed, worker, rank);
    without it torch's own per-worker seed stands."""
    monkeypatch.delenv("PL_SEED_WORKERS", raising=False)
    torch_seeded = [draw for _, draw in _worker_states(2)]
    assert torch_seeded == [draw for _, draw in _worker_states(2)]
    monkeypatch.setenv("PL_SEED_WORKERS", "1")
    lightning_seeded = [draw for _, draw in _worker_states(2)]
    assert lightning_seeded[0] != lightning_seeded[1]
    assert set(lightning_seeded).isdisjoint(torch_seeded)


def test_volseg_loaders_use_it(train_cfg):
    import hydra

    datamodule = hydra.utils.instantiate(train_cfg.data)
    datamodule.prepare_data()
    datamodule.setup("fit")
    assert datamodule.train_dataloader().worker_init_fn is init_loader_worker
    assert datamodule.val_dataloader().worker_init_fn is init_loader_worker
