"""GPU runs kept as data: ``benchmarks/results/cuda/<date>_<gpu>.json``.

Each run is a real ``python train.py trainer=gpu <overrides>`` in a fresh process (the memory
monitor on every micro-batch into the CSV logger; seconds per optimizer step from
:class:`volseg.callbacks.step_timer.StepTimer`) and, for a whole run, ``python predict.py`` of
the validated volume with that run's checkpoint. Up to ``--jobs`` processes are in flight, and
each uses the GPU only while it holds one lock (:class:`volseg.callbacks.step_timer.GpuTurn`:
from the start of training to its end, validation included, and around prediction): runs train
one at a time, and one run's start-up (imports, data, CUDA context: ~10 s on the H200 machine)
overlaps another's training.

``measured`` holds the steady step's (the 2nd.. step with the largest rise above its start) peak
allocated and reserved and that rise, the median seconds per optimizer step of the steps after
the first, ``nvidia_smi_mib`` (the largest figure nvidia-smi gave for the process, polled every
0.25 s: reserved plus the CUDA context), and the process's wall seconds. A whole run adds
``validation`` (the monitor's ``mem/val_peak_allocated_mib`` / ``mem/val_peak_reserved_mib``) and
``prediction`` (predict.py's peaks, from the monitor's ``prediction_memory.json``), each beside
its estimate. ``estimated``: the run's newest row in
``benchmarks/results/cpu/*_cuda_grid_estimates.json``, which ``--estimate`` writes on a CPU
before the GPU run (``memory.plan_device=cuda``; for the held-out runs the estimate predates the
measurement).

The runs, in the order they start (the most wanted figures first; no run starts after
``--budget-s``, runs still going at ``--deadline-s`` are stopped, and every run not finished is
listed under ``not_run``):

1. the reference config (unet_large, 2x1x26x150x320, 16-mixed) with
   ``memory.allocator.expandable_segments`` false and true, 10 steps each;
2. whole runs (:data:`WHOLE_RUN`): train.py's validation and predict.py's prediction;
3. levers toward a 4x cut on the reference config at little step time (:data:`LEVERS`);
4. the other main recorded runs (:data:`ALLOCATOR_MAIN`) with expandable segments false and true;
5. :data:`HELD_OUT_NEW` and :data:`WHOLE_RUN_HELD_OUT`, written before any GPU ran them;
6. the rest of the recorded grid (``recorded``: the configs already in
   ``benchmarks/results/cuda``), alternating with :data:`HELD_OUT`.

Held-out runs are marked ``held_out``: written into this file before any GPU ran them and never
tuned on. The file is rewritten after every run, so a run cut short keeps what was measured; it
ends with ``allocator_comparison`` (each config with expandable segments off and on: reserved,
nvidia-smi, step time) and ``levers_toward_4x`` (each lever run's cut of the reference's peak
allocated, reserved and nvidia-smi, and its step time against the reference's).

    python -m benchmarks cuda_results [--budget-s 300] [--deadline-s 350] [--jobs 3] [--out DIR]
    python -m benchmarks cuda_results --estimate    # on a CPU: the grid's CUDA estimates
    python -m benchmarks cuda_results --dry-run [--groups ...] [--out DIR]   # tiny, on the CPU
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from itertools import zip_longest
from pathlib import Path
from typing import NamedTuple

from benchmarks import grid, harness, results_io
from benchmarks.grid import COMPOSE_LOCK, Grid, accumulation, merge
from volseg.memory.estimate.cuda_context import nvidia_smi
from volseg.utils.units import MIB

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("PROJECT_ROOT", str(REPO))

RESULTS = REPO / "benchmarks" / "results" / "cuda"
GRIDS = REPO / "benchmarks" / "grids" / "cuda"


def _grid(name: str) -> Grid:
    """A frozen grid of ``benchmarks/grids/<name>``: ``[(name, overrides), ...]``."""
    return [(n, list(o)) for n, o in json.loads((GRIDS / name).read_text())["configs"]]


#: ``--estimate`` writes ``<date>_cuda_grid_estimates.json`` here; a GPU run reads the newest
ESTIMATES = REPO / "benchmarks" / "results" / "cpu"
ESTIMATES_NAME = "cuda_grid_estimates"

#: the reference config: unet_large (channels-last) batch 2 of 1x26x150x320, 16-mixed
SEED = ["model=unet_large", "data.batch_size=2", "data.patch_size=[26,150,320]"]
REFERENCE = [*SEED, "trainer.precision=16-mixed"]
REFERENCE_NAME = "reference table: unet_large 16-mixed"
STEP_TIMER = "+callbacks.step_timer._target_=volseg.callbacks.step_timer.StepTimer"
EXPANDABLE = "memory.allocator.expandable_segments"
ON = ", expandable_segments on"
#: optimizer steps of a run: memory only, and timed (step time: the median of steps 2..10)
STEPS, TIMED_STEPS = 3, 10
#: a child process's limit (s), waiting for its turn on the GPU included
RUN_LIMIT_S = 150


class Job(NamedTuple):
    """One ``train.py`` run (and, with ``volume``, ``predict.py`` of that volume)."""

    name: str
    overrides: tuple[str, ...]
    group: str
    held_out: bool = False
    steps: int = STEPS
    #: a whole run: the validated and predicted volume [D, H, W]
    volume: tuple[int, ...] | None = None
    #: the volume generated (1 training and 1 validation case of that shape), else the
    #: embedded dataset's own (its 4 validation cases)
    generate: bool = False


def expandable(overrides: list[str] | tuple[str, ...], on: bool) -> list[str]:
    return merge(overrides, [f"{EXPANDABLE}={'true' if on else 'false'}"])


#: fixed before any GPU ran it; the estimator is never tuned on it
HELD_OUT: Grid = _grid("held-out.json")

#: written on 2026-12-02 before any GPU ran them, and never tuned on: configs of no recorded run
#: (MONAI networks, another preset, other patches, bf16-mixed against the reference's 16-mixed,
#: expandable segments on a config never measured without them)
HELD_OUT_NEW: Grid = _grid("held-out-new.json")

#: whole runs: 3 training steps, validation of ``volume`` (train.py's, with the monitor's
#: ``mem/val_peak_*``), then predict.py of the same volume with the run's checkpoint
WHOLE_RUN: list[Job] = [
    Job(
        "whole run: unet_large 16-mixed b2 26x150x320, validation and prediction of 26x300x640",
        tuple(expandable(REFERENCE, False)),
        "whole run",
        volume=(26, 300, 640),
        generate=True,
    ),
    Job(
        "whole run: CT-sized, unet_large 16-mixed b2 128x128x128, 14 classes, 300x512x512",
        (
            "model=unet_large",
            "num_classes=14",
            "data.batch_size=2",
            "data.patch_size=[128,128,128]",
            "trainer.precision=16-mixed",
        ),
        "whole run",
        volume=(300, 512, 512),
        generate=True,
    ),
    Job(
        "whole run: unet_tiny 16-mixed b2 32x64x64, the embedded 32x96x96 volumes",
        ("trainer.precision=16-mixed",),
        "whole run",
        volume=(32, 96, 96),
    ),
]

#: written on 2026-12-02 before any GPU ran it, never tuned on
WHOLE_RUN_HELD_OUT: list[Job] = [
    Job(
        "whole run: unet_small_gn bf16-mixed b2 32x128x128, 4 windows at once, 3 classes, "
        "64x256x256",
        (
            "model=unet_small_gn",
            "num_classes=3",
            "data.batch_size=2",
            "data.patch_size=[32,128,128]",
            "trainer.precision=bf16-mixed",
            "model.inferer.sw_batch_size=4",
        ),
        "whole run",
        held_out=True,
        volume=(64, 256, 256),
        generate=True,
    ),
]

_MB1 = ["data.batch_size=1", "trainer.accumulate_grad_batches=2"]
_CKPT = ["model.activation_checkpointing=all", "model.checkpoint_loss=true"]
_BF16 = ["trainer.precision=bf16-true"]

#: combinations toward a 4x cut of the reference's memory at <= 1.35x its step time, each on the
#: reference config (10 steps; baseline: its allocator run with expandable segments off). The
#: CUDA estimate of 2026-12-02 (torch 2.13.0+cpu; peak allocated / reserved MiB, reference
#: 6,022 / 6,892): micro-batch 1 3,367 / 3,582; checkpointing 4,378 / 5,100; both 2,578 /
#: 3,418; + bf16-true 1,807 / 2,212 (expandable 1,800 / 1,902); + offload of the
#: full-resolution maps, expandable 1,495 / 1,722 (4.0x); + offload of all, 1,247 / 1,806
#: (expandable 1,244 / 1,522: 4.8x / 4.5x). Offload cost 4x the step time on the H200.
LEVERS: Grid = [
    ("levers toward 4x: micro-batch 1 (x2)", merge(REFERENCE, _MB1)),
    ("levers toward 4x: checkpointing all + loss", merge(REFERENCE, _CKPT)),
    ("levers toward 4x: micro-batch 1 + checkpointing", merge(REFERENCE, _MB1, _CKPT)),
    (
        "levers toward 4x: micro-batch 1 + checkpointing + bf16-true",
        merge(REFERENCE, _MB1, _CKPT, _BF16),
    ),
    (
        f"levers toward 4x: micro-batch 1 + checkpointing + bf16-true{ON}",
        expandable(merge(REFERENCE, _MB1, _CKPT, _BF16), True),
    ),
    (
        "levers toward 4x: micro-batch 1 + checkpointing + offload full resolution + "
        f"bf16-true{ON}",
        expandable(
            merge(REFERENCE, _MB1, _CKPT, _BF16, ["model.offload_activations=full_resolution"]),
            True,
        ),
    ),
    (
        "levers toward 4x: micro-batch 1 + checkpointing + offload + bf16-true",
        merge(REFERENCE, _MB1, _CKPT, _BF16, ["model.offload_activations=true"]),
    ),
    (
        f"levers toward 4x: micro-batch 1 + checkpointing + offload + bf16-true{ON}",
        expandable(merge(REFERENCE, _MB1, _CKPT, _BF16, ["model.offload_activations=true"]), True),
    ),
]

#: the recorded grid's main runs measured again with expandable segments off and on (the
#: reference's pair runs first, on its own)
ALLOCATOR_MAIN = [
    "reference table: unet_small 16-mixed",
    "reference table: unet_large 16-true",
    "levers: micro-batch 1 (x2 accumulation)",
    "levers: activation offload",
]

#: appended in --dry-run: the same runs at a size a CPU takes in seconds
TINY = [
    "data.patch_size=[16,32,32]",
    "model.net.widths=[4,8,16]",
    "model.net.decoder_widths=null",
    "model.net.pooling=null",
    "model.activation_checkpointing=none",
    "data.batch_size=1",
    "trainer.precision=32",
]
TINY_VOLUME = (16, 48, 48)

GROUPS = ("allocator", "whole run", "levers", "held-out", "recorded")


def recorded_grid() -> Grid:
    """The not-held-out runs of the files already in :data:`RESULTS` (one per config)."""
    seen: dict[str, list[str]] = {}
    for path in sorted(RESULTS.glob("*.json")):
        for run in json.loads(path.read_text())["runs"]:
            name = run["name"].removeprefix("train.py: ")
            if not run["held_out"] and name not in seen:
                seen[name] = run["overrides"]
    return list(seen.items())


def pair(name: str, overrides: list[str], steps: int = TIMED_STEPS) -> list[Job]:
    """A config with expandable segments off (named as recorded) and on."""
    return [
        Job(name, tuple(expandable(overrides, False)), "allocator", steps=steps),
        Job(name + ON, tuple(expandable(overrides, True)), "allocator", steps=steps),
    ]


def all_jobs(recorded: Grid | None = None) -> list[Job]:
    """Every run, in the order they start (the module's docstring)."""
    recorded = recorded_grid() if recorded is None else recorded
    by_name = dict(recorded)
    jobs = pair(REFERENCE_NAME, by_name.get(REFERENCE_NAME, REFERENCE))
    jobs += WHOLE_RUN
    # the reference's whole run with expandable segments: validation's reserved both ways
    first = WHOLE_RUN[0]
    jobs.append(
        first._replace(name=first.name + ON, overrides=tuple(expandable(first.overrides, True)))
    )
    jobs += [
        Job(n, tuple(o if n.endswith(ON) else expandable(o, False)), "levers", steps=TIMED_STEPS)
        for n, o in LEVERS
    ]
    for name in ALLOCATOR_MAIN:
        if name in by_name:
            jobs += pair(name, by_name[name])
    jobs += [Job(n, tuple(o), "held-out", held_out=True) for n, o in HELD_OUT_NEW]
    jobs += WHOLE_RUN_HELD_OUT
    paired = {REFERENCE_NAME, *ALLOCATOR_MAIN}
    rest = [Job(n, tuple(o), "recorded") for n, o in recorded if n not in paired]
    held = [Job(n, tuple(o), "held-out", held_out=True) for n, o in HELD_OUT]
    # alternating: a run cut short by the budget loses some of each
    jobs += [job for group in zip_longest(rest, held) for job in group if job is not None]
    return jobs


def tiny(job: Job) -> Job:
    """The job at a size a CPU runs in seconds (``--dry-run``)."""
    return job._replace(
        overrides=tuple(merge(job.overrides, TINY)),
        steps=min(job.steps, 3),
        volume=TINY_VOLUME if job.volume else None,
        generate=bool(job.volume),
    )


def dry_run_jobs(jobs: list[Job], groups: list[str]) -> list[Job]:
    """``--dry-run``: of each group asked for, its first job (the allocator group's first pair,
    the levers' first with micro-batches), at tiny sizes."""
    chosen = []
    for group in groups:
        members = [
            j for j in jobs if j.group == group and "model/net=" not in " ".join(j.overrides)
        ]
        if group == "allocator":
            members = members[:2]
        elif group == "levers":
            members = [j for j in members if "trainer.accumulate_grad_batches=2" in j.overrides][:1]
        else:
            members = members[:1]
        chosen += [tiny(j) for j in members]
    return chosen


def step_seconds(rows: list[dict[str, str]]) -> float | None:
    """Median ``time/step_s`` (seconds per optimizer step) of a run's metrics rows after the
    first step (a warm-up), or ``None``."""
    times = harness.column(rows, "time/step_s")
    return statistics.median(times[1:]) if len(times) > 1 else None


def prepare(job: Job, work: Path) -> tuple[Path, Path | None]:
    """The job's ``paths.data_dir`` and, for a whole run, the volume predict.py reads: a
    generated volume (:func:`benchmarks.grid.prepare_volume`), else the embedded dataset
    (:func:`benchmarks.grid.prepare_data`) and its last validation case."""
    if job.generate:
        return grid.prepare_volume(list(job.overrides), job.volume, work)
    with grid.COMPOSE_LOCK:
        data_dir = grid.prepare_data(list(job.overrides), work)
        root = data_dir / "synthetic"
        if job.volume and not root.exists():
            grid.ensure_embedded(work)
    if not job.volume:
        return data_dir, None
    splits = json.loads((root / "splits.json").read_text())
    return data_dir, root / "images" / splits["val"][-1]


# -- child processes ------------------------------------------------------------------------
class SmiPoller:
    """The largest ``used_memory`` nvidia-smi reports per process id, polled every
    ``interval_s`` in a thread (nothing without nvidia-smi)."""

    def __init__(self, interval_s: float = 0.25) -> None:
        self.interval_s = interval_s
        self.peaks: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self.available = bool(nvidia_smi("gpu=name"))

    def _poll(self) -> None:
        while not self._stop.wait(self.interval_s):
            for line in nvidia_smi("compute-apps=pid,used_memory"):
                pid, _, used = line.partition(",")
                if pid.strip().isdigit() and used.strip().isdigit():
                    p = int(pid)
                    self.peaks[p] = max(self.peaks.get(p, 0.0), float(used))

    def start(self) -> SmiPoller:
        if self.available:
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def peak(self, pid: int) -> float | None:
        return self.peaks.get(pid) if self.available else None


class Clock:
    """Seconds since the run started, and what is left to ``deadline_s``."""

    def __init__(self, deadline_s: float) -> None:
        self.started = time.perf_counter()
        self.deadline_s = deadline_s

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def left(self) -> float:
        return self.deadline_s - self.elapsed()


def run_child(
    script: str, arguments: list[str], work: Path, env: dict, clock: Clock, smi: SmiPoller
) -> dict:
    """``python <script> <arguments>`` through the harness, stopped whole at
    :data:`RUN_LIMIT_S` or the deadline: wall seconds and nvidia-smi's largest figure."""
    limit = min(RUN_LIMIT_S, clock.left())
    if limit <= 0:
        raise harness.TimedOut(f"{script}: not started, the deadline has passed", 0)
    child = harness.start(script, arguments, work, env)
    seconds = child.wait(limit)
    return {"run_s": round(seconds, 1), "nvidia_smi_mib": smi.peak(child.pid)}


def train_args(job: Job, device: str, data_dir: Path, run_dir: Path, lock: Path) -> list[str]:
    """``train.py``'s arguments: the job's config, its steps (a whole run: one epoch of
    ``steps`` optimizer steps, then validation; else ``trainer.max_steps``, no validation), the
    monitor on every micro-batch into the CSV logger, the step timer and the GPU turn."""
    k = accumulation(job.overrides)
    if job.volume:
        steps = [
            "trainer.max_epochs=1",
            f"trainer.limit_train_batches={job.steps * k}",
            # 1 training case: enough patches for every step
            f"data.samples_per_volume={2 * job.steps * k * 4}",
            "trainer.check_val_every_n_epoch=1",
        ]
    else:  # no checkpoint either (unet_large's is ~0.5 GB a run)
        steps = [
            f"trainer.max_steps={job.steps}",
            "trainer.limit_val_batches=0",
            "callbacks.model_checkpoint=null",
            "callbacks.last_checkpoint=null",
        ]
    return [
        f"trainer={'gpu' if device == 'cuda' else 'cpu'}",
        *job.overrides,
        *steps,
        "trainer.num_sanity_val_steps=0",
        "trainer.log_every_n_steps=1",
        "memory.every_n_steps=1",
        "logger=csv",
        "memory.plan_step=false",
        "extras.print_config=false",
        "callbacks.validation_overlays=null",
        STEP_TIMER,
        "+callbacks.gpu_turn._target_=volseg.callbacks.step_timer.GpuTurn",
        f"+callbacks.gpu_turn.lock_file={lock}",
        f"paths.data_dir={data_dir}",
        f"hydra.run.dir={run_dir}",
    ]


def predict_args(cfg, device: str, run_dir: Path, volume: Path, lock: Path) -> list[str]:
    """``predict.py``'s arguments: the run's last checkpoint on ``volume``, stitched on the
    device, the windows as the run validated them (``model.inferer``'s overlap and batch), the
    monitor's prediction peaks into the run dir, the GPU turn."""
    out = run_dir / "predict"
    return [
        f"ckpt_path={run_dir / 'checkpoints' / 'last.ckpt'}",
        f"input={volume}",
        f"output={out / 'labels'}",
        f"trainer={'gpu' if device == 'cuda' else 'cpu'}",
        "stitch=device",
        f"inferer.overlap={cfg.model.inferer.overlap}",
        f"inferer.sw_batch_size={cfg.model.inferer.sw_batch_size}",
        "+callbacks.memory_monitor._target_=volseg.memory.MemoryMonitor",
        f"+callbacks.memory_monitor.output_dir={out}",
        "+callbacks.gpu_turn._target_=volseg.callbacks.step_timer.GpuTurn",
        f"+callbacks.gpu_turn.lock_file={lock}",
        f"hydra.run.dir={out}",
    ]


def _mib(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value / MIB, digits)


def _beside(measured: float | None, estimated: float | None) -> float | None:
    """The estimate's error against the measurement (estimated / measured - 1)."""
    if measured is None or estimated is None or measured == 0:
        return None
    return round(estimated / measured - 1, 4)


def measure_job(
    job: Job, device: str, work: Path, clock: Clock, smi: SmiPoller, estimate: dict | None
) -> dict:
    """Run the job; its entry of the results file."""
    slug = re.sub(r"[^A-Za-z0-9]+", "_", job.name)[:80]
    run_dir = work / "runs" / slug
    lock = work / "gpu.lock"
    data_dir, volume = prepare(job, work)
    env = grid.child_env(device, work)
    args = train_args(job, device, data_dir, run_dir, lock)
    train = run_child("train.py", args, work, env, clock, smi)
    run = harness.read(run_dir, train["run_s"])
    steady = harness.steady_step(run, accumulation(job.overrides), job.steps)
    measured = {
        "peak_allocated_mib": round(steady["peak_allocated"] / MIB, 1),
        "peak_reserved_mib": round(steady["peak_reserved"] / MIB, 1),
        "nvidia_smi_mib": train["nvidia_smi_mib"],
        "step_s": step_seconds(run.rows),
        "step_peak_growth_mib": round(steady["growth"] / MIB, 1),
        "steps": job.steps,
        "run_s": train["run_s"],
    }
    entry = {
        "name": f"train.py: {job.name}",
        "script": "benchmarks/cuda_results.py (python train.py trainer=gpu)",
        "overrides": list(job.overrides),
        "held_out": job.held_out,
        "group": job.group,
        "measured": measured,
    }
    if estimate is not None:
        entry["estimated"] = {
            "peak_allocated_mib": _mib(estimate["peak_allocated"]),
            "peak_reserved_mib": _mib(estimate["peak_reserved"]),
            "step_peak_growth_mib": _mib(estimate["step_peak_growth"]),
            "from": estimate.get("from"),
        }
        entry["error"] = {
            "allocated": _beside(
                measured["peak_allocated_mib"], entry["estimated"]["peak_allocated_mib"]
            ),
            "reserved": _beside(
                measured["peak_reserved_mib"], entry["estimated"]["peak_reserved_mib"]
            ),
        }
    if job.volume:
        entry.update(whole_run(job, device, work, run, volume, env, clock, smi, estimate))
        entry["validation"].get("measured", {})["nvidia_smi_mib"] = train["nvidia_smi_mib"]
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
    return entry


def whole_run(job, device, work, run, volume, env, clock, smi, estimate) -> dict:
    """A whole run's ``validation`` (from the run's CSV) and ``prediction`` (predict.py); a part
    that failed keeps why (``not_run``), the training step's figures stay."""
    validation = {
        "volume_shape": list(job.volume),
        "cases": 1 if job.generate else "the embedded dataset's validation cases",
    }
    run_dir = run.run_dir
    try:
        val = harness.last_with(run.rows, "mem/val_peak_allocated_mib")
        validation["measured"] = {
            "val_peak_allocated_mib": round(val["mem/val_peak_allocated_mib"], 1),
            "val_peak_reserved_mib": round(val["mem/val_peak_reserved_mib"], 1),
            "val_start_allocated_mib": round(val["mem/val_start_allocated_mib"], 1),
        }
    except (RuntimeError, OSError, KeyError) as err:
        validation["not_run"] = str(err)[-300:]
    with COMPOSE_LOCK:
        cfg = grid.compose(list(job.overrides), "cpu", work / "data")
    args = predict_args(cfg, device, run_dir, volume, work / "gpu.lock")
    prediction = {
        "volume_shape": list(job.volume),
        "arguments": [
            a
            for a in args
            if not a.startswith(("ckpt_path=", "input=", "output=", "hydra.", "+callbacks"))
        ],
    }
    try:
        predicted = run_child("predict.py", args, work, env, clock, smi)
        peaks = json.loads((run_dir / "predict" / "prediction_memory.json").read_text())
        prediction["measured"] = {
            "peak_allocated_mib": _mib(peaks["peak_allocated"]),
            "peak_reserved_mib": _mib(peaks["peak_reserved"]),
            "start_allocated_mib": _mib(peaks["start_allocated"]),
            "nvidia_smi_mib": predicted["nvidia_smi_mib"],
            "run_s": predicted["run_s"],
        }
    except (RuntimeError, OSError, KeyError, ValueError) as err:
        print(f"{job.name}: predict.py: {str(err)[-600:]}", flush=True)
        prediction["not_run"] = str(err)[-300:]
    if estimate is not None:
        for part, kind in ((validation, "validation"), (prediction, "prediction")):
            est = estimate.get(kind)
            if not est or "measured" not in part:
                continue
            part["estimated"] = {
                "peak_allocated_mib": _mib(est["peak_allocated"]),
                "peak_reserved_mib": _mib(est["peak_reserved"]),
                "windows": est.get("windows"),
            }
            got = part["measured"]
            key = "val_peak" if kind == "validation" else "peak"
            part["error"] = {
                "allocated": _beside(
                    got[f"{key}_allocated_mib"], part["estimated"]["peak_allocated_mib"]
                ),
                "reserved": _beside(
                    got[f"{key}_reserved_mib"], part["estimated"]["peak_reserved_mib"]
                ),
            }
    return {"validation": validation, "prediction": prediction}


# -- estimates ------------------------------------------------------------------------------
def estimate_job(job: Job, device: str, work: Path) -> dict:
    """The estimate of a job's config as train.py plans it (bytes): the step, and for a whole
    run its validation and predict.py's prediction of the volume (:func:`grid.predict`)."""
    made = grid.predict(list(job.overrides), device, work, job.volume)
    kept = {k: made[k] for k in ("validation", "prediction") if k in made}
    return {
        "peak_allocated": made["peak_allocated"],
        "peak_reserved": made["peak_reserved"],
        "step_peak_growth": made["growth"],
        **kept,
    }


def newest_estimates() -> tuple[dict[str, dict], str | None]:
    """Each run's newest estimate from the ``--estimate`` files (a later file's row replaces an
    earlier one's: ``--estimate --groups levers`` renews those alone), with its file, and the
    files' names."""

    def written(path: Path) -> tuple[str, int]:  # <date>_<name>.json, then -2, -3, ...
        counter = re.search(r"-(\d+)$", path.stem)
        return path.name[:10], int(counter.group(1)) if counter else 1

    files = sorted(ESTIMATES.glob(f"*_{ESTIMATES_NAME}*.json"), key=written)
    rows: dict[str, dict] = {}
    for path in files:
        doc = json.loads(path.read_text())
        made = f"benchmarks/results/cpu/{path.name} ({doc['date']}, torch {doc['torch']})"
        for row in doc["rows"]:
            rows[row["name"]] = {**row["estimate"], "overrides": row["overrides"], "from": made}
    return rows, ", ".join(f"benchmarks/results/cpu/{p.name}" for p in files) or None


def write_estimates(jobs: list[Job], argv: list[str]) -> Path:
    rows = []
    with tempfile.TemporaryDirectory(prefix="cuda_grid_estimates_") as work:
        for job in jobs:
            started = time.perf_counter()
            try:
                made = estimate_job(job, "cuda", Path(work))
            except Exception as err:  # noqa: BLE001  (one config's failure is a row, not the end)
                print(f"{job.name}: {type(err).__name__}: {err}", flush=True)
                continue
            rows.append({"name": job.name, "overrides": list(job.overrides), "estimate": made})
            print(
                f"{job.name}: {made['peak_allocated'] / MIB:,.0f} / "
                f"{made['peak_reserved'] / MIB:,.0f} MiB ({time.perf_counter() - started:.1f} s)",
                flush=True,
            )
    doc = results_io.result(
        ESTIMATES_NAME,
        rows,
        script=__file__,
        argv=argv,
        note="memory.plan_device=cuda, memory.cuda_context_mib=0 (allocator figures), each "
        "config planned as train.py plans it; bytes",
    )
    return results_io.write(doc, results_io.DEFAULT)


# -- what the file concludes ----------------------------------------------------------------
def _run_figures(run: dict) -> dict:
    m = run["measured"]
    return {
        k: m.get(k) for k in ("peak_allocated_mib", "peak_reserved_mib", "nvidia_smi_mib", "step_s")
    }


def _ratio(a: float | None, b: float | None, digits: int = 2) -> float | None:
    return None if a is None or b is None or b == 0 else round(a / b, digits)


def allocator_comparison(runs: list[dict]) -> list[dict]:
    """Each config measured with expandable segments off and on: both runs' figures, and
    off / on for memory (above 1: on holds less), on / off for step time."""
    by_name = {r["name"]: r for r in runs}
    rows = []
    for name, on in by_name.items():
        if not name.endswith(ON) or name.removesuffix(ON) not in by_name:
            continue
        off = _run_figures(by_name[name.removesuffix(ON)])
        got = _run_figures(on)
        rows.append(
            {
                "config": name.removesuffix(ON).removeprefix("train.py: "),
                "off": off,
                "on": got,
                "reserved_off_over_on": _ratio(off["peak_reserved_mib"], got["peak_reserved_mib"]),
                "nvidia_smi_off_over_on": _ratio(off["nvidia_smi_mib"], got["nvidia_smi_mib"]),
                "allocated_off_over_on": _ratio(
                    off["peak_allocated_mib"], got["peak_allocated_mib"]
                ),
                "step_time_on_over_off": _ratio(got["step_s"], off["step_s"], 3),
            }
        )
        if "measured" in on.get("validation", {}) and "measured" in by_name[
            name.removesuffix(ON)
        ].get("validation", {}):
            both = [
                by_name[name.removesuffix(ON)]["validation"]["measured"],
                on["validation"]["measured"],
            ]
            rows[-1]["validation"] = {
                "off": both[0],
                "on": both[1],
                "reserved_off_over_on": _ratio(
                    both[0]["val_peak_reserved_mib"], both[1]["val_peak_reserved_mib"]
                ),
            }
    return rows


def levers_toward_4x(runs: list[dict]) -> dict | None:
    """Each lever run against the reference (expandable segments off): its cut of peak
    allocated, peak reserved and nvidia-smi (reference / run) and its step time (run /
    reference); which reach 4x, and which of those stay within 1.35x the step time."""
    by_name = {r["name"]: r for r in runs}
    base = by_name.get(f"train.py: {REFERENCE_NAME}")
    if base is None:
        return None
    b = _run_figures(base)
    rows = []
    for run in runs:
        if run.get("group") != "levers" and run["name"] != f"train.py: {REFERENCE_NAME}{ON}":
            continue
        f = _run_figures(run)
        row = {
            "name": run["name"].removeprefix("train.py: "),
            **f,
            "cut_allocated": _ratio(b["peak_allocated_mib"], f["peak_allocated_mib"]),
            "cut_reserved": _ratio(b["peak_reserved_mib"], f["peak_reserved_mib"]),
            "cut_nvidia_smi": _ratio(b["nvidia_smi_mib"], f["nvidia_smi_mib"]),
            "time_ratio": _ratio(f["step_s"], b["step_s"], 3),
        }
        cuts = [row["cut_allocated"], row["cut_reserved"]]
        row["reaches_4x"] = {
            "allocated": (cuts[0] or 0) >= 4,
            "reserved": (cuts[1] or 0) >= 4,
            "nvidia_smi": (row["cut_nvidia_smi"] or 0) >= 4,
        }
        row["within_1_35x_time"] = row["time_ratio"] is not None and row["time_ratio"] <= 1.35
        rows.append(row)
    return {
        "baseline": {"name": REFERENCE_NAME, **b},
        "target": "cut >= 4x, time <= 1.35x",
        "rows": rows,
    }


# -- the run --------------------------------------------------------------------------------
def device_info(device: str) -> dict:
    import torch

    info = {
        "gpu": "cpu (dry run)",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "driver": None,
        "date": datetime.date.today().isoformat(),
        "cuda_context_mib": None,
    }
    if device != "cuda":
        return info
    torch.ones(1, device="cuda")
    torch.cuda.synchronize()
    info["gpu"] = torch.cuda.get_device_name()
    info["gpu_memory_mib"] = torch.cuda.get_device_properties(0).total_memory // 2**20
    driver = nvidia_smi("gpu=driver_version")
    info["driver"] = driver[0] if driver else None
    mine = [line.split(",") for line in nvidia_smi("compute-apps=pid,used_memory")]
    used = [float(m[1]) for m in mine if m[0].strip() == str(os.getpid())]
    if used:
        info["cuda_context_mib"] = round(used[0] - torch.cuda.memory_reserved() / 2**20)
    return info


def main(argv: list[str] | None = None) -> Path | None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", nargs="+", choices=GROUPS, default=list(GROUPS))
    parser.add_argument("--out", type=Path, default=None, help=f"default: {RESULTS}")
    parser.add_argument(
        "--budget-s", type=float, default=300.0, help="start no new run after this many seconds"
    )
    parser.add_argument(
        "--deadline-s", type=float, default=350.0, help="stop the runs still going at this time"
    )
    parser.add_argument("--jobs", type=int, default=None, help="processes in flight (3; dry run 1)")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="tiny sizes on the CPU, the first job of each group, into a temporary folder",
    )
    parser.add_argument(
        "--estimate", action="store_true", help="write the grid's CUDA estimates (on a CPU)"
    )
    args = parser.parse_args(argv)
    jobs = [j for j in all_jobs() if j.group in args.groups]
    if args.estimate:
        return write_estimates(jobs, sys.argv[1:] if argv is None else argv)
    device = "cpu" if args.dry_run else "cuda"
    n_jobs = args.jobs or (1 if args.dry_run else 3)
    info = device_info(device)
    out_dir = args.out or (
        Path(tempfile.mkdtemp(prefix="cuda_results_")) if args.dry_run else RESULTS
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    gpu_slug = re.sub(r"[^a-z0-9]+", "-", info["gpu"].lower()).strip("-")
    path = out_dir / f"{info['date']}_{gpu_slug}.json"
    if args.dry_run:
        jobs = dry_run_jobs(jobs, args.groups)
    doc = {
        **info,
        "source": results_io.command(__file__, argv),
        "code": results_io.code("cuda_results"),
        "held_out_note": "held_out runs (HELD_OUT, HELD_OUT_NEW, WHOLE_RUN_HELD_OUT in "
        "benchmarks/cuda_results.py) were written before any GPU ran them and are never "
        "tuned on",
        "runs_in_flight": n_jobs,
        "run_note": f"{n_jobs} train.py/predict.py processes in flight, training (and "
        "validating, predicting) one at a time under one lock: the others were starting up "
        "on the CPU meanwhile; step_s: seconds per optimizer step, median of the steps after "
        "the first; nvidia_smi_mib: the process's largest figure, polled every 0.25 s",
        "alloc_conf_environment": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
        "runs": [],
        "not_run": [],
    }
    if args.dry_run:
        estimates, source = {}, "made live on the CPU (dry run)"
    else:
        estimates, source = newest_estimates()
    doc["estimates_from"] = source
    order = {job.name: i for i, job in enumerate(jobs)}
    clock = Clock(args.deadline_s)
    signal.signal(signal.SIGTERM, harness.stop_children)
    smi = SmiPoller().start()

    def finish() -> None:
        doc["runs"].sort(key=lambda r: order.get(r["name"].removeprefix("train.py: "), 1e9))
        doc["allocator_comparison"] = allocator_comparison(doc["runs"])
        doc["levers_toward_4x"] = levers_toward_4x(doc["runs"])
        path.write_text(json.dumps(doc, indent=1) + "\n")

    with tempfile.TemporaryDirectory(prefix="volseg_gpu_runs_") as tmp:
        work = Path(tmp)
        grid.ensure_embedded(work)

        def one(job: Job) -> dict:
            est = estimates.get(job.name)
            if est is not None and est.get("overrides") != list(job.overrides):
                est = None  # the grid changed since the estimate
            if args.dry_run:
                with COMPOSE_LOCK:
                    est = {**estimate_job(job, "cpu", work), "from": source}
            return measure_job(job, device, work, clock, smi, est)

        pending = list(jobs)
        running: dict[Future, Job] = {}
        with ThreadPoolExecutor(n_jobs) as pool:
            while pending or running:
                while pending and len(running) < n_jobs and clock.elapsed() <= args.budget_s:
                    job = pending.pop(0)
                    running[pool.submit(one, job)] = job
                if not running:
                    break
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    job = running.pop(future)
                    try:
                        entry = future.result()
                    except (RuntimeError, subprocess.SubprocessError, OSError) as err:
                        print(f"{job.name}: not run: {str(err)[-600:]}", flush=True)
                        doc["not_run"].append({"name": job.name, "why": str(err)[-300:]})
                        continue
                    doc["runs"].append(entry)
                    finish()
                    print(f"{job.name}: {json.dumps(entry['measured'])}", flush=True)
        doc["not_run"] += [
            {"name": job.name, "why": f"not started within --budget-s {args.budget_s:.0f}"}
            for job in pending
        ]
    smi.stop()
    finish()
    print(
        f"wrote {path} ({len(doc['runs'])} runs, {len(doc['not_run'])} not run, "
        f"{clock.elapsed():.0f} s)"
    )
    return path


if __name__ == "__main__":
    main()
