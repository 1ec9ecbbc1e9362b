"""A real ``python train.py`` (or ``plan.py``, ``predict.py``) in a fresh process, read back.

Every benchmark that starts an entry point goes through here: :func:`train` starts
``python train.py <overrides> hydra.run.dir=<run_dir>`` in a work dir with an environment and a
time limit, waits, and returns a :class:`TrainRun`: the rows of the run's ``csv/metrics.csv``
(``logger=csv``), its ``summary.json``, the run dir and the wall seconds of the whole process.
:func:`start` and :meth:`Child.wait` split the same into two, for runs in parallel. Each child
leads its own process group, so a limit (or :func:`stop_children`, from a signal handler) stops
it with its loader workers. A failure raises :class:`RunFailed` with the end of its stderr, a
limit :class:`TimedOut`.

The memory monitor's rows (one per micro-batch) and each optimizer step's rise above what it
held at its start are read by :func:`monitor_rows` and :func:`step_rises`; what the estimator
says of the same config (nothing run), by :func:`estimated`.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from volseg.utils.units import MIB

REPO = Path(__file__).resolve().parents[1]

#: the process groups of the children running now (each child leads its own)
_CHILDREN: set[int] = set()


class RunFailed(RuntimeError):
    """A child exited with an error (the message ends with its stderr's last lines)."""


class TimedOut(RunFailed):
    """A child stopped at its limit (``timeout``: seconds)."""

    def __init__(self, message: str, timeout: float) -> None:
        super().__init__(message)
        self.timeout = timeout


@dataclass(frozen=True)
class TrainRun:
    """A finished ``train.py`` run: ``rows`` of ``csv/metrics.csv`` as the CSV logger wrote them
    (strings, empty where a row has no value), ``summary`` (``summary.json``; None when the run
    wrote none), ``seconds`` (wall time of the whole process) and the child's ``pid``."""

    run_dir: Path
    rows: list[dict[str, str]]
    summary: dict[str, Any] | None
    seconds: float
    pid: int


def child_env(extra: dict[str, str] | None = None, path: Sequence[Path] = ()) -> dict[str, str]:
    """This process's environment for a child, unbuffered, with ``extra`` set and ``path`` put
    first on ``PYTHONPATH`` (a user's own modules, as ``PYTHONPATH=. python train.py``)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(extra or {}))
    env.setdefault("PROJECT_ROOT", str(REPO))
    parts = [*(str(p) for p in path), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in parts if p)
    return env


@dataclass
class Child:
    """A started entry point; :meth:`wait` for it."""

    script: str
    process: subprocess.Popen
    stderr: TextIO
    started: float

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait(self, timeout: float | None = None) -> float:
        """Wall seconds once it exits 0; :class:`TimedOut` (its group killed) past ``timeout``
        seconds from its start, :class:`RunFailed` on an error."""
        left = None if timeout is None else max(0.0, timeout - (time.perf_counter() - self.started))
        try:
            self.process.wait(timeout=left)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
            self.process.wait()
            self.stderr.close()
            raise TimedOut(f"{self.script} ran past {timeout:.0f} s (stopped)", timeout) from None
        finally:
            _CHILDREN.discard(self.pid)
        seconds = time.perf_counter() - self.started
        self.stderr.seek(0)
        err = self.stderr.read()
        self.stderr.close()
        if self.process.returncode != 0:
            raise RunFailed(f"{self.script} failed ({self.process.returncode}):\n{err[-3000:]}")
        return seconds


def start(
    script: str, arguments: Sequence[str], cwd: Path = REPO, env: dict[str, str] | None = None
) -> Child:
    """Start ``python <REPO/script> <arguments>`` in ``cwd``, in a process group of its own,
    stdout discarded, stderr kept for an error message."""
    err = tempfile.TemporaryFile("w+")  # noqa: SIM115  (Child.wait closes it)
    process = subprocess.Popen(
        [sys.executable, str(REPO / script), *arguments],
        cwd=cwd,
        env=env if env is not None else child_env(),
        stdout=subprocess.DEVNULL,
        stderr=err,
        text=True,
        start_new_session=True,
    )
    _CHILDREN.add(process.pid)
    return Child(script, process, err, time.perf_counter())


def run(
    script: str,
    arguments: Sequence[str],
    cwd: Path = REPO,
    env: dict[str, str] | None = None,
    timeout: float | None = None,
) -> float:
    """:func:`start`, then :meth:`Child.wait`: the wall seconds of ``python <script>``."""
    return start(script, arguments, cwd, env).wait(timeout)


def start_train(
    overrides: Sequence[str],
    run_dir: Path,
    cwd: Path = REPO,
    env: dict[str, str] | None = None,
    script: str = "train.py",
) -> Child:
    """Start ``python train.py <overrides> hydra.run.dir=<run_dir>``; :func:`read` it after
    :meth:`Child.wait`."""
    return start(script, [*overrides, f"hydra.run.dir={run_dir}"], cwd, env)


def read(run_dir: Path, seconds: float, pid: int = 0) -> TrainRun:
    """A finished run's metrics rows (none without ``logger=csv``) and summary."""
    metrics = run_dir / "csv" / "metrics.csv"
    rows: list[dict[str, str]] = []
    if metrics.is_file():
        with metrics.open(newline="") as f:
            rows = [{k: v or "" for k, v in row.items()} for row in csv.DictReader(f)]
    summary_file = run_dir / "summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.is_file() else None
    return TrainRun(run_dir, rows, summary, seconds, pid)


def train(
    overrides: Sequence[str],
    run_dir: Path,
    cwd: Path = REPO,
    env: dict[str, str] | None = None,
    timeout: float | None = None,
    script: str = "train.py",
) -> TrainRun:
    """``python train.py <overrides>`` into ``run_dir``, waited for and read back."""
    child = start_train(overrides, run_dir, cwd, env, script)
    seconds = child.wait(timeout)
    return read(run_dir, seconds, child.pid)


def stop_children(signum: int, frame: object) -> None:
    """A signal handler (``signal.signal(signal.SIGTERM, stop_children)``): the children, in
    process groups of their own, would outlive this process (and hold a GPU); they are killed
    first."""
    for pid in list(_CHILDREN):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    raise SystemExit(128 + signum)


def column(rows: Sequence[dict[str, str]], key: str) -> list[float]:
    """Every value of ``key`` in a run's metrics rows, in the order they were logged."""
    return [float(row[key]) for row in rows if row.get(key)]


def last_with(rows: Sequence[dict[str, str]], key: str) -> dict[str, float]:
    """The last metrics row that has ``key``, its filled values as floats."""
    found = [row for row in rows if row.get(key)]
    if not found:
        raise RunFailed(f"the run logged no {key}")
    return {k: float(v) for k, v in found[-1].items() if v}


def monitor_rows(rows: Sequence[dict[str, str]]) -> list[dict[str, float]]:
    """The memory monitor's rows (one per micro-batch, ``memory.every_n_steps=1``), in the order
    they were logged; Lightning's own rows, without ``mem/*``, are left out."""
    return [
        {k: float(v) for k, v in row.items() if v not in ("", None)}
        for row in rows
        if row.get("mem/peak_allocated_mib")
    ]


def step_rises(rows: Sequence[dict[str, float]], accumulate_grad_batches: int) -> list[dict]:
    """Per optimizer step (``accumulate_grad_batches`` consecutive monitor rows): peak allocated
    and reserved, what was held at its start and its rise above it (bytes)."""
    k = accumulate_grad_batches
    if len(rows) % k:
        raise ValueError(f"{len(rows)} monitor rows are not whole steps of {k} micro-batches")
    steps = []
    for first in range(0, len(rows), k):
        micro = rows[first : first + k]
        start_bytes = micro[0]["mem/step_start_allocated_mib"] * MIB
        peak = max(r["mem/peak_allocated_mib"] for r in micro) * MIB
        steps.append(
            {
                "start": start_bytes,
                "peak_allocated": peak,
                "peak_reserved": max(r["mem/peak_reserved_mib"] for r in micro) * MIB,
                "growth": peak - start_bytes,
            }
        )
    return steps


def steady_step(run: TrainRun, accumulate_grad_batches: int, steps: int) -> dict:
    """The steady step of a run of ``steps`` optimizer steps: of steps 2.. (the first also
    creates the optimizer state) the one with the largest rise, with every step's rise
    (``rises``, bytes)."""
    found = step_rises(monitor_rows(run.rows), accumulate_grad_batches)
    if len(found) != steps:
        raise RunFailed(f"{run.run_dir.name}: the monitor logged {len(found)} steps, not {steps}")
    steady = max(found[1:], key=lambda s: s["growth"])
    return {**steady, "rises": [s["growth"] for s in found]}


def estimated(cfg: Any, candidate: Any = None, volume: Sequence[int] | None = None) -> Any:
    """:func:`volseg.memory.estimate_run` of the planned ``cfg`` (``planned_config``'s) as a
    :class:`volseg.memory.Candidate` changes it, with its validation of one ``volume``
    ``[D, H, W]`` where given: a ``RunEstimate`` (``.step``, ``.flops_per_step``,
    ``.validation``), from fake tensors."""
    from volseg.memory import estimate_run
    from volseg.plan import RunPlan

    return estimate_run(RunPlan(cfg, {}), candidate, volume)
