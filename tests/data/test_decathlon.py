"""data=msd on tasks laid out as the Medical Segmentation Decathlon ships them: one file per
case (3-D, or 4-D with the modalities last), ``./`` paths in ``training``/``test`` lists, and
macOS ``._`` files beside the volumes, as in the Decathlon's tar files."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch
import yaml

from tests.conftest import compose_config, tiny_train_overrides
from volseg.tasks.predict import predict
from volseg.tasks.train import train
from volseg.utils.errors import UserInputError

#: a case as nibabel stores it: (x, y, z); loading gives [D, H, W] = [z, y, x] = [12, 20, 24]
SHAPE_XYZ = (24, 20, 12)
AFFINE = np.array([[0.8, 0, 0, -10.0], [0, 0.8, 0, 4.0], [0, 0, 2.5, 30.0], [0, 0, 0, 1]])
PATCH = [8, 16, 16]
SPLEEN = {"modality": {"0": "CT"}, "labels": {"0": "background", "1": "spleen"}}
BRAIN = {
    "modality": {"0": "FLAIR", "1": "T1w", "2": "t1gd", "3": "T2w"},
    # the other direction, as nnU-Net v2 writes it
    "labels": {"background": 0, "edema": 1, "non-enhancing tumor": 2, "enhancing tumour": 3},
}


def _case(rng: np.random.Generator, modalities: int, classes: int) -> tuple[np.ndarray, ...]:
    """An (x, y, z[, modality]) image whose intensity tells the classes apart, and its label:
    nested boxes around a random centre."""
    centre = rng.integers([8, 7, 4], [16, 13, 8])
    grid = np.indices(SHAPE_XYZ)
    half = np.array([6.0, 5.0, 3.0])[:, None, None, None]
    distance = np.max(np.abs(grid - centre[:, None, None, None]) / half, axis=0)
    label = np.clip(classes - 1 - np.floor(distance * (classes - 1)), 0, classes - 1)
    channels = [label * (c + 1) + rng.normal(0, 0.1, SHAPE_XYZ) for c in range(modalities)]
    image = channels[0] if modalities == 1 else np.stack(channels, axis=-1)
    return image.astype(np.float32), label.astype(np.uint8)


def make_task(root: Path, task: str, meta: dict, cases: int = 4, tests: int = 2) -> Path:
    """``root`` as the Decathlon's ``TaskNN_<task>.tar`` unpacks: ``imagesTr/<task>_<i>.nii.gz``
    (4-D for several modalities), ``labelsTr/``, ``imagesTs/``, ``dataset.json`` with
    ``training`` and ``test`` lists, and a ``._`` file beside each volume."""
    rng = np.random.default_rng(len(task))
    modalities, classes = len(meta["modality"]), len(meta["labels"])
    for sub in ("imagesTr", "labelsTr", "imagesTs"):
        (root / sub).mkdir(parents=True)
    training, test = [], []
    for i in range(cases + tests):
        name = f"{task}_{i}.nii.gz"
        image, label = _case(rng, modalities, classes)
        folder = "imagesTr" if i < cases else "imagesTs"
        nib.save(nib.Nifti1Image(image, AFFINE), root / folder / name)
        (root / folder / f"._{name}").write_bytes(b"\x00\x05\x16\x07 macOS resource fork")
        if i < cases:
            nib.save(nib.Nifti1Image(label, AFFINE), root / "labelsTr" / name)
            (root / "labelsTr" / f"._{name}").write_bytes(b"\x00\x05\x16\x07")
            training.append({"image": f"./imagesTr/{name}", "label": f"./labelsTr/{name}"})
        else:
            test.append(f"./imagesTs/{name}")
    dataset = {
        "name": task,
        "tensorImageSize": "4D" if modalities > 1 else "3D",
        **meta,
        "numTraining": cases,
        "numTest": tests,
        "training": training,
        "test": test,
    }
    (root / "dataset.json").write_text(json.dumps(dataset, indent=4))
    return root


@pytest.fixture
def spleen(tmp_path) -> Path:
    return make_task(tmp_path / "Task09_Spleen", "spleen", SPLEEN)


@pytest.fixture
def brain(tmp_path) -> Path:
    return make_task(tmp_path / "Task01_BrainTumour", "BRATS", BRAIN)


def test_the_decathlon_layout_is_read_with_channels_and_classes_from_dataset_json(
    spleen, brain, data_module
):
    for root, channels, classes in (
        (spleen, ["CT"], 2),
        (brain, list(BRAIN["modality"].values()), 4),
    ):
        dm = data_module("msd", root, f"patch_size={PATCH}")
        dm.check()
        assert dm.layout == "decathlon"
        assert (dm.in_channels, dm.num_classes) == (len(channels), classes)
        assert dm.channel_names == channels
        cases = sorted(c.name for c in dm.train_cases + dm.val_cases)
        assert cases == sorted(p.name for p in (root / "labelsTr").glob("[!.]*"))  # no ._ files
        assert all(c.image == root / "imagesTr" / c.name for c in dm.train_cases)


def test_a_decathlon_task_that_disagrees_with_its_files_is_named(brain, data_module):
    prostate_like = json.loads((brain / "dataset.json").read_text())
    prostate_like["modality"] = {"0": "T2", "1": "ADC"}
    (brain / "dataset.json").write_text(json.dumps(prostate_like))
    (brain / "imagesTr" / "BRATS_3.nii.gz").unlink()
    with pytest.raises(UserInputError) as err:
        data_module("msd", brain, f"patch_size={PATCH}").check()
    text = str(err.value)
    assert (
        f"{brain}/labelsTr/BRATS_3.nii.gz: label has no image (expected "
        f"{brain}/imagesTr/BRATS_3.nii.gz, one file per case)"
    ) in text
    assert f"{brain}/dataset.json: lists ./imagesTr/BRATS_3.nii.gz ('training' image)" in text
    assert (
        f"{brain}/imagesTr/BRATS_0.nii.gz: 4 image channel(s) (BRATS_0.nii.gz: (24, 20, 12, 4) "
        "as stored (x, y, z, channels), [D, H, W] = [12, 20, 24] after orientation to RAS), but "
        f"{brain}/dataset.json lists 2 channel(s) (T2, ADC) in 'modality'"
    ) in text


def test_predict_cases_take_the_test_list_or_a_folder(spleen, data_module):
    dm = data_module("msd", spleen, f"patch_size={PATCH}")
    listed = dm.predict_cases(spleen, in_channels=1)
    assert [c.name for c in listed] == ["spleen_4.nii.gz", "spleen_5.nii.gz"]
    assert [c.name for c in dm.predict_cases(spleen / "imagesTs", 1)] == [c.name for c in listed]
    (spleen / "imagesTs" / "spleen_5.nii.gz").unlink()
    with pytest.raises(UserInputError, match=r"lists ./imagesTs/spleen_5.nii.gz \('test'\), file"):
        dm.predict_cases(spleen, in_channels=1)
    with pytest.raises(UserInputError, match=r"takes in_channels=4"):
        dm.predict_cases(spleen / "imagesTs", in_channels=4)
    listing = json.loads((spleen / "dataset.json").read_text())
    listing["test"] = [{"image": ["./imagesTs/spleen_4.nii.gz"]}]
    (spleen / "dataset.json").write_text(json.dumps(listing))
    with pytest.raises(UserInputError, match=r"each 'test' entry must be \"./imagesTs/<file>\""):
        dm.predict_cases(spleen, in_channels=1)


@pytest.mark.slow
@pytest.mark.parametrize("task", ["spleen", "brain"])
def test_a_decathlon_task_trains_two_steps_and_predicts_its_test_list(
    task, request, tmp_path, caplog
):
    root = request.getfixturevalue(task)
    caplog.set_level(logging.INFO)
    meta = SPLEEN if task == "spleen" else BRAIN
    overrides = [
        *tiny_train_overrides(root),
        "data=msd",
        f"data.patch_size={PATCH}",
        "trainer.max_epochs=1",
        "trainer.max_steps=2",
        "data.batch_size=1",
    ]
    train(compose_config("train", tmp_path / "train", overrides))
    # the plan and the datamodule each read dataset.json: its classes are logged once
    assert sum("decathlon layout, classes" in r.getMessage() for r in caplog.records) == 1
    decisions = yaml.safe_load((tmp_path / "train" / "plan.yaml").read_text())["decisions"]
    channels = ", ".join(meta["modality"].values())
    assert decisions["in_channels"]["why"] == (
        f"{len(meta['modality'])} channel(s) ({channels}) listed in {root}/dataset.json"
    )
    assert decisions["num_classes"]["why"] == (
        f"{len(meta['labels'])} classes listed in {root}/dataset.json"
    )
    state = torch.load(tmp_path / "train" / "checkpoints" / "last.ckpt", weights_only=True)
    assert state["global_step"] == 2
    # in_channels and num_classes from dataset.json: the first and last layers' weights
    weights = state["state_dict"]
    assert weights["net.inc.0.weight"].shape[1] == len(meta["modality"])
    assert state["volseg"]["config"]["model"]["net"]["num_classes"] == len(meta["labels"])

    out = tmp_path / "pred"
    ckpt = tmp_path / "train" / "checkpoints" / "last.ckpt"
    predict(
        compose_config(
            "predict", tmp_path / "predict", [f"ckpt_path={ckpt}", f"input={root}", f"output={out}"]
        )
    )
    names = [f"{'spleen' if task == 'spleen' else 'BRATS'}_{i}.nii.gz" for i in (4, 5)]
    assert sorted(p.name for p in out.iterdir()) == names
    for name in names:
        source, pred = nib.load(root / "imagesTs" / name), nib.load(out / name)
        assert pred.shape == SHAPE_XYZ == source.shape[:3]  # labels: no modality axis
        assert np.allclose(pred.affine, source.affine)
        assert np.asarray(pred.dataobj).max() < len(meta["labels"])


def test_a_patch_side_beyond_a_volume_is_one_log_line(spleen, caplog, data_module):
    caplog.set_level(logging.INFO)
    data_module("msd", spleen, "patch_size=[16,16,16]").check()  # D = z = 12 < 16
    padded = [r.getMessage() for r in caplog.records if "zero-padded" in r.getMessage()]
    assert padded == [
        "data.patch_size=[16, 16, 16] is larger than 4 volume(s) in some axis (e.g. "
        "spleen_0.nii.gz: [D, H, W] = [12, 20, 24]): they are zero-padded to the patch"
    ]
    caplog.clear()
    data_module("msd", spleen, f"patch_size={PATCH}").check()
    assert not [r for r in caplog.records if "zero-padded" in r.getMessage()]


def test_a_4d_case_counts_every_modality_in_host_memory_and_the_fingerprint(brain, data_module):
    from volseg.data.fingerprint import dataset_fingerprint
    from volseg.data.host_memory import volume_bytes

    dm = data_module("msd", brain, f"patch_size={PATCH}")
    dm.check()
    sized = volume_bytes(dm.train_cases[0], orientation="RAS")
    assert sized.shape_zyx == (12, 20, 24)
    assert sized.image == 4 * 12 * 20 * 24 * 4  # four float32 modalities
    cfg = compose_config("train", brain.parent / "run", ["data=msd", f"data.root={brain}"])
    fingerprint = dataset_fingerprint(cfg.data)
    assert fingerprint["cases"] == 4 and fingerprint["median_shape"] == [12, 20, 24]
    assert fingerprint["median_spacing"] == [2.5, 0.8, 0.8]


def test_data_root_one_level_off_or_an_archive_says_where_the_task_is(spleen, data_module):
    with pytest.raises(
        UserInputError,
        match=rf"data.root={spleen.parent}: no dataset.json here, "
        rf"but in {spleen}: point data.root at the task folder",
    ):
        data_module("msd", spleen.parent, f"patch_size={PATCH}").check()
    archive = spleen.parent / "Task09_Spleen.tar"
    archive.write_bytes(b"")
    with pytest.raises(UserInputError, match=r"Task09_Spleen.tar: an archive; extract it first"):
        data_module("msd", archive, f"patch_size={PATCH}").check()
