"""train.py end to end: composed configs, the used-by command, resume, outputs."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import hydra
import pytest
import torch
from lightning.pytorch import Callback

from tests.conftest import REPO, compose_config, tiny_train_overrides
from volseg.models.unet import UNet3D
from volseg.plan import make_plan
from volseg.tasks.train import train
from volseg.utils.errors import UserInputError
from volseg.utils.precision import resolve_precision

CLASSES = ["background", "blob", "tube", "shell", "granule"]


def _metrics_rows(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "csv" / "metrics.csv") as f:
        return list(csv.DictReader(f))


def _run(args: list[str], **kwargs) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        **kwargs,
    )


@pytest.fixture(scope="module")
def trained(small_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple:
    """One tiny run (``tiny_train_overrides``), read (never written) by the tests below:
    ``(run dir, the metrics train() returned)``."""
    run_dir = tmp_path_factory.mktemp("train") / "run"
    metrics = train(compose_config("train", run_dir, tiny_train_overrides(small_dataset)))
    return run_dir, metrics


def test_train_writes_checkpoints_metrics_and_summary(trained):
    run_dir, metrics = trained

    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert Path(summary["best_checkpoint"]).is_file()
    assert list(summary["best_val_dice_per_class"]) == CLASSES
    # the best of the logged validations, and the mean of its foreground classes
    logged = [float(r["val/dice_mean"]) for r in _metrics_rows(run_dir) if r["val/dice_mean"]]
    assert len(logged) == 2 and summary["best_val_dice_mean"] == pytest.approx(max(logged))
    per_class = summary["best_val_dice_per_class"]
    foreground = sum(per_class[c] for c in CLASSES[1:]) / (len(CLASSES) - 1)
    assert summary["best_val_dice_mean"] == pytest.approx(foreground, abs=1e-6)
    assert summary["parameters"] == sum(p.numel() for p in UNet3D(1, 5, [4, 8, 16]).parameters())
    # 4 training volumes x 1 patch each, batch 2 -> 2 steps per epoch, 2 epochs
    assert summary["global_step"] == 4
    # no step estimate (memory.plan_step=false): no predicted time, and why; the fit's measured
    assert summary["predicted_seconds"] is None and "plan_step=false" in summary["not_predicted"]
    assert summary["measured_seconds"] == pytest.approx(summary["wall_time_s"], abs=0.01)
    assert summary["wall_time_s"] > 0
    keys = set(_metrics_rows(run_dir)[0])
    expected = {"train/loss", "val/loss", "val/dice_mean", "val/dice_mean_best"}
    assert expected | {f"val/dice_{c}" for c in CLASSES} <= keys
    assert metrics["val/dice_mean_best"] == pytest.approx(summary["best_val_dice_mean"])
    # pictures without W&B: overlays of the 2 validation volumes after each epoch
    assert len(list((run_dir / "overlays").glob("epoch_00[01]_case_*.png"))) == 4


def test_checkpoint_loads_weights_only_and_carries_the_config(trained):
    ckpt = torch.load(trained[0] / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["volseg"]["config"]["model"]["net"]["widths"] == [4, 8, 16]
    assert ckpt["volseg"]["config"]["data"]["patch_size"] == [16, 32, 32]
    assert set(ckpt["volseg"]["best_dice_per_class"]) == set(CLASSES)


def test_a_finished_checkpoint_is_one_error_and_a_raised_limit_trains_on(
    trained, small_dataset, tmp_path
):
    """The tiny run trained 2 epochs, 4 steps: resuming it at the same limits trains nothing."""
    last = trained[0] / "checkpoints" / "last.ckpt"
    common = [*tiny_train_overrides(small_dataset), f"ckpt_path={last}"]
    for limit, fix in [
        ("trainer.max_epochs=2", "trainer.max_epochs=2: nothing left to train; raise it"),
        ("trainer.max_steps=4", "trainer.max_steps=4: nothing left to train; raise it"),
    ]:
        cfg = compose_config("train", tmp_path / limit, [*common, limit])
        with pytest.raises(UserInputError, match="its run has trained 2 epoch") as raised:
            train(cfg)
        assert fix in str(raised.value)
        assert not (tmp_path / limit / "checkpoints").exists()  # no work
    # a raised limit trains on, as Lightning does: one more epoch of 2 steps
    cfg = compose_config("train", tmp_path / "on", [*common, "trainer.max_epochs=3"])
    train(cfg)
    assert json.loads((tmp_path / "on" / "summary.json").read_text())["global_step"] == 6


def test_test_true_evaluates_the_best_checkpoint_on_the_validation_split(
    small_dataset, tmp_path, caplog
):
    overrides = [*tiny_train_overrides(small_dataset), "trainer.max_epochs=1", "test=true"]
    cfg = compose_config("train", tmp_path, overrides)
    with caplog.at_level("INFO", logger="volseg.tasks.train"):
        metrics = train(cfg)
    best = json.loads((Path(cfg.paths.output_dir) / "summary.json").read_text())
    assert "on the validation split (the data have no test split)" in caplog.text
    assert best["best_checkpoint"] in caplog.text
    # the best checkpoint's own validation, again
    assert metrics["test/dice_mean"] == pytest.approx(best["best_val_dice_mean"], abs=1e-6)
    assert {f"test/dice_{c}" for c in CLASSES} <= set(metrics)


class StopAfterEpochs(Callback):
    """Interrupts a run after ``epochs`` epochs (as a crash would), leaving its config alone."""

    def __init__(self, epochs: int) -> None:
        self.epochs = epochs

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if trainer.current_epoch + 1 >= self.epochs:
            trainer.should_stop = True


@pytest.mark.slow
def test_resume_ends_where_an_uninterrupted_run_ends(small_dataset, tmp_path):
    """2 epochs + resume to 4 == 4 epochs straight: weights, step, optimizer and scheduler.
    Every validation saves a checkpoint, so a last.ckpt saved at the end of an epoch that
    validated is a second name of that file: the run resumes from one."""
    common = [*tiny_train_overrides(small_dataset), "seed=7", "callbacks.early_stopping=null"]
    # every epoch end saves last.ckpt (not as the time share allows), so both runs end alike
    common += ["trainer.max_epochs=4", "callbacks.last_checkpoint.max_time_share=null"]
    common += ["callbacks.model_checkpoint.save_top_k=-1"]
    full = compose_config("train", tmp_path / "full", common)
    train(full)
    # the same run (same horizon, so the same LR schedule), interrupted after 2 of its 4 epochs
    stop = "+callbacks.stop={_target_: tests.test_train.StopAfterEpochs, epochs: 2}"
    first = compose_config("train", tmp_path / "part", [*common, stop])
    train(first)
    last = Path(first.paths.output_dir) / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["global_step"] == 4
    assert os.path.samefile(last, last.with_name("epoch_001.ckpt"))
    resumed = compose_config("train", tmp_path / "resumed", [*common, f"ckpt_path={last}"])
    train(resumed)

    a = torch.load(Path(full.paths.output_dir) / "checkpoints" / "last.ckpt", weights_only=True)
    b = torch.load(Path(resumed.paths.output_dir) / "checkpoints" / "last.ckpt", weights_only=True)
    assert a["global_step"] == b["global_step"] == 8 and a["epoch"] == b["epoch"]
    for key, value in a["state_dict"].items():
        assert torch.allclose(value.float(), b["state_dict"][key].float(), atol=1e-6), key
    # the scheduler steps every optimizer step
    assert a["lr_schedulers"][0]["last_epoch"] == b["lr_schedulers"][0]["last_epoch"] == 8
    sa, sb = a["optimizer_states"][0]["state"], b["optimizer_states"][0]["state"]
    assert all(torch.allclose(sa[k]["exp_avg"], sb[k]["exp_avg"], atol=1e-6) for k in sa)


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["32", "16-mixed", "bf16-mixed", "16-true", "bf16-true"])
def test_every_precision_trains_without_nan(small_dataset, tmp_path, precision):
    overrides = [
        *tiny_train_overrides(small_dataset),
        f"trainer.precision={precision}",
        "trainer.max_epochs=1",
        "trainer.limit_val_batches=1",
    ]
    metrics = train(compose_config("train", tmp_path, overrides))
    assert torch.isfinite(torch.tensor(metrics["train/loss"]))
    assert torch.isfinite(torch.tensor(metrics["val/loss"]))  # the validation forward too


@pytest.mark.slow
def test_a_diverging_run_stops_with_one_line_and_exit_1(small_dataset, tmp_path):
    """AdamW at lr 1e30 blows the weights up within a step: the NaN/Inf loss stops the run with
    one message naming the fix and exit code 1 (not a user-input error: not 2), no traceback."""
    result = _run(
        [
            "train.py",
            f"data.root={small_dataset}",
            "data.patch_size=[16,32,32]",
            "model.net.widths=[4,8]",
            "model.optimizer.lr=1e30",
            "model.nonfinite_check_every_n_steps=1",
            "trainer.max_epochs=2",
            "trainer.limit_val_batches=1",
            "trainer.precision=32",
            "memory.plan_step=false",
            "callbacks.rich_progress_bar=null",
            f"hydra.run.dir={tmp_path}",
        ]
    )
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "train/loss is NaN or Inf" in errors[0], result.stderr[-3000:]
    assert "model.optimizer.lr" in errors[0]


@pytest.mark.slow
def test_used_by_command_runs_as_written(small_dataset, tmp_path):
    """`python train.py model=unet_small trainer.precision=16-mixed`, with tiny limits."""
    result = _run(
        [
            "train.py",
            "model=unet_small",
            "trainer.precision=16-mixed",
            f"data.root={small_dataset}",
            "data.patch_size=[16,32,32]",
            "trainer.max_epochs=1",
            "trainer.limit_train_batches=1",
            "trainer.limit_val_batches=1",
            "trainer.max_time=00:00:05:00",
            f"hydra.run.dir={tmp_path}",
        ]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    log = (tmp_path / "train.log").read_text()
    # bf16 autocast where this CPU runs it natively, float32 where oneDNN would emulate it
    runs = resolve_precision("16-mixed", "cpu").precision
    assert f"trainer.precision=16-mixed runs as {runs} on cpu: fp16 autocast needs CUDA" in log
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["parameters"] == 14_496_517
    assert summary["precision"] == {"32": "32-true"}.get(runs, runs)


class TrainStartMarker(Callback):
    """Prints ``TRAINING STARTS`` when training starts (where the progress bar first shows)."""

    def on_train_start(self, trainer, pl_module) -> None:
        print("TRAINING STARTS", flush=True)


@pytest.mark.slow
def test_at_most_40_lines_before_the_first_progress_bar(small_dataset, tmp_path):
    """The default console (config tree in config_tree.log, the plan in train.log, no
    third-party tips), at most 40 lines before training; a short epoch still logs train/loss
    and the model summary has no FLOPs column it cannot fill."""
    marker = "+callbacks.marker._target_=tests.test_train.TrainStartMarker"
    result = subprocess.run(
        [
            sys.executable,
            "train.py",
            f"data.root={small_dataset}",
            "data.patch_size=[16,32,32]",
            "model.net.widths=[4,8]",
            "trainer.max_epochs=1",
            "trainer.limit_val_batches=1",
            marker,
            f"hydra.run.dir={tmp_path}",
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:]
    before = result.stdout.split("TRAINING STARTS")[0].splitlines()
    assert len(before) <= 40, "\n".join(before)
    assert "config_tree.log" in result.stdout and (tmp_path / "config_tree.log").is_file()
    assert "Tip:" not in result.stdout and "FLOPs" not in result.stdout
    assert "Run plan:" in (tmp_path / "train.log").read_text()
    # 8 batches an epoch against log_every_n_steps=10: train/loss logged anyway
    assert any(r["train/loss"] for r in _metrics_rows(tmp_path))
    # an overlay at the one validation (epoch 0), whatever check_val_every_n_epoch says
    assert sorted(p.name for p in (tmp_path / "overlays").glob("*.png"))


@pytest.mark.slow
def test_missing_data_root_is_one_clear_error(tmp_path):
    result = _run(
        ["train.py", f"data.root={tmp_path / 'nowhere'}", f"hydra.run.dir={tmp_path / 'run'}"]
    )
    assert result.returncode == 2
    assert f"data.root={tmp_path / 'nowhere'}: folder does not exist" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert not (tmp_path / "nowhere").exists()
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.slow
def test_patch_thinner_than_the_poolings_is_one_clear_error(small_dataset, tmp_path):
    thin = ["data.patch_size=[8,32,32]", "model.net.widths=[4,8,16,32,64]"]
    thin += ["model.net.pooling=null"]
    args = [f"data.root={small_dataset}", *thin, f"hydra.run.dir={tmp_path / 'run'}"]
    result = _run(["train.py", *args])
    assert result.returncode == 2
    message = result.stderr
    assert "data.patch_size=[8, 32, 32] is too thin for the network: D=8 < 16" in message
    assert "model.net.widths=[4, 8, 16, 32, 64]" in message and "model.net.pooling=null" in message
    assert "model.net.pooling=auto" in message
    assert "Traceback" not in result.stderr + result.stdout
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_pooling_auto_builds_the_thin_patch_network_from_the_config(small_dataset, tmp_path):
    thin = ["data.patch_size=[8,32,32]", "model.net.widths=[4,8,16,32,64]"]
    overrides = [*tiny_train_overrides(small_dataset), *thin, "model.net.pooling=auto"]
    cfg = compose_config("train", tmp_path, overrides)
    # built from the plan's config: pooling=auto planned for ${data.patch_size}
    net = hydra.utils.instantiate(make_plan(cfg, estimate_step=False).config.model.net)
    # z: 8 -> 4, then kept; y, x: 32 -> 16 -> 8 -> 4, then kept
    assert net.pooling == [[2, 2, 2], [1, 2, 2], [1, 2, 2], [1, 1, 1]]
    x = torch.randn(2, 1, 8, 32, 32)
    assert net(x).shape == (2, 5, 8, 32, 32)


@pytest.mark.slow
def test_bad_labels_stop_before_training_and_keep_files(small_dataset, tmp_path):
    import shutil

    from volseg.data.io import read_array, write_volume

    root = tmp_path / "bad"
    shutil.copytree(small_dataset, root)
    label_file = root / "labels" / "case_001.nii.gz"
    write_volume(label_file, read_array(label_file) * 3, spacing_zyx=(1, 0.5, 0.5))
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    result = _run(["train.py", f"data.root={root}", f"hydra.run.dir={tmp_path / 'run'}"])
    assert result.returncode == 2
    assert f"{label_file}: label values" in result.stderr and "outside [0, 5)" in result.stderr
    assert "Traceback" not in result.stderr
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before
    assert not (tmp_path / "run" / "checkpoints").exists()
    # the error once, last, on stderr; no config tree or run plan above it on the console
    both = result.stdout + result.stderr
    assert both.count("label values") == 1, both[-3000:]
    lines = result.stderr.strip().splitlines()
    (at,) = [i for i, line in enumerate(lines) if line.startswith("error: ")]
    assert all(line.startswith("  - ") for line in lines[at + 1 :]), lines  # its problems
    assert f"{label_file}: label values" in "\n".join(lines[at:])
    assert len(both.splitlines()) <= 20, both
    # the run folder says how it ended
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "failed" and "label values" in summary["error"]


@pytest.mark.slow
@pytest.mark.skipif(
    bool(os.environ.get("ATEN_CPU_CAPABILITY")),
    # torch 2.13: the compiled step segfaults when ATen's kernels are held below the CPU's own
    # ISA (ATEN_CPU_CAPABILITY=avx2 on an AVX-512 CPU), a stand-in for older CPUs only
    reason="torch.compile crashes with ATEN_CPU_CAPABILITY below the CPU's ISA",
)
def test_compiled_network_trains_and_its_checkpoint_loads_uncompiled(small_dataset, tmp_path):
    overrides = [
        *tiny_train_overrides(small_dataset),
        "model.compile=true",
        "model.net.widths=[4,8]",
        "trainer.max_epochs=1",
        "trainer.precision=32",
    ]
    cfg = compose_config("train", tmp_path, overrides)
    metrics = train(cfg)
    assert torch.isfinite(torch.tensor(metrics["train/loss"]))
    state = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    plain = UNet3D(1, 5, [4, 8], norm="instance")  # unet_tiny's norm
    plain.load_state_dict(
        {k.removeprefix("net."): v for k, v in state.items() if k.startswith("net.")}
    )


def test_check_only_checks_and_stops(small_dataset, tmp_path):
    cfg = compose_config(
        "train", tmp_path, [*tiny_train_overrides(small_dataset), "data.check_only=true"]
    )
    assert train(cfg) == {}
    assert not (tmp_path / "checkpoints").exists()


@pytest.mark.slow
def test_ddp_sim_trains_in_two_processes_with_one_run_dir(small_dataset, tmp_path):
    # 3 validation cases on 2 ranks: each must be validated once (no padding with a repeat)
    data = tmp_path / "data"
    shutil.copytree(small_dataset, data)
    names = sorted(p.name for p in (data / "images").iterdir())
    (data / "splits.json").write_text(json.dumps({"train": names[:3], "val": names[3:]}))
    run_dir = tmp_path / "runs" / "one"
    result = _run(
        [
            "train.py",
            "trainer=ddp_sim",
            f"data.root={data}",
            "data.patch_size=[16,32,32]",
            "model.net.widths=[4,8]",
            "trainer.max_epochs=2",
            "trainer.check_val_every_n_epoch=1",
            "hydra.verbose=volseg.models.segmentation_module",
            "memory.plan_step=false",
            f"hydra.run.dir={run_dir}",
        ]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["one"]  # no per-rank dirs
    summary = json.loads((run_dir / "summary.json").read_text())
    # 3 volumes x 4 patches split over 2 ranks, batch 2: 3 steps per epoch on each rank
    assert summary["global_step"] == 6
    logged = [float(r["val/dice_mean"]) for r in _metrics_rows(run_dir) if r["val/dice_mean"]]
    assert len(logged) == 2 and summary["best_val_dice_mean"] == pytest.approx(max(logged))
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    log = (run_dir / "train.log").read_text()
    assert log.count("Validation Dice over 3 case(s)") >= 2, log[-2000:]
    assert "Validation Dice over 4 case(s)" not in log


@pytest.fixture
def built(monkeypatch) -> list:
    """Every datamodule built from here on."""
    from volseg.data.datamodule import VolumeDataModule

    made: list[VolumeDataModule] = []
    init = VolumeDataModule.__init__

    def counted(self, *args, **kwargs):
        made.append(self)
        init(self, *args, **kwargs)

    monkeypatch.setattr(VolumeDataModule, "__init__", counted)
    return made


def _reads_shapes(small_dataset: Path) -> list[str]:
    return [
        *tiny_train_overrides(small_dataset),
        "memory.plan_step=true",  # the plan reads the validation shapes
        "data.check_only=true",
    ]


def test_train_builds_the_datamodule_once(small_dataset, tmp_path, built):
    """The plan builds the datamodule to read the validation shapes; train.py uses that one
    (the planner changed none of the ``data`` keys it was built from)."""
    overrides = _reads_shapes(small_dataset)
    assert train(compose_config("train", tmp_path / "a", overrides)) == {}
    assert len(built) == 1
    built.clear()
    plan = make_plan(compose_config("train", tmp_path / "b", overrides))
    assert built == [plan.datamodule]


@pytest.mark.slow
def test_a_planned_batch_builds_the_datamodule_anew(small_dataset, tmp_path, built):
    """The planner changes data.batch_size after the plan read the validation shapes: the
    datamodule it read them with was built with the old batch, and the run builds its own."""
    overrides = _reads_shapes(small_dataset)
    step = make_plan(compose_config("train", tmp_path / "b", overrides)).estimate
    budgeted = [*overrides, "data.batch_size=4", f"memory.budget={step['process_total'] * 3 // 2}"]
    built.clear()
    planned = make_plan(compose_config("train", tmp_path / "c", budgeted), fit_budget=True)
    assert planned.decisions["data.batch_size"].source == "planned"
    assert planned.datamodule is None and len(built) == 1
