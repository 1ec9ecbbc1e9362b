"""The training loader's state: a resumed epoch yields the positions an epoch had left."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch import nn

from volseg.data.sampling import (
    EpochSeededSampler,
    ResumableLoader,
    check_resume_world,
    saved_loader_states,
)
from volseg.utils.errors import UserInputError


def _loader(done: int, total: int, epoch: int, rank: int = 0, world: int = 1) -> ResumableLoader:
    sampler = EpochSeededSampler(12, seed=3, rank=rank, world=world)
    sampler.set_epoch(epoch)
    loader = ResumableLoader(list(range(12)), batch_size=2, sampler=sampler)
    loader.progress = lambda: (done, total)
    return loader


def test_mid_epoch_state_skips_the_batches_trained_on():
    uninterrupted = list(_loader(0, 6, 4).sampler)
    state = _loader(done=2, total=6, epoch=4).state_dict()
    assert state == {"epoch": 4, "batches_done": 2, "world": 1}

    fresh = _loader(0, 6, 0)  # a new process: its sampler starts at epoch 0
    fresh.load_state_dict(state)
    assert list(fresh.sampler) == uninterrupted[4:]
    fresh.sampler.set_epoch(5)
    assert len(list(fresh.sampler)) == 12  # the next epoch is whole again


def test_complete_epoch_state_starts_the_next_epoch_whole():
    state = _loader(done=6, total=6, epoch=4).state_dict()
    assert state == {"epoch": 5, "batches_done": 0, "world": 1}
    fresh = _loader(0, 6, 0)
    fresh.load_state_dict(state)
    assert list(fresh.sampler) == list(_loader(0, 6, 5).sampler)


def test_mid_epoch_state_resumes_each_rank_share_on_the_same_world():
    # rank 1 of 2: 6 items, 3 batches of 2; 1 batch done
    uninterrupted = list(_loader(0, 3, 4, rank=1, world=2).sampler)
    state = _loader(done=1, total=3, epoch=4, rank=1, world=2).state_dict()
    assert state == {"epoch": 4, "batches_done": 1, "world": 2}
    fresh = _loader(0, 3, 0, rank=1, world=2)
    fresh.load_state_dict(state)
    assert list(fresh.sampler) == uninterrupted[2:]


def test_mid_epoch_state_on_another_world_is_one_clear_error():
    state = _loader(done=1, total=3, epoch=4, rank=0, world=2).state_dict()
    fresh = _loader(0, 6, 0)  # one process
    with pytest.raises(UserInputError) as raised:
        fresh.load_state_dict(state)
    message = str(raised.value)
    assert "\n" not in message
    assert "ckpt_path" in message
    assert "saved mid-epoch by 2 processes, resumed on 1" in message


def test_epoch_end_state_on_another_world_starts_the_next_epoch_sharded_anew():
    state = _loader(done=3, total=3, epoch=4, rank=1, world=2).state_dict()
    assert state == {"epoch": 5, "batches_done": 0, "world": 2}
    fresh = _loader(0, 4, 0, rank=0, world=3)
    fresh.load_state_dict(state)
    assert list(fresh.sampler) == list(_loader(0, 4, 5, rank=0, world=3).sampler)


def test_state_without_world_resumes_as_before():
    uninterrupted = list(_loader(0, 6, 4).sampler)
    fresh = _loader(0, 6, 0)
    fresh.load_state_dict({"epoch": 4, "batches_done": 2})  # an older checkpoint
    assert list(fresh.sampler) == uninterrupted[4:]


class _Positions(torch.utils.data.Dataset):
    """The position of each ``(position, item_seed)`` key the sampler yields."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, key: tuple[int, int]) -> torch.Tensor:
        return torch.tensor([float(key[0])])


class _Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(1, 1)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return self.layer(batch).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class _SaveAfterTwoBatches(L.Callback):
    def __init__(self, path) -> None:
        self.path = path

    def on_train_batch_end(self, trainer, *args) -> None:
        if trainer.fit_loop.epoch_loop.batch_progress.current.processed == 2:
            trainer.save_checkpoint(self.path)


def test_a_lightning_checkpoint_saved_mid_epoch_names_ckpt_path_on_another_world(tmp_path):
    """The loader state found where Lightning's fit loop keeps it in a real checkpoint."""
    trainer = L.Trainer(
        max_steps=3,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[_SaveAfterTwoBatches(tmp_path / "last.ckpt")],
    )
    loader = ResumableLoader(
        _Positions(), batch_size=2, sampler=EpochSeededSampler(12, seed=3, rank=0, world=1)
    )
    loop = trainer.fit_loop
    loader.progress = lambda: (loop.epoch_loop.batch_progress.current.processed, 6)
    trainer.fit(_Tiny(), train_dataloaders=loader)

    checkpoint = torch.load(tmp_path / "last.ckpt", weights_only=True)
    states = saved_loader_states(checkpoint)
    assert states == [{"epoch": 0, "batches_done": 2, "world": 1}]
    check_resume_world(states[0], 1, "ckpt_path=last.ckpt")  # the same world: no error
    with pytest.raises(UserInputError, match=r"^ckpt_path=last\.ckpt: saved mid-epoch by 1 "):
        check_resume_world(states[0], 2, "ckpt_path=last.ckpt")


def test_seeding_a_samples_transforms_draws_as_a_new_random_state_of_its_seed():
    import numpy as np
    from monai.transforms import Compose, RandFlipd, RandScaleIntensityd

    from volseg.data.sampling import seed_random_transforms

    flip, scale = RandFlipd(["image"], prob=0.5), RandScaleIntensityd("image", factors=0.1)
    transform = Compose([flip, scale])
    for seed in (0, 7, 2**31 - 1):
        seed_random_transforms(transform, seed)
        drawn = [flip.R.randint(1000), scale.R.randint(1000)]
        expected = np.random.RandomState(seed)
        first, second = expected.randint(2**31), expected.randint(2**31)
        assert drawn == [
            np.random.RandomState(first).randint(1000),
            np.random.RandomState(second).randint(1000),
        ]
