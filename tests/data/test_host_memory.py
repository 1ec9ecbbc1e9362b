"""The host estimate of the data side: it follows data.cache, cache_rate and the volumes, and its
cache bytes are the bytes of the arrays the datasets really hold."""

from __future__ import annotations

from pathlib import Path

import hydra
import pytest

from tests.conftest import compose_config, tiny_train_overrides
from volseg.data import host_memory as host
from volseg.data.host_memory import (
    VolumeBytes,
    available_ram,
    estimate_host,
    fitting_cache_rate,
    local_processes,
)
from volseg.data.synthetic import generate_synthetic_dataset
from volseg.data.transforms import LOCATIONS_KEY
from volseg.tasks.estimate_memory import run_estimate


def _datamodule(small_dataset: Path, tmp_path: Path, *overrides: str):
    cfg = compose_config(
        "train", tmp_path / "run", [*tiny_train_overrides(small_dataset), *overrides]
    )
    datamodule = hydra.utils.instantiate(cfg.data)
    datamodule.prepare_data()
    return datamodule


def _cached_bytes(dataset) -> tuple[int, int]:
    """Bytes of the image and label arrays a MONAI CacheDataset holds, and of the class
    locations cached with the training volumes."""
    arrays = locations = 0
    for item in dataset._cache[: dataset.cache_num]:
        arrays += sum(item[k].numel() * item[k].element_size() for k in ("image", "label"))
        locations += sum(a.numel() * a.element_size() for a in item.get(LOCATIONS_KEY, []))
    return arrays, locations


@pytest.mark.parametrize(
    ("overrides", "tolerance"),
    [
        # the volume's own grid, padded to a patch longer than the volume in H: exact
        (["data.patch_size=[16,64,64]"], 0.0),
        # resampled (MONAI's Spacing rounds the extent half to even: 8.5 -> 8, 16.7 -> 17)
        (["data.spacing=[2.0,1.5,1.5]", "data.patch_size=[8,32,32]"], 0.0),
        (["data.cache_rate=0.5"], 0.0),
        (["data.cache_rate=0"], 0.0),
    ],
    ids=["padded", "resampled", "half", "none_cached"],
)
def test_cache_estimate_is_the_bytes_the_cache_holds(small_dataset, tmp_path, overrides, tolerance):
    datamodule = _datamodule(small_dataset, tmp_path, *overrides)
    est = datamodule.host_estimate("cpu")
    datamodule.setup("fit")
    train, val = datamodule._train_ds.dataset, datamodule._val_ds
    assert (est.train_cached, est.val_cached) == (train.cache_num, val.cache_num)
    sizes = datamodule._volume_sizes()[0]
    for role, dataset, cached in (("train", train, est.train_cached), ("val", val, est.val_cached)):
        arrays, locations = _cached_bytes(dataset)
        predicted = sum(v.image + v.label for v in sizes[role][:cached])
        assert predicted == pytest.approx(arrays, rel=tolerance, abs=0), (predicted, arrays)
        # class locations: at most max_locations_per_class per class, counted as that bound
        bound = sum(v.locations for v in sizes[role][:cached])
        assert (locations > 0) == (role == "train" and cached > 0)
        assert locations <= bound <= 5 * locations, (locations, bound)
    assert est.train_cache == sum(v.total for v in sizes["train"][: est.train_cached])


def test_estimate_follows_cache_rate_volumes_and_cache_mode():
    volumes = [VolumeBytes((10, 10, 10), 4000, 4000)] * 10
    val = [VolumeBytes((20, 10, 10), 8000, 8000)] * 2

    def est(train=volumes, cache="memory", rate=1.0, workers=0, pin=False, method="fork"):
        return estimate_host(train, val, cache, rate, 2, [8, 8, 8], 1, workers, pin, 1, method)

    full = est()
    assert full.train_cache == 10 * 8000 and full.val_cache == 2 * 16000
    # CacheDataset caches the first int(n * rate) items
    assert est(rate=0.35).train_cache == 3 * 8000 and est(rate=0.35).val_cache == 0
    assert est(train=volumes * 2).train_cache == 2 * full.train_cache
    bigger = [VolumeBytes((20, 10, 10), 8000, 8000)] * 10
    assert est(train=bigger).train_cache == 2 * full.train_cache
    for mode in ("disk", "none"):
        assert est(cache=mode).cache_bytes == 0 and est(cache=mode).data_total > 0
    # each worker loads its own volume; pinning adds the batches in flight once more
    assert est(workers=4).train_loading > est(workers=1).train_loading
    assert est(workers=2, pin=True).train_loading > est(workers=2).train_loading
    # forked workers share the cache; spawned ones unpickle their own copy
    assert est(workers=2).spawned_copies == 0
    assert est(workers=2, method="spawn").spawned_copies == 2 * (full.train_cache + full.val_cache)
    assert est().total == est().process_rss + est().data_total


def test_fitting_cache_rate_is_the_largest_that_fits():
    volumes = [VolumeBytes((10, 10, 10), 4000, 4000)] * 10

    def rate_for(rate: float):
        return estimate_host(volumes, [], "memory", rate, 1, [8, 8, 8], 1, 0, False, 1, "fork")

    room = rate_for(0.4).data_total  # 4 of 10 volumes
    rate = fitting_cache_rate(rate_for, room, 1.0)
    # 0.45 caches int(4.5) = 4 volumes too: the largest step of 0.05 that fits
    assert rate == 0.45 and rate_for(rate + 0.05).data_total > room
    assert fitting_cache_rate(rate_for, room - 1, 1.0) == 0.35
    assert fitting_cache_rate(rate_for, 0, 1.0) is None


def test_available_ram_takes_the_lower_of_meminfo_and_the_cgroup(monkeypatch):
    available, source = available_ram()
    assert available is None or available > 0
    monkeypatch.setattr(host, "_cgroup_available", lambda: 1234)
    assert available_ram() == (1234, "the memory cgroup's limit")


def test_local_processes_counts_the_ranks_of_this_machine():
    assert local_processes({"devices": 4}, "cuda") == 4
    assert local_processes({"devices": [0, 2]}, "cuda") == 2
    assert local_processes({"devices": "auto"}, "cpu") == 1


def test_estimate_memory_prints_and_writes_the_host_section(small_dataset, tmp_path, capsys):
    out = tmp_path / "estimate.json"
    cfg = compose_config(
        "estimate_memory",
        tmp_path / "run",
        [*tiny_train_overrides(small_dataset), "data.cache_rate=0.5", f"memory.json_out={out}"],
    )
    result = run_estimate(cfg)
    printed = capsys.readouterr().out
    assert "Host memory of the data side" in printed and "training cache (2/4 vol.)" in printed
    assert result["host"]["train_cached"] == 2 and result["host"]["total"] > 0
    # a dataset not there yet: the step estimate stands, the host section says why it is missing
    cfg = compose_config(
        "estimate_memory",
        tmp_path / "run2",
        [*tiny_train_overrides(small_dataset), f"data.root={tmp_path / 'nowhere'}"],
    )
    assert run_estimate(cfg)["host"] is None
    assert "Host memory: not estimated" in capsys.readouterr().out


def test_multichannel_volumes_count_every_channel(tmp_path):
    from volseg.data.cases import Case
    from volseg.data.host_memory import volume_bytes

    root = generate_synthetic_dataset(tmp_path / "s", num_volumes=2, num_val=1, shape=[8, 16, 16])
    image = sorted((root / "images").iterdir())[0]
    label = sorted((root / "labels").iterdir())[0]
    two = volume_bytes(Case("c", (image, image), label))
    assert two.image == 2 * 8 * 16 * 16 * 4 and two.label == 8 * 16 * 16 * 4
