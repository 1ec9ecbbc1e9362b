import hydra
import torch

from tests.conftest import SMALL_PATCH


def test_batches_have_patch_shape_and_every_class_is_sampled(train_cfg):
    datamodule = hydra.utils.instantiate(train_cfg.data, batch_size=2, samples_per_volume=8)
    datamodule.prepare_data()
    datamodule.setup("fit")
    seen = torch.zeros(5)
    batches = list(datamodule.train_dataloader())
    assert len(batches) == 4 * 8 // 2
    for batch in batches:
        assert batch["image"].shape == (2, 1, *SMALL_PATCH)
        assert batch["label"].shape == (2, 1, *SMALL_PATCH)
        seen += torch.bincount(batch["label"].long().flatten(), minlength=5)[:5] > 0
    # class-balanced sampling: each class appears in most batches, not only background
    assert (seen >= len(batches) // 2).all(), seen
    val = next(iter(datamodule.val_dataloader()))
    assert val["image"].shape == (1, 1, 16, 48, 48)
    assert datamodule.class_names == ["background", "blob", "tube", "shell", "granule"]


def test_synthetic_dataset_is_generated_only_at_its_own_root(train_cfg, tmp_path):
    target = tmp_path / "gen"
    synthetic = {"root": str(target), "num_volumes": 3, "num_val": 1, "shape": [8, 16, 16]}
    dm = hydra.utils.instantiate(train_cfg.data, root=str(target), synthetic=synthetic)
    dm.prepare_data()
    assert (target / "images").is_dir()
    other = tmp_path / "user_data"
    dm = hydra.utils.instantiate(train_cfg.data, root=str(other), synthetic=synthetic)
    dm.prepare_data()
    assert not other.exists()


def test_epoch_seeded_sampler_shards_by_rank_and_changes_with_the_epoch(monkeypatch):
    from volseg.data.sampling import EpochSeededSampler

    seen = []
    sampler = EpochSeededSampler(10, seed=3, on_epoch=seen.append)
    sampler.set_epoch(0)
    first = list(sampler)
    assert sorted(first) == list(range(10)) and len(sampler) == 10
    sampler.set_epoch(1)
    assert list(sampler) != first and len(seen) == 2 and seen[0] != seen[1]
    sampler.set_epoch(0)
    assert list(sampler) == first  # a function of (seed, epoch) only
    shards = []
    for rank in (0, 1, 2):
        monkeypatch.setattr(EpochSeededSampler, "_shard", lambda self, r=rank: (r, 3))
        shards.append(list(sampler))
    assert [len(s) for s in shards] == [4, 4, 4]
    assert set().union(*shards) == set(range(10))
