"""Hydra multirun: one row per job in the sweep's ``sweep_summary.csv``, failed jobs included."""

from __future__ import annotations

import csv
import json
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from lightning.fabric.utilities.rank_zero import rank_zero_only

from volseg.utils.errors import TrialPruned

log = logging.getLogger(__name__)

SUMMARY_FILE = "sweep_summary.csv"
# set by SweepSummary when a job of the sweep failed: the entry point then exits with code 1
failed_jobs: list[str] = []

COLUMNS = [
    "job",
    "overrides",
    "status",
    "best_val_dice_mean",
    "peak_allocated_mib",
    "error",
    "run_dir",
]


@dataclass(frozen=True)
class JobStopped:
    """A multirun job's ``failed`` or ``pruned`` status and error, for the sweeper."""

    status: str
    error: str


def objective(
    result: dict[str, float] | JobStopped | None, optimized_metric: str | Sequence[str] | None
) -> float | list[float | None] | JobStopped | None:
    """What a job returns to the sweeper: its metric value(s), or its :class:`JobStopped`."""
    if isinstance(result, JobStopped) or not optimized_metric:
        return result
    metrics = result or {}
    names = [optimized_metric] if isinstance(optimized_metric, str) else list(optimized_metric)
    absent = [n for n in names if n not in metrics]
    if absent and metrics:
        log.warning(
            "optimized_metric: %s not among the run's metrics (%s)",
            ", ".join(absent),
            ", ".join(sorted(metrics)),
        )
    values = [metrics.get(n) for n in names]
    return values[0] if isinstance(optimized_metric, str) else values


def in_multirun() -> bool:
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def is_global_zero() -> bool:
    """Rank 0 of a distributed job, or not distributed (only rank 0 adds the job's row)."""
    return getattr(rank_zero_only, "rank", 0) == 0


def job_status(error: BaseException | None) -> str:
    """``ok``, ``pruned`` (a :class:`TrialPruned`, e.g. over the memory budget) or ``failed``."""
    if error is None:
        return "ok"
    return "pruned" if isinstance(error, TrialPruned) else "failed"


def record_job(metrics: dict[str, Any] | None, error: BaseException | None) -> None:
    """Append this job's row to ``<sweep dir>/sweep_summary.csv``."""
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    summary_file = run_dir / "summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.is_file() else {}
    best = (metrics or {}).get("val/dice_mean_best", summary.get("best_val_dice_mean"))
    row = {
        "job": hydra_cfg.job.num,
        "overrides": " ".join(hydra_cfg.overrides.task),
        "status": job_status(error),
        "best_val_dice_mean": "" if best is None else f"{best:.4f}",
        "peak_allocated_mib": summary.get("memory", {}).get("peak_allocated_mib", ""),
        "error": "" if error is None else error_line(error),
        "run_dir": str(run_dir),
    }
    path = Path(hydra_cfg.sweep.dir) / SUMMARY_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    # parallel launchers run jobs in separate processes: one writer at a time
    with FileLock(f"{path}.lock"), open(path, "a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        if f.tell() == 0:
            writer.writeheader()
        writer.writerow(row)


def stop_job(err: BaseException) -> JobStopped:
    """A failed or pruned job (called where it is caught): logged, its row recorded, its status
    returned to the sweeper; the sweep goes on."""
    status = job_status(err)
    if status == "pruned":
        log.warning("Job pruned: %s; the sweep goes on", err)
    else:
        log.exception("Job failed; the sweep goes on")
    print(f"error: job {status}: {err}", file=sys.stderr)
    if is_global_zero():
        record_job(None, err)
    return JobStopped(status, error_line(err))


def error_line(error: BaseException) -> str:
    """The error as one line of at most 500 characters (``Type: message | next line``)."""
    return " | ".join(f"{type(error).__name__}: {error}".splitlines())[:500]


class SweepSummary(Callback):
    """Hydra callback: the table of a multirun; failed jobs make the exit code 1."""

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        if not (sweep_dir / SUMMARY_FILE).is_file():
            return  # no job got to write its row
        with open(sweep_dir / SUMMARY_FILE, newline="") as f:
            rows = list(csv.DictReader(f))
        counts = {s: sum(r["status"] == s for r in rows) for s in ("ok", "pruned", "failed")}
        lines = [
            f"Sweep {sweep_dir}: {len(rows)} job(s), "
            + ", ".join(f"{n} {status}" for status, n in counts.items()),
            f"  {'job':>4}  {'status':<7} {'best dice':>9}  overrides / error",
        ]
        for r in sorted(rows, key=lambda r: int(r["job"]) if r["job"].isdigit() else -1):
            lines.append(
                f"  {r['job']:>4}  {r['status']:<7} {r['best_val_dice_mean'] or '-':>9}  "
                f"{r['overrides']}"
            )
            if r["error"]:
                lines.append(f"  {'':>4}  {'':<7} {'':>9}  {r['error'][:200]}")
        print("\n".join(lines), flush=True)
        failed = [r["job"] for r in rows if r["status"] == "failed"]
        failed_jobs.extend(failed)
        if failed:
            print(
                f"error: {len(failed)} of {len(rows)} job(s) failed (job {', '.join(failed)}); "
                f"see the error column of {sweep_dir / SUMMARY_FILE}",
                file=sys.stderr,
                flush=True,
            )
