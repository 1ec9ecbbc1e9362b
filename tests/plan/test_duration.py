"""The run's predicted wall time: its steps, validations and checkpoint writes from the real
configs, each limit changing it as it changes the run. The step's seconds are given here (the
replay's own figures are the benchmarks'): 10 s a step, 0.01 s a window batch, and a validation
well within callbacks.validation_budget's share of an epoch unless a test makes it costly."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tests.conftest import compose_config
from volseg.callbacks.run_summary import predicted_and_measured
from volseg.plan import duration, make_plan
from volseg.plan.duration import duration_line, predict_duration, window_count
from volseg.speed.step_time import StepWork

STEP_S = 10.0
WINDOW_BATCH_S = 0.01


def _fake_run(device: str = "cpu") -> SimpleNamespace:
    """A step estimate as the engine gives it: its device, a checkpoint's bytes, its work."""
    step = SimpleNamespace(device=device, params=4_000_000, buffers=0, optimizer_state=8_000_000)
    return SimpleNamespace(step=step, work=StepWork(device))


@pytest.fixture
def given_seconds(monkeypatch):
    """The step costs STEP_S, a window batch WINDOW_BATCH_S (replayed: the line says so)."""
    run = _fake_run()

    def seconds_of(cfg, found):
        return (lambda work: STEP_S if work is found.work else WINDOW_BATCH_S), "replayed"

    monkeypatch.setattr(duration, "_seconds_of", seconds_of)
    monkeypatch.setattr(duration, "_load", lambda: (0.5, 2))  # a quiet machine
    return run


def _predict(tmp_path, overrides, run):
    """The default train config (the embedded dataset, not generated yet: 20 training and 4
    validation volumes of [32, 96, 96]), planned, and its predicted duration."""
    base = [f"paths.data_dir={tmp_path / 'data'}", "trainer.accelerator=cpu"]
    cfg = compose_config("train", tmp_path / "run", [*base, *overrides])
    planned = make_plan(cfg, estimate_step=False).run_config()
    return predict_duration(planned, run, None)


def test_steps_are_epochs_times_the_batches_of_an_epoch(tmp_path, given_seconds):
    found = _predict(tmp_path, [], given_seconds)
    # 20 training volumes x 4 samples / batch 2 = 40 steps an epoch, 12 epochs
    assert (found["steps_per_epoch"], found["epochs"], found["optimizer_steps"]) == (40, 12, 480)
    assert found["steps_from"].startswith(
        "20 training volumes x data.samples_per_volume=4 / data.batch_size=2 = 40 batches"
    )
    assert found["stopped_by"] == "trainer.max_epochs" and "capped_by" not in found
    # every 2nd epoch validated: 6; the sanity check validates 1 volume
    assert found["validations"] == 6
    # each validation volume: 4 windows of [32, 64, 64] in 2 batches of 2
    assert window_count([32, 96, 96], [32, 64, 64], 0.25) == 4
    sanity = found["validation_seconds"] / 4
    assert found["sanity_validation_seconds"] == pytest.approx(sanity, rel=1e-2)
    assert found["validation_seconds"] >= 4 * 2 * WINDOW_BATCH_S
    # the best checkpoint at each validation (at most: when it improves), last.ckpt at the 6
    # other epoch ends (at a validated one, a link to the best's file) and within each 400 s
    # epoch once (callbacks.last_checkpoint.save_every_minutes=5)
    assert found["checkpoint_writes"] == 6 + 6 + 12
    assert found["checkpoint_bytes"] == 12_000_000
    total = (
        480 * STEP_S
        + (6 + 0.25) * found["validation_seconds"]
        + 24 * found["checkpoint_write_seconds"]
    )
    assert found["seconds"] == pytest.approx(total, abs=0.1)
    assert found["training_seconds"] == 480 * STEP_S
    assert duration_line(found) == (
        f"run time: about {found['seconds'] / 60:,.0f} min on this machine: 480 steps at 10 s a "
        f"step, 6 validations at {found['validation_seconds']:.3g} s, 24 checkpoint writes"
    )


@pytest.mark.parametrize(
    ("overrides", "steps", "epoch_steps"),
    [
        (["trainer.accumulate_grad_batches=2"], 240, 20),  # a step every 2 batches
        (["trainer.limit_train_batches=10"], 120, 10),
        (["trainer.limit_train_batches=0.25"], 120, 10),
        (["data.batch_size=4"], 240, 20),
        (["data.samples_per_volume=1", "trainer.max_epochs=3"], 30, 10),
    ],
)
def test_the_step_count_follows_the_batches_an_epoch(
    tmp_path, given_seconds, overrides, steps, epoch_steps
):
    found = _predict(tmp_path, overrides, given_seconds)
    assert (found["optimizer_steps"], found["steps_per_epoch"]) == (steps, epoch_steps)


def test_max_steps_caps_the_steps_and_the_validations_that_run(tmp_path, given_seconds):
    full = _predict(tmp_path, [], given_seconds)
    found = _predict(tmp_path, ["trainer.max_steps=100"], given_seconds)
    # 40 + 40 + 20 steps: the 2nd epoch validated, the 3rd stopped inside
    assert (found["optimizer_steps"], found["epochs"], found["validations"]) == (100, 3, 1)
    assert found["stopped_by"] == "trainer.max_steps" and found["seconds"] < full["seconds"]
    assert "(trainer.max_steps=100 ends it)" in duration_line(found)
    # stopped inside the 2nd epoch: no validation ran (train.py says so at the end)
    found = _predict(tmp_path, ["trainer.max_steps=60"], given_seconds)
    assert (found["optimizer_steps"], found["validations"]) == (60, 0)
    # a limit the run does not reach changes nothing
    found = _predict(tmp_path, ["trainer.max_steps=1000"], given_seconds)
    assert found["optimizer_steps"] == 480 and found["seconds"] == full["seconds"]


def test_max_time_caps_the_duration_and_says_so(tmp_path, given_seconds):
    # trainer.max_time unbounds the epochs (configs/trainer/default.yaml): the time ends the run
    budget = ["callbacks.validation_budget=null"]
    found = _predict(tmp_path, ["trainer.max_time=00:01:00:00", *budget], given_seconds)
    assert found["stopped_by"] == "trainer.max_time" and found["max_time_seconds"] == 3600
    # an hour of training less the validations and writes in it, to the step that reaches it
    assert 340 < found["optimizer_steps"] <= 360 and found["epochs"] == 9
    after = found["sanity_validation_seconds"] + found["validation_seconds"] + STEP_S
    assert 3600 <= found["seconds"] <= 3600 + after
    assert "trainer.max_time=00:01:00:00 caps it: the run stops at the step" in duration_line(found)
    # callbacks.validation_budget (on by default) stops it after the last validation that fits:
    # the epoch that starts with less than two epochs and a validation left (800 s) is the last
    found = _predict(tmp_path, ["trainer.max_time=00:01:00:00"], given_seconds)
    assert found["stopped_by"].startswith("trainer.max_time (callbacks.validation_budget")
    assert (found["optimizer_steps"], found["epochs"]) == (320, 8)
    assert 3600 - 800 < found["seconds"] < 3600
    assert "after the last validation that fits" in duration_line(found)
    # a time the run does not reach: the epochs end it as before
    longer = ["trainer.max_time=00:10:00:00", "trainer.max_epochs=12"]
    found = _predict(tmp_path, longer, given_seconds)
    assert found["optimizer_steps"] == 480 and "capped_by" not in found


@pytest.mark.parametrize(
    ("overrides", "validations"),
    [
        (["trainer.check_val_every_n_epoch=1"], 12),
        (["trainer.check_val_every_n_epoch=3"], 4),
        # epochs 5 and 10, and the last: callbacks.validation_budget validates it
        (["trainer.check_val_every_n_epoch=5"], 3),
        (["trainer.check_val_every_n_epoch=5", "callbacks.validation_budget=null"], 2),
        (["trainer.val_check_interval=0.5", "trainer.check_val_every_n_epoch=1"], 24),
        (["trainer.limit_val_batches=0"], 0),
    ],
)
def test_validations_follow_the_epochs_that_validate(
    tmp_path, given_seconds, overrides, validations
):
    assert _predict(tmp_path, overrides, given_seconds)["validations"] == validations


def test_an_expensive_validation_is_run_less_often_as_the_budget_callback_does(
    tmp_path, monkeypatch
):
    """A validation longer than 10% of an epoch (callbacks.validation_budget.max_fraction):
    after the first, the interval is raised; the last epoch is still validated."""
    run = _fake_run()
    seconds = (lambda work: STEP_S if work is run.work else 100.0), "replayed"
    monkeypatch.setattr(duration, "_seconds_of", lambda cfg, found: seconds)
    found = _predict(tmp_path, [], run)
    assert found["validations"] == 2  # after the 2nd epoch and the 12th
    budget_off = _predict(tmp_path, ["callbacks.validation_budget=null"], run)
    assert budget_off["validations"] == 6


def test_a_plan_without_a_step_estimate_says_why(tmp_path):
    cfg = compose_config("train", tmp_path, ["trainer.accelerator=cpu"])
    plan = make_plan(cfg, estimate_step=False)
    assert plan.duration == {"not_predicted": "no step estimate (memory.plan_step=false)"}
    assert plan.to_dict()["duration"] == dict(plan.duration)
    line = duration_line(plan.duration)
    assert line == "run time: not predicted (no step estimate (memory.plan_step=false))"
    # the engine's reason where it could not estimate the step
    why = predict_duration(cfg, None, None, {"not_estimated": "ValueError: not modelled"})
    assert why == {"not_predicted": "ValueError: not modelled"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA plan made without a GPU")
def test_a_cuda_plan_without_a_gpu_is_modelled_for_the_named_gpu(tmp_path):
    """Nothing to replay on here: the stated GPU model of memory.gpu prices the step, and the
    line says so."""
    overrides = [f"paths.data_dir={tmp_path / 'data'}", "memory.plan_device=cuda"]
    cfg = compose_config("train", tmp_path / "run", [*overrides, "memory.gpu=L4"])
    planned = make_plan(cfg, estimate_step=False).run_config()
    found = predict_duration(planned, _fake_run("cuda"), None)
    assert found["timed"] == "modelled for the L4" and found["optimizer_steps"] == 480
    assert "modelled for the L4: 480 steps" in duration_line(found)


def test_a_debugging_run_and_a_dataset_not_there_are_not_predicted(tmp_path, given_seconds):
    found = _predict(tmp_path, ["trainer.fast_dev_run=true"], given_seconds)
    assert found == {"not_predicted": "trainer.fast_dev_run=True: a debugging run"}
    found = _predict(tmp_path, [f"data.root={tmp_path / 'none'}"], given_seconds)
    assert found["not_predicted"].endswith("does not exist yet: no case to count")


def test_the_time_is_predicted_when_first_read(tmp_path, given_seconds, monkeypatch):
    """A plan asked only for its decisions times nothing: the prediction is made when the
    duration is first read (train.py's line, plan.yaml), then kept."""
    calls = []
    predict = duration._predict
    monkeypatch.setattr(duration, "_predict", lambda *a: calls.append(1) or predict(*a))
    found = _predict(tmp_path, [], given_seconds)
    assert calls == []
    assert found["optimizer_steps"] == 480 and dict(found)["epochs"] == 12 and calls == [1]


def test_summary_json_puts_the_predicted_time_beside_the_measured_one(tmp_path, given_seconds):
    """RunSummary's figures: the plan's (``model.run_plan``, as train.py sets it) and the fit's
    wall time (a tiny training writes them: tests/test_train.py, tests/plan/test_plan.py)."""
    found = _predict(tmp_path, [], given_seconds)
    module = SimpleNamespace(run_plan={"duration": dict(found)})
    assert predicted_and_measured(module, 123.456) == {
        "predicted_seconds": found["seconds"],
        "predicted_timed": "replayed",
        "measured_seconds": 123.46,
    }
    module = SimpleNamespace(run_plan={"duration": {"not_predicted": "no step estimate"}})
    assert predicted_and_measured(module, 1.0) == {
        "predicted_seconds": None,
        "not_predicted": "no step estimate",
        "measured_seconds": 1.0,
    }


def test_a_time_replayed_on_a_busy_machine_says_so(tmp_path, given_seconds, monkeypatch):
    monkeypatch.setattr(duration, "_load", lambda: (5.2, 2))
    found = _predict(tmp_path, [], given_seconds)
    assert (found["load_average"], found["cores"]) == (5.2, 2)
    assert duration_line(found).endswith(
        "(timed while this machine was busy, load 5.2 on 2 cores: its replays, and the run, are "
        "slower than on a quiet one)"
    )
