"""How fast a run trains and how busy it keeps its device: step time, the share of it spent
fetching batches, and the step's FLOP rate against the GPU's peak (model FLOP utilization).

Nothing is synchronized: wall-clock means over the optimizer steps after the warm-up count queued
CUDA work where the loop waits for it. Gaps between epochs and validation are not counted.
"""

from __future__ import annotations

import logging
import os
import re
import statistics
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer

from volseg.data.loader_options import available_cores
from volseg.utils.precision import HALF

log = logging.getLogger(__name__)

#: dense tensor-core peaks per GPU (TFLOP/s, without sparsity) for half precision (bfloat16 or
#: float16) and for TF32 (float32 convolutions with ``torch.backends.cudnn.allow_tf32``, on by
#: default), from NVIDIA's data sheets. Lightning's table (``get_available_flops``) gives
#: Hopper's figures with sparsity and does not match the name ``NVIDIA H200``.
DENSE_PEAK_TFLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    (r"\bH100\b.*\bPCIe\b", {"half": 756.0, "tf32": 378.0}),
    (r"\bH(100|200)\b(?!.*\b(NVL|PCIe)\b)", {"half": 989.0, "tf32": 494.7}),
    (r"\bA100\b", {"half": 312.0, "tf32": 156.0}),
    (r"\bL40S\b", {"half": 362.0, "tf32": 183.0}),
)

_KEY = "callbacks.training_speed"  # the config node, for errors


def dense_peak_tflops(device_name: str, precision: str) -> float | None:
    """The dense peak (TFLOP/s) of a GPU named ``device_name`` (``torch.cuda.get_device_name``)
    at Lightning's ``precision``; None for a GPU not in :data:`DENSE_PEAK_TFLOPS` and for
    float32 without TF32."""
    kind = "half" if str(precision) in HALF else "tf32"
    if kind == "tf32" and not torch.backends.cudnn.allow_tf32:
        return None
    found = (p for name, p in DENSE_PEAK_TFLOPS if re.search(name, device_name, flags=re.I))
    return next((peaks[kind] for peaks in found), None)


def batch_samples(batch: Any) -> int:
    """Samples in a training batch: the first dimension of its first tensor (0 without one);
    not Lightning's ``extract_batch_size``, which warns of an "ambiguous collection" for every
    volseg batch (it reads the lists of case names and paths too)."""
    if isinstance(batch, Mapping):
        values = list(batch.values())
    else:
        values = list(batch) if isinstance(batch, list | tuple) else [batch]
    return next((int(v.shape[0]) for v in values if isinstance(v, torch.Tensor)), 0)


def machine_load() -> tuple[float | None, int]:
    """(the 1-minute load average, None where the OS has none; this process's cores)."""
    try:
        return os.getloadavg()[0], available_cores()
    except (AttributeError, OSError):
        return None, available_cores()


class TrainingSpeed(Callback):
    """Measures every optimizer step after ``warmup_steps``; reports in the log at fit end, under
    ``speed`` in summary.json (:meth:`summary`) and as ``speed/*`` at each epoch's end:
    ``step_s`` (wall seconds per optimizer step, fetching included), ``data_wait_share`` (of it,
    between one batch's end and the next one's start), ``samples_per_s`` (all processes),
    ``tflops_per_s`` (``plan.yaml``'s ``estimate.flops_per_step`` per step second, per process)
    and ``mfu`` (that over ``peak_tflops``; None: :data:`DENSE_PEAK_TFLOPS`'s for the GPU).
    Warnings: ``data_wait_warning``, ``slow_step_factor`` and the load at the start (the YAML).
    """

    summary_key = "speed"  # RunSummary puts summary() under this key of summary.json

    def __init__(
        self,
        warmup_steps: int = 5,
        peak_tflops: float | None = None,
        data_wait_warning: float = 0.1,
        slow_step_factor: float | None = 5.0,
        recent_steps: int = 20,
    ) -> None:
        if slow_step_factor is not None and float(slow_step_factor) <= 1:
            raise ValueError(f"{_KEY}.slow_step_factor={slow_step_factor}: must be > 1, or null")
        if int(recent_steps) < 3:
            raise ValueError(f"{_KEY}.recent_steps={recent_steps}: must be 3 or more")
        if not 0 <= float(data_wait_warning) <= 1:
            raise ValueError(f"{_KEY}.data_wait_warning={data_wait_warning}: must be in [0, 1]")
        if int(warmup_steps) < 0:
            raise ValueError(f"{_KEY}.warmup_steps={warmup_steps}: must be 0 or more")
        if peak_tflops is not None and float(peak_tflops) <= 0:
            raise ValueError(f"{_KEY}.peak_tflops={peak_tflops}: must be a positive TFLOP/s figure")
        self.slow_step_factor = None if slow_step_factor is None else float(slow_step_factor)
        self._recent: deque[float] = deque(maxlen=int(recent_steps))
        self._batches_since_warning = int(recent_steps)
        self.data_wait_warning = float(data_wait_warning)
        self.warmup_steps = int(warmup_steps)
        self.peak_tflops = None if peak_tflops is None else float(peak_tflops)
        self.peak_source = "configured" if peak_tflops is not None else ""
        self.flops_per_step: int | None = None
        self.world_size = 1
        self.steps = 0
        self.samples = 0
        self.busy_s = 0.0  # batches' own time: forward, backward, update
        self.wait_s = 0.0  # between one batch's end and the next one's start
        self._batch_start: float | None = None
        self._step_at_start = 0
        self._counted_from = 0  # the first step measured: warm-up steps after the fit's first
        self._last_end: float | None = None

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        estimate = (getattr(pl_module, "run_plan", None) or {}).get("estimate") or {}
        flops = estimate.get("flops_per_step")
        self.flops_per_step = int(flops) if flops else None
        self.world_size = int(trainer.world_size)
        device = trainer.strategy.root_device
        if self.peak_tflops is None and device.type == "cuda":
            name = torch.cuda.get_device_name(device)
            self.peak_tflops = dense_peak_tflops(name, str(trainer.precision))
            self.peak_source = name if self.peak_tflops is not None else f"{name}: not in the table"
        elif self.peak_tflops is None:
            self.peak_source = f"{device.type}: no peak"

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # after a checkpoint's state is restored: a resumed fit warms up again from its step
        self._counted_from = trainer.global_step + self.warmup_steps
        load, cores = machine_load()
        if self.slow_step_factor is not None and load is not None and load > cores:
            log.warning(
                "The load average is %.1f on %d core(s): other processes share this machine's "
                "CPUs, so steps will be slower and their times vary",
                load,
                cores,
            )

    def _check_slow(self, seconds: float, step: int) -> None:
        """Warn of a batch far slower than the recent ones (the warm-up's are not recent)."""
        recent, before = self._recent, len(self._recent)
        usual = statistics.median(recent) if before >= 3 else None
        recent.append(seconds)
        self._batches_since_warning += 1
        if (
            usual is None
            or self.slow_step_factor is None
            or seconds <= self.slow_step_factor * usual
            or self._batches_since_warning < recent.maxlen
        ):
            return
        self._batches_since_warning = 0
        load, cores = machine_load()
        shared = ""
        if load is not None:
            shared = f"; load average {load:.1f} on {cores} core(s)"
            shared += ": other processes share the CPUs" if load > cores else ""
        log.warning(
            "Step %d took %.2f s, %.1fx the median %.2f s of the %d before it "
            "(a shared or throttled machine?)%s",
            step,
            seconds,
            seconds / usual,
            usual,
            before,
            shared,
        )

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int
    ) -> None:
        now = time.perf_counter()
        self._step_at_start = trainer.global_step
        if self._last_end is not None and self._step_at_start >= self._counted_from:
            self.wait_s += now - self._last_end
        self._batch_start = now

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        now = time.perf_counter()
        if self._batch_start is not None and self._step_at_start >= self._counted_from:
            self.busy_s += now - self._batch_start
            self.samples += batch_samples(batch)
            self.steps += trainer.global_step - self._step_at_start
            self._check_slow(now - self._batch_start, trainer.global_step)
        self._batch_start = None
        self._last_end = now

    def _pause(self, *_: Any) -> None:
        self._last_end = None  # validation, epoch ends: not a batch fetched for a step

    on_validation_start = _pause
    on_train_epoch_start = _pause

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._pause()
        if not trainer.is_global_zero:
            return
        # rank 0's figures, as in summary.json, straight to the loggers: no collective that
        # every rank must join with the same keys
        figures = self.summary()
        keys = ("step_s", "data_wait_share", "samples_per_s", "tflops_per_s", "mfu")
        metrics = {f"speed/{k}": float(figures[k]) for k in keys if figures[k] is not None}
        if metrics:
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=trainer.global_step)

    def summary(self) -> dict[str, Any]:
        """The figures so far (None where nothing was measured)."""
        total = self.busy_s + self.wait_s
        step_s = total / self.steps if self.steps else None
        tflops = self.flops_per_step / step_s / 1e12 if step_s and self.flops_per_step else None
        return {
            "steps_measured": self.steps,
            "warmup_steps": self.warmup_steps,
            "step_s": step_s,
            "data_wait_share": self.wait_s / total if self.steps and total > 0 else None,
            "samples_per_s": self.samples * self.world_size / total if self.steps else None,
            "flops_per_step": self.flops_per_step,
            "tflops_per_s": tflops,
            "peak_tflops": self.peak_tflops,
            "peak_source": self.peak_source,
            "mfu": tflops / self.peak_tflops if tflops and self.peak_tflops else None,
        }

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        s = self.summary()
        if s["step_s"] is None:
            log.info(
                "Training speed: not measured (%d optimizer steps, %s.warmup_steps=%d)",
                trainer.global_step,
                _KEY,
                self.warmup_steps,
            )
            return
        rate = ""
        if s["tflops_per_s"] is not None:
            rate = f"; {s['tflops_per_s']:.2f} TFLOP/s per process"
            if s["mfu"] is not None:
                rate += f", {s['mfu']:.3f} of {s['peak_tflops']:g} TFLOP/s ({s['peak_source']})"
        log.info(
            "Training speed over %d optimizer steps after %d of warm-up: %.4f s per step "
            "(%.1f samples/s), %.1f%% of it fetching batches%s",
            s["steps_measured"],
            self.warmup_steps,
            s["step_s"],
            s["samples_per_s"],
            100 * s["data_wait_share"],
            rate,
        )
        if s["data_wait_share"] > self.data_wait_warning:
            workers = getattr(getattr(trainer, "train_dataloader", None), "num_workers", None)
            cpu = trainer.strategy.root_device.type == "cpu"
            log.warning(
                "The loader did not keep up: %.0f%% of the step time went to fetching batches "
                "(%s.data_wait_warning=%g). Cached volumes (data.cache=memory or disk) or more "
                "loader workers (data.num_workers, %s here%s) shorten it",
                100 * s["data_wait_share"],
                _KEY,
                self.data_wait_warning,
                "unknown" if workers is None else workers,
                "; on a CPU they take cores from the step" if cpu else "",
            )
