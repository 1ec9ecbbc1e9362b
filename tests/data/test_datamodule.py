import hydra
import pytest
import torch

from tests.conftest import SMALL_PATCH
from volseg.utils.entry import user_error
from volseg.utils.errors import UserInputError


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


def test_epoch_seeded_sampler_shards_by_rank_and_changes_with_the_epoch():
    from volseg.data.sampling import EpochSeededSampler

    sampler = EpochSeededSampler(10, seed=3)
    sampler.set_epoch(0)
    first = list(sampler)
    assert sorted(i for i, _ in first) == list(range(10)) and len(sampler) == 10
    assert len({seed for _, seed in first}) == 10  # each item its own augmentation seed
    sampler.set_epoch(1)
    assert list(sampler) != first
    sampler.set_epoch(0)
    assert list(sampler) == first  # a function of (seed, epoch) only
    shards = [[i for i, _ in EpochSeededSampler(10, 3, rank=r, world=3)] for r in (0, 1, 2)]
    assert [len(s) for s in shards] == [4, 4, 4]
    assert set().union(*shards) == set(range(10))


def _epoch_batches(datamodule, epoch: int) -> list[dict]:
    loader = datamodule.train_dataloader()
    loader.sampler.set_epoch(epoch)
    return list(loader)


def test_patches_do_not_depend_on_loader_workers(train_cfg):
    """Item seeds travel with the indices: 0 workers, or 2 persistent ones, give the same
    patches and augmentations, epoch after epoch (exact resume needs this)."""
    batches = {}
    for workers in (0, 2):
        datamodule = hydra.utils.instantiate(
            train_cfg.data, num_workers=workers, persistent_workers=True
        )
        datamodule.prepare_data()
        datamodule.setup("fit")
        batches[workers] = _epoch_batches(datamodule, 0) + _epoch_batches(datamodule, 1)
    assert len(batches[0]) == len(batches[2]) == 4
    for a, b in zip(batches[0], batches[2], strict=True):
        assert torch.equal(a["image"], b["image"]) and torch.equal(a["label"], b["label"])
    assert not torch.equal(batches[0][0]["image"], batches[0][2]["image"])  # epochs differ


def test_loader_options_follow_the_device(monkeypatch):
    from volseg.data import loader_options
    from volseg.data.loader_options import LoaderOptions, resolve_loader_options

    monkeypatch.setattr(loader_options, "available_cores", lambda: 16)
    assert resolve_loader_options("auto", "auto", "auto", "cuda") == LoaderOptions(8, True, True)
    assert resolve_loader_options("auto", "auto", "auto", "cuda", 4) == LoaderOptions(3, True, True)
    assert resolve_loader_options("auto", "auto", "auto", "cpu") == LoaderOptions(0, False, False)
    assert resolve_loader_options(2, False, "auto", "cuda") == LoaderOptions(2, False, True)
    monkeypatch.setattr(loader_options, "available_cores", lambda: 1)
    assert resolve_loader_options("auto", "auto", "auto", "cuda").num_workers == 1


def test_bad_loader_option_names_the_key(train_cfg):
    with pytest.raises(Exception) as raised:  # Hydra wraps it; the entry point unwraps it
        hydra.utils.instantiate(train_cfg.data, num_workers=-1)
    err = user_error(raised.value)
    assert isinstance(err, UserInputError)
    assert str(err) == "data.num_workers=-1: expected auto or a number >= 0"


def test_validation_shards_count_every_case_exactly_once_and_pad_to_equal_length():
    """DistributedSampler would pad 5 cases on 2 ranks to 6, validating one case twice; here the
    padding key is marked not counted, and a rank without a case still gets a batch."""
    from volseg.data.sampling import ShardedEvalSampler

    shards = [list(ShardedEvalSampler(5, rank=r, world=2)) for r in (0, 1)]
    assert [[i for i, counted in s if counted] for s in shards] == [[0, 2, 4], [1, 3]]
    assert [len(s) for s in shards] == [3, 3] and shards[1][-1][1] is False
    shards = [list(ShardedEvalSampler(3, rank=r, world=5)) for r in range(5)]
    assert [len(s) for s in shards] == [1] * 5
    assert sorted(s[0][0] for s in shards if s[0][1]) == [0, 1, 2]
    assert [s[0][1] for s in shards] == [True, True, True, False, False]
    assert list(ShardedEvalSampler(3)) == [(0, True), (1, True), (2, True)]  # one process


@pytest.mark.slow
def test_num_classes_null_takes_the_classes_from_classes_json(small_dataset, tmp_path):
    import json
    import shutil

    from tests.conftest import compose_config
    from volseg.plan import plan_run

    root = tmp_path / "regions"
    shutil.copytree(small_dataset, root)
    names = ["background", *(f"region_{k}" for k in range(1, 9))]  # labels use 0..4 of 9
    (root / "classes.json").write_text(json.dumps(names))
    overrides = [f"data.root={root}", "data.mni152=null", f"data.patch_size={SMALL_PATCH}"]
    cfg = compose_config("train", tmp_path / "run", ["data=mni152_regions", *overrides])
    assert cfg.data.num_classes is None and cfg.num_classes == 5
    datamodule = hydra.utils.instantiate(cfg.data)
    datamodule.check()
    assert datamodule.num_classes == 9 and datamodule.class_names == names
    planned = plan_run(cfg).run_config()
    assert planned.num_classes == 9  # the model is built for the dataset's classes
    assert planned.model.net.num_classes == 9

    (root / "classes.json").unlink()
    with pytest.raises(UserInputError, match=r"data.num_classes=null .*classes.json"):
        hydra.utils.instantiate(cfg.data).check()


def test_patch_centres_follow_the_class_ratios(tmp_path):
    """The class at each patch's centre is the class drawn: over 400 patches the classes come
    at the configured ratios (a class of ratio 0 never), from the cached class locations."""
    import numpy as np

    from tests.conftest import compose_config
    from volseg.data.io import write_volume

    label = np.zeros((40, 40, 40), dtype=np.uint8)
    for k, corner in enumerate([(12, 12, 12), (12, 24, 12), (24, 12, 24), (24, 24, 24)], 1):
        z, y, x = corner
        label[z : z + 5, y : y + 5, x : x + 5] = k  # inside: no centre is moved off it
    rng = np.random.default_rng(0)
    for i in range(2):
        for sub, array in (("images", rng.standard_normal(label.shape)), ("labels", label)):
            write_volume(tmp_path / "data" / sub / f"c{i}.nii.gz", array.astype(np.float32))
    ratios = [1, 2, 0, 1, 4]
    cfg = compose_config(
        "train",
        tmp_path / "run",
        [
            "data=folder",
            f"data.root={tmp_path / 'data'}",
            "data.patch_size=[8,8,8]",
            f"data.class_ratios={ratios}",
            "data.samples_per_volume=400",
            "data.val_fraction=0.5",
            "data.max_locations_per_class=50",
        ],
    )
    datamodule = hydra.utils.instantiate(cfg.data)
    datamodule.setup("fit")
    counts = torch.zeros(5)
    for batch in datamodule.train_dataloader():
        centres = batch["label"][:, 0, 4, 4, 4].long()
        counts += torch.bincount(centres, minlength=5)
    assert counts.sum() == 400 and counts[2] == 0
    expected = torch.tensor(ratios, dtype=torch.float) / sum(ratios)
    assert torch.allclose(counts / 400, expected, atol=0.07), counts


def test_loaders_shard_by_the_trainers_world_across_nodes(train_cfg):
    """2 nodes x 2 devices: 4 ranks, whatever torch.distributed says before the launch."""
    from lightning.pytorch import Trainer

    datamodule = hydra.utils.instantiate(train_cfg.data, samples_per_volume=4)
    datamodule.prepare_data()
    datamodule.setup("fit")
    datamodule.trainer = Trainer(
        accelerator="cpu", devices=2, num_nodes=2, strategy="ddp", logger=False
    )
    assert datamodule.trainer.world_size == 4
    train_sampler = datamodule.train_dataloader().sampler
    assert (train_sampler.rank, train_sampler.world, len(train_sampler)) == (0, 4, 4)
    val_sampler = datamodule.val_dataloader().sampler  # 2 cases on 4 ranks
    assert (val_sampler.rank, val_sampler.world, list(val_sampler)) == (0, 4, [(0, True)])
