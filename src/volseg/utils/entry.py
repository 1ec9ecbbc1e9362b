"""What every entry point does around its task: project root, config printing, user errors."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import rich.syntax
import rich.tree
from omegaconf import DictConfig, OmegaConf

from volseg.utils.errors import UserInputError
from volseg.utils.sweep import in_multirun, is_global_zero, job_status, record_job

log = logging.getLogger(__name__)


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
    """Run ``task(cfg)``; a :class:`UserInputError` becomes one stderr message and exit code 2.

    In a Hydra multirun every job gets a row in the sweep's ``sweep_summary.csv``, and a job that
    fails (bad input, an exception, CUDA out of memory) is recorded as failed, or one that raises
    :class:`~volseg.utils.errors.TrialPruned` as pruned, while the sweep goes on to the next job;
    such a job returns ``None`` (the Optuna sweeper records a trial without a value as failed).
    """
    multirun = in_multirun()
    try:
        result = task(cfg)
    except Exception as raised:
        err = user_error(raised) or raised
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
            return None
        if isinstance(err, UserInputError):
            log.error("%s", err)
            print(f"error: {err}", file=sys.stderr)
            sys.exit(2)
        raise
    close_wandb()
    if multirun and is_global_zero():
        record_job(result if isinstance(result, dict) else None, None)
    return result


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
