"""The Optuna sweeper, resumable: ``hparams_search=optuna`` with a storage picks a study up where
it stopped.

With ``hydra.sweeper.storage=sqlite:///FILE`` and ``hydra.sweeper.study_name=NAME``, starting
the same command again (after a kill, a crash, a lost node) runs only the trials still missing
to ``n_trials``, in the first run's sweep dir, with job numbers that go on from the last one, so
``sweep_summary.csv`` holds every trial once. A trial the kill interrupted (left ``RUNNING`` in
the storage) is marked failed and run again as a new trial.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import optuna
from hydra_plugins.hydra_optuna_sweeper.optuna_sweeper import OptunaSweeper
from omegaconf import OmegaConf, open_dict
from optuna.trial import TrialState

log = logging.getLogger(__name__)

# the study's user attribute that remembers its sweep dir
SWEEP_DIR_ATTR = "volseg_sweep_dir"


class ResumableOptunaSweeper(OptunaSweeper):
    """:class:`OptunaSweeper` (same options) that resumes a stored study instead of adding
    ``n_trials`` more trials to it."""

    def sweep(self, arguments: list[str]) -> None:
        impl = self.sweeper
        if impl.storage is not None:
            self._resume(impl)
        try:
            return impl.sweep(arguments)
        except ValueError as err:
            # optuna's best_trial when no trial completed: the sweep's table says why each failed
            if "Record does not exist" not in str(err) and "No trials are completed" not in str(
                err
            ):
                raise
            log.error("No trial of the study completed: no best parameters to write")
            return None

    def _resume(self, impl: Any) -> None:
        study = optuna.create_study(
            study_name=impl.study_name,
            storage=impl.storage,
            directions=impl._get_directions(),
            load_if_exists=True,
        )
        trials = study.get_trials(deepcopy=False)
        interrupted = [t for t in trials if t.state == TrialState.RUNNING]
        for trial in interrupted:
            study._storage.set_trial_state(trial._trial_id, TrialState.FAIL)
        finished = len(trials) - len(interrupted)
        sweep_dir = str(impl.config.hydra.sweep.dir)
        first_dir = study.user_attrs.get(SWEEP_DIR_ATTR)
        if first_dir is None:
            study.set_user_attr(SWEEP_DIR_ATTR, sweep_dir)
        elif first_dir != sweep_dir:
            self._move_sweep_dir(impl.config, sweep_dir, first_dir)
        if not trials:
            return
        left = max(impl.n_trials - finished, 0)
        log.info(
            "Resuming study %s: %d of %d trial(s) done, %d interrupted (marked failed), %d to run",
            study.study_name,
            finished,
            impl.n_trials,
            len(interrupted),
            left,
        )
        impl.n_trials = left
        impl.job_idx = len(trials)  # job numbers (and their folders) go on after the last one

    @staticmethod
    def _move_sweep_dir(config: Any, new_dir: str, first_dir: str) -> None:
        """Run this invocation's jobs in the study's first sweep dir (one ``sweep_summary.csv``):
        the launcher reads ``hydra.sweep.dir`` of this config, each job's config is composed
        again from the ``hydra.*`` overrides."""
        log.info("Study's sweep dir: %s (not %s)", first_dir, new_dir)
        OmegaConf.set_readonly(config.hydra, False)
        with open_dict(config):
            config.hydra.sweep.dir = first_dir
            config.hydra.overrides.hydra.append(f"hydra.sweep.dir={first_dir}")
        if Path(new_dir).is_dir() and not os.listdir(new_dir):
            os.rmdir(new_dir)  # the empty folder made for this invocation
