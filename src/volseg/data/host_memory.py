"""Host memory of the data side of a training run, estimated from the files' headers, per
training process (a DDP rank has its own):

- caches (``data.cache=memory``): the first ``int(len * cache_rate)`` volumes of each split
  (MONAI ``CacheDataset``'s count), float32 image and label (``LoadImaged`` reads labels as
  float32 too) after ``data.spacing``; training volumes padded to the patch, with their class
  locations (int64, up to ``max_locations_per_class`` per class);
- loader copies: each loading process works on one volume: a volume cached in memory is read in
  place (``copy_cache=False``: only its patch is copied), one on disk is read whole, an uncached
  one read and converted (two copies) with its class locations found again;
- batches in flight: ``PREFETCH_FACTOR`` per worker, as many pinned with ``pin_memory``;
  validation batches are whole volumes. The two loaders never load at once: the larger counts.

Forked workers share the cache's pages (never written; ``ps`` counts them in every worker's
RSS); ``spawn``/``forkserver`` workers unpickle their own copy, which is counted. Not counted:
each worker's interpreter and libraries, and the training step (``estimate_memory.py``).
"""

from __future__ import annotations

import math
import multiprocessing
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from volseg.data.cases import Case
from volseg.data.io import read_geometry
from volseg.data.orientation import oriented_geometry
from volseg.data.transforms import resampled_shape

FLOAT32 = 4
INDEX = 8  # int64 voxel index of a class location
#: torch DataLoader's default batches in flight per worker
PREFETCH_FACTOR = 2
CACHE_MODES = ("memory", "disk", "none")


@dataclass(frozen=True)
class VolumeBytes:
    """One case after the loading transforms: voxels ``[D, H, W]`` and bytes of image and label."""

    shape_zyx: tuple[int, int, int]
    image: int
    label: int
    #: the class locations cached with a training volume
    locations: int = 0

    @property
    def total(self) -> int:
        return self.image + self.label + self.locations

    @property
    def voxels(self) -> int:
        return math.prod(self.shape_zyx)


def volume_bytes(
    case: Case,
    spacing: Sequence[float] | None = None,
    pad_to: Sequence[int] | None = None,
    locations: tuple[int, int | None] | None = None,
    orientation: str | None = None,
) -> VolumeBytes:
    """Bytes of a case after loading (float32 image and label), from its headers only:
    resampled to ``spacing`` ``[z, y, x]`` after reorienting to ``orientation``, padded to
    ``pad_to`` (a training volume's patch), with ``locations=(num_classes,
    max_locations_per_class)``: its cached class locations (int64, at most ``min(voxels,
    num_classes * max)``)."""
    channels = 0
    geometry: dict[str, Any] = {}
    for path in case.image_files:
        geometry = oriented_geometry(read_geometry(path, case.image_key), orientation)
        channels += int(geometry["channels"])
    shape = resampled_shape(geometry["shape_zyx"][:3], geometry["affine"], spacing)
    if pad_to is not None:
        shape = [max(s, int(p)) for s, p in zip(shape, pad_to, strict=True)]
    voxels = math.prod(shape)
    label = voxels * FLOAT32 if case.label is not None else 0
    kept = 0
    if locations is not None and case.label is not None:
        num_classes, limit = locations
        kept = INDEX * (voxels if limit is None else min(voxels, num_classes * limit))
    return VolumeBytes((shape[0], shape[1], shape[2]), channels * voxels * FLOAT32, label, kept)


@dataclass
class HostEstimate:
    """Host memory of the data side (bytes): caches, loaders' copies and batches
    (``*_loading``) and the caches non-forked workers hold again (``spawned_copies``), per
    process; ``process_rss``: this process now; ``rejected``: cases the checks will reject."""

    cache: str
    cache_rate: float
    ranks: int
    num_workers: int
    pin_memory: bool
    start_method: str
    train_volumes: int
    train_cached: int
    train_cache: int
    val_volumes: int
    val_cached: int
    val_cache: int
    train_loading: int
    val_loading: int
    spawned_copies: int
    process_rss: int
    rejected: list[str] = field(default_factory=list)

    @property
    def cache_bytes(self) -> int:
        """The caches of all ranks."""
        return self.ranks * (self.train_cache + self.val_cache + self.spawned_copies)

    @property
    def data_total(self) -> int:
        """Caches plus the larger loader's copies and batches, all ranks."""
        return self.cache_bytes + self.ranks * max(self.train_loading, self.val_loading)

    @property
    def total(self) -> int:
        """Predicted host total: this process now plus the data side."""
        return self.process_rss + self.data_total

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "cache_bytes": self.cache_bytes,
            "data_total": self.data_total,
            "total": self.total,
        }


def estimate_host(
    train: Sequence[VolumeBytes],
    val: Sequence[VolumeBytes],
    cache: str,
    cache_rate: float,
    batch_size: int,
    patch_size: Sequence[int],
    in_channels: int,
    num_workers: int,
    pin_memory: bool,
    ranks: int = 1,
    start_method: str | None = None,
    rejected: Sequence[str] = (),
) -> HostEstimate:
    """The data side's host memory (see the module docstring); ``train`` padded, in order."""
    start_method = start_method or multiprocessing.get_start_method()
    # MONAI's CacheDataset caches the first int(len * cache_rate) items
    n_train = min(len(train), int(len(train) * cache_rate)) if cache == "memory" else 0
    n_val = min(len(val), int(len(val) * cache_rate)) if cache == "memory" else 0
    train_cache = sum(v.total for v in train[:n_train])
    val_cache = sum(v.total for v in val[:n_val])
    loaders = max(1, num_workers)  # 0 workers: the training process loads
    in_flight = PREFETCH_FACTOR * num_workers if num_workers else 1
    pinned = in_flight if pin_memory else 0
    batch = batch_size * math.prod(int(p) for p in patch_size) * (in_channels + 1) * FLOAT32
    if n_train == len(train) and train:  # every volume read in place: patch copies only
        largest = 0
    elif cache == "disk":  # read whole, class locations included, per sample
        largest = max((v.total for v in train), default=0)
    else:  # read and converted (two copies), class locations found again
        largest = max((2 * (v.image + v.label) + INDEX * v.voxels for v in train), default=0)
    train_loading = loaders * largest + (in_flight + pinned) * batch
    val_largest = max((v.total for v in val), default=0)
    # validation batches are whole volumes: the collated copy, in flight and pinned
    val_loading = (min(len(val), loaders) + min(len(val), in_flight + pinned)) * val_largest
    forked = start_method == "fork"
    spawned = 0 if forked or num_workers == 0 else num_workers * (train_cache + val_cache)
    return HostEstimate(
        cache=cache,
        cache_rate=float(cache_rate),
        ranks=ranks,
        num_workers=num_workers,
        pin_memory=pin_memory,
        start_method=start_method,
        train_volumes=len(train),
        train_cached=n_train,
        train_cache=train_cache,
        val_volumes=len(val),
        val_cached=n_val,
        val_cache=val_cache,
        train_loading=train_loading,
        val_loading=val_loading,
        spawned_copies=spawned,
        process_rss=process_rss(),
        rejected=list(rejected),
    )


def local_processes(trainer_cfg: Any, device: str) -> int:
    """Training processes on this machine (``trainer.devices``; each DDP rank has its own
    caches and loaders): a count, a list of devices, ``-1``/``auto`` (every GPU; 1 on a CPU)."""
    devices = trainer_cfg.get("devices", 1) if trainer_cfg is not None else 1
    if isinstance(devices, Sequence) and not isinstance(devices, str):
        return max(1, len(devices))
    if str(devices) in ("-1", "auto"):
        return max(1, torch.cuda.device_count()) if device == "cuda" else 1
    try:
        return max(1, int(devices))
    except (TypeError, ValueError):
        return 1  # a malformed value is the trainer's error, named there


def _field(path: Path, pattern: str) -> int | None:
    """The integer of ``pattern``'s group in the file ``path``; None without the file or a match."""
    try:
        match = re.search(pattern, path.read_text(), re.M)
    except OSError:
        return None
    return int(match.group(1)) if match else None


def process_rss() -> int:
    """This process's resident set now (VmRSS, bytes); 0 where /proc is missing."""
    kib = _field(Path("/proc/self/status"), r"^VmRSS:\s+(\d+) kB")
    return 1024 * kib if kib else 0


def _cgroup_available() -> int | None:
    """Bytes the memory cgroup still allows (limit − usage, page cache that can be dropped not
    counted as used); ``None`` without a limit."""
    number = r"^(\d+)$"
    for folder, limit_file, usage_file in (
        (Path("/sys/fs/cgroup"), "memory.max", "memory.current"),  # v2 writes "max": no limit
        (Path("/sys/fs/cgroup/memory"), "memory.limit_in_bytes", "memory.usage_in_bytes"),
    ):
        limit, usage = _field(folder / limit_file, number), _field(folder / usage_file, number)
        if limit is not None:
            break
    # v1 writes "no limit" as a huge number
    if limit is None or usage is None or limit >= 2**60:
        return None
    reclaimable = _field(folder / "memory.stat", r"^(?:total_)?inactive_file (\d+)") or 0
    return max(0, limit - max(0, usage - reclaimable))


def available_ram() -> tuple[int | None, str]:
    """RAM a new allocation can get without swapping (bytes), and where the figure comes from:
    MemAvailable of /proc/meminfo, or the memory cgroup's room when that is lower."""
    available, source = None, "unknown"
    kib = _field(Path("/proc/meminfo"), r"^MemAvailable:\s+(\d+) kB")
    if kib is not None:
        available, source = 1024 * kib, "MemAvailable in /proc/meminfo"
    room = _cgroup_available()
    if room is not None and (available is None or room < available):
        available, source = room, "the memory cgroup's limit"
    return available, source


def fitting_cache_rate(
    rate_for: Any, available: int, cache_rate: float, step: float = 0.05
) -> float | None:
    """The largest ``data.cache_rate`` below ``cache_rate`` (in ``step``s) whose estimate
    ``rate_for(rate)`` fits ``available`` bytes; ``None`` if not even 0 fits."""
    rate = math.floor(cache_rate / step) * step
    while rate >= 0:
        if rate_for(round(rate, 4)).data_total <= available:
            return round(rate, 4)
        rate -= step
    return None
