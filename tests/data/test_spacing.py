"""data.spacing: resampling on load (labels nearest), checks and predictions on the input grid."""

from __future__ import annotations

import json

import hydra
import numpy as np
import pytest
import torch

from tests.conftest import (
    assert_logged_dice,
    check_cases,
    compose_config,
    counted_dice,
    save_validation_predictions,
    tiny_train_overrides,
)
from volseg.data.cases import case_problems, find_cases
from volseg.data.io import read_array, read_geometry, write_volume
from volseg.data.synthetic import CLASS_NAMES
from volseg.data.transforms import eval_transforms
from volseg.tasks.evaluate import evaluate
from volseg.tasks.predict import predict
from volseg.tasks.train import train
from volseg.utils.errors import UserInputError


def test_resampling_halves_the_grid_and_keeps_label_values(tmp_path):
    z, y, x = np.meshgrid(np.arange(4), np.arange(8), np.arange(8), indexing="ij")
    image = (x + 10 * z).astype(np.float32)  # a ramp: resampling keeps it a ramp
    label = (x >= 4).astype(np.uint8) * 3
    write_volume(tmp_path / "i.nii.gz", image, spacing_zyx=(2.0, 0.5, 0.5))
    write_volume(tmp_path / "l.nii.gz", label, spacing_zyx=(2.0, 0.5, 0.5))
    item = eval_transforms(spacing=[2.0, 1.0, 1.0])(
        {"image": str(tmp_path / "i.nii.gz"), "label": str(tmp_path / "l.nii.gz")}
    )
    assert tuple(item["image"].shape) == (1, 4, 4, 4) and tuple(item["label"].shape) == (1, 4, 4, 4)
    assert set(torch.unique(item["label"]).tolist()) == {0, 3}  # nearest: no blended values
    # x is the fast axis: values rise along W, and by 10 (before z-scoring) along D
    row = item["image"][0, 0, 0]
    assert torch.all(row[1:] > row[:-1])
    assert item["image"][0, 1, 0, 0] > item["image"][0, 0, 0, -1]


def test_patch_is_checked_against_the_resampled_volume(tmp_path):
    for i in range(2):
        write_volume(tmp_path / "images" / f"c{i}.nii.gz", np.zeros((8, 16, 16)), (1, 1, 1))
        write_volume(tmp_path / "labels" / f"c{i}.nii.gz", np.zeros((8, 16, 16)), (1, 1, 1))
    check_cases(find_cases(tmp_path), 2, [8, 16, 16])
    problems = case_problems(find_cases(tmp_path), 2, [8, 16, 16], spacing=[2.0, 2.0, 2.0])
    assert len(problems) == 2
    assert problems[0].endswith(
        "c0.nii.gz: data.patch_size=[8, 16, 16] is larger than the volume in every axis: "
        "[D, H, W] = [4, 8, 8] at data.spacing=[2.0, 2.0, 2.0], from (16, 16, 8) as stored "
        "(x, y, z), [D, H, W] = [8, 16, 16] (the file's z, y, x)"
    )


@pytest.mark.slow
def test_spacing_trains_on_the_resampled_grid_and_predicts_on_the_input_grid(
    small_dataset, tmp_path
):
    overrides = [
        *tiny_train_overrides(small_dataset),
        "data.spacing=[1.0,1.0,1.0]",  # the files: 1.0 x 0.5 x 0.5
        "data.patch_size=[16,16,16]",
        "trainer.max_epochs=1",
        *save_validation_predictions(tmp_path / "scored"),
    ]
    cfg = compose_config("train", tmp_path / "train", overrides)
    datamodule = hydra.utils.instantiate(cfg.data)
    datamodule.setup("validate")
    assert next(iter(datamodule.val_dataloader()))["image"].shape == (1, 1, 16, 24, 24)
    metrics = train(cfg)
    # validated on the 1 mm grid: nearest resampling from 0.5 mm keeps every second y and x
    val = json.loads((small_dataset / "splits.json").read_text())["val"]
    labels = {n: read_array(small_dataset / "labels" / n)[:, ::2, ::2] for n in val}
    dice = counted_dice(tmp_path / "scored", labels, 5)
    assert_logged_dice(metrics, list(CLASS_NAMES), dice)

    source = small_dataset / "images" / "case_000.nii.gz"
    ckpt = tmp_path / "train" / "checkpoints" / "last.ckpt"
    out = tmp_path / "pred"
    cfg = compose_config(
        "predict", tmp_path / "predict", [f"ckpt_path={ckpt}", f"input={source}", f"output={out}"]
    )
    predict(cfg)
    assert read_geometry(out / source.name)["shape_zyx"] == (16, 48, 48)
    assert np.allclose(read_geometry(out / source.name)["affine"], read_geometry(source)["affine"])
    assert read_array(out / source.name).max() < 5

    # eval.py writes its predictions on the input grid too
    evaluate(compose_config("eval", tmp_path / "eval", [f"ckpt_path={ckpt}"]))
    for written in (tmp_path / "eval" / "predictions").iterdir():
        assert read_geometry(written)["shape_zyx"] == (16, 48, 48)


def test_bad_spacing_is_named(small_dataset, data_module):
    with pytest.raises(
        UserInputError, match=r"data.spacing=\[1.0, 0.0\]: expected \[z, y, x\] > 0"
    ):
        data_module("folder", small_dataset, "spacing=[1.0,0.0]")


AFFINES = {
    "identity": np.eye(4),
    "anisotropic": np.diag([0.7, 0.7, 2.5, 1.0]),
    # LPS-like flips with an origin, and a permuted (sagittal) grid: Spacing keeps the rotation
    "flipped": np.array(
        [[-0.8, 0, 0, 90.0], [0, -0.8, 0, 120.0], [0, 0, 3.0, -40.0], [0, 0, 0, 1]]
    ),
    "permuted": np.array([[0, 0, -0.7, 5.0], [0, 1.3, 0, 2.0], [2.5, 0, 0, 1.0], [0, 0, 0, 1]]),
}


@pytest.mark.parametrize("affine", AFFINES.values(), ids=AFFINES.keys())
def test_resampled_shape_is_the_shape_monai_spacing_produces(affine):
    from monai.data import MetaTensor
    from monai.transforms import Spacing

    from volseg.data.transforms import resampled_shape

    for shape_zyx in [(10, 10, 10), (7, 9, 11), (1, 5, 64), (33, 17, 2)]:
        for spacing_zyx in [(4.0, 4.0, 4.0), (2.0, 2.0, 2.0), (1.0, 0.5, 3.0), (0.37, 1.9, 0.8)]:
            volume = MetaTensor(torch.zeros(1, *shape_zyx[::-1]), affine=torch.tensor(affine))
            produced = Spacing(pixdim=spacing_zyx[::-1])(volume).shape[1:]
            assert resampled_shape(shape_zyx, affine, spacing_zyx) == list(produced)[::-1], (
                shape_zyx,
                spacing_zyx,
            )


def test_resampled_shape_of_the_issue_examples():
    from volseg.data.transforms import resampled_shape

    # the extent between the first and last voxel centres is kept, plus one voxel
    assert resampled_shape([10, 10, 10], np.eye(4), [4.0, 4.0, 4.0]) == [3, 3, 3]
    assert resampled_shape([7, 9, 11], np.eye(4), [2.0, 2.0, 2.0]) == [4, 5, 6]
