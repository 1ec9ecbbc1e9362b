"""data.cache=memory|disk|none: each trains and draws the same seeded patches; the disk cache is
reused by a second run and keyed by the loading settings; a memory cache that does not fit the
RAM stops train.py before any volume is loaded."""

from __future__ import annotations

import re
from pathlib import Path

import hydra
import pytest
import torch
from monai.data import PersistentDataset

from tests.conftest import compose_config, tiny_train_overrides
from volseg.data import datamodule as datamodule_module
from volseg.data.datamodule import disk_cache_dir
from volseg.data.transforms import eval_transforms
from volseg.tasks.train import train
from volseg.utils.entry import run_task


def _cfg(small_dataset: Path, run_dir: Path, *overrides: str):
    return compose_config(
        "train",
        run_dir,
        [
            *tiny_train_overrides(small_dataset),
            "trainer.max_epochs=1",
            "callbacks.validation_overlays=null",
            *overrides,
        ],
    )


def _files(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*.pt")}


@pytest.mark.slow
def test_disk_cache_trains_and_a_second_run_reuses_it(small_dataset, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    overrides = ["data.cache=disk", f"data.cache_dir={cache}"]
    train(_cfg(small_dataset, tmp_path / "first", *overrides))
    written = _files(cache)
    # 4 training and 2 validation volumes, each written once, in one folder per role
    assert len(written) == 6
    assert sorted({Path(name).parts[0].split("-")[0] for name in written}) == ["train", "val"]
    loads = []
    pre_transform = PersistentDataset._pre_transform

    def counting(self, item):  # runs only on a cache miss
        loads.append(item["name"])
        return pre_transform(self, item)

    monkeypatch.setattr(PersistentDataset, "_pre_transform", counting)
    metrics = train(_cfg(small_dataset, tmp_path / "second", *overrides))
    assert "val/dice_mean" in metrics
    assert loads == [] and _files(cache) == written  # read back, nothing loaded or rewritten


def test_no_cache_trains(small_dataset, tmp_path):
    metrics = train(_cfg(small_dataset, tmp_path / "run", "data.cache=none"))
    assert "val/dice_mean" in metrics and "train/loss" in metrics


def test_every_cache_mode_draws_the_same_seeded_patches(small_dataset, tmp_path):
    """A patch is a function of (position, seed) whatever holds the volumes: seeded sampling
    and mid-epoch resume behave alike for data.cache=memory, disk and none."""
    patches = {}
    for mode in ("memory", "disk", "none"):
        cfg = _cfg(small_dataset, tmp_path / mode, f"data.cache={mode}")
        dm = hydra.utils.instantiate(cfg.data, cache_dir=str(tmp_path / "cache"))
        dm.setup("fit")
        # the class-balanced crop returns a list of its num_samples (1) patches
        patches[mode] = [dm._train_ds[(position, 1234 + position)][0] for position in range(3)]
        val = dm._val_ds[0]["image"]
        assert val.shape[1:] == (16, 48, 48)
    for mode in ("disk", "none"):
        for mine, reference in zip(patches[mode], patches["memory"], strict=True):
            assert torch.equal(mine["image"], reference["image"]), mode
            assert torch.equal(mine["label"], reference["label"]), mode


def test_disk_cache_folder_changes_with_the_loading_settings(tmp_path):
    transform = eval_transforms()
    plain = disk_cache_dir(tmp_path, "val", transform, {"spacing": None})
    assert disk_cache_dir(tmp_path, "val", transform, {"spacing": None}) == plain
    resampled = disk_cache_dir(
        tmp_path, "val", eval_transforms(spacing=[2, 1, 1]), {"spacing": [2, 1, 1]}
    )
    assert resampled != plain
    assert disk_cache_dir(tmp_path, "train", transform, {"spacing": None}) != plain
    assert '"spacing": null' in (plain / "key.json").read_text()


def test_a_file_rewritten_in_place_is_loaded_again(small_dataset, tmp_path):
    from volseg.data.datamodule import item_hash

    image = tmp_path / "a.nii.gz"
    image.write_bytes(sorted((small_dataset / "images").iterdir())[0].read_bytes())
    item = {"name": "a", "image": str(image), "image_path": str(image)}
    before = item_hash(item)
    image.write_bytes(image.read_bytes() + b"\0")
    assert item_hash(item) != before


def test_memory_cache_too_big_is_refused_before_any_volume_is_loaded(
    small_dataset, tmp_path, monkeypatch, capsys
):
    cfg = _cfg(small_dataset, tmp_path / "run")
    dm = hydra.utils.instantiate(cfg.data)
    room = dm.host_estimate("cpu", cache_rate=0.5).data_total  # what half the volumes need
    monkeypatch.setattr(datamodule_module, "available_ram", lambda: (room, "MemAvailable"))
    opened = []

    def no_reading(*args, **kwargs):
        opened.append(args)
        raise AssertionError("a volume was read")

    # every way a volume's voxels are read: the checks, and the datasets' loading transforms
    monkeypatch.setattr("volseg.data.cases.read_array", no_reading)
    monkeypatch.setattr(datamodule_module, "CacheDataset", no_reading)
    with pytest.raises(SystemExit) as stopped:
        run_task(train, cfg)
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and "Traceback" not in err
    assert "data.cache=memory" in err and "data.cache_rate=1" in err and "GiB" in err
    # the rate it names fits and caches as many volumes as 0.5 does (2 of 4)
    rate = float(re.search(r"data.cache_rate=([0-9.]+) fits", err).group(1))
    assert 0.5 <= rate < 0.75 and "data.cache=disk" in err
    assert opened == []
    assert not (tmp_path / "run" / "checkpoints").exists()
    # the same run with the cache on disk is not refused
    monkeypatch.undo()
    monkeypatch.setattr(datamodule_module, "available_ram", lambda: (room, "MemAvailable"))
    cfg = _cfg(small_dataset, tmp_path / "disk", "data.cache=disk", f"data.cache_dir={tmp_path}/c")
    assert "val/dice_mean" in train(cfg)


def test_a_case_problem_is_reported_before_the_cache_size(
    small_dataset, tmp_path, monkeypatch, capsys
):
    """Padded to a patch larger than every volume, the cache would look huge; the check's
    message (the patch) is the one to fix first."""
    monkeypatch.setattr(datamodule_module, "available_ram", lambda: (1, "MemAvailable"))
    cfg = _cfg(small_dataset, tmp_path / "run", "data.patch_size=[32,64,64]")
    with pytest.raises(SystemExit):
        run_task(train, cfg)
    err = capsys.readouterr().err
    assert "is larger than the volume" in err and "data.cache=memory" not in err


def _count_class_location_calls(monkeypatch) -> list[int]:
    """Every whole-volume search for class locations MONAI can make: ClassesToIndicesd's and
    the crop's own (when it is given no locations); each call appends the volume's voxels."""
    import monai.transforms.croppad.array as croppad
    import monai.transforms.utility.array as utility

    calls: list[int] = []
    for module in (croppad, utility):
        original = module.map_classes_to_indices

        def counting(label, *args, _original=original, **kwargs):
            calls.append(int(label.numel()))
            return _original(label, *args, **kwargs)

        monkeypatch.setattr(module, "map_classes_to_indices", counting)
    return calls


@pytest.mark.parametrize(
    ("mode", "per_volume"), [("memory", True), ("disk", True), ("none", False)]
)
def test_class_locations_are_found_once_per_cached_volume(
    small_dataset, tmp_path, monkeypatch, mode, per_volume
):
    """An epoch of 3 samples per volume searches each cached volume's labels once (when it is
    cached), an uncached one for every sample; a second run reads the disk cache's."""
    calls = _count_class_location_calls(monkeypatch)
    cfg = _cfg(small_dataset, tmp_path / mode, f"data.cache={mode}", "data.samples_per_volume=3")

    def epoch() -> int:
        dm = hydra.utils.instantiate(cfg.data, cache_dir=str(tmp_path / "cache"))
        dm.setup("fit")
        return sum(batch["image"].shape[0] for batch in dm.train_dataloader())

    samples = epoch()
    assert samples == 4 * 3
    assert len(calls) == (4 if per_volume else samples)
    if mode == "disk":
        calls.clear()
        assert epoch() == samples and calls == []
