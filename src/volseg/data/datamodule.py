"""LightningDataModule for a folder of 3D stacks (``images/`` + ``labels/``)."""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Sequence
from itertools import takewhile
from pathlib import Path
from typing import Any

import monai
import torch
from lightning.pytorch import LightningDataModule
from monai.data import CacheDataset, Dataset, PersistentDataset
from monai.data.utils import pickle_hashing
from monai.transforms import Compose, Randomizable
from torch.utils.data import DataLoader

from volseg.data.cases import (
    Case,
    case_problems,
    find_cases,
    find_inputs,
    in_channels_fix,
    input_problems,
    split_cases,
)
from volseg.data.dataset_defaults import resolve_augment
from volseg.data.host_memory import (
    CACHE_MODES,
    HostEstimate,
    VolumeBytes,
    available_ram,
    estimate_host,
    fitting_cache_rate,
    volume_bytes,
)
from volseg.data.loader_options import LoaderOptions, check_loader_options, resolve_loader_options
from volseg.data.mni152 import build_mni152_dataset, check_build_installed
from volseg.data.orientation import check_axcodes
from volseg.data.sampling import EpochSeededSampler, ResumableLoader, SeededItems, eval_loader
from volseg.data.synthetic import generate_synthetic_dataset
from volseg.data.transforms import eval_transforms, train_transforms
from volseg.utils.errors import UserInputError, raise_problems
from volseg.utils.units import GIB, MIB

log = logging.getLogger(__name__)

#: part of every disk cache's key: raise it when the loading code changes what it caches
DISK_CACHE_VERSION = 1


def item_hash(item: dict[str, Any]) -> bytes:
    """``PersistentDataset``'s key of an item: its file paths plus each file's size and
    modification time, so that a file rewritten in place is loaded again, not read stale."""
    images = item["image"] if isinstance(item["image"], list) else [item["image"]]
    stats = []
    for path in (Path(name).resolve() for name in [*images, item.get("label")] if name):
        stat = path.stat() if path.exists() else None
        stats.append((str(path), stat.st_size if stat else -1, stat.st_mtime_ns if stat else -1))
    return pickle_hashing({**item, "files": stats})


def disk_cache_dir(root: Path, role: str, transform: Compose, settings: dict[str, Any]) -> Path:
    """The folder of one disk cache: ``root/<role>-<hash>``, the hash taken over what decides the
    cached arrays (the transforms before the first random one, the loading settings, the MONAI
    version), so a change of e.g. ``data.spacing`` starts a new cache; ``key.json`` says what."""
    cached = takewhile(lambda t: not isinstance(t, Randomizable), transform.transforms)
    key = {
        "role": role,
        "transforms": [type(t).__name__ for t in cached],
        "settings": settings,
        "monai": monai.__version__,
        "version": DISK_CACHE_VERSION,
    }
    text = json.dumps(key, sort_keys=True, default=str)
    folder = root / f"{role}-{hashlib.sha256(text.encode()).hexdigest()[:16]}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "key.json").write_text(json.dumps(key, indent=2, sort_keys=True, default=str))
    return folder


class VolumeDataModule(LightningDataModule):
    """Training patches and whole validation volumes from ``root``. Every argument is a
    ``data.*`` key, explained with its default in ``configs/data/folder.yaml`` (Hydra passes
    them all); beyond it: ``num_classes=None`` takes the classes ``root/classes.json`` names;
    ``in_channels=None`` takes any number of image channels; ``synthetic``/``mni152``:
    ``{"root": ..., **builder kwargs}``, the embedded dataset built when ``root`` is that missing
    folder; ``patch_voxels`` is the planner's (checked here); ``check_only`` is read by
    ``train.py``.
    """

    def __init__(
        self,
        root: str,
        num_classes: int | None,
        in_channels: int | None,
        patch_size: Sequence[int],
        batch_size: int,
        samples_per_volume: int,
        val_fraction: float,
        split_seed: int,
        fold: int | None,
        class_ratios: Sequence[float] | None,
        class_names: Sequence[str] | None,
        num_workers: int | str,
        pin_memory: bool | str,
        persistent_workers: bool | str,
        cache_rate: float,
        synthetic: dict[str, Any] | None,
        check_only: bool,
        spacing: Sequence[float] | None,
        mni152: dict[str, Any] | None,
        augment: dict[str, Any] | None,
        patch_voxels: int | None,
        cache: str,
        cache_dir: str | None,
        max_locations_per_class: int | None,
        orientation: str | None,
    ) -> None:
        super().__init__()
        if str(patch_size) == "auto":
            raise UserInputError(
                "data.patch_size=auto is planned from the data by the run plan; build the "
                "datamodule from volseg.plan.make_plan(cfg).run_config()"
            )
        # null: no budget (a fixed patch) and every voxel location
        optional = {
            "patch_voxels": patch_voxels,
            "max_locations_per_class": max_locations_per_class,
        }
        whole = {"batch_size": batch_size, "samples_per_volume": samples_per_volume, **optional}
        for key, value in whole.items():
            if (key in optional and value is None) or (type(value) is int and value >= 1):
                continue
            null = ", or null" if key in optional else ""
            raise UserInputError(f"data.{key}={value}: expected a whole number >= 1{null}")
        if not isinstance(val_fraction, int | float) or not 0 <= val_fraction < 1:
            raise UserInputError(f"data.val_fraction={val_fraction}: expected a number in [0, 1)")
        if not isinstance(cache_rate, int | float) or not 0 <= cache_rate <= 1:
            raise UserInputError(f"data.cache_rate={cache_rate}: expected a number in [0, 1]")
        if cache not in CACHE_MODES:
            raise UserInputError(f"data.cache={cache}: expected one of {', '.join(CACHE_MODES)}")
        if cache == "disk" and not cache_dir:
            raise UserInputError("data.cache=disk needs data.cache_dir (a folder for the cache)")
        if len(patch_size) != 3 or min(patch_size) < 1:
            raise UserInputError(f"data.patch_size={list(patch_size)}: expected [D, H, W] > 0")
        if spacing is not None and (len(spacing) != 3 or min(spacing) <= 0):
            raise UserInputError(f"data.spacing={list(spacing)}: expected [z, y, x] > 0 or null")
        check_axcodes(orientation)
        check_loader_options(num_workers, pin_memory, persistent_workers)
        check_build_installed(root, mni152)
        self.root = Path(root)
        self.num_classes = num_classes
        self.in_channels = in_channels
        self.patch_size = [int(p) for p in patch_size]
        self.batch_size = batch_size
        self.samples_per_volume = samples_per_volume
        self.val_fraction = val_fraction
        self.split_seed = split_seed
        self.fold = fold
        self.class_ratios = class_ratios
        self._class_names = list(class_names) if class_names is not None else None
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.persistent_workers = persistent_workers
        # CUDA initialised before these data exist: by an earlier run in this process (a
        # multirun sweep, a notebook); its loader workers must not be forked from it
        self.cuda_before = torch.cuda.is_initialized()
        self.cache = cache
        self.cache_rate = cache_rate
        self.cache_dir = Path(cache_dir) if cache_dir else None
        self.max_locations_per_class = max_locations_per_class
        self.orientation = str(orientation) if orientation is not None else None
        self.synthetic = dict(synthetic) if synthetic else None
        self.mni152 = dict(mni152) if mni152 else None
        self.check_only = check_only
        self.spacing = [float(v) for v in spacing] if spacing is not None else None
        self.augment = dict(augment) if augment else None
        self.train_cases: list[Case] = []
        self.val_cases: list[Case] = []
        self._train_ds: SeededItems | None = None
        self._val_ds: Dataset | None = None
        self._split: tuple[list[Case], list[str]] | None = None  # all cases, layout problems
        self._sizes: tuple[dict[str, list[VolumeBytes]], list[str]] | None = None
        self._checked = False
        self._seed = 0

    @property
    def class_names(self) -> list[str]:
        """Class names, background first (``num_classes`` entries)."""
        if self._class_names is None:
            names_file = self.root / "classes.json"
            if names_file.is_file():
                self._class_names = list(json.loads(names_file.read_text()))
            else:
                self._class_names = [f"class_{k}" for k in range(self.num_classes)]
        if len(self._class_names) != self.num_classes:
            raise UserInputError(
                f"class names {self._class_names} do not match num_classes={self.num_classes}"
            )
        return self._class_names

    def prepare_data(self) -> None:
        """Generate the embedded (or MNI152) dataset if ``root`` is its (missing) folder."""
        builders = [
            (self.synthetic, generate_synthetic_dataset, "the embedded synthetic dataset"),
            (self.mni152, build_mni152_dataset, "the MNI152 brain dataset"),
        ]
        for options, build, what in builders:
            if options and not self.root.exists():
                settings = dict(options)
                target = Path(settings.pop("root"))
                if target.resolve() == self.root.resolve():
                    log.info("Generating %s in %s", what, self.root)
                    build(self.root, **settings)

    def find(self) -> tuple[list[Case], list[str]]:
        """The dataset's complete cases, and problems of the layout itself (one line each);
        ``num_classes=None`` takes the classes from ``root/classes.json``."""
        if self.num_classes is None:
            names_file = self.root / "classes.json"
            if not names_file.is_file():
                raise UserInputError(
                    f"data.num_classes=null takes the classes from {names_file}, which does not "
                    "exist: set num_classes=K"
                )
            self._class_names = list(json.loads(names_file.read_text()))
            self.num_classes = len(self._class_names)
        return find_cases(self.root), []

    def check(self) -> None:
        """Find, split and check all cases: one :class:`UserInputError` with every problem of
        the layout and of the cases' files, before any training."""
        if self._checked:
            return
        cases, problems = self.split()
        padded: dict[str, list[int]] = {}
        problems = problems + case_problems(
            cases,
            self.num_classes,
            self.patch_size,
            self.in_channels,
            self.classes_from,
            self.spacing,
            self.orientation,
            self.channels_fix,
            padded,
        )
        raise_problems(problems, "the dataset")
        self._checked = True
        log.info(
            "Dataset %s: %d train, %d val volumes, %s",
            self.root,
            len(self.train_cases),
            len(self.val_cases),
            self.describe_channels(),
        )
        if padded:
            name, shape = next(iter(padded.items()))
            log.info(
                "data.patch_size=%s is larger than %d volume(s) in some axis (e.g. %s: [D, H, W] "
                "= %s%s): they are zero-padded to the patch",
                list(self.patch_size),
                len(padded),
                name,
                shape,
                f" at data.spacing={list(self.spacing)}" if self.spacing else "",
            )

    def describe_channels(self) -> str:
        """The classes (and channels, where the layout names them) for the dataset's log line."""
        return f"classes {self.class_names}"

    #: ``(in_channels, channels) -> str``: what to change when a case's image has ``channels``
    channels_fix = staticmethod(in_channels_fix)

    def split(self) -> tuple[list[Case], list[str]]:
        """Find the cases and split them into ``train_cases``/``val_cases`` (no voxel is read);
        returns all cases and the layout's problems (then nothing is split)."""
        if self._split is not None:
            return self._split
        cases, problems = self.find()
        if not problems:
            self.train_cases, self.val_cases = split_cases(
                cases, self.root, self.val_fraction, self.split_seed, self.fold
            )
            if not self.train_cases or not self.val_cases:
                raise UserInputError(
                    f"data.root={self.root}: the split leaves no training or no validation case "
                    f"({len(self.train_cases)} train, {len(self.val_cases)} val)"
                )
        self._split = (cases, problems)
        return self._split

    def host_estimate(
        self, device: str, devices: int = 1, cache_rate: float | None = None
    ) -> HostEstimate:
        """The data side's host memory from the headers, ``devices`` processes on ``device``."""
        sizes, rejected = self._volume_sizes()
        options = resolve_loader_options(
            self.num_workers, self.pin_memory, self.persistent_workers, device, devices
        )
        return estimate_host(
            sizes["train"],
            sizes["val"],
            self.cache,
            self.cache_rate if cache_rate is None else cache_rate,
            self.batch_size,
            self.patch_size,
            self.in_channels,
            options.num_workers,
            options.pin_memory,
            ranks=devices,
            rejected=rejected,
        )

    def _volume_sizes(self) -> tuple[dict[str, list[VolumeBytes]], list[str]]:
        """Each split's volumes after loading (from headers, read once), and the cases the check
        will reject (unreadable, or smaller than the patch in every axis): left out."""
        if self._sizes is None:
            self.split()
            sizes: dict[str, list[VolumeBytes]] = {"train": [], "val": []}
            rejected = []
            for role, cases in (("train", self.train_cases), ("val", self.val_cases)):
                for case in cases:
                    try:
                        size = volume_bytes(case, self.spacing, orientation=self.orientation)
                    except Exception:  # a bad file: the check reports it with its reason
                        rejected.append(case.name)
                        continue
                    if all(p > s for p, s in zip(self.patch_size, size.shape_zyx, strict=True)):
                        rejected.append(case.name)
                    if role == "train":  # cached padded to the patch, with its class locations
                        locations = (self.num_classes, self.max_locations_per_class)
                        size = volume_bytes(
                            case, self.spacing, self.patch_size, locations, self.orientation
                        )
                    sizes[role].append(size)
            self._sizes = (sizes, rejected)
        return self._sizes

    def validation_shapes(self) -> list[list[int]]:
        """``[D, H, W]`` of each validation volume as validation sees it (from the headers)."""
        return [list(size.shape_zyx) for size in self._volume_sizes()[0]["val"]]

    def check_host_memory(self, device: str, devices: int = 1) -> HostEstimate | None:
        """One :class:`UserInputError`, saying what fits, when ``cache=memory`` exceeds RAM."""
        if self.cache != "memory" or self.split()[1] or self._volume_sizes()[1]:
            return None  # a problem of the layout or of a case: the check reports it first
        est = self.host_estimate(device, devices)
        available, source = available_ram()
        if available is None or est.data_total <= available:
            return est
        rate = fitting_cache_rate(
            lambda r: self.host_estimate(device, devices, cache_rate=r), available, self.cache_rate
        )
        fits = f"data.cache_rate={rate:g} fits" if rate else "no data.cache_rate above 0 fits"
        processes = f" ({est.ranks} training processes, each its own)" if est.ranks > 1 else ""
        raise UserInputError(
            f"data.cache=memory with data.cache_rate={self.cache_rate:g}: the data would need "
            f"{est.data_total / GIB:.3g} GiB of host RAM{processes}: training cache "
            f"{est.train_cache / GIB:.3g} GiB ({est.train_cached} of {est.train_volumes} "
            f"volumes), validation cache {est.val_cache / GIB:.3g} GiB, loader copies and "
            f"batches {max(est.train_loading, est.val_loading) / GIB:.3g} GiB; "
            f"{available / GIB:.3g} GiB is available ({source}). Nothing was loaded. {fits}; "
            f"data.cache=disk keeps the volumes under data.cache_dir={self.cache_dir} and reads "
            "them per sample"
        )

    @property
    def load_options(self) -> dict[str, Any]:
        """Options of :func:`volseg.data.transforms.load_transforms` for this layout."""
        return {"spacing": self.spacing, "orientation": self.orientation}

    @property
    def classes_from(self) -> str:
        """Where the number of classes comes from, for messages."""
        return f"num_classes={self.num_classes}"

    @property
    def channels_from(self) -> str:
        """Where the number of image channels comes from, for messages."""
        return f"in_channels={self.in_channels}"

    def predict_cases(self, path: str | Path, in_channels: int) -> list[Case]:
        """Checked images to predict (no labels): the volume file ``path`` or those in it."""
        cases = find_inputs(path)
        raise_problems(input_problems(cases, in_channels, self.orientation), "the input")
        return cases

    def predict_transforms(self) -> Compose:
        """Loading and normalization as in validation: image ``(C, D, H, W)``."""
        return eval_transforms(with_label=False, **self.load_options)

    def setup(self, stage: str | None = None) -> None:
        self.check()
        if self._train_ds is None and stage in (None, "fit"):
            transform = train_transforms(
                self.patch_size,
                self.num_classes,
                self.class_ratios,
                # keys left null: the folder's own defaults (the run plan passes them resolved)
                augment=resolve_augment(self.augment, self.root)[0],
                max_locations_per_class=self.max_locations_per_class,
                **self.load_options,
            )
            self._seed = torch.initial_seed()  # set by seed_everything(cfg.seed)
            dataset = self._dataset(self.train_cases, transform, "train")
            # every volume appears samples_per_volume times per epoch without caching it twice
            indices = list(range(len(self.train_cases))) * self.samples_per_volume
            self._train_ds = SeededItems(dataset, indices)
        if self._val_ds is None:
            self._val_ds = self._dataset(
                self.val_cases, eval_transforms(**self.load_options), "val"
            )

    def _dataset(self, cases: Sequence[Case], transform: Compose, role: str) -> Dataset:
        """The MONAI dataset ``data.cache`` asks for (each applies ``transform``'s random part in
        ``__getitem__``: the seeded sampling relies on it)."""
        items = [c.as_dict() for c in cases]
        if self.cache == "memory":
            # copy_cache=False: a sample reads its cached volume in place instead of deep-copying
            # all of it (the crop copies its patch out first: OwnPatchd)
            return CacheDataset(
                items,
                transform,
                cache_rate=self.cache_rate,
                num_workers=None,
                progress=False,
                copy_cache=False,
            )
        if self.cache == "disk":
            # training volumes are cached padded to the patch, with their class locations: the
            # patch and the locations' limit are part of their key
            settings = {**self.load_options}
            if role == "train":
                settings["patch_size"] = self.patch_size
                settings["max_locations_per_class"] = self.max_locations_per_class
            folder = disk_cache_dir(self.cache_dir, role, transform, settings)
            log.info("data.cache=disk: %s volumes cached in %s", role, folder)
            return PersistentDataset(items, transform, cache_dir=folder, hash_func=item_hash)
        if role == "train":  # what data.cache=none costs: the largest volume against one patch
            largest = max(self._volume_sizes()[0]["train"], key=lambda v: v.voxels)
            log.info(
                "data.cache=none: every training sample reads, normalizes and finds the class "
                "locations of its whole volume (up to %s = %.1f M voxels, %.0f MiB, %.0fx a %s "
                "patch); data.cache=memory or disk does that once per volume",
                "x".join(str(s) for s in largest.shape_zyx),
                largest.voxels / 1e6,
                largest.total / MIB,
                largest.voxels / math.prod(self.patch_size),
                "x".join(str(p) for p in self.patch_size),
            )
        return Dataset(items, transform)

    def loader_options(self) -> LoaderOptions:
        """``num_workers``/``pin_memory``/``persistent_workers`` for the trainer's device."""
        trainer = self.trainer
        device = trainer.strategy.root_device.type if trainer is not None else "cpu"
        devices = trainer.num_devices if trainer is not None else 1
        asked = (self.num_workers, self.pin_memory, self.persistent_workers)
        return resolve_loader_options(*asked, device, devices, cuda_initialized=self.cuda_before)

    def shard(self) -> tuple[int | None, int | None]:
        """``(rank, world size)`` of this process: the trainer's (``None``: torch.distributed's)."""
        trainer = self.trainer
        return (None, None) if trainer is None else (trainer.global_rank, trainer.world_size)

    def train_dataloader(self) -> DataLoader:
        sampler = EpochSeededSampler(len(self._train_ds), self._seed, *self.shard())
        options = self.loader_options()
        context = options.multiprocessing_context
        log.info(
            "Training loader: %d worker(s)%s, pin_memory=%s, persistent_workers=%s "
            "(data.num_workers=%s%s)",
            options.num_workers,
            f" started by {context} (CUDA was initialised before the data)" if context else "",
            options.pin_memory,
            options.persistent_workers,
            self.num_workers,
            f": {options.cores_from}" if options.cores_from else "",
        )
        loader = ResumableLoader(
            self._train_ds,
            batch_size=self.batch_size,
            sampler=sampler,
            # the sampler seeds every item; a fixed generator keeps the loader off the global RNG
            generator=torch.Generator().manual_seed(self._seed),
            **options.loader_kwargs(),
        )
        loader.progress = self._epoch_progress  # its position goes into every checkpoint
        return loader

    def _epoch_progress(self) -> tuple[int, int]:
        """(batches trained on in the current epoch, batches in the epoch), from the trainer."""
        trainer = self.trainer
        done = trainer.fit_loop.epoch_loop.batch_progress.current.processed
        return int(done), int(trainer.num_training_batches)

    def val_dataloader(self) -> DataLoader:
        """Whole validation volumes, batch 1, sharded by :class:`ShardedEvalSampler`."""
        return eval_loader(self._val_ds, self.loader_options(), *self.shard())
