"""A training step's memory and FLOPs, asked of a planned config: the engine's answer
(:func:`volseg.memory.engine.estimate_run`, one build and one trace per variant), with the step
trace's names its readers use (:mod:`volseg.memory.step_trace`: how a step is built, traced and
read).

Fake tensors under torch's MemTracker: no memory is allocated and no GPU is needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from omegaconf import DictConfig

from volseg.memory.engine import Variant, estimate_config
from volseg.memory.step_trace import (
    LoopSettings,
    MemoryEstimate,
    build_training_step,
    estimate_step,
    module_training_step,
    planned_device,
    planned_precision,
)

__all__ = [
    "LoopSettings",
    "MemoryEstimate",
    "build_training_step",
    "estimate",
    "estimate_step",
    "module_training_step",
    "planned_device",
    "planned_precision",
    "step_flops",
]


def estimate(
    cfg: DictConfig,
    batch_size: int | None = None,
    patch_size: Sequence[int] | None = None,
    activation_checkpointing: Any = None,
    accumulate_grad_batches: int | None = None,
) -> MemoryEstimate:
    """Predicted memory of a training step of the planned config ``cfg`` (see
    :func:`volseg.memory.engine.estimate_run`, whose step this is: asked again for the same
    config and overrides, the engine answers from the same trace).

    ``batch_size``, ``patch_size``, ``activation_checkpointing`` and ``accumulate_grad_batches``
    override the config's ``data.batch_size``, ``data.patch_size``,
    ``model.activation_checkpointing`` and ``trainer.accumulate_grad_batches``.
    """
    variant = Variant.of(batch_size, patch_size, activation_checkpointing, accumulate_grad_batches)
    return estimate_config(cfg, variant).step


def step_flops(
    cfg: DictConfig,
    batch_size: int | None = None,
    patch_size: Sequence[int] | None = None,
    activation_checkpointing: Any = None,
    accumulate_grad_batches: int | None = None,
) -> int:
    """Floating-point operations of one optimizer step of ``cfg`` (all its micro-batches:
    forward, loss, backward with checkpointing's recomputation), counted in the estimate's own
    trace (:func:`estimate`; the same overrides)."""
    variant = Variant.of(batch_size, patch_size, activation_checkpointing, accumulate_grad_batches)
    return estimate_config(cfg, variant).flops_per_step
