"""MemoryMonitor: memory per training step and phase, per validation and per prediction.

Phases of one training step: ``fwd`` (batch start -> ``on_before_backward``: forward and loss),
``bwd`` (-> ``on_after_backward``), ``opt`` (-> batch end). The peak counter is read and reset
at each boundary, so ``mem/peak_<phase>_mib`` is that phase's own peak.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.loggers import TensorBoardLogger, WandbLogger

from volseg.memory.monitor.charts import plot_timeline, png_as_rgb
from volseg.memory.monitor.layers import LayerTrace
from volseg.memory.monitor.oom_report import oom_report
from volseg.memory.monitor.readers import (
    HostMemoryReader,
    MemoryReading,
    make_reader,
    set_mmap_threshold,
)
from volseg.utils.units import MIB

log = logging.getLogger(__name__)

PHASES = ("fwd", "bwd", "opt")


def snapshot_path(output_dir: Path, rank: int, world: int) -> Path:
    """Where a rank dumps its allocator snapshot: one file per rank when there are several
    (each GPU has its own allocator; one shared name would keep only the last writer's)."""
    name = "memory_snapshot.pickle" if world == 1 else f"memory_snapshot_rank{rank}.pickle"
    return output_dir / name


def placed_readers(pl_module: LightningModule, root: torch.device) -> dict[str, Any]:
    """Readers of the devices a split network (``model.placement``) uses besides ``root``,
    by key name (``cuda1``, ``cpu``): ``mem/*`` reads the root device only."""
    placement = getattr(getattr(pl_module, "levers", None), "placement", None) or {}
    readers = {}
    for device in {torch.device(d) for d in placement.values()}:
        other = (device.type, device.index or 0) != (root.type, root.index or 0)
        if other and (reader := make_reader(device)) is not None:
            readers[str(device).replace(":", "")] = reader
    return readers


class MemoryMonitor(Callback):
    """Logs ``mem/*`` (MiB; the keys: docs/memory.md) every ``every_n_steps`` training steps and
    after each validation, and summarizes at fit end. Added to ``predict.py``
    (``+callbacks.memory_monitor._target_=volseg.memory.monitor.callback.MemoryMonitor
    +callbacks.memory_monitor.output_dir=DIR``), it logs the prediction's peaks (all volumes)
    and writes them to ``DIR/prediction_memory.json`` (bytes).

    Args:
        output_dir: run dir for ``memory_timeline.png``, ``memory_layers.{csv,png}`` and snapshots.
        every_n_steps: log every N training steps (other steps are not touched).
        trace_step: global step whose memory is traced per module and category with torch's
            ``MemTracker`` (``None``: no trace).
        snapshot_steps: on CUDA, dump this many first steps' allocator history
            (``memory_snapshot.pickle``).
        host_mmap_threshold: on a CPU, serve allocations above this many bytes with mmap so freed
            tensors leave the resident set (``None``: leave glibc's malloc as it is).
    """

    summary_key = "memory"  # RunSummary puts summary() under this key of summary.json

    def __init__(
        self,
        output_dir: str | Path,
        every_n_steps: int = 1,
        trace_step: int | None = None,
        snapshot_steps: int = 0,
        host_mmap_threshold: int | None = None,
    ) -> None:
        self.output_dir = Path(output_dir)
        self.every_n_steps = max(1, int(every_n_steps))
        self.trace_step = trace_step
        self.snapshot_steps = int(snapshot_steps)
        self.host_mmap_threshold = host_mmap_threshold
        self.reader = None
        self.placed_readers: dict[str, Any] = {}
        self.history: list[dict[str, float]] = []
        self.val_history: list[dict[str, float]] = []  # one row per validation (not sanity's)
        self._inference_start: MemoryReading | None = None  # a validation's or the prediction's
        self._active = False
        self._start: MemoryReading | None = None
        self._phase_peaks: dict[str, MemoryReading] = {}
        self._trace: LayerTrace | None = None
        self._snapshot_until: int | None = None

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self.reader = make_reader(trainer.strategy.root_device)
        self.placed_readers = placed_readers(pl_module, trainer.strategy.root_device)
        if self.reader is None:
            log.warning("Memory monitor: no memory counters on this platform; not logging mem/*")
            return
        if self.reader.kind == "host":
            if self.host_mmap_threshold:
                set_mmap_threshold(self.host_mmap_threshold)
            log.info(
                "Memory monitor: training on the CPU, so mem/* hold this process's host memory "
                "(resident set from /proc), not GPU memory"
            )
        if self.snapshot_steps > 0 and self.reader.kind != "cuda":
            log.info(
                "Memory monitor: allocator snapshots need CUDA; skipping memory.snapshot_steps"
            )

    @staticmethod
    def _log(trainer: Trainer, metrics: dict[str, float], step: int, history: list) -> None:
        """Append ``metrics`` (MiB) at ``step`` to ``history``; send them to the loggers."""
        history.append({"step": float(step), **metrics})
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=step)

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        cuda = self.reader is not None and self.reader.kind == "cuda"
        if cuda and self.snapshot_steps > 0 and self._snapshot_until is None:
            # from the first step of this fit (also after a resume), once per fit
            torch.cuda.memory._record_memory_history(max_entries=200_000)
            self._snapshot_until = step + self.snapshot_steps
        logged = self.reader is not None and step % self.every_n_steps == 0
        self._active = logged or step == self.trace_step
        if not self._active:
            return
        if step == self.trace_step:
            self._trace = LayerTrace(pl_module, trainer.optimizers, batch)
            self._trace.start()
        self.reader.reset_peak()
        for reader in self.placed_readers.values():
            reader.reset_peak()
        self._start = self.reader.read()
        self._phase_peaks = {}

    def _end_phase(self, phase: str) -> None:
        if self._active:
            self._phase_peaks[phase] = self.reader.read()
            self.reader.reset_peak()

    def on_before_backward(
        self, trainer: Trainer, pl_module: LightningModule, loss: torch.Tensor
    ) -> None:
        self._end_phase("fwd")

    def on_after_backward(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._end_phase("bwd")

    def on_before_optimizer_step(
        self, trainer: Trainer, pl_module: LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        if self._trace is not None:
            self._trace.optimizer_update_begins()

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._snapshot_until is not None and trainer.global_step >= self._snapshot_until:
            path = snapshot_path(self.output_dir, trainer.global_rank, trainer.world_size)
            self.output_dir.mkdir(parents=True, exist_ok=True)
            torch.cuda.memory._dump_snapshot(str(path))
            torch.cuda.memory._record_memory_history(enabled=None)
            self._snapshot_until, self.snapshot_steps = None, 0  # once per fit
            log.info("Allocator snapshot: %s (open it at https://pytorch.org/memory_viz)", path)
        if not self._active:
            return
        self._end_phase("opt")
        self._active = False
        if self._trace is not None:
            trace, self._trace = self._trace, None
            trace.stop()
            if trainer.is_global_zero:
                trace.write(self.output_dir)
        peaks = self._phase_peaks  # fwd, bwd, opt: in the order they ended
        now = peaks["opt"]
        metrics = {
            "mem/allocated_mib": now.allocated / MIB,
            "mem/reserved_mib": now.reserved / MIB,
            "mem/peak_allocated_mib": max(r.peak_allocated for r in peaks.values()) / MIB,
            "mem/peak_reserved_mib": max(r.peak_reserved for r in peaks.values()) / MIB,
            "mem/fragmentation_mib": (now.reserved - now.allocated) / MIB,
            "mem/alloc_retries": float(now.alloc_retries),
            "mem/ooms": float(now.ooms),
            "mem/step_start_allocated_mib": self._start.allocated / MIB,
        }
        metrics.update({f"mem/peak_{p}_mib": r.peak_allocated / MIB for p, r in peaks.items()})
        if self.reader.kind == "cuda" and HostMemoryReader.available():
            # host memory is memory too (caches, pinned batches): on a CPU mem/* already hold it
            metrics["mem/host_rss_mib"] = HostMemoryReader().read().allocated / MIB
        for name, reader in self.placed_readers.items():  # the other part of a split network
            other = reader.read()
            for key in ("allocated", "reserved", "peak_allocated"):
                metrics[f"mem/{name}/{key}_mib"] = getattr(other, key) / MIB
        # the step that just ran (global_step was incremented)
        self._log(trainer, metrics, trainer.global_step - 1, self.history)

    def _start_inference(self) -> None:
        """Whole-volume inference has a peak of its own (sliding windows, stitching buffers
        beside what is held): the counters are reset when it begins, and read when it ends."""
        self.reader.reset_peak()
        self._inference_start = self.reader.read()

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._inference_start = None
        if self.reader is not None and not trainer.sanity_checking:
            self._start_inference()

    def _end_inference(self) -> dict[str, int] | None:
        """Bytes since :meth:`_start_inference`: ``peak_allocated``, ``peak_reserved`` and
        ``start_allocated`` (held when it began); ``None`` where none was started."""
        start, self._inference_start = self._inference_start, None
        if start is None:
            return None
        end = self.reader.read()
        return {
            "peak_allocated": end.peak_allocated,
            "peak_reserved": end.peak_reserved,
            "start_allocated": start.allocated,
        }

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # read here, not at on_validation_end: checkpoint callbacks save there (their memory is
        # the checkpoint's, not validation's)
        figures = self._end_inference()
        if figures is not None:
            metrics = {f"mem/val_{key}_mib": nbytes / MIB for key, nbytes in figures.items()}
            # the next training step resets the counters itself; between them nothing is logged
            self._log(trainer, metrics, trainer.global_step, self.val_history)

    def on_predict_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """predict.py's inference of every volume (the network already on its device)."""
        self.reader = make_reader(trainer.strategy.root_device)
        if self.reader is not None:
            self._start_inference()

    def on_predict_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        figures = self._end_inference()
        if figures is None:
            return
        log.info(
            "Prediction memory (%s): peak allocated %.1f MiB, peak reserved %.1f MiB, "
            "%.1f MiB held when it began",
            self.reader.kind,
            *(nbytes / MIB for nbytes in figures.values()),
        )
        if trainer.is_global_zero:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            path = self.output_dir / "prediction_memory.json"
            path.write_text(json.dumps({"device": self.reader.kind, **figures}, indent=1) + "\n")

    def summary(self) -> dict[str, Any]:
        """Peak allocated/reserved (MiB), the phase where the peak occurred, mean fragmentation."""
        if not self.history:
            return {}

        def most(rows: list[dict[str, float]], key: str) -> float:
            return round(max(r[key] for r in rows), 1)

        peak_row = max(self.history, key=lambda r: r["mem/peak_allocated_mib"])
        phase = max(PHASES, key=lambda p: peak_row.get(f"mem/peak_{p}_mib", float("-inf")))
        summary = {
            "device": self.reader.kind if self.reader else None,
            "peak_allocated_mib": round(peak_row["mem/peak_allocated_mib"], 1),
            "peak_reserved_mib": most(self.history, "mem/peak_reserved_mib"),
            "peak_step": int(peak_row["step"]),
            "peak_phase": phase,
            "mean_fragmentation_mib": round(
                sum(r["mem/fragmentation_mib"] for r in self.history) / len(self.history), 1
            ),
            "logged_steps": len(self.history),
        }
        if self.val_history:
            for key in ("val_peak_allocated_mib", "val_peak_reserved_mib"):
                summary[key] = most(self.val_history, f"mem/{key}")
        if "mem/host_rss_mib" in self.history[0]:
            summary["peak_host_rss_mib"] = most(self.history, "mem/host_rss_mib")
        return summary

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        peaks = None
        if trainer.world_size > 1:  # every rank measured its own device: a collective, all call
            mine = [
                max((r[f"mem/peak_{kind}_mib"] for r in self.history), default=0.0)
                for kind in ("allocated", "reserved")
            ]
            local = torch.tensor(mine, dtype=torch.float64, device=trainer.strategy.root_device)
            peaks = trainer.strategy.all_gather(local).reshape(-1, 2).cpu().tolist()
        if not trainer.is_global_zero or not self.history:
            return
        if peaks is not None:
            log.info(
                "Memory per rank, peak allocated / peak reserved MiB: %s",
                ", ".join(f"rank {i}: {a:.1f} / {r:.1f}" for i, (a, r) in enumerate(peaks)),
            )
        self.output_dir.mkdir(parents=True, exist_ok=True)
        plot_timeline(self.history, self.output_dir / "memory_timeline.png", self.reader.kind)
        log.info("Memory summary: %s", json.dumps(self.summary()))
        self._log_charts(trainer)

    def _log_charts(self, trainer: Trainer) -> None:
        """The charts written so far (the timeline, the layers at ``trace_step``) to TensorBoard
        as images and to W&B; the loggers are not finalized before every on_fit_end has run."""
        charts = {
            key: path
            for key, name in (("mem/timeline", "memory_timeline"), ("mem/layers", "memory_layers"))
            if (path := self.output_dir / f"{name}.png").is_file()
        }
        step = trainer.global_step
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                for key, path in charts.items():
                    logger.experiment.add_image(key, png_as_rgb(path), step, dataformats="HWC")
            elif isinstance(logger, WandbLogger):
                import wandb

                logger.log_metrics({k: wandb.Image(str(p)) for k, p in charts.items()}, step=step)

    def on_exception(
        self, trainer: Trainer, pl_module: LightningModule, exception: BaseException
    ) -> None:
        if isinstance(exception, torch.OutOfMemoryError):
            if self._trace is not None:
                self._trace.stop()
            stage = trainer.state.stage.value if trainer.state.stage is not None else "train"
            report = oom_report(
                self.reader, self._start, self._phase_peaks, self.history, pl_module, stage
            )
            log.error("%s", report)
            print(report, flush=True)
