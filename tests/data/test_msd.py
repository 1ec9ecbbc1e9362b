"""data=msd: dataset.json + imagesTr/ + labelsTr/, channels stacked, shape from dataset.json."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from tests.conftest import REPO, compose_config, tiny_train_overrides
from volseg.data.io import read_array, read_geometry, write_volume
from volseg.tasks.evaluate import evaluate
from volseg.tasks.predict import predict
from volseg.tasks.train import train
from volseg.utils.errors import UserInputError

CLASSES = ["background", "blob", "other"]


def make_msd(source: Path, root: Path) -> Path:
    """The small synthetic dataset as a 2-channel, 3-class MSD dataset (+ one imagesTs case)."""
    names = sorted(p.name for p in (source / "images").glob("*.nii.gz"))
    for name in names:
        case_id = name.removesuffix(".nii.gz")
        affine = read_geometry(source / "images" / name)["affine"]
        image = read_array(source / "images" / name)
        label = np.minimum(read_array(source / "labels" / name), 2).astype(np.uint8)
        write_volume(root / "imagesTr" / f"{case_id}_0000.nii.gz", image, affine=affine)
        write_volume(root / "imagesTr" / f"{case_id}_0001.nii.gz", -image, affine=affine)
        write_volume(root / "labelsTr" / name, label, affine=affine)
    test_image = read_array(source / "images" / names[0])
    for channel, sign in enumerate((1, -1)):
        target = root / "imagesTs" / f"new_case_{channel:04d}.nii.gz"
        write_volume(target, sign * test_image, spacing_zyx=(3.0, 0.7, 0.7))
    dataset = {
        "channel_names": {"0": "raw", "1": "inverted"},
        "labels": {"background": 0, "blob": 1, "other": 2},
        "numTraining": len(names),
        "file_ending": ".nii.gz",
    }
    (root / "dataset.json").write_text(json.dumps(dataset))
    shutil.copy(source / "splits.json", root / "splits.json")
    return root


@pytest.fixture
def msd_root(small_dataset, tmp_path) -> Path:
    return make_msd(small_dataset, tmp_path / "msd")


@pytest.fixture
def msd_module(msd_root, data_module):
    """The ``data=msd`` datamodule of :func:`msd_root`, patch ``[16, 32, 32]``."""
    return lambda: data_module("msd", msd_root, "patch_size=[16,32,32]")


@pytest.mark.slow
def test_msd_trains_with_shape_and_names_from_dataset_json_and_predicts(msd_root, tmp_path):
    overrides = [*tiny_train_overrides(msd_root), "data=msd", "trainer.max_epochs=1"]
    cfg = compose_config("train", tmp_path / "train", overrides)
    metrics = train(cfg)

    decisions = yaml.safe_load((tmp_path / "train" / "plan.yaml").read_text())["decisions"]
    assert decisions["num_classes"]["value"] == 3 and decisions["in_channels"]["value"] == 2
    assert decisions["num_classes"]["source"] == "the data"  # dataset.json, via the run plan
    assert {f"val/dice_{name}" for name in CLASSES} <= set(metrics)
    ckpt = tmp_path / "train" / "checkpoints" / "last.ckpt"
    state = torch.load(ckpt, weights_only=True)
    assert state["state_dict"]["net.inc.0.weight"].shape[1] == 2  # in_channels from the json
    assert state["volseg"]["config"]["model"]["net"]["num_classes"] == 3
    with open(tmp_path / "train" / "csv" / "metrics.csv") as f:
        assert "val/dice_other" in next(csv.reader(f))
    # eval.py rebuilds the msd datamodule from the saved config (dataset.json read again)
    scores = evaluate(compose_config("eval", tmp_path / "eval", [f"ckpt_path={ckpt}"]))
    assert {f"val/dice_{name}" for name in CLASSES} <= set(scores)
    written = sorted((tmp_path / "eval" / "predictions").iterdir())
    assert written and all("_0000" not in p.name for p in written)  # named by case, not channel

    out = tmp_path / "pred"
    cfg = compose_config(
        "predict",
        tmp_path / "predict",
        [f"ckpt_path={ckpt}", f"input={msd_root}/imagesTs", f"output={out}"],
    )
    predict(cfg)
    assert sorted(p.name for p in out.iterdir()) == ["new_case.nii.gz"]
    pred, source = out / "new_case.nii.gz", msd_root / "imagesTs" / "new_case_0000.nii.gz"
    assert read_geometry(pred)["shape_zyx"] == read_geometry(source)["shape_zyx"]
    assert np.allclose(read_geometry(pred)["affine"], read_geometry(source)["affine"])
    assert read_array(pred).max() < 3

    # one channel file: predict.py finds its sibling; without it, the channel count is named
    cfg = compose_config(
        "predict", tmp_path / "predict2", [f"ckpt_path={ckpt}", f"input={source}", f"output={out}2"]
    )
    predict(cfg)
    assert np.array_equal(read_array(Path(f"{out}2") / "new_case.nii.gz"), read_array(pred))
    (msd_root / "imagesTs" / "new_case_0001.nii.gz").unlink()
    cfg = compose_config(
        "predict", tmp_path / "predict3", [f"ckpt_path={ckpt}", f"input={source}", f"output={out}3"]
    )
    with pytest.raises(
        UserInputError, match=r"new_case_0000.nii.gz: 1 image channel\(s\) .* in_channels=2"
    ):
        predict(cfg)


def test_dataset_json_disagreements_are_reported_together(msd_root, msd_module):
    (msd_root / "imagesTr" / "case_001_0001.nii.gz").unlink()
    shutil.copy(
        msd_root / "imagesTr" / "case_002_0000.nii.gz",
        msd_root / "imagesTr" / "case_002_0002.nii.gz",
    )
    label = msd_root / "labelsTr" / "case_003.nii.gz"
    write_volume(label, read_array(label) + 1, affine=read_geometry(label)["affine"])
    write_volume(msd_root / "imagesTr" / "case_000_0001.nii.gz", np.zeros((16, 48, 40), np.float32))
    dataset = json.loads((msd_root / "dataset.json").read_text())
    dataset["training"] = [
        {"image": "./imagesTr/case_000.nii.gz", "label": "./labelsTr/gone.nii.gz"}
    ]
    (msd_root / "dataset.json").write_text(json.dumps(dataset))

    with pytest.raises(UserInputError) as err:
        msd_module().check()
    text = str(err.value)
    assert "5 problem(s) in the dataset" in text
    assert (
        f"{msd_root}/imagesTr/case_000_0001.nii.gz: shape (40, 48, 16) as stored (x, y, z), "
        "[D, H, W] = [16, 48, 40] after orientation to RAS differs from case_000_0000.nii.gz's "
        "(48, 48, 16) as stored (x, y, z), [D, H, W] = [16, 48, 48] after orientation to RAS"
    ) in text
    listed = f"{msd_root}/dataset.json lists 2 channel(s) (raw, inverted)"
    assert f"{msd_root}/imagesTr/case_001_0001.nii.gz: missing; {listed}" in text
    assert f"{msd_root}/imagesTr/case_002_0002.nii.gz: an extra channel; {listed}" in text
    assert (
        f"{msd_root}/dataset.json: lists ./labelsTr/gone.nii.gz ('training' label), file not found"
        in text
    )
    assert (
        f"{label}: label values [3] outside [0, 3) (3 classes listed in {msd_root}/dataset.json)"
        in text
    )


def test_unpaired_files_num_training_and_bad_json(msd_root, msd_module):
    (msd_root / "labelsTr" / "case_000.nii.gz").unlink()
    for channel in ("0000", "0001"):
        (msd_root / "imagesTr" / f"case_005_{channel}.nii.gz").unlink()
    with pytest.raises(UserInputError) as err:
        msd_module().check()
    text = str(err.value)
    assert f"{msd_root}/imagesTr/case_000_0000.nii.gz: image has no label" in text
    assert f"{msd_root}/labelsTr/case_005.nii.gz: label has no image" in text
    assert f"{msd_root}/dataset.json: numTraining=6, but {msd_root}/labelsTr holds 5 labels" in text

    (msd_root / "dataset.json").write_text(
        '{"labels": {"0": "background", "2": "x"}, "modality": {"0": "a"}}'
    )
    with pytest.raises(
        UserInputError, match=r"dataset.json: 'labels' indices must be 0..1, got \[0, 2\]"
    ):
        msd_module().check()
    (msd_root / "dataset.json").unlink()
    with pytest.raises(UserInputError, match=r"no dataset.json"):
        msd_module().check()


@pytest.mark.slow
def test_explicit_num_classes_must_agree_and_bad_data_exits_cleanly(
    msd_root, tmp_path, data_module
):
    with pytest.raises(UserInputError, match=r"data.num_classes=5: .*dataset.json says 3"):
        data_module("msd", msd_root, "num_classes=5").check()

    (msd_root / "imagesTr" / "case_004_0001.nii.gz").unlink()
    before = {p: p.read_bytes() for p in msd_root.rglob("*") if p.is_file()}
    result = subprocess.run(
        [
            sys.executable,
            "train.py",
            "data=msd",
            f"data.root={msd_root}",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2
    assert f"{msd_root}/imagesTr/case_004_0001.nii.gz: missing" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert {p: p.read_bytes() for p in msd_root.rglob("*") if p.is_file()} == before
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_channel_files_stay_stacked_when_cached_in_threads(msd_root, msd_module):
    """MONAI's NibabelReader is not thread-safe: CacheDataset's threads truncated 2-channel
    images to 1 channel in about 1 of 6 loads before volseg's NiftiReader."""
    from monai.data import CacheDataset

    from volseg.data.transforms import eval_transforms

    dm = msd_module()
    dm.check()
    items = [c.as_dict() for c in dm.train_cases + dm.val_cases]
    for _ in range(8):
        ds = CacheDataset(items, eval_transforms(), num_workers=4, progress=False)
        assert [tuple(ds[i]["image"].shape) for i in range(len(ds))] == [(2, 16, 48, 48)] * 6


def test_nnunet_test_images_group_by_case_from_the_task_folder(msd_root, msd_module):
    dm = msd_module()
    cases = dm.predict_cases(msd_root, in_channels=2)  # no 'test' list: imagesTs/
    assert [(c.name, [p.name for p in c.image_files]) for c in cases] == [
        ("new_case.nii.gz", ["new_case_0000.nii.gz", "new_case_0001.nii.gz"])
    ]
    assert dm.layout == "nnunet"
    # nnU-Net v1 lists test images without their channel suffix
    dataset = json.loads((msd_root / "dataset.json").read_text())
    (msd_root / "dataset.json").write_text(
        json.dumps({**dataset, "test": ["./imagesTs/new_case.nii.gz"]})
    )
    assert [c.name for c in dm.predict_cases(msd_root, in_channels=2)] == ["new_case.nii.gz"]
