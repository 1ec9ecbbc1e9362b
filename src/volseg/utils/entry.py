"""What every entry point does around its task: project root, config printing, user errors."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import rich.syntax
import rich.tree
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from volseg.utils.alloc_conf import apply_allocator, run_allocator_node
from volseg.utils.config import renamed_key
from volseg.utils.errors import TrainingDiverged, UserInputError
from volseg.utils.extras import MissingPackage, check_plugin_choices
from volseg.utils.sweep import (
    JobStopped,
    error_line,
    failed_jobs,
    in_multirun,
    is_global_zero,
    job_status,
    record_job,
)

log = logging.getLogger(__name__)

# the command shape of each entry point (by task_name), shown when a mandatory value is missing
USAGE = {
    "train": "python train.py [key=value ...]",
    "eval": "python eval.py ckpt_path=PATH [data.root=DIR] [predictions_dir=DIR]",
    "predict": "python predict.py ckpt_path=PATH input=DIR_OR_FILE output=DIR",
    "estimate": "python estimate_memory.py [train.py overrides] [memory.json_out=FILE]",
    "plan": "python plan.py data.root=DIR [memory.budget=16GiB] [memory.plan_device=cuda]",
}

# set when the entry point's task starts: an error before it is Hydra's (composing the config)
_task_started = False


def run_main(main: Callable[[], Any]) -> None:
    """Call a ``@hydra.main`` function. Hydra reports a bad override (an unknown key, a value
    that does not parse, a missing config file) as one message, but with exit code 1: it becomes
    2 like every other user mistake; a failure inside the task keeps its own code. A multirun
    in which any job failed exits with code 1 (pruned jobs are no failure). A choice whose Hydra
    plugin is not installed (``hparams_search=optuna`` without the ``sweeps`` extra) is one line
    naming the extra, exit code 2, before Hydra composes anything."""
    try:
        check_plugin_choices(sys.argv[1:])
    except MissingPackage as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    renamed = renamed_key(sys.argv[1:])
    if renamed is not None:
        print(f"error: {renamed}", file=sys.stderr)
        sys.exit(2)
    try:
        main()
    except SystemExit as done:
        if done.code == 1 and not _task_started:
            name_unparsable_override(sys.argv[1:])
            sys.exit(2)
        raise
    if failed_jobs:
        sys.exit(1)  # a multirun in which a job failed (SweepSummary printed which)


def name_unparsable_override(args: list[str]) -> None:
    """Hydra's grammar error ("no viable alternative at input '[1'") does not say which
    override it is about: name the first one that does not parse."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for arg in args:
        if arg.startswith("-"):
            continue  # Hydra's own flags (--multirun, --cfg job)
        try:
            parser.parse_override(arg)
        except Exception:
            print(
                f"error: {arg}: not a valid override (key=value; quote values with brackets, "
                "commas or spaces, e.g. 'data.patch_size=[32,64,64]')",
                file=sys.stderr,
            )
            return


def set_project_root(entry_file: str) -> Path:
    """Make ``paths.root_dir`` (``${oc.env:PROJECT_ROOT}``) the folder of the entry point."""
    root = Path(entry_file).resolve().parent
    os.environ.setdefault("PROJECT_ROOT", str(root))
    return root


def print_config(cfg: DictConfig, save_to: Path | None = None) -> None:
    """Print the composed config as a tree, one branch per top-level group."""
    tree = rich.tree.Tree("CONFIG", style="dim", guide_style="dim")
    for key, value in cfg.items():
        body = (
            OmegaConf.to_yaml(value, resolve=False) if isinstance(value, DictConfig) else str(value)
        )
        tree.add(str(key), style="bold").add(rich.syntax.Syntax(body, "yaml"))
    rich.print(tree)
    if save_to is not None:
        save_to.parent.mkdir(parents=True, exist_ok=True)
        with open(save_to, "w") as f:
            rich.print(tree, file=f)


def run_task(task: Callable[[DictConfig], Any], cfg: DictConfig) -> Any:
    """Run ``task(cfg)`` after writing ``memory.allocator`` into the environment
    (:func:`volseg.utils.alloc_conf.apply_allocator`); a :class:`UserInputError` becomes one
    stderr message and exit code 2,
    a :class:`TrainingDiverged` (NaN/Inf loss) one message and exit code 1.

    In a Hydra multirun every job gets a row in the sweep's ``sweep_summary.csv``, and a job that
    fails (bad input, an exception, CUDA out of memory) is recorded as failed, or one that raises
    :class:`~volseg.utils.errors.TrialPruned` as pruned, while the sweep goes on to the next job;
    such a job returns a :class:`~volseg.utils.sweep.JobStopped` (the Optuna sweeper records its
    trial as failed or pruned).
    """
    global _task_started
    _task_started = True
    multirun = in_multirun()
    try:
        # first of all: memory.allocator into PYTORCH_CUDA_ALLOC_CONF, before anything starts
        # CUDA (torch reads it once, when its allocator starts; child processes inherit it)
        apply_allocator(run_allocator_node(cfg))
        check_mandatory(cfg)
        result = task(cfg)
    except Exception as raised:
        err = user_error(raised) or missing_value_error(raised, cfg) or raised
        close_wandb()
        if multirun:
            status = job_status(err)
            if status == "pruned":
                log.warning("Job pruned: %s; the sweep goes on", err)
            else:
                log.exception("Job failed; the sweep goes on")
            print(f"error: job {status}: {err}", file=sys.stderr)
            if is_global_zero():
                record_job(None, err)
            return JobStopped(status, error_line(err))
        if isinstance(err, UserInputError | TrainingDiverged):
            log.error("%s", err)
            print(f"error: {err}", file=sys.stderr)
            sys.exit(2 if isinstance(err, UserInputError) else 1)
        raise
    close_wandb()
    if multirun and is_global_zero():
        record_job(result if isinstance(result, dict) else None, None)
    return result


def check_mandatory(cfg: DictConfig) -> None:
    """One error naming every top-level ``???`` value the command line did not set."""
    missing = [str(k) for k in cfg if OmegaConf.is_missing(cfg, k)]
    if missing:
        raise UserInputError(
            f"no value for {', '.join(missing)} (no default); set it on the command line: "
            f"{USAGE.get(str(cfg.get('task_name')), 'key=value')}"
        )


def missing_value_error(err: BaseException, cfg: DictConfig) -> UserInputError | None:
    """OmegaConf's ``MissingMandatoryValue`` (a ``???`` value read by the task, e.g. ``data.root``
    of ``data=folder``) as a :class:`UserInputError` naming the key."""
    while err is not None and not isinstance(err, MissingMandatoryValue):
        err = err.__cause__ or err.__context__
    if err is None:
        return None
    key = getattr(err, "full_key", None) or "a value"
    usage = USAGE.get(str(cfg.get("task_name")), "key=value")
    return UserInputError(f"{key}: no value (???); set it on the command line: {usage} {key}=...")


def seed_everything(cfg: DictConfig) -> None:
    """Seed Python, NumPy and torch (and loader workers) with ``seed`` unless it is null."""
    seed = cfg.get("seed")
    if seed is None:
        return
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise UserInputError(f"seed={seed}: expected a whole number >= 0, or null")
    L.seed_everything(seed, workers=True)


def user_error(err: BaseException) -> UserInputError | None:
    """The :class:`UserInputError` behind ``err``: Hydra's ``instantiate`` wraps what a
    constructor raises in its own InstantiationException."""
    while err is not None:
        if isinstance(err, UserInputError):
            return err
        err = err.__cause__
    return None


def close_wandb() -> None:
    """Finish the job's W&B run, so that the next job of a multirun starts its own."""
    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "run", None) is not None:
        wandb.finish()
