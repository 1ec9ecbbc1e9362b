"""``estimate_run(plan, variant)``: one build of the network and one fake-tensor trace answer a
planned run's training step (peak by category, per module), its FLOPs and its validation.

The input is the plan (:class:`volseg.plan.RunPlan`): its device, precision, learning rate,
divisibility and loader are decided there, so nothing here resolves an ``auto``. A
:class:`Variant` is what a planner searches (batch, patch, checkpointing, accumulation, windows
at once, window size, stitching device): the plan's config with those keys changed. For each
variant the module is built once (:func:`volseg.memory.estimate.step.fake_step`) and traced once
(:func:`volseg.memory.estimate.step.trace_steps`): two training steps (the first under torch's FLOP
counter), then, where a validation volume is given, the validation of that volume, so that what
training leaves behind is what validation starts from. The step's figures are read off the
events before validation's mark, validation's off those after it.

Prediction is not in this trace: ``predict.py`` runs in its own process at its own precision,
with no training state (:func:`volseg.memory.estimate.inference.estimate_prediction`).
"""

from __future__ import annotations

import copy
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from omegaconf import DictConfig, OmegaConf, open_dict

from volseg.memory.estimate.allocator import AllocatorSettings
from volseg.memory.estimate.inference import (
    InferenceEstimate,
    allocator_settings,
    validation_phase,
    whole_volume,
)
from volseg.memory.estimate.margins import Margin, with_margin
from volseg.memory.estimate.step import (
    MemoryEstimate,
    estimate_step,
    fake_step,
    planned_precision,
    trace_steps,
)
from volseg.utils.config import set_key

#: answers kept for repeated questions (the planner asks for a variant's memory, then its FLOPs)
CACHED_RUNS = 32


class PlannedRun(Protocol):
    """What the engine reads of a :class:`volseg.plan.RunPlan` (memory/ does not import plan/)."""

    decisions: Mapping[str, Any]

    def run_config(self) -> DictConfig: ...


def _frozen(value: Any) -> Any:
    """A list (of a config) as a tuple, so that a variant can be hashed."""
    if isinstance(value, list | tuple):
        return tuple(_frozen(v) for v in value)
    return value


def _thawed(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_thawed(v) for v in value]
    return value


@dataclass(frozen=True)
class Variant:
    """The keys a planner varies, each ``None`` where the plan's value stands: ``batch_size``
    (of a micro-batch), ``patch_size`` ``(D, H, W)``, ``activation_checkpointing``,
    ``accumulate_grad_batches``, validation's ``sw_batch_size`` (windows at once),
    ``roi_size`` (window size) and ``stitch_device`` (``model.inferer.device``)."""

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

    def overrides(self) -> dict[str, Any]:
        """``{config key: value}`` of the keys this variant sets."""
        return {
            key: _thawed(getattr(self, field))
            for field, key in self.KEYS.items()
            if getattr(self, field) is not None
        }


@dataclass
class RunEstimate:
    """One variant of a planned run, from one trace: ``step`` (the training step's memory, by
    category and module), ``flops_per_step`` (one optimizer step's), ``validation`` (of the
    given volume, after the training steps; ``None`` where no volume was given)."""

    variant: Variant
    step: MemoryEstimate
    flops_per_step: int
    validation: InferenceEstimate | None = None


def estimate_run(
    plan: PlannedRun, variant: Variant | None = None, validation_shape: Sequence[int] | None = None
) -> RunEstimate:
    """The estimate of ``plan``'s run with ``variant``'s keys changed (default: as planned), its
    validation of one ``validation_shape`` ``[D, H, W]`` volume where given: one build, one
    trace."""
    cfg = plan.run_config()
    device = plan.decisions.get("device")
    if device is not None:
        with open_dict(cfg):  # the plan's device (a plan may be for a GPU this machine lacks)
            OmegaConf.update(cfg, "memory.plan_device", device.value, force_add=True)
    return estimate_config(cfg, variant or Variant(), validation_shape)


def estimate(
    cfg: DictConfig,
    batch_size: int | None = None,
    patch_size: Sequence[int] | None = None,
    activation_checkpointing: Any = None,
    accumulate_grad_batches: int | None = None,
) -> MemoryEstimate:
    """Predicted memory of a training step of the planned config ``cfg`` (see
    :func:`volseg.memory.estimate.engine.estimate_run`, whose step this is: asked again for the same
    config and overrides, the engine answers from the same trace).

    ``batch_size``, ``patch_size``, ``activation_checkpointing`` and ``accumulate_grad_batches``
    override the config's ``data.batch_size``, ``data.patch_size``,
    ``model.activation_checkpointing`` and ``trainer.accumulate_grad_batches``.
    """
    variant = Variant.of(batch_size, patch_size, activation_checkpointing, accumulate_grad_batches)
    return estimate_config(cfg, variant).step


def step_flops(cfg: DictConfig, **overrides: Any) -> int:
    """Floating-point operations of one optimizer step of ``cfg`` (all its micro-batches:
    forward, loss, backward with checkpointing's recomputation), counted in the estimate's own
    trace; ``overrides``: :func:`estimate`'s."""
    return estimate_config(cfg, Variant.of(**overrides)).flops_per_step


def estimate_validation(
    cfg: DictConfig, volume_shape: Sequence[int], settings: Any = None
) -> InferenceEstimate:
    """Predicted memory of validating one volume of ``volume_shape`` ``[D, H, W]`` in a
    ``train.py`` run of ``cfg`` (planned), after two training steps; ``settings``: the
    ``estimate`` config (``cuda_context_mib``, ``gpu``; default ``cfg.memory``). The engine's
    (:func:`volseg.memory.estimate.engine.estimate_config`): the step's estimate is in the same
    trace."""
    validation = estimate_config(cfg, Variant(), whole_volume(volume_shape), settings).validation
    assert validation is not None  # a shape was given
    return validation


_runs: OrderedDict[tuple, RunEstimate] = OrderedDict()


def estimate_config(
    cfg: DictConfig,
    variant: Variant,
    validation_shape: Sequence[int] | None = None,
    settings: Any = None,
) -> RunEstimate:
    """:func:`estimate_run` of a planned config (``memory.plan_device`` and ``trainer.precision``
    as the plan decided them); ``settings``: the ``estimate`` config's ``cuda_context_mib`` and
    ``gpu`` (default: ``cfg.memory``'s). The same run asked again (the same config once the
    variant's keys are set) is answered from the trace already made; a trace with a validation
    answers for the step alone too."""
    cfg = copy.deepcopy(cfg)
    for key, value in variant.overrides().items():
        set_key(cfg, key, value)
    shape = None if validation_shape is None else tuple(int(v) for v in validation_shape)
    settings = settings if settings is not None else (cfg.get("memory") or {})
    if isinstance(settings, DictConfig):
        settings = OmegaConf.to_container(settings)
    run_key = (OmegaConf.to_yaml(cfg), repr(settings))
    found = _runs.get((*run_key, shape))
    if found is None and shape is None:
        found = next((r for k, r in _runs.items() if k[:2] == run_key), None)
    if found is None:
        found = _trace(cfg, variant, shape, settings)
        _runs[(*run_key, shape)] = found
        while len(_runs) > CACHED_RUNS:
            _runs.popitem(last=False)
    return found


def _trace(
    cfg: DictConfig, variant: Variant, shape: tuple[int, ...] | None, settings: Any
) -> RunEstimate:
    """One build and one trace of the planned config ``cfg`` (the variant's keys set)."""
    started = time.perf_counter()
    device, mode, step = fake_step(cfg)
    precision = planned_precision(cfg)
    allocator: AllocatorSettings = allocator_settings(cfg)
    phase = None if shape is None else validation_phase(cfg, step, device, shape)
    trace = trace_steps(step, mode, device, None if phase is None else phase.then)
    est = estimate_step(step, mode, device, precision, settings, started, allocator, trace)
    validation = None
    if phase is not None:
        validation = phase.estimate(trace, precision, settings, allocator, started)
        if device == "cuda":  # validation's reserved peak rests on the step's replay
            with_margin(validation, Margin(est.margin, est.margin_source, est.margin_fixed_mib))
    return RunEstimate(variant, est, trace.flops, validation)
