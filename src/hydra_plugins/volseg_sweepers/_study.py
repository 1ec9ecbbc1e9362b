"""The sweeper's Optuna study: opened (or picked up from its storage), resumed, summed up.

Only Optuna's public API: ``create_study(load_if_exists=True)``, ``Study.tell`` (also by trial
number, for a trial another process left ``RUNNING``), user attributes, ``best_trial(s)``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import optuna
import yaml
from optuna.study import StudyDirection
from optuna.trial import TrialState

from volseg.utils.errors import UserInputError

log = logging.getLogger(__name__)

#: the study's user attribute that remembers its sweep dir (where a resumed sweep writes)
SWEEP_DIR_ATTR = "volseg_sweep_dir"
#: the trial's user attributes: its job number, run dir and (when it did not complete) why
JOB_ATTR, RUN_DIR_ATTR, ERROR_ATTR = "job", "run_dir", "error"
RESULTS_FILE = "optimization_results.yaml"


def directions(direction: str | Sequence[str]) -> list[StudyDirection]:
    """``hydra.sweeper.direction``: ``maximize``, ``minimize`` or a list of them (one per
    objective)."""
    names = [direction] if isinstance(direction, str) else list(direction)
    if not names:
        raise UserInputError("hydra.sweeper.direction: empty; expected maximize or minimize")
    found = []
    for name in names:
        try:
            found.append(StudyDirection[str(name).upper()])
        except KeyError:
            raise UserInputError(
                f"hydra.sweeper.direction={name}: expected maximize or minimize (or a list of "
                "them, one per objective)"
            ) from None
        if found[-1] == StudyDirection.NOT_SET:
            raise UserInputError(f"hydra.sweeper.direction={name}: expected maximize or minimize")
    return found


def open_storage(url: str | None) -> optuna.storages.BaseStorage | None:
    """The study's storage (``None``: in memory); a URL that cannot be opened (a driver that is
    not installed, a folder that does not exist, a database that refuses) is the user's error."""
    if url is None:
        return None
    try:
        return optuna.storages.RDBStorage(str(url))
    except Exception as err:  # SQLAlchemy's errors, by driver: any of them means "cannot open"
        reason = " ".join(str(err).split())[:300] or type(err).__name__
        raise UserInputError(f"hydra.sweeper.storage={url}: cannot open it: {reason}") from None


def open_study(
    storage: optuna.storages.BaseStorage | None,
    study_name: str | None,
    sampler: optuna.samplers.BaseSampler,
    study_directions: list[StudyDirection],
) -> optuna.Study:
    """The study named ``study_name`` in ``storage``, created if it is not there yet."""
    study = optuna.create_study(
        storage=storage,
        study_name=study_name,
        sampler=sampler,
        directions=study_directions,
        load_if_exists=True,
    )
    # a stored study keeps the directions of its first start (Optuna loads it without a word)
    if list(study.directions) != list(study_directions):
        stored = ", ".join(d.name.lower() for d in study.directions)
        raise UserInputError(
            f"hydra.sweeper.direction: the stored study {study_name} has direction {stored}; "
            "give it the same, or start a new study (another hydra.sweeper.study_name)"
        )
    return study


def fail_interrupted(study: optuna.Study) -> int:
    """Mark the trials a killed sweep left ``RUNNING`` as failed (they are run again as new
    trials); the number of them."""
    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    for trial in running:
        study.tell(trial.number, state=TrialState.FAIL)
        log.warning(
            "Trial %d (job %s) was cut short: marked failed",
            trial.number,
            trial.user_attrs.get(JOB_ATTR, "?"),
        )
    return len(running)


def finished_trials(study: optuna.Study) -> int:
    """Trials that ran to an end: complete, failed or pruned."""
    states = (TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED)
    return len(study.get_trials(deepcopy=False, states=states))


def study_sweep_dir(study: optuna.Study, sweep_dir: str) -> str:
    """The sweep dir of the study's first run (remembered in the study), else ``sweep_dir``."""
    first = study.user_attrs.get(SWEEP_DIR_ATTR)
    if first is None:
        study.set_user_attr(SWEEP_DIR_ATTR, sweep_dir)
        return sweep_dir
    return str(first)


def write_results(study: optuna.Study, sweep_dir: Path) -> Path | None:
    """``<sweep_dir>/optimization_results.yaml``: the best parameters and value (one objective)
    or the Pareto front (several); ``None`` when no trial completed."""
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if not complete:
        log.error("No trial of the study completed: no best parameters to write")
        return None
    results: dict[str, Any] = {"name": "optuna", "study_name": study.study_name}
    if len(study.directions) == 1:
        best = study.best_trial
        results |= {"best_params": best.params, "best_value": best.value, "best_trial": best.number}
        log.info("Best parameters: %s, value %s (trial %d)", best.params, best.value, best.number)
    else:
        results["solutions"] = [
            {"params": t.params, "values": t.values, "trial": t.number} for t in study.best_trials
        ]
        log.info("Pareto front: %d trial(s)", len(results["solutions"]))
    path = Path(sweep_dir) / RESULTS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(results, sort_keys=False))
    return path
