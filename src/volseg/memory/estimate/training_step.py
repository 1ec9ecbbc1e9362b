"""A training step traced before it runs: the module as ``train.py`` builds it, with fake
parameters (``FakeTensorMode``: no data, no GPU), two optimizer steps as Lightning runs them
(:class:`TrainingStep`), recorded into one ledger (:mod:`volseg.memory.estimate.events`) that
every figure is read from. What is not modelled: ``docs/memory.md``.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any
from unittest import mock

import torch
from lightning.pytorch.plugins.precision import HalfPrecision
from omegaconf import DictConfig, OmegaConf
from torch import nn

from volseg.memory.estimate.allocator import AllocatorSettings, replay, round_size
from volseg.memory.estimate.autocast import CudaAutocast
from volseg.memory.estimate.cuda_context import resolve_cuda_context
from volseg.memory.estimate.events import (
    Event,
    category_peak,
    held_peak,
    held_series,
    module_activations,
)
from volseg.memory.estimate.margins import Planned, margin_for
from volseg.memory.estimate.torch_private import (
    FakeTensorMode,
    RecordingMemTracker,
    unset_fake_temporarily,
)
from volseg.memory.estimate.workspace import RULES, CudnnWorkspace, cpu_workspace
from volseg.models import offload
from volseg.models.build import build_model
from volseg.models.conv import traced_for_cuda
from volseg.speed.step_time import StepWork, counted_segments
from volseg.utils.errors import UserInputError
from volseg.utils.units import MIB

DEVICES = ("cuda", "cpu")
MIXED = {"16-mixed": torch.float16, "bf16-mixed": torch.bfloat16}
TRUE = {"16-true": torch.float16, "bf16-true": torch.bfloat16}
FULL = {"32", "32-true", "64", "64-true"}


@dataclass
class MemoryEstimate(Planned):
    """Predicted memory of one training step, in bytes. ``step_peak_growth``: how far a steady
    (second) step rises above what it starts with; ``kernel_workspace``: the part of
    ``peak_allocated`` kernels hold inside an op; ``process_total``: ``peak_reserved`` (the
    CUDA allocator's; the CPU's ``peak_allocated``) plus the CUDA context."""

    device: str
    precision: str
    batch_size: int
    patch_size: list[int]
    activation_checkpointing: Any
    num_parameters: int
    params: int
    buffers: int
    grads: int
    optimizer_state: int
    activations: int
    temporaries: int
    peak_allocated: int
    kernel_workspace: int
    step_peak_growth: int
    peak_reserved: int
    cuda_context: int
    process_total: int
    seconds: float
    modules: dict[str, int] = field(default_factory=dict)
    accumulate_grad_batches: int = 1
    margin: float = 0.0
    margin_source: str = ""
    margin_fixed_mib: float = 0.0


def planned_device(cfg: DictConfig) -> str:
    """``memory.plan_device``, else ``trainer.accelerator`` where it names a device."""
    device = OmegaConf.select(cfg, "memory.plan_device")
    if device is None:
        accelerator = str(OmegaConf.select(cfg, "trainer.accelerator") or "auto").lower()
        device = {"cpu": "cpu", "gpu": "cuda", "cuda": "cuda"}.get(accelerator)
    if device not in DEVICES:
        raise UserInputError(
            f"memory.plan_device={device}: must be one of {', '.join(DEVICES)} (the estimator "
            "takes a planned config: volseg.plan.make_plan decides the device)"
        )
    return str(device)


def planned_precision(cfg: DictConfig, precision: str | None = None) -> str:
    """``trainer.precision`` of a planned config, or ``precision`` in its place."""
    precision = str(precision or OmegaConf.select(cfg, "trainer.precision") or "32")
    if precision not in MIXED and precision not in TRUE and precision not in FULL:
        raise UserInputError(
            f"trainer.precision={precision}: the estimator takes a planned precision, one of "
            "32, 16-mixed, bf16-mixed, 16-true and bf16-true (volseg.plan.make_plan resolves auto)"
        )
    return precision


def _fake_parameters(module: nn.Module, mode: FakeTensorMode) -> None:
    """Swap every parameter and buffer for a fake tensor."""
    for sub in module.modules():
        # every slot, a tensor two of them hold too (remove_duplicate=False): each its own fake
        for name, param in list(sub.named_parameters(recurse=False, remove_duplicate=False)):
            fake = mode.from_tensor(param.detach())
            setattr(sub, name, nn.Parameter(fake, requires_grad=param.requires_grad))
        for name, buf in list(sub.named_buffers(recurse=False, remove_duplicate=False)):
            setattr(sub, name, mode.from_tensor(buf))


_ARANGE = torch.arange


def _constant_arange(*args: Any, **kwargs: Any) -> torch.Tensor:
    """``torch.arange`` of plain ints made for real: MONAI's DiceLoss reads its reduction axes
    from ``torch.arange(2, ndim).tolist()``, which a fake tensor cannot give."""
    if not kwargs and all(isinstance(a, int) for a in args):
        with unset_fake_temporarily():
            return _ARANGE(*args)
    return _ARANGE(*args, **kwargs)


class _SavedOnHost(torch.autograd.graph.saved_tensors_hooks):
    """``OffloadToHost`` in the trace: saved tensors packed to ``meta`` (not in the ledger)."""

    def __init__(self, pin_memory: bool = False, min_voxels: int = 0) -> None:
        def pack(t: torch.Tensor) -> tuple[torch.device | None, torch.Tensor]:
            if not offload.worth_offloading(t, min_voxels):
                return None, t  # stays on the device
            return t.device, torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device="meta")

        def unpack(packed: tuple[torch.device | None, torch.Tensor]) -> torch.Tensor:
            device, t = packed
            if device is None:
                return t
            return torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=device)

        super().__init__(pack, unpack)


def _configured_optimizer(module: nn.Module) -> torch.optim.Optimizer:
    """The optimizer of the module's ``configure_optimizers()`` (a scheduler holds no tensors)."""
    configured = module.configure_optimizers()
    return configured["optimizer"] if isinstance(configured, dict) else configured


@dataclass(frozen=True)
class LoopSettings:
    """What Lightning's loop does around the module, from the ``trainer`` config."""

    accumulate_grad_batches: int = 1
    gradient_clip_val: float | None = None
    gradient_clip_algorithm: str = "norm"
    # where the gradients are set to None (zero_grad_setting)
    zero_grad: str = "closure"

    @classmethod
    def from_config(cls, trainer: DictConfig) -> LoopSettings:
        k = trainer.accumulate_grad_batches
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise UserInputError(
                f"trainer.accumulate_grad_batches={k}: must be a whole number, 1 or more"
            )
        clip = trainer.get("gradient_clip_val")
        if clip is not None and (isinstance(clip, bool) or not isinstance(clip, int | float)):
            raise UserInputError(f"trainer.gradient_clip_val={clip}: must be a number or null")
        algorithm = str(trainer.get("gradient_clip_algorithm") or "norm").lower()
        if algorithm not in ("norm", "value"):
            raise UserInputError(
                f"trainer.gradient_clip_algorithm={algorithm}: must be norm, value or null"
            )
        return cls(k, float(clip) if clip is not None else None, algorithm)


@dataclass
class TrainingStep:
    """One optimizer step as Lightning's automatic optimization runs it, on real or fake
    tensors (``GradScaler.step`` as for finite gradients: fake tensors cannot give its inf
    check)."""

    module: nn.Module
    optimizer: torch.optim.Optimizer
    image_shape: tuple[int, ...]  # one micro-batch: (B, C, D, H, W)
    input_dtype: torch.dtype
    # the autocast of forward and loss; with CUDA's rules emulated, backward runs under it too
    autocast: Callable[[], AbstractContextManager] = contextlib.nullcontext
    autocast_in_backward: bool = False
    loop: LoopSettings = field(default_factory=LoopSettings)
    clip_foreach: bool | None = None
    scaler: torch.amp.GradScaler | None = None
    # loss(output, label); None: the module's own compute_loss (a volseg SegmentationModule)
    loss: Callable[[Any, Any], torch.Tensor] | None = None
    # make_batch(image_shape, label_shape, dtype) -> (image, label); None: torch.empty of both
    make_batch: Callable[..., tuple[Any, Any]] | None = None

    def run(
        self,
        steps: int,
        new_batch: Any = None,
        before_update: Any = None,
        on_micro_batch_start: Any = None,
    ) -> None:
        """``steps`` optimizer steps; ``before_update``: ``on_before_optimizer_step``."""
        for _ in range(steps):
            for micro_batch in range(self.loop.accumulate_grad_batches):
                if on_micro_batch_start is not None:
                    on_micro_batch_start()
                self._forward_backward(new_batch, first=micro_batch == 0)
            if self.scaler is not None:
                self.scaler.unscale_(self.optimizer)
            if before_update is not None:
                before_update()
            self._clip_gradients()
            self.optimizer.step()
            if self.scaler is not None:
                self.scaler.update()
            if self.loop.zero_grad == "after_update":
                self.optimizer.zero_grad(set_to_none=True)

    def _forward_backward(self, new_batch: Any, first: bool) -> None:
        """Lightning's closure for one micro-batch: training step, zero_grad, backward."""
        label_shape = (self.image_shape[0], 1, *self.image_shape[2:])
        new_batch = new_batch or self.make_batch
        if new_batch is None:
            image = torch.empty(self.image_shape, dtype=self.input_dtype)
            label = torch.empty(label_shape, dtype=self.input_dtype)
        else:
            image, label = new_batch(self.image_shape, label_shape, self.input_dtype)
        if first and self.loop.zero_grad == "before_forward":
            self.optimizer.zero_grad(set_to_none=True)
        compute_loss = self.loss or self.module.compute_loss
        with self.autocast():
            logits = self.module(image)
            loss = compute_loss(logits, label)
        # training_step returns the loss: its logits go, the batch stays until the closure ends
        del logits
        loss = loss / self.loop.accumulate_grad_batches  # ClosureResult's normalization
        if first and self.loop.zero_grad == "closure":
            self.optimizer.zero_grad(set_to_none=True)
        if self.scaler is not None:
            loss = self.scaler.scale(loss)
        with self.autocast() if self.autocast_in_backward else contextlib.nullcontext():
            loss.backward()
        del loss, image, label

    def _clip_gradients(self) -> None:
        """``Precision.clip_gradients``: nothing for a clip value of ``None``, 0 or less."""
        if self.loop.gradient_clip_val is None or self.loop.gradient_clip_val <= 0:
            return
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        if self.loop.gradient_clip_algorithm == "value":
            clip = nn.utils.clip_grad_value_
        else:
            clip = nn.utils.clip_grad_norm_
        clip(params, self.loop.gradient_clip_val, foreach=self.clip_foreach)


def build_training_step(
    cfg: DictConfig,
    device: str,
    fake_mode: FakeTensorMode | None = None,
    precision: str | None = None,
) -> TrainingStep:
    """``cfg``'s training step for ``device`` as ``train.py`` builds it (``precision``: in place
    of ``trainer.precision``). ``model.compile`` compiles at ``setup``, which is not called here:
    compiling changes kernels, not what the step keeps."""
    precision = planned_precision(cfg, precision)
    loop = replace(LoopSettings.from_config(cfg.trainer), zero_grad=zero_grad_setting(cfg))
    in_channels = int(cfg.model.net.get("in_channels", cfg.get("in_channels", 1)))
    return module_training_step(
        build_model(cfg),
        _configured_optimizer,
        (int(cfg.data.batch_size), in_channels, *map(int, cfg.data.patch_size)),
        precision,
        device,
        loop,
        fake_mode,
    )


def module_training_step(
    module: nn.Module,
    make_optimizer: Callable[[nn.Module], torch.optim.Optimizer],
    image_shape: Sequence[int],
    precision: str,
    device: str,
    loop: LoopSettings | None = None,
    fake_mode: FakeTensorMode | None = None,
    **step_options: Any,
) -> TrainingStep:
    """The training step of any ``module`` with ``make_optimizer(module)`` on batches of
    ``image_shape`` ``(B, C, D, H, W)`` at ``precision``; ``step_options``: further
    :class:`TrainingStep` fields."""
    module.train()
    if precision in TRUE:
        # HalfPrecision.convert_module: the whole module in the lower precision
        module = module.to(TRUE[precision])
    if fake_mode is not None:
        _fake_parameters(module, fake_mode)
    optimizer = make_optimizer(module)
    if device == "cuda":  # CUDA's default update is the foreach one (a temporary per state)
        for group in optimizer.param_groups:
            if "foreach" in group and group["foreach"] is None:
                group["foreach"] = True
    step = TrainingStep(
        module=module,
        optimizer=optimizer,
        image_shape=tuple(int(n) for n in image_shape),
        input_dtype=TRUE.get(precision, torch.float32),
        loop=loop or LoopSettings(),
        # clip_grad_*_'s default (foreach=None) takes the foreach path for CUDA tensors only
        clip_foreach=True if device == "cuda" else None,
        **step_options,
    )
    if precision in TRUE and RULES["true_default_dtype"]:
        # Lightning's: tensors the forward and the loss create without a dtype are in the lower
        # precision too (SwinUNETR's attention mask), not float32 copies that promote what they meet
        step.autocast = HalfPrecision(precision).forward_context
    if precision in MIXED and device == "cpu":
        # resolved for the CPU already (volseg.utils.precision): a mixed precision is bf16 here;
        # MixedPrecision.autocast_context_manager turns the cast cache off
        step.autocast = partial(torch.autocast, "cpu", dtype=MIXED[precision], cache_enabled=False)
    elif precision in MIXED:
        step.autocast = partial(CudaAutocast, MIXED[precision])
        step.autocast_in_backward = True
        if precision == "16-mixed":
            # MixedPrecision's GradScaler; a "cpu" one, as the step's tensors are CPU tensors
            # (fake or real): the same calls and the same few scalars as CUDA's
            step.scaler = torch.amp.GradScaler("cpu")
    return step


ZERO_GRAD = ("closure", "after_update", "before_forward")


def zero_grad_setting(cfg: DictConfig) -> str:
    """``estimate.zero_grad`` (benchmarks only): where gradients are set to ``None``:
    ``closure`` (Lightning's), ``after_update`` or ``before_forward`` (nnU-Net's)."""
    value = str(cfg.get("estimate", {}).get("zero_grad") or "closure")
    if value not in ZERO_GRAD:
        raise UserInputError(f"estimate.zero_grad={value}: must be one of {', '.join(ZERO_GRAD)}")
    return value


def cudnn_workspace(module: nn.Module) -> CudnnWorkspace:
    """cuDNN's workspaces for ``module``'s step, capped by its ``cudnn_workspace_mib`` lever."""
    levers = getattr(module, "levers", None)
    limit = getattr(levers, "cudnn_workspace_mib", None)
    # fake tensors follow the CPU's layout rules, which keep half-precision maps NCDHW: the
    # lever says whether CUDA's would be channels-last
    channels_last = bool(getattr(levers, "channels_last", False))
    return CudnnWorkspace(None if limit is None else int(limit * MIB), channels_last)


@dataclass
class StepTrace:
    """One trace of the training steps and of ``then`` (from event ``then_start`` on);
    ``flops`` and ``work``: one optimizer step's, with recomputation."""

    events: list[Event]
    flops: int
    then_start: int
    work: StepWork


def trace_steps(
    step: TrainingStep,
    mode: FakeTensorMode,
    device: str,
    then: Callable[[RecordingMemTracker], None] | None = None,
    steps: int = 2,
) -> StepTrace:
    """``steps`` fake training steps under a recording tracker, the first one's FLOPs counted,
    then ``then(tracker)`` in the same trace (a validation or a prediction)."""
    # kernels' scratch memory: oneDNN's on the CPU, cuDNN's workspaces on CUDA
    workspace = cpu_workspace if device == "cpu" else cudnn_workspace(step.module)
    cuda = device == "cuda"
    offloaded = mock.patch.object(offload, "OffloadToHost", _SavedOnHost)
    tracker = RecordingMemTracker(workspace, peaks=False)
    tracker.work = StepWork(device)
    tracker.track_external(step.module, step.optimizer)
    with (
        mode,
        mock.patch.object(torch, "arange", _constant_arange),
        counted_segments(tracker.work, lambda: tracker.count_flops),
        offloaded if cuda else contextlib.nullcontext(),
        traced_for_cuda() if cuda else contextlib.nullcontext(),
        warnings.catch_warnings(),
        tracker,
    ):
        # MemTracker's module tracker warns for modules it meets in backward only (the loss)
        warnings.filterwarnings("ignore", message="Module is None")
        for n in range(steps):
            tracker.count_flops = n == 0
            tracker.mark()
            step.run(
                1,
                before_update=tracker.optimizer_update_begins,
                # MemTracker follows one forward per module
                on_micro_batch_start=tracker.reset_mod_stats,
            )
        tracker.count_flops = False
        then_start = len(tracker.events)
        if then is not None:
            # a small host tensor there (torch.tensor(..., device="meta")) is real, not fake
            mode.allow_non_fake_inputs = True
            then(tracker)
    return StepTrace(tracker.events, tracker.flops, then_start, tracker.work)


def phase_peaks(
    events: list[Event],
    device: str,
    settings: Any,
    allocator_settings: AllocatorSettings,
    start: int = 0,
) -> dict[str, int]:
    """A step's and an inference's shared figures, in bytes, from event ``start`` on;
    ``settings``: ``memory.*``'s ``cuda_context_mib`` and ``gpu``."""
    if device == "cuda":
        allocator = replay(events, settings=allocator_settings, phase_start=start)
        context = resolve_cuda_context(settings.get("cuda_context_mib"), settings.get("gpu"))
        return {
            "resident": allocator.phase_resident,
            "peak_allocated": allocator.peak_allocated,
            "peak_reserved": allocator.peak_reserved,
            "cuda_context": context.nbytes,
        }
    held = held_series(events)
    resident = held[start - 1] if start > 0 else 0
    peak = max(held[start:], default=resident)
    return {"resident": resident, "peak_allocated": peak, "peak_reserved": peak, "cuda_context": 0}


def fake_step(
    cfg: DictConfig, precision: str | None = None
) -> tuple[str, FakeTensorMode, TrainingStep]:
    """The planned device, a fake mode and ``cfg``'s training step with fake parameters
    (``precision``: in place of ``trainer.precision``)."""
    device = planned_device(cfg)
    mode = FakeTensorMode()
    return device, mode, build_training_step(cfg, device, mode, precision)


def estimate_step(
    step: TrainingStep,
    mode: FakeTensorMode,
    device: str,
    precision: str,
    settings: Any = None,
    started: float | None = None,
    allocator: AllocatorSettings | None = None,
    trace: StepTrace | None = None,
) -> MemoryEstimate:
    """Predicted memory of ``step`` on ``device``, read off its ``trace`` (traced here where not
    given); ``settings``: as :func:`phase_peaks`."""
    started = time.perf_counter() if started is None else started
    trace = trace_steps(step, mode, device) if trace is None else trace
    events = trace.events[: trace.then_start]
    names = {id(m): name for name, m in step.module.named_modules() if name}
    allocator = allocator or AllocatorSettings()
    found = phase_peaks(events, device, settings or {}, allocator)
    del found["resident"]
    if device == "cuda":
        # cuDNN's workspaces are the allocations with negative handles; the replays differ in
        # how blocks split, so without workspaces the tensors' peak may come out a few blocks
        # above it: no workspace then
        tensors_peak = replay([e for e in events if e[1] >= 0]).peak_allocated
        growth = held_peak(events, after_last_mark=True, rounding=round_size)
    else:
        tensors_peak = held_peak([e for e in events if e[0] != "workspace"])
        growth = held_peak(events, after_last_mark=True)
    levers = getattr(step.module, "levers", None)
    result = MemoryEstimate(
        device=device,
        precision=precision,
        batch_size=step.image_shape[0],
        patch_size=list(step.image_shape[2:]),
        activation_checkpointing=getattr(levers, "activation_checkpointing", "none"),
        num_parameters=sum(p.numel() for p in step.module.parameters()),
        # host copies on the meta device (offloaded activations) are not in the ledger
        **{k: v for k, v in category_peak(events).items() if k != "other"},
        **found,
        kernel_workspace=max(0, found["peak_allocated"] - tensors_peak),
        step_peak_growth=growth,
        process_total=found["peak_reserved"] + found["cuda_context"],
        seconds=time.perf_counter() - started,
        modules=module_activations(events, names),
        accumulate_grad_batches=step.loop.accumulate_grad_batches,
    )
    offload = bool(getattr(levers, "offload_activations", False))
    result.set_margin(margin_for(device, offload, step.loop.accumulate_grad_batches))
    result.events, result.allocator = events, allocator
    return result
