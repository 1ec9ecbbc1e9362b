"""``estimate_run(plan, variant)``: one build and one fake-tensor trace of a planned run answer
its training step (peak by category and module, FLOPs) and then its validation, which starts
from what training leaves. A :class:`Variant` is what a planner searches.
"""

from __future__ import annotations

import copy
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from omegaconf import DictConfig, OmegaConf

from volseg.memory.estimate.inference import (
    InferenceEstimate,
    allocator_settings,
    validation_phase,
    whole_volume,
)
from volseg.memory.estimate.margins import Margin
from volseg.memory.estimate.step import (
    MemoryEstimate,
    estimate_step,
    fake_step,
    planned_precision,
    trace_steps,
)
from volseg.memory.estimate.workspace import RULES
from volseg.speed.step_time import StepWork
from volseg.utils.config import set_key

#: answers kept for repeated questions (the planner asks for a variant's memory, then its FLOPs)
CACHED_RUNS = 32


def _frozen(value: Any) -> Any:
    """A list as a tuple, so that a variant can be hashed."""
    if isinstance(value, list | tuple):
        return tuple(_frozen(v) for v in value)
    return value


@dataclass(frozen=True)
class Variant:
    """The keys a planner varies (:attr:`KEYS`), each ``None`` where the plan's value stands;
    ``batch_size`` is a micro-batch's, ``patch_size`` ``(D, H, W)``."""

    batch_size: int | None = None
    patch_size: tuple[int, ...] | None = None
    activation_checkpointing: Any = None
    accumulate_grad_batches: int | None = None
    sw_batch_size: int | None = None
    roi_size: tuple[int, ...] | None = None
    stitch_device: str | None = None

    KEYS: ClassVar[dict[str, str]] = {
        "batch_size": "data.batch_size",
        "patch_size": "data.patch_size",
        "activation_checkpointing": "model.activation_checkpointing",
        "accumulate_grad_batches": "trainer.accumulate_grad_batches",
        "sw_batch_size": "model.inferer.sw_batch_size",
        "roi_size": "model.inferer.roi_size",
        "stitch_device": "model.inferer.device",
    }

    @classmethod
    def of(
        cls,
        batch_size: int | None = None,
        patch_size: Sequence[int] | None = None,
        activation_checkpointing: Any = None,
        accumulate_grad_batches: int | None = None,
    ) -> Variant:
        """A training-step variant (the estimator's overrides)."""
        return cls(
            None if batch_size is None else int(batch_size),
            None if patch_size is None else tuple(int(p) for p in patch_size),
            _frozen(activation_checkpointing),
            None if accumulate_grad_batches is None else int(accumulate_grad_batches),
        )


@dataclass
class RunEstimate:
    """One variant of a planned run, from one trace."""

    step: MemoryEstimate
    flops_per_step: int
    work: StepWork
    validation: InferenceEstimate | None = None


class PlannedRun(Protocol):
    """What the engine reads of a :class:`volseg.plan.RunPlan` (memory/ does not import plan/)."""

    decisions: Mapping[str, Any]

    def run_config(self) -> DictConfig: ...


def estimate_run(
    plan: PlannedRun, variant: Variant | None = None, validation_shape: Sequence[int] | None = None
) -> RunEstimate:
    """``plan``'s run with ``variant``'s keys changed, and its validation of one
    ``validation_shape`` ``[D, H, W]`` volume where given."""
    cfg = plan.run_config()
    device = plan.decisions.get("device")
    if device is not None:
        # the plan's device (a plan may be for a GPU this machine lacks)
        set_key(cfg, "memory.plan_device", device.value)
    return estimate_config(cfg, variant or Variant(), validation_shape)


def estimate(
    cfg: DictConfig,
    batch_size: int | None = None,
    patch_size: Sequence[int] | None = None,
    activation_checkpointing: Any = None,
    accumulate_grad_batches: int | None = None,
) -> MemoryEstimate:
    """The training step of the planned ``cfg`` with a :class:`Variant`'s keys changed."""
    variant = Variant.of(batch_size, patch_size, activation_checkpointing, accumulate_grad_batches)
    return estimate_config(cfg, variant).step


def step_flops(cfg: DictConfig, **overrides: Any) -> int:
    """Floating-point operations of one optimizer step of ``cfg``; ``overrides``:
    :func:`estimate`'s."""
    return estimate_config(cfg, Variant.of(**overrides)).flops_per_step


def estimate_validation(cfg: DictConfig, volume_shape: Sequence[int]) -> InferenceEstimate:
    """Validating one ``[D, H, W]`` volume after the planned ``cfg``'s training steps."""
    validation = estimate_config(cfg, Variant(), whole_volume(volume_shape)).validation
    assert validation is not None  # a shape was given
    return validation


_runs: OrderedDict[tuple, RunEstimate] = OrderedDict()


def estimate_config(
    cfg: DictConfig, variant: Variant, validation_shape: Sequence[int] | None = None
) -> RunEstimate:
    """:func:`estimate_run` of a planned config. A run asked again is answered from its cached
    trace."""
    cfg = copy.deepcopy(cfg)
    for name, key in Variant.KEYS.items():
        if getattr(variant, name) is not None:  # a tuple becomes a list in the config
            set_key(cfg, key, getattr(variant, name))
    shape = None if validation_shape is None else tuple(int(v) for v in validation_shape)
    run_key = (OmegaConf.to_yaml(cfg), repr(RULES))
    found = _runs.get((*run_key, shape))
    if found is None and shape is None:
        found = next((r for k, r in _runs.items() if k[:-1] == run_key), None)
    if found is None:
        found = _trace(cfg, shape)
        _runs[(*run_key, shape)] = found
        while len(_runs) > CACHED_RUNS:
            _runs.popitem(last=False)
    return found


def _trace(cfg: DictConfig, shape: tuple[int, ...] | None) -> RunEstimate:
    started = time.perf_counter()
    settings = cfg.get("memory")  # cuda_context_mib and gpu
    device, mode, step = fake_step(cfg)
    precision = planned_precision(cfg)
    allocator = allocator_settings(cfg)
    phase = None if shape is None else validation_phase(cfg, step, device, shape)
    trace = trace_steps(step, mode, device, None if phase is None else phase.then)
    est = estimate_step(step, mode, device, precision, settings, started, allocator, trace)
    validation = None
    if phase is not None:
        validation = phase.estimate(trace, precision, settings, allocator, started)
        if device == "cuda":  # validation's reserved peak rests on the step's replay
            validation.set_margin(Margin(est.margin, est.margin_source, est.margin_fixed_mib))
    return RunEstimate(est, trace.flops, trace.work, validation)
