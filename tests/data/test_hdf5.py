"""data=hdf5: one file per volume with raw/label datasets; predictions back into HDF5."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest

from tests.conftest import (
    assert_logged_dice,
    compose_config,
    counted_dice,
    save_validation_predictions,
    tiny_train_overrides,
)
from volseg.data.io import read_array, read_geometry
from volseg.tasks.evaluate import evaluate
from volseg.tasks.predict import predict
from volseg.tasks.train import train
from volseg.utils.errors import UserInputError

SPACING = [2.0, 0.5, 0.25]  # element_size_um, z y x


def _write(path: Path, **datasets: np.ndarray) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as f:
        f.attrs["element_size_um"] = SPACING
        for key, array in datasets.items():
            f.create_dataset(key, data=array)
    return path


def make_hdf5(source: Path, root: Path) -> Path:
    """The small synthetic dataset as one HDF5 file per volume, with its splits."""
    for path in sorted((source / "images").glob("*.nii.gz")):
        name = path.name.replace(".nii.gz", ".h5")
        label = read_array(source / "labels" / path.name)
        _write(root / name, raw=read_array(path), label=label)
    splits = json.loads((source / "splits.json").read_text())
    splits = {k: [n.replace(".nii.gz", ".h5") for n in v] for k, v in splits.items()}
    (root / "splits.json").write_text(json.dumps(splits))
    return root


@pytest.fixture
def h5_root(small_dataset, tmp_path) -> Path:
    return make_hdf5(small_dataset, tmp_path / "h5")


def test_hdf5_trains_and_predicts_into_hdf5_with_the_voxel_size(h5_root, tmp_path):
    val = json.loads((h5_root / "splits.json").read_text())["val"]
    # class 1 absent from one validation case: left out of that class's mean, not scored 0 or 1
    raw, label = read_array(h5_root / val[-1], "raw"), read_array(h5_root / val[-1], "label")
    _write(h5_root / val[-1], raw=raw, label=np.where(label == 1, 0, label).astype(label.dtype))
    scored = tmp_path / "scored"
    overrides = [
        *tiny_train_overrides(h5_root),
        "data=hdf5",
        "trainer.max_epochs=1",
        *save_validation_predictions(scored),
    ]
    metrics = train(compose_config("train", tmp_path / "train", overrides))
    # the logged Dice is that of the predictions against the files' label datasets
    labels = {}
    for name in val:
        with h5py.File(h5_root / name, "r") as f:
            labels[name] = f["label"][()]
    # HDF5 files name no classes: class_0 is the background
    names = [f"class_{k}" for k in range(5)]
    assert_logged_dice(metrics, names, counted_dice(scored, labels, 5))

    ckpt = tmp_path / "train" / "checkpoints" / "last.ckpt"
    new = _write(tmp_path / "new" / "stack.h5", raw=read_array(h5_root / "case_000.h5", "raw"))
    out = tmp_path / "pred"
    overrides = [f"ckpt_path={ckpt}", f"input={new}", f"output={out}", "write_probabilities=true"]
    predict(compose_config("predict", tmp_path / "predict", overrides))

    with h5py.File(out / "stack.h5", "r") as f:
        assert set(f) == {"predictions", "probabilities"}
        labels, probs = f["predictions"][()], f["probabilities"][()]
        assert list(f["predictions"].attrs["element_size_um"]) == SPACING
    assert labels.shape == (16, 48, 48) and labels.dtype == np.uint8 and labels.max() < 5
    assert probs.shape == (5, 16, 48, 48) and np.allclose(probs.sum(0), 1.0, atol=1e-4)
    geometry = read_geometry(out / "stack.h5", "predictions")
    assert np.allclose(geometry["affine"], read_geometry(new, "raw")["affine"])

    # eval.py writes its validation predictions as HDF5 too
    evaluate(compose_config("eval", tmp_path / "eval", [f"ckpt_path={ckpt}"]))
    for name in json.loads((h5_root / "splits.json").read_text())["val"]:
        written = read_array(tmp_path / "eval" / "predictions" / name, "predictions")
        assert written.shape == (16, 48, 48) and written.max() < 5


def test_multichannel_raw_and_channel_count(tmp_path, data_module):
    rng = np.random.default_rng(0)
    for i in range(3):
        raw = rng.normal(size=(2, 8, 16, 16)).astype(np.float32)
        _write(tmp_path / f"v{i}.h5", raw=raw, label=np.zeros((8, 16, 16), np.uint8))
    with pytest.raises(UserInputError, match=r"v0.h5 \(dataset 'raw'\): 2 image channel\(s\)"):
        data_module("hdf5", tmp_path, "in_channels=1", "patch_size=[8,16,16]").check()
    dm = data_module("hdf5", tmp_path, "in_channels=2", "patch_size=[8,16,16]")
    dm.check()
    item = dm.predict_transforms()(dm.val_cases[0].as_dict())
    assert tuple(item["image"].shape) == (2, 8, 16, 16)
    raw = read_array(dm.val_cases[0].image, "raw")
    z = (raw[1] - raw[1].mean()) / raw[1].std()  # z-scored per channel, axes (C, Z, Y, X) kept
    assert np.allclose(item["image"][1].numpy(), z, atol=1e-4)


def test_missing_datasets_unreadable_files_and_shape_mismatch_are_named(
    h5_root, tmp_path, data_module
):
    _write(h5_root / "case_001.h5", raw=np.zeros((16, 48, 48), np.float32))  # no label
    (h5_root / "case_002.h5").write_bytes(b"not hdf5")
    _write(
        h5_root / "case_003.h5",
        raw=np.zeros((16, 48, 48), np.float32),
        label=np.zeros((16, 48, 40), np.uint8),
    )
    with pytest.raises(UserInputError) as err:
        data_module("hdf5", h5_root, "patch_size=[16,32,32]").check()
    text = str(err.value)
    assert "3 problem(s) in the dataset" in text
    assert f"{h5_root}/case_001.h5: no dataset 'label' (data.label_key; the file has: raw)" in text
    assert f"{h5_root}/case_002.h5: cannot read" in text
    assert (
        f"{h5_root}/case_003.h5 (dataset 'label'): label shape [D, H, W] = [16, 48, 40] (Z, Y, "
        "X as stored) differs from the image's [D, H, W] = [16, 48, 48] (Z, Y, X as stored)"
    ) in text

    # through the composed config (the exit code 2 path is run_task's, tested with train.py)
    overrides = [*tiny_train_overrides(h5_root), "data=hdf5", "data.label_key=seg"]
    cfg = compose_config("train", tmp_path / "run", [*overrides, "data.check_only=true"])
    with pytest.raises(UserInputError, match=rf"{h5_root}/case_000.h5: no dataset 'seg' \(data"):
        train(cfg)
    assert not (tmp_path / "run" / "checkpoints").exists()
