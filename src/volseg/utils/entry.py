"""What every entry point does around its task: project root, config printing, user errors; what
reaches the terminal: errors once on stderr, long reports in the log file only."""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import rich.syntax
import rich.tree
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from volseg.utils.alloc_conf import apply_allocator, run_allocator_node
from volseg.utils.config import renamed_key
from volseg.utils.errors import TrainingDiverged, UserInputError, causes
from volseg.utils.extras import MissingPackage, check_plugin_choices
from volseg.utils.overrides import why_composing_failed
from volseg.utils.signals import TrainingInterrupted, raise_on, resume_command
from volseg.utils.sweep import failed_jobs, in_multirun, is_global_zero, record_job, stop_job

log = logging.getLogger(__name__)

# the command shape of each entry point (by task_name), shown when a mandatory value is missing
USAGE = {
    "train": "python train.py [key=value ...]",
    "eval": "python eval.py ckpt_path=PATH [data.root=DIR] [predictions_dir=DIR]",
    "predict": "python predict.py ckpt_path=PATH input=DIR_OR_FILE output=DIR",
    "estimate": "python estimate_memory.py [train.py overrides] [memory.json_out=FILE]",
    "plan": "python plan.py data.root=DIR [memory.budget=16GiB] [memory.plan_device=cuda]",
}

#: records for the run's log file, not the console
file_log = logging.getLogger("volseg.file_only")


def report_error(message: str, prefix: str = "error: ") -> None:
    """``message`` once on stderr (``error: ...``), and in the run's log file."""
    file_log.error("%s", message)
    sys.stderr.flush()
    sys.stdout.flush()
    print(f"{prefix}{message}", file=sys.stderr, flush=True)


#: third-party log lines that advertise or repeat what the run says itself (message prefixes)
QUIET_PREFIXES = (
    "💡 Tip:",  # Lightning's litlogger / litmodels advertisements
    "Trainer already configured with model summary callbacks",  # callbacks.model_summary is ours
)


def _keep(record: logging.LogRecord) -> bool:
    return not str(record.getMessage()).startswith(QUIET_PREFIXES)


def quiet_third_party() -> None:
    """Drop Lightning's tips (:data:`QUIET_PREFIXES`) from the console and the log."""
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logging.getLogger(name).addFilter(_keep)  # once: addFilter skips one it holds


class HeldStderr(io.StringIO):
    """``sys.stderr`` held while Hydra composes (its advice replaced by one line)."""

    def __init__(self, stream: Any) -> None:
        super().__init__()
        self.stream = stream

    def release(self, write: bool = True) -> None:
        """Hand stderr back, writing what was held (``write``) or dropping it."""
        if sys.stderr is self:
            sys.stderr = self.stream
        if write:
            self.stream.write(self.getvalue())
            self.stream.flush()
        self.seek(0)
        self.truncate()

    def fileno(self) -> int:
        return self.stream.fileno()

    def isatty(self) -> bool:
        return self.stream.isatty()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.stream, "encoding", None) or "utf-8"


def run_main(main: Callable[[], Any]) -> None:
    """Call a ``@hydra.main`` function: a bad override or a missing plugin's extra exits 2 with one
    line; a multirun in which a job failed exits 1."""
    try:
        check_plugin_choices(sys.argv[1:])
        refused = renamed_key(sys.argv[1:])
    except MissingPackage as err:
        refused = str(err)
    if refused is not None:
        print(f"error: {refused}", file=sys.stderr)
        sys.exit(2)
    # held until the task starts (run_task): an error before it is Hydra's, composing the config
    sys.stderr = held = HeldStderr(sys.stderr)
    try:
        main()
    except SystemExit as done:
        if done.code == 1 and sys.stderr is held:  # Hydra could not compose the config
            line = why_composing_failed(sys.argv[1:])
            held.release(write=line is None)  # else Hydra's own message (a missing file, ...)
            if line is not None:
                print(f"error: {line}", file=sys.stderr)
            sys.exit(2)
        raise
    finally:
        held.release()
    if failed_jobs:
        sys.exit(1)  # a multirun in which a job failed (SweepSummary printed which)


def set_project_root(entry_file: str) -> None:
    """Make ``paths.root_dir`` (``${oc.env:PROJECT_ROOT}``) the folder of the entry point."""
    os.environ.setdefault("PROJECT_ROOT", str(Path(entry_file).resolve().parent))


def print_config(cfg: DictConfig) -> None:
    """``extras.print_config``: the config as a tree written to the run's ``config_tree.log``
    (``file``), and printed (``true``)."""
    if not cfg.extras.get("print_config"):
        return
    save_to = Path(cfg.paths.output_dir) / "config_tree.log"
    tree = rich.tree.Tree("CONFIG", style="dim", guide_style="dim")
    for key, value in cfg.items():
        body = (
            OmegaConf.to_yaml(value, resolve=False) if isinstance(value, DictConfig) else str(value)
        )
        tree.add(str(key), style="bold").add(rich.syntax.Syntax(body, "yaml"))
    save_to.parent.mkdir(parents=True, exist_ok=True)
    with open(save_to, "w") as f:
        rich.print(tree, file=f)
    if cfg.extras.print_config is True:
        rich.print(tree)
    else:
        log.info("Config: %s (extras.print_config=true prints it here)", save_to)


def run_task(task: Callable[[DictConfig], Any], cfg: DictConfig) -> Any:
    """Run ``task(cfg)`` after writing ``memory.allocator`` into the environment: a
    :class:`UserInputError` is one stderr line and exit code 2, a :class:`TrainingDiverged` exit
    code 1; SIGINT/SIGTERM end with the command that resumes (:func:`stopped`). In a multirun a
    failed or pruned job is recorded and returns a ``JobStopped``: the sweep goes on."""
    if isinstance(sys.stderr, HeldStderr):  # the task's warnings and errors go out as they come
        sys.stderr.release()
    quiet_third_party()
    multirun = in_multirun()
    # until training handles it (a clean stop at a step boundary): SIGTERM stops as Ctrl-C does
    restore_signals = raise_on()
    try:
        try:
            # first of all: torch reads PYTORCH_CUDA_ALLOC_CONF once, when CUDA starts
            apply_allocator(run_allocator_node(cfg))
            check_mandatory(cfg)
            result = task(cfg)
        finally:
            restore_signals()
            close_wandb()
    except (KeyboardInterrupt, TrainingInterrupted, SIGTERMException) as raised:
        stopped(raised, cfg)
    except Exception as raised:
        err = user_error(raised) or missing_value_error(raised, cfg) or raised
        mark_failed(cfg, err)
        if multirun:
            return stop_job(err)
        if isinstance(err, UserInputError | TrainingDiverged):
            report_error(str(err))
            sys.exit(2 if isinstance(err, UserInputError) else 1)
        raise
    if multirun and is_global_zero():
        record_job(result if isinstance(result, dict) else None, None)
    return result


def stopped(raised: BaseException, cfg: DictConfig) -> None:
    """A run stopped by SIGINT or SIGTERM: ``summary.json`` says so, the last line on stderr is the
    command that resumes, exit code 128 + the signal's number."""
    if not isinstance(raised, TrainingInterrupted):
        # Ctrl-C outside training, or Lightning's SIGTERM stop before the first step
        signum = signal.SIGINT if isinstance(raised, KeyboardInterrupt) else signal.SIGTERM
        raised = TrainingInterrupted(signum)
    mark_failed(cfg, raised, status="interrupted")
    message = str(raised)
    if raised.checkpoint:
        message += f"\nresume with: {resume_command(raised.checkpoint)}"
    report_error(message, prefix="")  # not an error: what the user asked for
    sys.exit(raised.exit_code)


def mark_failed(cfg: DictConfig, err: BaseException, status: str = "failed") -> None:
    """``summary.json`` (status and error) for a run that ended without one."""
    out = OmegaConf.select(cfg, "paths.output_dir", throw_on_resolution_failure=False)
    summary = Path(str(out)) / "summary.json"
    if out is None or not summary.parent.is_dir() or summary.exists() or not is_global_zero():
        return  # no run folder (a config without paths), or a summary written already
    summary.write_text(json.dumps({"status": status, "error": str(err)}, indent=2))


def check_mandatory(cfg: DictConfig) -> None:
    """One error naming every top-level ``???`` value the command line did not set."""
    missing = [str(k) for k in cfg if OmegaConf.is_missing(cfg, k)]
    if missing:
        raise UserInputError(
            f"no value for {', '.join(missing)} (no default); set it on the command line: "
            f"{USAGE.get(str(cfg.get('task_name')), 'key=value')}"
        )


def missing_value_error(err: BaseException, cfg: DictConfig) -> UserInputError | None:
    """A ``???`` value the task read, as a :class:`UserInputError` naming it."""
    while err is not None and not isinstance(err, MissingMandatoryValue):
        err = err.__cause__ or err.__context__
    if err is None:
        return None
    key = getattr(err, "full_key", None) or "a value"
    usage = USAGE.get(str(cfg.get("task_name")), "key=value")
    return UserInputError(f"{key}: no value (???); set it on the command line: {usage} {key}=...")


def seed_everything(cfg: DictConfig) -> None:
    """Seed Python, NumPy, torch and loader workers with ``seed`` unless it is null."""
    seed = cfg.get("seed")
    if seed is None:
        return
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise UserInputError(f"seed={seed}: expected a whole number >= 0, or null")
    L.seed_everything(seed, workers=True)


def user_error(err: BaseException) -> UserInputError | None:
    """The :class:`UserInputError` behind ``err`` (Hydra's ``instantiate`` wraps it)."""
    return next((e for e in causes(err) if isinstance(e, UserInputError)), None)


def close_wandb() -> None:
    """Finish the job's W&B run, so that the next job of a multirun starts its own."""
    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "run", None) is not None:
        wandb.finish()
