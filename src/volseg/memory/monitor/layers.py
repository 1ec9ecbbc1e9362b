"""Per-module memory of one real training step, by category, from torch's ``MemTracker``: a
module's own activations are what its forward left alive (saved tensors and its output).
"""

from __future__ import annotations

import csv
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from lightning_utilities.core.apply_func import apply_to_collection
from torch import nn

from volseg.memory.estimate.events import blocks
from volseg.memory.estimate.torch_private import ClosureMemTracker, module_snapshots
from volseg.utils.units import MIB

log = logging.getLogger(__name__)

CATEGORIES = {
    "Parameter": "params",
    "Buffer": "buffers",
    "Gradient": "grads",
    "Optstate": "optimizer_state",
    "Activation": "activations",
    "Temp": "temporaries",
    "Other": "other",
}
# MemTracker's states, in their order: Pre-Forward -> pre_forward
PHASES = {
    f"{when}-{part}": f"{when}_{part}".lower()
    for part in ("Forward", "Backward")
    for when in ("Pre", "Post", "Peak")
}
CSV_COLUMNS = [
    "module",
    "is_block",
    "own_params_mib",
    "own_activations_mib",
    "phase",
    *(f"{c}_mib" for c in CATEGORIES.values()),
    "total_mib",
]


def _device_sum(snapshot: dict[torch.device, dict[str, int]], key: str) -> int:
    return sum(per_device.get(key, 0) for per_device in snapshot.values())


class LayerTrace:
    """Trace one training step: ``start()`` at batch start, ``stop()`` at batch end, ``write()``."""

    def __init__(
        self, module: nn.Module, optimizers: Iterable[torch.optim.Optimizer], batch: Any
    ) -> None:
        self.module = module
        self.tracker = ClosureMemTracker()
        tensors: list[torch.Tensor] = []  # the batch's tensors (not its names, paths, ...)
        apply_to_collection(batch, torch.Tensor, tensors.append)
        self.tracker.track_external(module, *optimizers, *tensors)

    def start(self) -> None:
        self.tracker.__enter__()

    def optimizer_update_begins(self) -> None:
        self.tracker.optimizer_update_begins()

    def stop(self) -> None:
        self.tracker.__exit__(None, None, None)

    def peak(self) -> dict[str, int]:
        """Peak bytes per category over the traced step, summed over devices."""
        snapshot = self.tracker.get_tracker_snapshot("peak")
        return {name: _device_sum(snapshot, key) for key, name in CATEGORIES.items()}

    def rows(self) -> list[dict[str, Any]]:
        """One row per (called module, phase): the step's memory by category at that moment,
        with the module's own parameters and activations."""
        called = {}  # name -> (module, its snapshots by state), in named_modules' order
        for name, mod in self.module.named_modules():
            if name and (snaps := module_snapshots(self.tracker, mod)) is not None:
                called[name] = (mod, snaps)
        inside = blocks(set(called))
        rows = []
        for name, (mod, snaps) in called.items():
            own_act = _device_sum(snaps.get("Post-Forward", {}), "Activation") - _device_sum(
                snaps["Pre-Forward"], "Activation"
            )
            own = {
                "module": name,
                "is_block": name in inside,
                "own_params_mib": sum(p.numel() * p.element_size() for p in mod.parameters()) / MIB,
                "own_activations_mib": max(own_act, 0) / MIB,
            }
            for state, phase in PHASES.items():
                if state in snaps:
                    at = snaps[state]
                    by = {f"{c}_mib": _device_sum(at, key) / MIB for key, c in CATEGORIES.items()}
                    total = _device_sum(at, "Total") / MIB
                    rows.append({**own, "phase": phase, **by, "total_mib": total})
        return rows

    def write(self, output_dir: Path, top: int = 10) -> list[dict[str, Any]]:
        """Write ``memory_layers.csv`` and ``memory_layers.png``; log the top blocks."""
        from volseg.memory.monitor.charts import plot_layer_bars

        rows = self.rows()
        output_dir.mkdir(parents=True, exist_ok=True)
        with open(output_dir / "memory_layers.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
            writer.writeheader()
            writer.writerows(rows)
        by_block = block_activations(rows)
        plot_layer_bars(by_block, output_dir / "memory_layers.png")
        peak = self.peak()
        kinds = ("activations", "temporaries", "params", "grads", "optimizer_state")
        at_peak = ", ".join(f"{kind} {peak[kind] / MIB:.1f} MiB" for kind in kinds)
        lines = [
            "Memory by module (one training step; activations a module's forward left alive). "
            f"At the step's peak: {at_peak}:"
        ]
        total = sum(by_block.values()) or 1.0
        for name, mib in list(by_block.items())[:top]:
            lines.append(f"  {name:<28} {mib:10.1f} MiB  {100 * mib / total:5.1f}%")
        log.info("\n".join(lines))
        return rows


def block_activations(rows: list[dict[str, Any]]) -> dict[str, float]:
    """``{block: own activation MiB}``, largest first."""
    own = {r["module"]: r["own_activations_mib"] for r in rows if r["is_block"]}
    return dict(sorted(own.items(), key=lambda kv: kv[1], reverse=True))
