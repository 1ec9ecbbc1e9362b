"""volseg's Optuna sweeper (``hparams_search=optuna``): Hydra's sweeper interface on Optuna's
ask/tell API.

Each batch asks ``n_jobs`` trials of the study, hands their overrides to the launcher as one
batch (joblib and SLURM run them side by side), and tells the study what each job returned:
its value(s), or failed, or pruned (a job over the memory budget stops before it trains). With a
storage and a study name, the same command started again after a kill runs only the trials
still missing to ``n_trials``, in the study's first sweep dir, with job numbers that go on.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydra.core.utils import JobReturn
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from hydra.utils import instantiate
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict

from volseg.utils.errors import UserInputError
from volseg.utils.sweep import JobStopped, failed_jobs

if TYPE_CHECKING:
    import optuna

    from hydra_plugins.volseg_sweepers._search_space import SearchSpace

log = logging.getLogger(__name__)


class OptunaSweeper(Sweeper):
    """``hydra.sweeper`` of ``configs/hydra/sweeper/optuna.yaml`` (every argument is a key
    there: ``sampler`` an Optuna sampler, ``params`` key -> search-space expression)."""

    def __init__(
        self,
        sampler: Any,
        direction: str | Sequence[str],
        storage: str | None,
        study_name: str | None,
        n_trials: int,
        n_jobs: int,
        max_failure_rate: float,
        params: Any = None,
    ) -> None:
        # Hydra builds the sweeper's arguments (recursive instantiation): a built sampler
        self.sampler = sampler
        self.direction = direction
        self.storage = storage
        self.study_name = study_name
        self.n_trials = n_trials
        self.n_jobs = n_jobs
        self.max_failure_rate = max_failure_rate
        self.params = params
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.launcher: Any = None

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        from hydra.core.plugins import Plugins

        self.config = config
        self.hydra_context = hydra_context
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def sweep(self, arguments: list[str]) -> None:
        from hydra_plugins.volseg_sweepers._study import write_results

        try:
            space, study, to_run, job_idx = self._prepare(arguments)
        except UserInputError as err:
            # before any trial: one line, exit code 2 (volseg.utils.entry keeps it)
            log.error("%s", err)
            print(f"error: {err}", file=sys.stderr, flush=True)
            sys.exit(2)
        self._run(study, space, to_run, job_idx)
        write_results(study, Path(str(self.config.hydra.sweep.dir)))

    def _prepare(self, arguments: list[str]) -> tuple[SearchSpace, optuna.Study, int, int]:
        """Everything a user can get wrong, checked before any trial: the search space, its keys,
        the options, the storage. Returns the space, the study, the trials to run and the first
        job number."""
        # Optuna is imported here, not when Hydra scans its plugins at every start
        from hydra_plugins.volseg_sweepers._search_space import parse_search_space
        from hydra_plugins.volseg_sweepers._study import (
            directions,
            fail_interrupted,
            finished_trials,
            open_storage,
            open_study,
            study_sweep_dir,
        )

        params = OmegaConf.to_container(self.params, resolve=False) if self.params else {}
        space = parse_search_space(params, arguments)
        self._check_keys(space)
        if not space.distributions:
            raise UserInputError(
                "hydra.sweeper.params: nothing to search (no choice, range or interval)"
            )
        for key, minimum in (("n_trials", 0), ("n_jobs", 1)):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise UserInputError(
                    f"hydra.sweeper.{key}={value}: expected a whole number >= {minimum}"
                )
        rate = self.max_failure_rate
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 <= rate <= 1:
            raise UserInputError(
                f"hydra.sweeper.max_failure_rate={self.max_failure_rate}: expected 0 to 1"
            )
        study_directions = directions(self.direction)
        storage = open_storage(self.storage)
        sampler = instantiate(self.sampler) if OmegaConf.is_config(self.sampler) else self.sampler
        study = open_study(storage, self.study_name, sampler, study_directions)
        to_run, job_idx = self.n_trials, 0
        if storage is not None and study.trials:
            interrupted = fail_interrupted(study)
            finished = finished_trials(study) - interrupted
            to_run = max(self.n_trials - finished, 0)
            job_idx = len(study.trials)  # job numbers (and their folders) go on after the last
            log.info(
                "Resuming study %s: %d of %d trial(s) done, %d cut short (marked failed), "
                "%d to run",
                study.study_name,
                finished,
                self.n_trials,
                interrupted,
                to_run,
            )
        if storage is not None:
            self._use_sweep_dir(study_sweep_dir(study, str(self.config.hydra.sweep.dir)))
        return space, study, to_run, job_idx

    def _check_keys(self, space: SearchSpace) -> None:
        """Each searched or fixed key names a value of the config, or a config group (and each
        choice one of its options)."""
        loader = self.hydra_context.config_loader
        keys = {**dict.fromkeys(space.fixed), **space.distributions}
        for key, dist in keys.items():
            name = key.lstrip("+~")
            if "@" in name or key.startswith("+"):
                continue  # a package override or a key being added: nothing to find
            options = loader.get_group_options(name)
            if options:
                unknown = [c for c in getattr(dist, "choices", ()) if str(c) not in options]
                if unknown:
                    raise UserInputError(
                        f"{space.where[key]}: no option {', '.join(map(str, unknown))} "
                        f"in config group {name} (options: {', '.join(options)})"
                    )
            elif not _has_key(self.config, name):
                raise UserInputError(
                    f"{space.where[key]}: the config has no key {name} (to add one, write +{name})"
                )

    def _use_sweep_dir(self, sweep_dir: str) -> None:
        """Run this invocation's jobs in the study's first sweep dir (one ``sweep_summary.csv``):
        the launcher reads ``hydra.sweep.dir`` of this config, and each job's config is composed
        again from its ``hydra.*`` overrides."""
        config = self.config
        new_dir = str(config.hydra.sweep.dir)
        if new_dir == sweep_dir:
            return
        log.info("Study's sweep dir: %s (not %s)", sweep_dir, new_dir)
        OmegaConf.set_readonly(config.hydra, False)
        with open_dict(config):
            config.hydra.sweep.dir = sweep_dir
            config.hydra.overrides.hydra.append(f"hydra.sweep.dir={sweep_dir}")
        if Path(new_dir).is_dir() and not os.listdir(new_dir):
            os.rmdir(new_dir)  # the empty folder made for this invocation

    def _run(self, study: optuna.Study, space: SearchSpace, to_run: int, job_idx: int) -> None:
        """Ask, launch and tell, ``n_jobs`` trials a batch, until ``to_run`` trials ran or more
        than ``max_failure_rate`` of them failed."""
        from optuna.trial import TrialState

        from hydra_plugins.volseg_sweepers._study import JOB_ATTR

        told = failed = 0
        while told < to_run:
            trials = [
                study.ask(space.distributions) for _ in range(min(self.n_jobs, to_run - told))
            ]
            batch = [space.overrides(trial.params) for trial in trials]
            for number, trial in enumerate(trials, start=job_idx):
                trial.set_user_attr(JOB_ATTR, number)
            try:
                self.validate_batch_is_legal(batch)
                returns = self.launcher.launch(batch, initial_job_idx=job_idx)
            except BaseException:
                # interrupted (Ctrl-C) or a batch that does not compose: no trial left RUNNING
                for trial in trials:
                    study.tell(trial, state=TrialState.FAIL)
                raise
            job_idx += len(trials)
            for trial, ret in zip(trials, returns, strict=True):
                state = self._tell(study, trial, ret)
                failed += state == TrialState.FAIL
                told += 1
            if failed / told > self.max_failure_rate:
                message = (
                    f"{failed} of {told} trial(s) failed, more than "
                    f"hydra.sweeper.max_failure_rate={self.max_failure_rate}: the sweep stops"
                )
                log.error("%s", message)
                print(f"error: {message}", file=sys.stderr, flush=True)
                failed_jobs.append("max_failure_rate")  # the entry point exits with code 1
                return

    def _tell(
        self, study: optuna.Study, trial: optuna.Trial, ret: JobReturn
    ) -> optuna.trial.TrialState:
        """Tell the study what the job of ``trial`` returned; its state."""
        from optuna.trial import TrialState

        from hydra_plugins.volseg_sweepers._study import ERROR_ATTR, RUN_DIR_ATTR

        # the job's run dir (its working dir is the sweep's, unless hydra.job.chdir)
        run_dir = OmegaConf.select(ret.hydra_cfg, "hydra.runtime.output_dir", default=None)
        trial.set_user_attr(RUN_DIR_ATTR, str(run_dir or ret.working_dir))
        try:
            value = ret.return_value  # re-raises what the job raised past volseg's entry point
        except Exception as err:
            value = JobStopped("failed", f"{type(err).__name__}: {err}"[:500])
        if isinstance(value, JobStopped):
            state = TrialState.PRUNED if value.status == "pruned" else TrialState.FAIL
            trial.set_user_attr(ERROR_ATTR, value.error)
            study.tell(trial, state=state)
            return state
        values = self._values(value, len(study.directions))
        if values is None:
            reason = f"the job returned {value!r}, not {len(study.directions)} finite number(s)"
            log.warning("Trial %d failed: %s", trial.number, reason)
            trial.set_user_attr(ERROR_ATTR, reason)
            study.tell(trial, state=TrialState.FAIL)
            return TrialState.FAIL
        study.tell(trial, values)
        return TrialState.COMPLETE

    @staticmethod
    def _values(value: Any, count: int) -> list[float] | None:
        """The job's return value as ``count`` finite floats, else ``None``."""
        items = list(value) if isinstance(value, list | tuple) else [value]
        if len(items) != count:
            return None
        try:
            floats = [float(v) for v in items]
        except (TypeError, ValueError):
            return None
        return floats if all(math.isfinite(v) for v in floats) else None


def _has_key(config: DictConfig, name: str) -> bool:
    """Whether the dotted key ``name`` is in ``config`` (a ``???`` value counts; nothing is
    resolved on the way)."""
    parent_key, _, leaf = name.rpartition(".")
    parent = (
        OmegaConf.select(config, parent_key, default=None, throw_on_resolution_failure=False)
        if parent_key
        else config
    )
    if isinstance(parent, DictConfig):
        return leaf in parent.keys()  # noqa: SIM118 (`in parent` is False for a ??? value)
    if isinstance(parent, ListConfig):
        return leaf.isdigit() and int(leaf) < len(parent)
    return False
