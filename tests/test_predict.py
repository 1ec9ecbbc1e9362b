"""predict.py: labels in the input's format and geometry, flips, refusals, clear errors."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from monai.inferers import SlidingWindowInferer

from tests.conftest import REPO, compose_config, tiny_train_overrides
from volseg.data.io import read_array, read_geometry, write_volume
from volseg.models.volume_predictor import VolumePredictor
from volseg.tasks.predict import predict
from volseg.tasks.train import train
from volseg.utils.errors import BudgetExceeded, UserInputError


@pytest.fixture(scope="module")
def checkpoint(small_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("predict_train")
    train(compose_config("train", run_dir, tiny_train_overrides(small_dataset)))
    return run_dir / "checkpoints" / "last.ckpt"


def _predict(ckpt: Path, input: Path, output: Path, *extra: str) -> dict:
    overrides = [f"ckpt_path={ckpt}", f"input={input}", f"output={output}", *extra]
    cfg = compose_config("predict", output.parent / f"{output.name}_run", overrides)
    return predict(cfg)


def _predict_process(
    ckpt: Path, input: Path, output: Path, run_dir: Path, *extra: str
) -> subprocess.CompletedProcess:
    """``python predict.py`` as a user runs it, in its own process."""
    args = [f"ckpt_path={ckpt}", f"input={input}", f"output={output}", *extra]
    return subprocess.run(
        [sys.executable, "predict.py", *args, f"hydra.run.dir={run_dir}"],
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )


def _assert_same_geometry(pred: Path, source: Path) -> None:
    assert read_geometry(pred)["shape_zyx"] == read_geometry(source)["shape_zyx"]
    assert np.allclose(read_geometry(pred)["affine"], read_geometry(source)["affine"], atol=1e-5)


def test_folder_of_nifti_gives_labels_and_probabilities_with_input_geometry(
    checkpoint, small_dataset, tmp_path
):
    images = tmp_path / "in"
    images.mkdir()
    for name in ("case_000.nii.gz", "case_001.nii.gz"):
        shutil.copy(small_dataset / "images" / name, images / name)
    out = tmp_path / "pred"
    result = _predict(checkpoint, images, out, "write_probabilities=true", "flip_axes=[2]")

    sources = sorted(images.glob("*.nii.gz"))
    assert len(result["written"]) == 2 * len(sources)
    for source in sources:
        pred = out / source.name
        _assert_same_geometry(pred, source)
        labels = read_array(pred)
        assert labels.dtype == np.uint8 and labels.min() >= 0 and labels.max() < 5
        probs_file = out / source.name.replace(".nii.gz", "_probabilities.nii.gz")
        probs = read_array(probs_file)
        assert probs.shape == (5, *labels.shape)
        assert np.allclose(probs.sum(axis=0), 1.0, atol=1e-4)
        assert np.array_equal(probs.argmax(axis=0), labels)
        assert np.allclose(read_geometry(probs_file)["affine"], read_geometry(source)["affine"])


def test_single_tiff_file_gives_a_tiff_with_its_spacing(checkpoint, small_dataset, tmp_path):
    source = small_dataset / "images" / "case_000.nii.gz"
    tif = write_volume(tmp_path / "in" / "stack.tif", read_array(source), (2.0, 0.5, 0.25))
    out = tmp_path / "pred"
    _predict(checkpoint, tif, out)
    _assert_same_geometry(out / "stack.tif", tif)
    assert read_array(out / "stack.tif").max() < 5
    # same voxels as the NIfTI input: the format changes nothing but the file
    _predict(checkpoint, source, tmp_path / "pred_nii")
    assert np.array_equal(
        read_array(out / "stack.tif"), read_array(tmp_path / "pred_nii" / source.name)
    )


def test_flips_average_the_softmax_of_mirrored_passes():
    torch.manual_seed(0)
    net = torch.nn.Conv3d(1, 3, kernel_size=3, padding=1)  # not mirror-symmetric
    inferer = SlidingWindowInferer(roi_size=(4, 6, 8), overlap=0.0)  # one window = net(x)
    image = torch.randn(1, 1, 4, 6, 8)
    predictor = VolumePredictor(net, inferer, num_classes=3, flip_axes=[1, 2]).eval()
    got = predictor.predict_step({"image": image}, 0)

    expected = torch.zeros_like(got)
    for dims in [(), (3,), (4,), (3, 4)]:
        x = image.flip(dims) if dims else image
        p = torch.softmax(net(x), dim=1)
        expected += p.flip(dims) if dims else p
    assert len(predictor.flips) == 4
    assert torch.allclose(got, expected.detach() / 4, atol=1e-5)
    assert predictor.stitch_device(image.shape[2:]).type == "cpu"


@pytest.mark.slow
def test_refuses_to_overwrite_then_overwrites_with_overwrite_true(
    checkpoint, small_dataset, tmp_path
):
    source = small_dataset / "images" / "case_001.nii.gz"
    out = tmp_path / "pred"
    out.mkdir()
    existing = out / source.name
    existing.write_bytes(b"keep me")
    result = _predict_process(checkpoint, source, out, tmp_path / "run")
    assert result.returncode == 2, result.stderr[-2000:]
    assert f"{existing}: exists" in result.stderr and "overwrite=true" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    # printed once, last, on stderr (and in predict.log, not the console's stdout)
    assert (result.stdout + result.stderr).count(f"{existing}: exists") == 1
    assert result.stderr.strip().endswith(f"{existing}: exists")
    assert existing.read_bytes() == b"keep me"

    _predict(checkpoint, source, out, "overwrite=true")
    _assert_same_geometry(existing, source)


def test_outputs_are_all_checked_before_anything_is_predicted(checkpoint, small_dataset, tmp_path):
    inputs = shutil.copytree(small_dataset / "images", tmp_path / "in")
    out = tmp_path / "pred"
    write_volume(out / "case_004.nii.gz", np.zeros((2, 2, 2), np.uint8))
    with pytest.raises(UserInputError, match=r"case_004.nii.gz: exists") as err:
        _predict(checkpoint, inputs, out)
    assert sorted(p.name for p in out.iterdir()) == ["case_004.nii.gz"]
    assert "1 output file(s) exist" in str(err.value)
    with pytest.raises(UserInputError, match=r"case_000.nii.gz: is an input file"):
        _predict(checkpoint, inputs, inputs, "overwrite=true")


def test_model_override_that_does_not_fit_the_weights_is_named(checkpoint, small_dataset, tmp_path):
    source = small_dataset / "images" / "case_000.nii.gz"
    with pytest.raises(UserInputError) as err:
        _predict(checkpoint, source, tmp_path / "pred", "model.net.widths=[8,16,32]")
    text = str(err.value)
    assert "its weights do not fit the network" in text and "volseg.models.unet.UNet3D" in text
    assert "net.inc.0.weight: shape [4, 1, 3, 3, 3] in the checkpoint, [8, 1, 3, 3, 3]" in text
    assert "Traceback" not in text and not (tmp_path / "pred").exists()


def test_bad_inputs_are_named(checkpoint, tmp_path):
    with pytest.raises(UserInputError, match=r"input=.*nowhere: no such file or folder"):
        _predict(checkpoint, tmp_path / "nowhere", tmp_path / "pred")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserInputError, match=r"input=.*empty: no volume files"):
        _predict(checkpoint, tmp_path / "empty", tmp_path / "pred")
    bad = tmp_path / "bad"
    write_volume(bad / "two_channels.nii.gz", np.zeros((2, 4, 8, 8), np.float32))
    (bad / "broken.nii.gz").write_bytes(b"not a volume")
    with pytest.raises(UserInputError) as err:
        _predict(checkpoint, bad, tmp_path / "pred")
    assert "2 problem(s) in the input" in str(err.value)
    assert "broken.nii.gz: cannot read" in str(err.value)
    # (x, y, z, 2) on disk: two channels, where the checkpoint's network takes one
    assert (
        "two_channels.nii.gz: 2 image channel(s) (two_channels.nii.gz: (8, 8, 4, 2) as stored "
        "(x, y, z, channels), [D, H, W] = [4, 8, 8] after orientation to RAS), but the "
        "checkpoint's network takes in_channels=1"
    ) in str(err.value)
    assert not (tmp_path / "pred").exists()


def test_inputs_that_share_an_output_are_named_before_any_work(checkpoint, small_dataset, tmp_path):
    """a.nii.gz's probabilities and the labels of a_probabilities.nii.gz: the same file."""
    inputs = tmp_path / "in"
    inputs.mkdir()
    for name in ("a.nii.gz", "a_probabilities.nii.gz"):
        shutil.copy(small_dataset / "images" / "case_000.nii.gz", inputs / name)
    out = tmp_path / "pred"
    with pytest.raises(UserInputError, match="two inputs would write the same file") as err:
        _predict(checkpoint, inputs, out, "write_probabilities=true")
    assert "a_probabilities.nii.gz: the output of a.nii.gz and of a_probabilities.nii.gz" in str(
        err.value
    )
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.slow
def test_ddp_predicts_every_volume_once_across_ranks(checkpoint, small_dataset, tmp_path):
    # trainer=ddp_sim turns Lightning's distributed sampler off (volseg shards its own training
    # patches); prediction must still give each of the 3 volumes to one rank, not to both
    images = tmp_path / "in"
    images.mkdir()
    names = [f"case_00{i}.nii.gz" for i in range(3)]
    for name in names:
        shutil.copy(small_dataset / "images" / name, images / name)
    out, run_dir = tmp_path / "pred", tmp_path / "run"
    result = _predict_process(checkpoint, images, out, run_dir, "trainer=ddp_sim")
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == names
    log = (run_dir / "predict.log").read_text()
    for name in names:  # the forked ranks log to the same file
        assert log.count(f"wrote {name}") == 1, log[-2000:]
    assert "Rank 0 wrote" in log and "Rank 1 wrote" in log
    assert "Wrote 3 file(s)" in log


def test_a_case_stored_lps_or_permuted_gets_the_ras_prediction_in_its_own_orientation(
    checkpoint, small_dataset, tmp_path
):
    """Loaded in data.orientation=RAS, the same case stored RAS, LPS and SPL is predicted
    alike; each prediction (labels and probabilities) is written in its input's orientation,
    shape and affine, so it lies voxel for voxel on its input."""
    import nibabel as nib
    from nibabel import orientations

    from tests.data.test_orientation import reoriented_copy

    source = small_dataset / "images" / "case_000.nii.gz"
    written = {}
    for axcodes in ("RAS", "LPS", "SPL"):
        image = reoriented_copy(source, tmp_path / axcodes / "in" / "case.nii.gz", axcodes)
        out = tmp_path / axcodes / "pred"
        _predict(checkpoint, image, out, "write_probabilities=true")
        _assert_same_geometry(out / "case.nii.gz", image)
        pred = nib.load(str(out / "case.nii.gz"))
        assert np.allclose(pred.affine, nib.load(str(image)).affine)
        # back to RAS to compare: the voxels at the same world positions
        ras = orientations.ornt_transform(
            orientations.io_orientation(pred.affine), orientations.axcodes2ornt("RAS")
        )
        written[axcodes] = np.asarray(pred.as_reoriented(ras).dataobj)
        probs = nib.load(str(out / "case_probabilities.nii.gz"))
        assert probs.shape[:3] == pred.shape and np.allclose(probs.affine, pred.affine)
        assert np.array_equal(np.asarray(probs.dataobj).argmax(axis=3), np.asarray(pred.dataobj))
    assert len(np.unique(written["RAS"])) > 1
    for axcodes in ("LPS", "SPL"):
        assert np.array_equal(written[axcodes], written["RAS"]), axcodes


def test_memory_budget_estimates_each_volume_before_predicting(
    checkpoint, small_dataset, tmp_path, caplog
):
    """The volumes' prediction is estimated before the first one and logged; a budget that no
    stitching fits stops predict.py in one line, before anything is written."""
    images = tmp_path / "in"
    images.mkdir()
    shutil.copy(small_dataset / "images" / "case_000.nii.gz", images / "case_000.nii.gz")
    with pytest.raises(BudgetExceeded) as err:
        _predict(checkpoint, images, tmp_path / "none", "memory.budget=1MiB")
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("memory.budget=1MiB: predicting one 16x48x48 volume needs")
    assert not (tmp_path / "none").exists()

    with caplog.at_level("INFO", logger="volseg.tasks.predict"):
        written = _predict(checkpoint, images, tmp_path / "out", "memory.budget=1GiB")["written"]
    assert written
    assert "16x48x48: stitched on the device" in caplog.text
    assert "memory.budget=1GiB" in caplog.text
