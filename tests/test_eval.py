"""eval.py: metrics on the validation split and predicted volumes in the input's format."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tests.conftest import compose_config, tiny_train_overrides
from volseg.callbacks.prediction_writer import ValidationPredictionWriter
from volseg.data.io import read_array, read_geometry, write_volume
from volseg.tasks.evaluate import evaluate
from volseg.tasks.train import train
from volseg.utils.errors import UserInputError


def _train_once(data_root: Path, run_dir: Path) -> Path:
    cfg = compose_config("train", run_dir, tiny_train_overrides(data_root))
    train(cfg)
    return run_dir / "checkpoints" / "last.ckpt"


@pytest.fixture(scope="module")
def checkpoint(small_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tiny run on the small dataset, read (never written) by the tests below."""
    return _train_once(small_dataset, tmp_path_factory.mktemp("eval_train"))


def _tiff_copy(root: Path, target: Path) -> Path:
    for sub in ("images", "labels"):
        for path in sorted((root / sub).glob("*.nii.gz")):
            name = path.name.replace(".nii.gz", ".tif")
            affine = read_geometry(path)["affine"]
            write_volume(target / sub / name, read_array(path), affine=affine)
    splits = json.loads((root / "splits.json").read_text())
    splits = {k: [n.replace(".nii.gz", ".tif") for n in v] for k, v in splits.items()}
    (target / "splits.json").write_text(json.dumps(splits))
    shutil.copy(root / "classes.json", target / "classes.json")
    return target


@pytest.mark.parametrize("fmt", ["nifti", "tiff"])
def test_eval_writes_predictions_with_the_input_geometry(small_dataset, checkpoint, tmp_path, fmt):
    if fmt == "nifti":
        data_root, ckpt = small_dataset, checkpoint
    else:
        data_root = _tiff_copy(small_dataset, tmp_path / "tif")
        ckpt = _train_once(data_root, tmp_path / "train")

    out = tmp_path / "eval"
    cfg = compose_config("eval", out, [f"ckpt_path={ckpt}", "extras.print_config=false"])
    metrics = evaluate(cfg)

    summary = json.loads((out / "eval_summary.json").read_text())
    assert summary["data_root"] == str(data_root)
    val_names = json.loads((data_root / "splits.json").read_text())["val"]
    written = sorted(Path(p).name for p in summary["predictions"])
    assert written == sorted(val_names)
    for name in val_names:
        pred, source = out / "predictions" / name, data_root / "images" / name
        assert read_geometry(pred)["shape_zyx"] == read_geometry(source)["shape_zyx"]
        affine_pred, affine_source = read_geometry(pred)["affine"], read_geometry(source)["affine"]
        assert np.allclose(affine_pred, affine_source, atol=1e-5)
        values = np.unique(read_array(pred))
        assert values.min() >= 0 and values.max() < 5
    # the reported Dice is the written predictions' against the labels (computed here)
    assert metrics["val/dice_mean"] == pytest.approx(
        _dice_mean(out / "predictions", data_root / "labels", val_names, 5), abs=1e-5
    )


def _dice_mean(predictions: Path, labels: Path, names: list[str], num_classes: int) -> float:
    """Mean over the foreground classes of each class's mean Dice over the cases whose label
    has it (0 for a class in no case): what ``val/dice_mean`` reports."""
    per_class = []
    for c in range(1, num_classes):
        scores = []
        for name in names:
            pred, label = read_array(predictions / name) == c, read_array(labels / name) == c
            if label.any():
                scores.append(2 * (pred & label).sum() / (pred.sum() + label.sum()))
        per_class.append(np.mean(scores) if scores else 0.0)
    return float(np.mean(per_class))


def test_eval_data_root_override_and_bad_checkpoint(small_dataset, checkpoint, tmp_path):
    ckpt = checkpoint
    other = shutil.copytree(small_dataset, tmp_path / "other")
    cfg = compose_config("eval", tmp_path / "eval", [f"ckpt_path={ckpt}", f"data.root={other}"])
    evaluate(cfg)
    summary = json.loads((tmp_path / "eval" / "eval_summary.json").read_text())
    assert summary["data_root"] == str(other)

    junk = tmp_path / "junk.ckpt"
    junk.write_bytes(b"not a checkpoint")
    cfg = compose_config("eval", tmp_path / "eval2", [f"ckpt_path={junk}"])
    with pytest.raises(UserInputError, match=r"junk.ckpt: not a loadable checkpoint"):
        evaluate(cfg)


def test_eval_never_writes_into_the_dataset_nor_over_existing_predictions(
    small_dataset, checkpoint, tmp_path
):
    data = shutil.copytree(small_dataset, tmp_path / "data")
    ckpt = [f"ckpt_path={checkpoint}", f"data.root={data}"]
    before = {p: p.read_bytes() for p in data.rglob("*") if p.is_file()}
    for inside in (data / "labels", data, data / "images" / "new"):
        cfg = compose_config("eval", tmp_path / "eval", [*ckpt, f"predictions_dir={inside}"])
        with pytest.raises(UserInputError, match=r"inside data.root=.*would change the dataset"):
            evaluate(cfg)
    assert {p: p.read_bytes() for p in data.rglob("*") if p.is_file()} == before

    out = tmp_path / "preds"
    out.mkdir()
    val_names = json.loads((data / "splits.json").read_text())["val"]
    (out / val_names[0]).write_bytes(b"keep me")
    args = [*ckpt, f"predictions_dir={out}"]
    with pytest.raises(UserInputError, match=rf"{val_names[0]}: exists.*") as err:
        evaluate(compose_config("eval", tmp_path / "eval2", args))
    assert "overwrite=true" in str(err.value)
    assert (out / val_names[0]).read_bytes() == b"keep me"
    assert sorted(p.name for p in out.iterdir()) == [val_names[0]]

    evaluate(compose_config("eval", tmp_path / "eval3", [*args, "overwrite=true"]))
    assert read_array(out / val_names[0]).max() < 5  # replaced by the prediction


def test_predicted_labels_above_255_keep_their_ids(tmp_path):
    """300 classes: written as uint16, class 299 reads back as 299 (uint8 would wrap it)."""
    source = tmp_path / "image.nii.gz"
    write_volume(source, np.zeros((2, 3, 4), np.float32))
    writer = ValidationPredictionWriter(tmp_path / "out")
    pred = torch.full((1, 2, 3, 4), 299)
    batch = {"image_path": [str(source)], "name": ["image.nii.gz"]}
    trainer = SimpleNamespace(sanity_checking=False, global_rank=0)
    module = SimpleNamespace(num_classes=300)
    writer.on_validation_batch_end(trainer, module, {"pred": pred}, batch, 0)
    written = read_array(tmp_path / "out" / "image.nii.gz")
    assert written.dtype == np.uint16 and int(written.max()) == 299


def test_eval_writes_a_reoriented_case_back_in_its_own_orientation(small_dataset, tmp_path):
    """The validation label of a case stored SPL, loaded in RAS and written back by the writer,
    is the stored label voxel for voxel, with the stored affine."""
    from tests.data.test_orientation import reoriented_copy
    from volseg.data.transforms import eval_transforms

    source = reoriented_copy(
        small_dataset / "labels" / "case_000.nii.gz", tmp_path / "spl.nii.gz", "SPL"
    )
    loaded = eval_transforms(orientation="RAS")({"image": str(source), "label": str(source)})
    pred = loaded["label"].long()  # (1, D, H, W) on the RAS grid
    assert pred.shape[1:] != read_array(source).shape  # SPL permutes the axes
    writer = ValidationPredictionWriter(tmp_path / "out", orientation="RAS")
    batch = {"image_path": [str(source)], "name": ["spl.nii.gz"]}
    trainer = SimpleNamespace(sanity_checking=False, global_rank=0)
    module = SimpleNamespace(num_classes=5)
    writer.on_validation_batch_end(trainer, module, {"pred": pred}, batch, 0)
    written = tmp_path / "out" / "spl.nii.gz"
    assert np.array_equal(read_array(written), read_array(source))
    assert np.allclose(read_geometry(written)["affine"], read_geometry(source)["affine"])
