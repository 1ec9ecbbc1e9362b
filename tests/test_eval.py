"""eval.py: metrics on the validation split and predicted volumes in the input's format."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import compose_config, tiny_train_overrides
from volseg.data.io import read_array, read_geometry, write_volume
from volseg.evaluation import evaluate
from volseg.training import train
from volseg.utils.errors import UserInputError


def _train_once(data_root: Path, run_dir: Path) -> Path:
    cfg = compose_config("train", run_dir, tiny_train_overrides(data_root))
    train(cfg)
    return run_dir / "checkpoints" / "last.ckpt"


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
def test_eval_writes_predictions_with_the_input_geometry(small_dataset, tmp_path, fmt):
    data_root = small_dataset if fmt == "nifti" else _tiff_copy(small_dataset, tmp_path / "tif")
    ckpt = _train_once(data_root, tmp_path / "train")

    out = tmp_path / "eval"
    cfg = compose_config("eval", out, [f"ckpt_path={ckpt}", "extras.print_config=false"])
    metrics = evaluate(cfg)

    assert 0.0 <= metrics["val/dice_mean"] <= 1.0
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


def test_eval_data_root_override_and_bad_checkpoint(small_dataset, tmp_path):
    ckpt = _train_once(small_dataset, tmp_path / "train")
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
