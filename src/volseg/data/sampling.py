"""Epoch-seeded sampling: each epoch's patch order and augmentations follow from (seed, epoch)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from monai.transforms import Compose, Randomizable
from torch.utils.data import DataLoader, Dataset, Sampler


class EpochSeededSampler(Sampler[tuple[int, int]]):
    """Random permutation of ``range(num_items)`` drawn from ``seed`` and the epoch; yields
    ``(index, item_seed)``.

    Lightning calls :meth:`set_epoch` before every training epoch (as for DistributedSampler).
    Each item's seed is drawn from (seed, epoch) too and travels with its index to whichever
    process loads it (this one, or a loader worker, persistent or not), where
    :class:`SeededItems` seeds the random transforms with it. A patch and its augmentations are
    thus a function of (seed, epoch, position) only: a run resumed at epoch ``e`` draws exactly
    the patches an uninterrupted run draws there, with any number of loader workers. Under DDP
    it shards itself by rank (configs set ``trainer.use_distributed_sampler=false``, since
    Lightning's wrapper around a custom sampler would not pass ``set_epoch`` on).
    """

    def __init__(self, num_items: int, seed: int) -> None:
        self.num_items = num_items
        self.seed = seed
        self.epoch = 0
        self._resume: tuple[int, int] | None = None  # (epoch, positions to skip)

    def resume_at(self, epoch: int, skip: int) -> None:
        """Make the next pass over ``epoch`` start at position ``skip`` of this rank's share
        (the items a resumed run has trained on already)."""
        self.epoch = epoch
        self._resume = (epoch, skip)

    def epoch_seed(self) -> int:
        return (self.seed * 1_000_003 + self.epoch) % 2**63

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _shard(self) -> tuple[int, int]:
        """(rank, world size): under DDP each rank takes every world-size-th index."""
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            return torch.distributed.get_rank(), torch.distributed.get_world_size()
        return 0, 1

    def __iter__(self) -> Iterator[tuple[int, int]]:
        generator = torch.Generator().manual_seed(self.epoch_seed())
        order = torch.randperm(self.num_items, generator=generator).tolist()
        seeds = torch.randint(0, 2**31 - 1, (self.num_items,), generator=generator).tolist()
        pairs = list(zip(order, seeds, strict=True))
        rank, world = self._shard()
        pairs += pairs[: len(self) * world - len(pairs)]  # equal shares, as DistributedSampler
        share = pairs[rank::world]
        if self._resume is not None:
            epoch, skip = self._resume
            self._resume = None
            if epoch == self.epoch:
                share = share[skip:]
        yield from share

    def __len__(self) -> int:
        return -(-self.num_items // self._shard()[1])


class ResumableLoader(DataLoader):
    """The training loader, with a state Lightning keeps in every checkpoint: the epoch and how
    many batches of it were trained on. A run resumed from a checkpoint saved within an epoch
    thus draws that epoch's remaining patches, not its first ones again.

    ``progress`` (set by the datamodule) returns ``(batches trained on in this epoch, batches
    in the epoch)`` from the trainer's loop; the sampler must be an :class:`EpochSeededSampler`.
    """

    progress: Callable[[], tuple[int, int]] | None = None

    def state_dict(self) -> dict[str, Any]:
        if self.progress is None or not isinstance(self.sampler, EpochSeededSampler):
            return {}
        done, total = self.progress()
        if done >= total:  # the epoch is complete: a resumed run starts the next one
            return {"epoch": self.sampler.epoch + 1, "batches_done": 0}
        return {"epoch": self.sampler.epoch, "batches_done": done}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "epoch" in state and isinstance(self.sampler, EpochSeededSampler):
            skip = int(state["batches_done"]) * int(self.batch_size or 1)
            self.sampler.resume_at(int(state["epoch"]), skip)


def seed_random_transforms(transform: Compose, seed: int) -> None:
    """Give every random transform of ``transform`` its own state drawn from ``seed``."""
    rng = np.random.RandomState(seed)
    # never bool()/len() a MONAI Compose: its __len__ builds a flattened Compose, whose
    # constructor re-seeds every child transform at random
    for t in transform.transforms:
        if isinstance(t, Randomizable):
            t.set_random_state(seed=int(rng.randint(2**31)))


class SeededItems(Dataset):
    """``dataset[indices[i]]`` for the key ``(i, seed)``, its random transforms seeded first.

    Args:
        dataset: a MONAI ``CacheDataset`` (or any dataset with a ``transform`` Compose applied
            in ``__getitem__``).
        indices: the dataset index of each position (a volume may appear several times).
    """

    def __init__(self, dataset: Dataset, indices: Sequence[int]) -> None:
        self.dataset = dataset
        self.indices = list(indices)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, key: tuple[int, int]) -> dict:
        position, seed = key
        seed_random_transforms(self.dataset.transform, seed)
        return self.dataset[self.indices[position]]


class ShardedEvalSampler(Sampler[int]):
    """Every index exactly once across ranks (rank ``r`` of ``w`` takes ``r, r + w, ...``).

    Unlike ``DistributedSampler(shuffle=False)`` it does not pad the ranks to equal length with
    repeated items, which would count those validation cases twice in the gathered Dice and
    write their predictions twice. Ranks may then run one batch more or fewer; metrics are
    gathered once at epoch end, so nothing waits on a per-batch collective.
    """

    def __init__(self, num_items: int, rank: int | None = None, world: int | None = None) -> None:
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        if rank is None:
            rank = torch.distributed.get_rank() if distributed else 0
        if world is None:
            world = torch.distributed.get_world_size() if distributed else 1
        self.num_items, self.rank, self.world = num_items, rank, world

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, self.num_items, self.world))

    def __len__(self) -> int:
        return len(range(self.rank, self.num_items, self.world))
