"""hparams_search=optuna: volseg's Optuna sweeper (src/hydra_plugins/volseg_sweepers). The grammar
as Optuna distributions, the user's mistakes before any trial, and sweeps that fail, prune, run
trials side by side and resume a killed study."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.plugins import Plugins
from hydra.core.utils import JobReturn, JobStatus
from hydra.types import HydraContext
from omegaconf import OmegaConf
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState

from hydra_plugins.volseg_sweepers._search_space import parse_search_space
from tests.conftest import CONFIGS, REPO
from volseg.utils.errors import UserInputError
from volseg.utils.sweep import JobStopped

# --- the grammar, a test per form ---------------------------------------------------------------


def _space(expression: str, key: str = "data.batch_size"):
    space = parse_search_space({key: expression}, [])
    return space.distributions.get(key), space


def test_choice_of_numbers_is_categorical():
    dist, space = _space("choice(1, 2, 4)")
    assert dist == CategoricalDistribution([1, 2, 4])
    assert space.overrides({"data.batch_size": 2}) == ["data.batch_size=2"]


def test_choice_of_lists_is_categorical_over_their_override_strings():
    dist, space = _space("choice([8,16], [16, 32])", "model.net.widths")
    assert dist == CategoricalDistribution(["[8,16]", "[16,32]"])
    assert space.overrides({"model.net.widths": "[16,32]"}) == ["model.net.widths=[16,32]"]


def test_choice_of_strings_is_escaped_on_the_command_line():
    dist, space = _space("choice(adam, 'x,y')", "model.optimizer.name")
    assert dist == CategoricalDistribution(["adam", "x,y"])
    # a comma would make the override a sweep of its own: escaped as Hydra's grammar wants
    assert space.overrides({"model.optimizer.name": "x,y"}) == ["model.optimizer.name=x\\,y"]


def test_range_stops_before_its_end_as_in_a_hydra_multirun():
    assert _space("range(1, 5)")[0] == IntDistribution(1, 4, step=1)
    assert _space("range(0, 10, 3)")[0] == IntDistribution(0, 9, step=3)


def test_range_with_a_float_is_a_stepped_float():
    assert _space("range(0.0, 1.0, 0.25)")[0] == FloatDistribution(0.0, 0.75, step=0.25)


def test_interval_is_uniform_over_floats():
    assert _space("interval(0.1, 1.5)")[0] == FloatDistribution(0.1, 1.5)
    # Hydra's grammar makes an interval's bounds floats (an integer search is a range)
    assert _space("interval(1, 8)")[0] == FloatDistribution(1.0, 8.0)


def test_tag_log_interval_is_log_uniform():
    assert _space("tag(log, interval(0.001, 0.05))")[0] == FloatDistribution(0.001, 0.05, log=True)
    assert _space("tag(log, interval(1, 64))")[0] == FloatDistribution(1.0, 64.0, log=True)


def test_a_fixed_value_goes_to_every_trial_as_written():
    space = parse_search_space({"trainer.max_epochs": 3, "data.patch_size": [16, 32, 32]}, [])
    assert not space.distributions
    assert space.overrides({}) == ["trainer.max_epochs=3", "data.patch_size=[16,32,32]"]


def test_the_command_line_adds_to_the_params_and_wins_over_them():
    space = parse_search_space(
        {"data.batch_size": "choice(1, 2)", "model.optimizer.lr": "interval(0.01, 0.1)"},
        ["data.batch_size=choice(4,8)", "trainer.max_epochs=1"],
    )
    assert space.distributions == {
        "data.batch_size": CategoricalDistribution([4, 8]),
        "model.optimizer.lr": FloatDistribution(0.01, 0.1),
    }
    assert space.fixed == {"trainer.max_epochs": "trainer.max_epochs=1"}


@pytest.mark.parametrize(
    ("expression", "says"),
    [
        ("interval(0.1)", "is not a search space"),
        ("choice(1, 2", "is not a search space"),
        ("tag(log, interval(0.0, 1.0))", "needs low > 0"),
        ("interval(2, 1)", "needs low < high"),
        ("range(5, 1)", "holds no value"),
        ("tag(log, choice(1, 2))", "takes interval"),
        ("tag(lg, interval(1.0, 2.0))", "unknown tag"),
    ],
)
def test_a_bad_expression_is_one_line_naming_the_key(expression, says):
    with pytest.raises(UserInputError) as raised:
        parse_search_space({"model.optimizer.lr": expression}, [])
    message = str(raised.value)
    assert message.startswith("hydra.sweeper.params.model.optimizer.lr: ") and says in message
    assert "\n" not in message


def test_the_shipped_search_space_composes_and_parses(tmp_path):
    with _hydra(tmp_path, []) as (cfg, _):
        sweeper = cfg.hydra.sweeper
        assert sweeper._target_ == "hydra_plugins.volseg_sweepers._optuna_sweeper.OptunaSweeper"
        assert sweeper.direction == "maximize" and cfg.optimized_metric == "val/dice_mean_best"
        assert sweeper.max_failure_rate == 1.0  # failed trials never stop the study
        assert sweeper.sampler._target_ == "optuna.samplers.TPESampler"
        assert sweeper.sampler.seed == 1234
        assert str(cfg.hydra.mode) == "RunMode.MULTIRUN"
        space = parse_search_space(sweeper.params, [])
    assert not space.fixed
    assert space.distributions["model.optimizer.lr"] == FloatDistribution(0.001, 0.05, log=True)
    assert space.distributions["data.batch_size"] == CategoricalDistribution([1, 2, 4])
    widths = space.distributions["model.net.widths"]
    assert "[16,32,64,128]" in widths.choices
    # every patch size fits every depth: divisible by 2^(levels - 1)
    for patch in space.distributions["data.patch_size"].choices:
        for choice in widths.choices:
            levels = len(yaml.safe_load(choice))
            assert all(s % 2 ** (levels - 1) == 0 for s in yaml.safe_load(patch)), (patch, choice)


@pytest.mark.parametrize(
    ("choice", "sampler"),
    [
        ("tpe_seeded", optuna.samplers.TPESampler),
        ("tpe", optuna.samplers.TPESampler),
        ("random", optuna.samplers.RandomSampler),
        ("cmaes", optuna.samplers.CmaEsSampler),
        ("nsgaii", optuna.samplers.NSGAIISampler),
    ],
)
def test_each_sampler_choice_builds_its_optuna_sampler(tmp_path, choice, sampler):
    overrides = [f"hydra/sweeper/sampler={choice}"]
    with _hydra(tmp_path, overrides) as (cfg, sweeper):
        assert isinstance(sweeper.sampler, sampler)
        assert cfg.hydra.runtime.choices["hydra/sweeper/sampler"] == choice


# --- the user's mistakes: one line naming the key, exit code 2, before any trial ----------------


class _hydra:
    """``train.yaml`` with ``hparams_search=optuna`` and ``overrides`` composed as the entry point
    composes it, and volseg's sweeper set up by Hydra's plugin machinery with a task that must
    never run (every mistake is found before the first trial)."""

    def __init__(self, tmp_path: Path, overrides: list[str]) -> None:
        self.overrides = [
            "hparams_search=optuna",
            f"hydra.sweep.dir={tmp_path / 'sweep'}",
            f"paths.log_dir={tmp_path / 'logs'}",
            *overrides,
        ]

    def __enter__(self):
        GlobalHydra.instance().clear()
        self._init = initialize_config_dir(version_base="1.3", config_dir=str(CONFIGS))
        self._init.__enter__()
        cfg = compose("train", overrides=self.overrides, return_hydra_config=True)
        HydraConfig.instance().set_config(cfg)
        context = HydraContext(config_loader=GlobalHydra.instance().config_loader(), callbacks=None)
        sweeper = Plugins.instance().instantiate_sweeper(
            hydra_context=context,
            task_function=lambda _: pytest.fail("a trial ran"),
            config=cfg,
        )
        return cfg, sweeper

    def __exit__(self, *exc) -> None:
        self._init.__exit__(*exc)
        GlobalHydra.instance().clear()


def _sweep_error(tmp_path: Path, overrides: list[str], capsys, arguments=()) -> str:
    with _hydra(tmp_path, overrides) as (_, sweeper), pytest.raises(SystemExit) as stopped:
        sweeper.sweep(arguments=list(arguments))
    assert stopped.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err  # one line
    assert not (tmp_path / "sweep").exists() or not any((tmp_path / "sweep").iterdir())
    return err


def test_a_bad_search_space_expression_stops_the_sweep(tmp_path, capsys):
    err = _sweep_error(
        tmp_path, ["hydra.sweeper.params={model.optimizer.lr:'intervall(0.1, 0.2)'}"], capsys
    )
    assert err.startswith("error: hydra.sweeper.params.model.optimizer.lr: 'intervall(0.1, 0.2)'")


@pytest.mark.parametrize(
    ("overrides", "arguments", "where"),
    [
        # a key added to the shipped params (++: hydra.sweeper.params has none by that name)
        (
            ["++hydra.sweeper.params={model.optimizer.lrr:'choice(0.1, 0.2)'}"],
            [],
            "hydra.sweeper.params.model.optimizer.lrr",
        ),
        # a sweep override on the command line
        ([], ["model.optimizer.lrr=choice(0.1,0.2)"], "model.optimizer.lrr=choice(0.1,0.2)"),
    ],
)
def test_a_key_the_config_lacks_stops_the_sweep(tmp_path, capsys, overrides, arguments, where):
    err = _sweep_error(tmp_path, overrides, capsys, arguments)
    assert err == (
        f"error: {where}: the config has no key model.optimizer.lrr (to add one, write "
        "+model.optimizer.lrr)"
    )


def test_a_group_option_that_does_not_exist_stops_the_sweep(tmp_path, capsys):
    err = _sweep_error(
        tmp_path, ["++hydra.sweeper.params={model:'choice(unet_tiny, unet_nope)'}"], capsys
    )
    assert err.startswith("error: hydra.sweeper.params.model: no option unet_nope in config group")


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("sqlite:///{tmp}/no/such/folder/study.db", "unable to open database file"),
        ("nosuchdb://localhost/study", "nosuchdb"),
    ],
)
def test_a_storage_that_cannot_be_opened_stops_the_sweep(tmp_path, capsys, url, says):
    url = url.format(tmp=tmp_path)
    err = _sweep_error(tmp_path, [f"hydra.sweeper.storage={url}"], capsys)
    assert err.startswith(f"error: hydra.sweeper.storage={url}: cannot open it: ") and says in err


def test_a_direction_that_is_neither_stops_the_sweep(tmp_path, capsys):
    err = _sweep_error(tmp_path, ["hydra.sweeper.direction=maximise"], capsys)
    assert err.startswith("error: hydra.sweeper.direction=maximise: expected maximize or minimize")


def test_a_stored_study_with_another_direction_stops_the_sweep(tmp_path, capsys):
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    optuna.create_study(study_name="s", storage=storage, direction="maximize")
    err = _sweep_error(
        tmp_path,
        [
            f"hydra.sweeper.storage={storage}",
            "hydra.sweeper.study_name=s",
            "hydra.sweeper.direction=minimize",
        ],
        capsys,
    )
    assert err.startswith(
        "error: hydra.sweeper.direction: the stored study s has direction maximize; "
    )


# --- what a job returns, as the study records it -------------------------------------------------


def _job(status: JobStatus, value, run_dir: Path) -> JobReturn:
    """A job's return as Hydra's launchers make it (``hydra_cfg``: the job's ``hydra`` node)."""
    hydra_cfg = OmegaConf.create({"hydra": {"runtime": {"output_dir": str(run_dir)}}})
    return JobReturn(status=status, _return_value=value, working_dir=str(REPO), hydra_cfg=hydra_cfg)


def test_what_a_job_returns_becomes_the_trials_state_and_value(tmp_path):
    """A value completes the trial, a stopped job is failed or pruned (its error kept), and a job
    that returned nothing usable, or raised past the entry point, is failed."""
    returns = [
        (0.75, TrialState.COMPLETE),
        (
            JobStopped("pruned", "BudgetExceeded: memory.budget=1GiB: no fit"),
            TrialState.PRUNED,
        ),
        (JobStopped("failed", "UserInputError: patch too large"), TrialState.FAIL),
        (None, TrialState.FAIL),
        (float("nan"), TrialState.FAIL),
        ([0.5, 0.25], TrialState.FAIL),  # two values for one objective
        (RuntimeError("lost the node"), TrialState.FAIL),
    ]
    with _hydra(tmp_path, []) as (_, sweeper):
        study = optuna.create_study(direction="maximize")
        for number, (value, state) in enumerate(returns):
            trial = study.ask({"data.batch_size": CategoricalDistribution([1, 2])})
            raised = isinstance(value, Exception)
            job = _job(
                JobStatus.FAILED if raised else JobStatus.COMPLETED, value, tmp_path / str(number)
            )
            assert sweeper._tell(study, trial, job) == state
    trials = study.trials
    assert [t.state for t in trials] == [state for _, state in returns]
    assert trials[0].value == 0.75 and trials[0].user_attrs["run_dir"] == str(tmp_path / "0")
    assert trials[1].user_attrs["error"] == "BudgetExceeded: memory.budget=1GiB: no fit"
    assert trials[2].user_attrs["error"] == "UserInputError: patch too large"
    assert trials[6].user_attrs["error"] == "RuntimeError: lost the node"


def test_several_objectives_take_a_value_each(tmp_path):
    with _hydra(tmp_path, ["hydra.sweeper.direction=[maximize,minimize]"]) as (_, sweeper):
        study = optuna.create_study(directions=["maximize", "minimize"])
        for value in ([0.5, 120.0], 0.5):
            trial = study.ask({"data.batch_size": CategoricalDistribution([1, 2])})
            sweeper._tell(study, trial, _job(JobStatus.COMPLETED, value, tmp_path))
    assert [t.state for t in study.trials] == [TrialState.COMPLETE, TrialState.FAIL]
    assert study.trials[0].values == [0.5, 120.0]


# --- sweeps of real training jobs (train.py as a subprocess) ------------------------------------

# one 1-step trial per job on the small dataset: every trial trains and validates once
TINY_JOB = [
    "trainer.max_epochs=1",
    "trainer.check_val_every_n_epoch=1",
    "trainer.limit_train_batches=1",
    "trainer.limit_val_batches=1",
    "callbacks.validation_overlays=null",
    "memory.plan_step=false",
]


def _params(**space: str) -> str:
    """``hydra.sweeper.params`` replaced by a tiny space (``__`` for ``.`` in the key)."""
    base = {
        "model.optimizer.lr": "choice(0.003)",
        "model.net.widths": "choice([4,8])",
        "data.batch_size": "choice(2)",
        "data.patch_size": "choice([16,32,32])",
    }
    base |= {k.replace("__", "."): v for k, v in space.items()}
    return "hydra.sweeper.params={" + ",".join(f"{k}:'{v}'" for k, v in base.items()) + "}"


def _train(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "train.py", "hparams_search=optuna", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _rows(sweep_dir: Path) -> list[dict[str, str]]:
    path = sweep_dir / "sweep_summary.csv"
    if not path.is_file():
        return []
    with open(path) as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_a_failing_trial_is_recorded_and_the_sweep_goes_on(small_dataset, tmp_path):
    """2 trials over 2 patch sizes: the first is larger than the volumes and fails, the second
    trains (the seeded TPE sampler draws them in this order)."""
    sweep_dir = tmp_path / "sweep"
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    result = _train(
        "hydra.sweeper.n_trials=2",
        "hydra.sweeper.sampler.seed=14",
        f"hydra.sweeper.storage={storage}",
        "hydra.sweeper.study_name=fails",
        _params(data__patch_size="choice([16,32,32],[999,999,999])"),
        f"data.root={small_dataset}",
        f"hydra.sweep.dir={sweep_dir}",
        *TINY_JOB,
    )
    assert result.returncode == 1, result.stderr[-3000:]  # a trial failed
    assert "error: 1 of 2 job(s) failed (job 0)" in result.stderr
    rows = {r["status"]: r for r in _rows(sweep_dir)}
    assert set(rows) == {"ok", "failed"}
    assert (rows["failed"]["job"], rows["ok"]["job"]) == ("0", "1")  # went on after the failure
    assert "data.patch_size=[999,999,999]" in rows["failed"]["overrides"]
    assert "is larger than the volume" in rows["failed"]["error"]
    failed, ok = optuna.load_study(study_name="fails", storage=storage).trials
    assert (failed.state, ok.state) == (TrialState.FAIL, TrialState.COMPLETE)
    assert "is larger than the volume" in failed.user_attrs["error"]
    results = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    assert results["best_params"]["data.patch_size"] == "[16,32,32]"
    assert results["best_value"] == pytest.approx(float(rows["ok"]["best_val_dice_mean"]), abs=1e-4)


@pytest.mark.slow
def test_more_failures_than_max_failure_rate_stop_the_sweep(small_dataset, tmp_path):
    """Every trial's patch is larger than the volumes: with max_failure_rate=0.5 the sweep stops
    after its first trial instead of running the 3 it was given."""
    sweep_dir = tmp_path / "sweep"
    result = _train(
        "hydra.sweeper.n_trials=3",
        "hydra.sweeper.max_failure_rate=0.5",
        _params(data__patch_size="choice([999,999,999])"),
        f"data.root={small_dataset}",
        f"hydra.sweep.dir={sweep_dir}",
        *TINY_JOB,
    )
    assert result.returncode == 1, result.stderr[-3000:]
    assert (
        "error: 1 of 1 trial(s) failed, more than hydra.sweeper.max_failure_rate=0.5: "
        "the sweep stops" in result.stderr
    )
    assert [(r["job"], r["status"]) for r in _rows(sweep_dir)] == [("0", "failed")]


@pytest.mark.slow
def test_an_over_budget_trial_is_pruned_and_n_jobs_trials_launch_together(small_dataset, tmp_path):
    """3 trials, 2 a batch, batch size 1 or 16 under a 72 MiB budget (between the two steps with
    the margin of any kind of CPU): the seeded random sampler draws 16, 1 (one batch of two: the
    16 is pruned before it trains) and then 1."""
    sweep_dir = tmp_path / "sweep"
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    result = _train(
        "hydra/sweeper/sampler=random",
        "hydra.sweeper.sampler.seed=8",
        "hydra.sweeper.n_trials=3",
        "hydra.sweeper.n_jobs=2",
        f"hydra.sweeper.storage={storage}",
        "hydra.sweeper.study_name=budget",
        _params(data__batch_size="choice(1,16)"),
        "trainer.accelerator=cpu",
        "trainer.precision=32",
        "memory.budget=72MiB",
        f"data.root={small_dataset}",
        f"hydra.sweep.dir={sweep_dir}",
        *TINY_JOB,
    )
    assert result.returncode == 0, result.stderr[-3000:]  # a pruned trial is no failure
    output = result.stdout + result.stderr
    # the launcher got the trials as batches of 2 and 1
    assert output.count("Launching 2 jobs locally") == 1, output[-3000:]
    assert output.count("Launching 1 jobs locally") == 1
    rows = sorted(_rows(sweep_dir), key=lambda r: int(r["job"]))
    assert [(r["job"], r["status"]) for r in rows] == [("0", "pruned"), ("1", "ok"), ("2", "ok")]
    assert (
        "data.batch_size=16" in rows[0]["overrides"] and "memory.budget=72MiB" in rows[0]["error"]
    )
    assert not list((sweep_dir / "0").rglob("*.ckpt"))  # it never trained
    trials = optuna.load_study(study_name="budget", storage=storage).trials
    assert [t.state for t in trials] == [
        TrialState.PRUNED,
        TrialState.COMPLETE,
        TrialState.COMPLETE,
    ]
    assert [t.params["data.batch_size"] for t in trials] == [16, 1, 1]
    assert "memory.budget=72MiB" in trials[0].user_attrs["error"]


@pytest.mark.slow
def test_a_killed_sweep_resumes_and_its_study_opens_in_optuna(small_dataset, tmp_path):
    """A stored 3-trial study killed (SIGKILL) during its second trial; the same command again
    marks that trial failed and runs the 2 left, in the same sweep dir, with job numbers that go
    on: 3 completed trials, one row each in sweep_summary.csv, and the study that
    optuna.load_study opens holds the values the run summaries hold."""
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    command = [
        sys.executable,
        "train.py",
        "hparams_search=optuna",
        f"hydra.sweeper.storage={storage}",
        "hydra.sweeper.study_name=resume_me",
        "hydra.sweeper.n_trials=3",
        _params(model__optimizer__lr="tag(log, interval(0.001, 0.01))"),
        f"paths.log_dir={tmp_path / 'logs'}",
        f"data.root={small_dataset}",
        *TINY_JOB,
    ]
    sweeps = tmp_path / "logs" / "train" / "multiruns"
    first = subprocess.Popen(
        command,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and first.poll() is None:
        dirs = list(sweeps.glob("*")) if sweeps.is_dir() else []
        # the second trial's job has started (its folder) and not finished (no row yet)
        if dirs and (dirs[0] / "1").is_dir() and len(_rows(dirs[0])) == 1:
            os.killpg(first.pid, signal.SIGKILL)
            break
        time.sleep(0.1)
    first.wait(timeout=30)
    assert first.returncode == -signal.SIGKILL, "the sweep ended before the kill"
    (sweep_dir,) = sweeps.glob("*")
    assert [r["job"] for r in _rows(sweep_dir)] == ["0"]

    again = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert list(sweeps.glob("*")) == [sweep_dir]  # the first run's dir, no second one
    rows = _rows(sweep_dir)
    assert [(r["job"], r["status"]) for r in rows] == [("0", "ok"), ("2", "ok"), ("3", "ok")]

    study = optuna.load_study(study_name="resume_me", storage=storage)
    assert [t.state.name for t in study.trials] == ["COMPLETE", "FAIL", "COMPLETE", "COMPLETE"]
    complete = [t for t in study.trials if t.state == TrialState.COMPLETE]
    for trial, row in zip(complete, rows, strict=True):
        run_dir = sweep_dir / row["job"]
        assert trial.user_attrs["run_dir"] == str(run_dir)
        summary = json.loads((run_dir / "summary.json").read_text())
        assert trial.value == pytest.approx(summary["best_val_dice_mean"], abs=1e-6)
        assert f"model.optimizer.lr={trial.params['model.optimizer.lr']}" in row["overrides"]

    # started once more: nothing left to run
    third = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert third.returncode == 0, third.stderr[-3000:]
    assert len(_rows(sweep_dir)) == 3
    assert len(optuna.load_study(study_name="resume_me", storage=storage).trials) == 4
