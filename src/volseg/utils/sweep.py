"""Hydra multirun: one row per job in the sweep's ``sweep_summary.csv``, failed jobs included."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode

COLUMNS = [
    "job",
    "overrides",
    "status",
    "best_val_dice_mean",
    "peak_allocated_mib",
    "error",
    "run_dir",
]


def in_multirun() -> bool:
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def record_job(metrics: dict[str, Any] | None, error: BaseException | None) -> Path:
    """Append this job's row to ``<sweep dir>/sweep_summary.csv`` and return the file's path."""
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    summary_file = run_dir / "summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.is_file() else {}
    best = (metrics or {}).get("val/dice_mean_best", summary.get("best_val_dice_mean"))
    row = {
        "job": hydra_cfg.job.num,
        "overrides": " ".join(hydra_cfg.overrides.task),
        "status": "ok" if error is None else "failed",
        "best_val_dice_mean": "" if best is None else f"{best:.4f}",
        "peak_allocated_mib": summary.get("memory", {}).get("peak_allocated_mib", ""),
        "error": ""
        if error is None
        else " | ".join(f"{type(error).__name__}: {error}".splitlines())[:500],
        "run_dir": str(run_dir),
    }
    path = Path(hydra_cfg.sweep.dir) / "sweep_summary.csv"
    new = not path.is_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        if new:
            writer.writeheader()
        writer.writerow(row)
    return path
