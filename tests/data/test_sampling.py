"""The training loader's state: a resumed epoch yields the positions an epoch had left."""

from __future__ import annotations

from volseg.data.sampling import EpochSeededSampler, ResumableLoader


def _loader(done: int, total: int, epoch: int) -> ResumableLoader:
    sampler = EpochSeededSampler(12, seed=3)
    sampler.set_epoch(epoch)
    loader = ResumableLoader(list(range(12)), batch_size=2, sampler=sampler)
    loader.progress = lambda: (done, total)
    return loader


def test_mid_epoch_state_skips_the_batches_trained_on():
    uninterrupted = list(_loader(0, 6, 4).sampler)
    state = _loader(done=2, total=6, epoch=4).state_dict()
    assert state == {"epoch": 4, "batches_done": 2}

    fresh = _loader(0, 6, 0)  # a new process: its sampler starts at epoch 0
    fresh.load_state_dict(state)
    assert list(fresh.sampler) == uninterrupted[4:]
    fresh.sampler.set_epoch(5)
    assert len(list(fresh.sampler)) == 12  # the next epoch is whole again


def test_complete_epoch_state_starts_the_next_epoch_whole():
    state = _loader(done=6, total=6, epoch=4).state_dict()
    assert state == {"epoch": 5, "batches_done": 0}
    fresh = _loader(0, 6, 0)
    fresh.load_state_dict(state)
    assert list(fresh.sampler) == list(_loader(0, 6, 5).sampler)
