"""Epoch-seeded shuffling: each epoch's patch order and augmentations follow from (seed, epoch)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from torch.utils.data import Sampler


class EpochSeededSampler(Sampler[int]):
    """Random permutation of ``range(num_items)`` drawn from ``seed`` and the epoch.

    Lightning calls :meth:`set_epoch` before every training epoch (as for DistributedSampler);
    ``on_epoch(epoch_seed)`` then re-seeds whatever else is random in the epoch (the transforms).
    Because nothing carries over between epochs, a run resumed at epoch ``e`` draws exactly the
    patches an uninterrupted run draws at epoch ``e``, whatever the loop did before. Under DDP it
    shards itself by rank (configs set ``trainer.use_distributed_sampler=false``, since Lightning's
    wrapper around a custom sampler would not pass ``set_epoch`` on).
    """

    def __init__(
        self, num_items: int, seed: int, on_epoch: Callable[[int], None] | None = None
    ) -> None:
        self.num_items = num_items
        self.seed = seed
        self.on_epoch = on_epoch
        self.epoch = 0

    def epoch_seed(self) -> int:
        return (self.seed * 1_000_003 + self.epoch) % 2**63

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if self.on_epoch is not None:
            self.on_epoch(self.epoch_seed())

    def _shard(self) -> tuple[int, int]:
        """(rank, world size): under DDP each rank takes every world-size-th index."""
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            return torch.distributed.get_rank(), torch.distributed.get_world_size()
        return 0, 1

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.epoch_seed())
        order = torch.randperm(self.num_items, generator=generator).tolist()
        rank, world = self._shard()
        order += order[: len(self) * world - len(order)]  # equal shares, as DistributedSampler
        yield from order[rank::world]

    def __len__(self) -> int:
        return -(-self.num_items // self._shard()[1])
