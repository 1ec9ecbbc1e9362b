"""A real ``python train.py`` run on the CPU and its validation's measured rise: what validation
estimates are checked against."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO


def validation_rises(overrides: list[str], run_dir: Path) -> list[float]:
    """Run ``python train.py`` with ``overrides`` in a fresh process (freed tensors returned to
    the system at once: ``MALLOC_MMAP_THRESHOLD_=65536``) into ``run_dir``; each logged
    validation's rise above its start (MiB: ``mem/val_peak_allocated_mib`` minus
    ``mem/val_start_allocated_mib``, the memory monitor's)."""
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    result = subprocess.run(
        [sys.executable, "train.py", *overrides, f"hydra.run.dir={run_dir}"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    with open(run_dir / "csv" / "metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r.get("mem/val_peak_allocated_mib")]
    return [
        float(r["mem/val_peak_allocated_mib"]) - float(r["mem/val_start_allocated_mib"])
        for r in rows
    ]
