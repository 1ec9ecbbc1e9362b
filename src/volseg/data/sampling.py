"""Epoch-seeded sampling: each epoch's patch order and augmentations follow from (seed, epoch)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from monai.transforms import Compose, Randomizable
from torch.utils.data import DataLoader, Dataset, Sampler

from volseg.data.loader_options import LoaderOptions
from volseg.utils.errors import UserInputError


class _RankShare(Sampler):
    """Rank ``rank``'s share of ``num_items`` among ``world`` processes, ``ceil(num_items /
    world)`` keys: ``rank``/``world`` the values given (the trainer's ``global_rank``/
    ``world_size``), else ``torch.distributed``'s when it is initialized, else ``(0, 1)``."""

    def __init__(self, num_items: int, rank: int | None = None, world: int | None = None) -> None:
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        if rank is None:
            rank = torch.distributed.get_rank() if distributed else 0
        if world is None:
            world = torch.distributed.get_world_size() if distributed else 1
        self.num_items, self.rank, self.world = num_items, int(rank), int(world)

    def __len__(self) -> int:
        return -(-self.num_items // self.world)


class EpochSeededSampler(_RankShare):
    """Random permutation of ``range(num_items)`` drawn from ``seed`` and the epoch (Lightning
    calls :meth:`set_epoch`); yields ``(index, item_seed)``, the seed drawn likewise, for
    :class:`SeededItems` to seed the random transforms with in whichever process loads it. A
    patch is thus a function of (seed, epoch, position) only: a resumed run draws the patches an
    uninterrupted one draws, with any number of workers. Rank ``r`` of ``world`` takes every
    ``world``-th item: the only sharding (every Trainer has ``use_distributed_sampler=False``).
    """

    def __init__(
        self, num_items: int, seed: int, rank: int | None = None, world: int | None = None
    ) -> None:
        super().__init__(num_items, rank, world)
        self.seed = seed
        self.epoch = 0
        self._resume: tuple[int, int] | None = None  # (epoch, positions to skip)

    def resume_at(self, epoch: int, skip: int) -> None:
        """Start the next pass over ``epoch`` at position ``skip`` of this rank's share."""
        self.epoch = epoch
        self._resume = (epoch, skip)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[tuple[int, int]]:
        generator = torch.Generator().manual_seed((self.seed * 1_000_003 + self.epoch) % 2**63)
        order = torch.randperm(self.num_items, generator=generator).tolist()
        seeds = torch.randint(0, 2**31 - 1, (self.num_items,), generator=generator).tolist()
        pairs = list(zip(order, seeds, strict=True))
        pairs += pairs[: len(self) * self.world - len(pairs)]  # equal shares, as DistributedSampler
        share = pairs[self.rank :: self.world]
        if self._resume is not None:
            epoch, skip = self._resume
            self._resume = None
            if epoch == self.epoch:
                share = share[skip:]
        yield from share


class ResumableLoader(DataLoader):
    """The training loader, with a state Lightning keeps in every checkpoint (the epoch, its
    batches trained on, the world size), so a run resumed within an epoch draws its remaining
    patches. ``progress`` (set by the datamodule) returns ``(batches trained on in this epoch,
    batches in the epoch)``; the sampler must be an :class:`EpochSeededSampler`.
    """

    progress: Callable[[], tuple[int, int]] | None = None

    def state_dict(self) -> dict[str, Any]:
        if self.progress is None or not isinstance(self.sampler, EpochSeededSampler):
            return {}
        done, total = self.progress()
        world = self.sampler.world
        if done >= total:  # a resumed run starts the next epoch
            return {"epoch": self.sampler.epoch + 1, "batches_done": 0, "world": world}
        return {"epoch": self.sampler.epoch, "batches_done": done, "world": world}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "epoch" in state and isinstance(self.sampler, EpochSeededSampler):
            check_resume_world(state, self.sampler.world, "ckpt_path (the resumed checkpoint)")
            skip = int(state["batches_done"]) * int(self.batch_size or 1)
            self.sampler.resume_at(int(state["epoch"]), skip)


def check_resume_world(state: dict[str, Any], world: int, source: str) -> None:
    """One :class:`UserInputError` (naming ``source``) when the loader ``state`` was saved within
    an epoch by another number of processes than ``world``: its batches done count a share of
    that world. A state saved at an epoch end, or without ``"world"``, resumes on any world."""
    saved = state.get("world")
    if saved is None or int(state.get("batches_done", 0)) == 0 or int(saved) == world:
        return
    processes = f"{int(saved)} process" + ("es" if int(saved) != 1 else "")
    raise UserInputError(
        f"{source}: saved mid-epoch by {processes}, resumed on {world}: resume on {processes} "
        "(trainer.devices x trainer.num_nodes), or from a checkpoint saved at an epoch end"
    )


def saved_loader_states(checkpoint: dict[str, Any]) -> list[dict[str, Any]]:
    """The training loaders' states in a Lightning checkpoint (the fit loop keeps them under
    ``loops.fit_loop.state_dict.combined_loader``, one per stateful loader); ``[]`` without."""
    loops = checkpoint.get("loops") or {}
    fit_state = (loops.get("fit_loop") or {}).get("state_dict") or {}
    return [s for s in fit_state.get("combined_loader") or [] if isinstance(s, dict)]


#: reseeded for every sample: seeding a RandomState in place draws the same numbers as a new
#: ``RandomState(seed)``, without building one (most of what a new one costs)
_SEEDS = np.random.RandomState()


def seed_random_transforms(transform: Compose, seed: int) -> None:
    """Give every random transform of ``transform`` its own state drawn from ``seed``."""
    _SEEDS.seed(seed)
    # never bool()/len() a MONAI Compose: its __len__ builds a flattened Compose, whose
    # constructor re-seeds every child transform at random
    for t in transform.transforms:
        if isinstance(t, Randomizable):
            t.set_random_state(seed=int(_SEEDS.randint(2**31)))


class SeededItems(Dataset):
    """``dataset[indices[i]]`` for the key ``(i, seed)``, the random transforms of its
    ``transform`` Compose (applied in ``__getitem__``) seeded first; a volume may appear at
    several positions."""

    def __init__(self, dataset: Dataset, indices: Sequence[int]) -> None:
        self.dataset = dataset
        self.indices = list(indices)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, key: tuple[int, int]) -> dict:
        position, seed = key
        seed_random_transforms(self.dataset.transform, seed)
        return self.dataset[self.indices[position]]


class ShardedEvalSampler(_RankShare):
    """Every index exactly once across ranks, the same number of keys on every rank: yields
    ``(index, counted)``, rank ``r`` of ``w`` taking ``r, r + w, ...``, padded to ``ceil(num_items
    / w)`` with ``(index, False)`` keys, so every rank joins every collective while a padding key
    is neither scored nor written (``DistributedSampler``'s repeated items count twice).
    """

    def __iter__(self) -> Iterator[tuple[int, bool]]:
        own = [(i, True) for i in range(self.rank, self.num_items, self.world)]
        pad = [(i % max(1, self.num_items), False) for i in range(len(self) - len(own))]
        return iter(own + pad)


class EvalItems(Dataset):
    """``dataset[index]`` for the key ``(index, counted)`` of :class:`ShardedEvalSampler`, with
    ``"counted"`` added (``False``: a padding item, skipped by the steps)."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: tuple[int, bool]) -> dict:
        index, counted = key
        return {**self.dataset[index], "counted": bool(counted)}


def eval_loader(
    dataset: Dataset, options: LoaderOptions, rank: int | None = None, world: int | None = None
) -> DataLoader:
    """Whole volumes of ``dataset``, batch 1, each on one rank (:class:`ShardedEvalSampler`)."""
    sampler = ShardedEvalSampler(len(dataset), rank, world)
    return DataLoader(EvalItems(dataset), sampler=sampler, batch_size=1, **options.loader_kwargs())
