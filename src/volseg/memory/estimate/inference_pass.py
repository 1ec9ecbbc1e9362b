"""Whole-volume inference traced before it runs: validation in ``train.py`` (after the
training steps, in their trace) and ``predict.py`` (its own trace), on a fake volume
``(1, C, D, H, W)``. Host memory is the ``meta`` device, left out of the ledger. MONAI's two
data-dependent steps stand in as what they allocate: the importance map (computed for real,
replaced by a fake of its shape) and Dice's ``masked_select`` (one value per voxel).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import monai.inferers.utils as sliding_window
import torch
from monai.data.utils import dense_patch_slices
from monai.metrics.meandice import DiceHelper
from omegaconf import DictConfig, OmegaConf

from volseg.memory.estimate.allocator import AllocatorSettings, round_size
from volseg.memory.estimate.events import Event, held_series
from volseg.memory.estimate.margins import Planned, margin_for
from volseg.memory.estimate.torch_private import RecordingMemTracker, unset_fake_temporarily
from volseg.memory.estimate.training_step import (
    StepTrace,
    fake_step,
    phase_peaks,
    planned_precision,
    trace_steps,
)
from volseg.models.volume_predictor import VolumePredictor
from volseg.utils.alloc_conf import resolve_allocator
from volseg.utils.errors import UserInputError

STITCH = ("device", "host")
#: the precision ``predict.py`` runs at by default (configs/predict.yaml)
PREDICT_PRECISION = "32-true"


@dataclass
class InferenceEstimate(Planned):
    """Predicted memory of one whole-volume inference on ``device``, in bytes. ``resident``:
    held when it starts; ``stitching``: MONAI's whole-volume buffers on the device
    (``host_stitching``: in host memory); ``window_batch``: the most one window batch adds."""

    phase: str
    device: str
    precision: str
    volume_shape: list[int]
    in_channels: int
    num_classes: int
    roi_size: list[int]
    sw_batch_size: int
    windows: int
    stitch: str
    flips: int
    resident: int
    volume: int
    stitching: int
    host_stitching: int
    window_batch: int
    peak_allocated: int
    peak_growth: int
    peak_reserved: int
    cuda_context: int
    process_total: int
    seconds: float
    margin: float = 0.0
    margin_source: str = ""
    margin_fixed_mib: float = 0.0

    def summary(self) -> dict[str, int]:
        """The figures ``plan.yaml`` and the JSON keep (bytes)."""
        keys = ("peak_allocated", "peak_reserved", "process_total", "resident", "stitching")
        return {k: getattr(self, k) for k in (*keys, "volume_shape", "stitch")}


def window_count(volume_shape: Sequence[int], roi_size: Sequence[int], overlap: Any) -> int:
    """Windows ``sliding_window_inference`` runs over one volume (its own scan rule)."""
    dims = len(volume_shape)
    image = [max(int(v), int(r)) for v, r in zip(volume_shape, roi_size, strict=True)]
    overlaps = list(overlap) if isinstance(overlap, Sequence) else [float(overlap)] * dims
    interval = sliding_window._get_scan_interval(image, list(roi_size), dims, overlaps)
    return len(dense_patch_slices(image, list(roi_size), interval))


def stitching_bytes(
    volume_shape: Sequence[int],
    roi_size: Sequence[int],
    num_classes: int,
    itemsize: int = 4,
) -> int:
    """MONAI's stitched output ``(1, K, D, H, W)``, count map ``(1, 1, D, H, W)`` (the volume
    padded to the window) and one window's importance map."""
    padded = math.prod(max(int(v), int(r)) for v, r in zip(volume_shape, roi_size, strict=True))
    return (num_classes + 1) * padded * itemsize + math.prod(roi_size) * itemsize


def _importance_map(patch_size, mode="constant", sigma_scale=0.125, device="cpu", dtype=None):  # noqa: ANN001, ANN202
    with unset_fake_temporarily():
        real = _IMPORTANCE_MAP(patch_size, mode, sigma_scale, "cpu", dtype or torch.float32)
    return torch.empty(real.shape, dtype=real.dtype, device=device)


def _dice_channel(self, y_pred, y, mask=None):  # noqa: ANN001, ANN202
    if mask is not None:
        y_pred = y_pred * mask.to(dtype=y_pred.dtype)
        y = y * mask
    total = torch.sum(y)
    selected = torch.empty(y.numel(), dtype=y.dtype, device=y.device)  # masked_select
    return (2.0 * torch.sum(selected)) / (total + torch.sum(y_pred))


_IMPORTANCE_MAP = sliding_window.compute_importance_map


#: window batches of one shape whose forward is traced; the later ones replay the last of them
TRACED_WINDOW_BATCHES = 2


def _forward_template(span: list[Event], out: Any) -> tuple | None:
    """A traced forward's events (``span``) to replay for the next window batches of its shape:
    ``(span, index of the output's malloc, shape, dtype, device)``; ``None`` where it keeps more
    than one dense output or frees what it did not allocate."""
    if not isinstance(out, torch.Tensor):
        return None
    freed = {h for kind, h, _ in span if kind == "free"}
    allocated = {h for kind, h, _ in span if kind == "malloc"}
    kept = [i for i, (kind, h, _) in enumerate(span) if kind == "malloc" and h not in freed]
    if len(kept) != 1 or not freed <= allocated:
        return None
    nbytes = out.numel() * out.element_size()
    if span[kept[0]][2] != nbytes or out.untyped_storage().nbytes() != nbytes:
        return None
    return span, kept[0], tuple(out.shape), out.dtype, out.device


class _CountedWindows:
    """An inferer's calls in the trace (its class's ``__call__`` made :meth:`counting`), each
    window batch's forward bracketed (``spans``). After :data:`TRACED_WINDOW_BATCHES` forwards
    of one shape, the last one's events are replayed instead (the same bytes at the same
    moments)."""

    def __init__(self, tracker: RecordingMemTracker) -> None:
        self.tracker = tracker
        self.spans: list[tuple[int, int]] = []
        # window batch (shape, dtype, device) -> (forwards traced, the last one's template)
        self.forwards: dict[tuple, tuple[int, tuple | None]] = {}

    def _replay(self, template: tuple) -> torch.Tensor:
        """A traced forward's events again (fresh handles), its output made where it was."""
        span, kept, shape, dtype, device = template
        tracker, handles = self.tracker, {}

        def emit(events: list[Event]) -> None:
            for kind, handle, nbytes in events:
                if kind == "malloc":
                    tracker._workspaces += 1  # negative handles: no tensor has them
                    handles[handle] = -tracker._workspaces
                    tracker.events.append(("malloc", handles[handle], nbytes))
                elif kind == "free":
                    tracker.events.append(("free", handles.pop(handle), 0))
                elif kind == "category":
                    tracker.events.append((kind, handles.get(handle, handle), nbytes))
                else:
                    tracker.events.append((kind, handle, nbytes))

        emit(span[:kept])
        out = torch.empty(shape, dtype=dtype, device=device)
        emit(span[kept + 1 :])
        return out

    def _forward(self, network: Any, window: torch.Tensor, *a: Any, **k: Any) -> Any:
        """``network(window, ...)`` traced, or a traced forward of its window batch's shape
        replayed; its events' span recorded."""
        self.tracker.reset_mod_stats()
        events = self.tracker.events
        start = len(events)
        key = (tuple(window.shape), window.dtype, window.device)
        traced, template = self.forwards.get(key, (0, None))
        if traced >= TRACED_WINDOW_BATCHES and template is not None and not (a or k):
            out = self._replay(template)
        else:
            out = network(window, *a, **k)
            self.forwards[key] = (traced + 1, _forward_template(events[start:], out))
        self.spans.append((start, len(events)))
        return out

    def counting(self, call: Callable[..., Any]) -> Callable[..., Any]:
        """An inferer class's ``__call__(inferer, inputs, network, ...)``, its network's
        forwards made :meth:`_forward`."""

        def counted(inferer: Any, inputs: torch.Tensor, network: Any, *args: Any, **kw: Any) -> Any:
            return call(inferer, inputs, functools.partial(self._forward, network), *args, **kw)

        return counted


def _window_rise(held: list[int], spans: list[tuple[int, int]]) -> int:
    """The most one window batch's forward rose above what was held when it began."""
    rise = 0
    for start, end in spans:
        before = held[start - 1] if start > 0 else 0
        rise = max(rise, max(held[start:end], default=before) - before)
    return rise


def allocator_settings(cfg: DictConfig) -> AllocatorSettings:
    """The caching allocator's settings of ``memory.allocator``."""
    return AllocatorSettings.from_conf(
        resolve_allocator(OmegaConf.select(cfg, "memory.allocator")).value
    )


def whole_volume(volume_shape: Sequence[int]) -> list[int]:
    """A volume's ``[D, H, W]`` as ints; anything else is one error naming memory.val_shape."""
    shape = [int(v) for v in volume_shape]
    if len(shape) != 3 or any(v < 1 for v in shape):
        raise UserInputError(f"memory.val_shape={list(volume_shape)}: expected [D, H, W] > 0")
    return shape


@dataclass
class Phase:
    """A whole-volume inference ``run(image_shape)`` by ``then`` after a trace's training
    steps."""

    step: Any
    device: str
    phase: str
    volume_shape: list[int]
    stitch: str
    run: Any
    flips: int = 1
    spans: list[tuple[int, int]] = field(default_factory=list)

    def then(self, tracker: RecordingMemTracker) -> None:
        tracker.mark()
        module = self.step.module
        inferer, windows = type(module.inferer), _CountedWindows(tracker)
        real_device = module.inferer.device
        if self.stitch == "host":
            module.inferer.device = "meta" if self.device == "cuda" else "cpu"
        module.eval()
        try:
            with (
                mock.patch.object(inferer, "__call__", windows.counting(inferer.__call__)),
                # MONAI's data-dependent steps, as what they allocate (the module's docstring)
                mock.patch.object(sliding_window, "compute_importance_map", _importance_map),
                mock.patch.object(DiceHelper, "compute_channel", _dice_channel),
                torch.no_grad(),
            ):
                self.run((1, self.step.image_shape[1], *self.volume_shape))
        finally:
            module.inferer.device = real_device
        self.spans = windows.spans

    def estimate(
        self,
        trace: StepTrace,
        precision: str,
        settings: Any,
        allocator: AllocatorSettings,
        started: float,
    ) -> InferenceEstimate:
        """The estimate of what the phase held in ``trace``."""
        module, device, volume_shape = self.step.module, self.device, self.volume_shape
        roi = [int(r) for r in module.inferer.roi_size]
        channels, classes = self.step.image_shape[1], int(module.num_classes)
        events = trace.events
        # the phase's mark is the first event of ``then``
        peaks = phase_peaks(events, device, settings or {}, allocator, trace.then_start + 1)
        rounding = round_size if device == "cuda" else None
        itemsize = torch.empty((), dtype=self.step.input_dtype).element_size()
        buffers = stitching_bytes(volume_shape, roi, classes, itemsize)
        voxels = math.prod(volume_shape)
        volume = channels * voxels * itemsize + (
            voxels * itemsize if self.phase == "validation" else 0
        )
        est = InferenceEstimate(
            phase=self.phase,
            device=device,
            precision=precision,
            volume_shape=list(volume_shape),
            in_channels=channels,
            num_classes=classes,
            roi_size=roi,
            sw_batch_size=int(module.inferer.sw_batch_size),
            windows=window_count(volume_shape, roi, module.inferer.overlap),
            stitch=self.stitch,
            flips=self.flips,
            resident=peaks["resident"],
            volume=volume,
            stitching=buffers if self.stitch == "device" else 0,
            host_stitching=buffers if self.stitch == "host" else 0,
            window_batch=_window_rise(held_series(events, rounding), self.spans),
            peak_allocated=peaks["peak_allocated"],
            peak_growth=peaks["peak_allocated"] - peaks["resident"],
            peak_reserved=peaks["peak_reserved"],
            cuda_context=peaks["cuda_context"],
            process_total=peaks["peak_reserved"] + peaks["cuda_context"],
            seconds=time.perf_counter() - started,
        )
        est.events, est.allocator = events, allocator
        return est


def validation_phase(cfg: DictConfig, step: Any, device: str, volume_shape: Sequence[int]) -> Phase:
    """Validating one ``[D, H, W]`` volume after ``step``'s training steps."""
    module = step.module

    def run(image_shape: tuple[int, ...]) -> None:
        label_shape = (1, 1, *image_shape[2:])
        with step.autocast():
            # the collated batch, moved to the device (Lightning's fetcher does not prefetch a
            # loader that has a length: no next batch is held)
            image = torch.empty(image_shape, dtype=step.input_dtype)
            label = torch.empty(label_shape, dtype=step.input_dtype)
            module.validate_cases(image, label)
            module._val_sums = None
            del image, label

    # model.inferer.device=cpu: a GPU run's stitching in host memory, its windows on the GPU
    configured = OmegaConf.select(cfg, "model.inferer.device")
    on_host = configured is not None and torch.device(str(configured)).type == "cpu"
    stitch = "host" if on_host and device == "cuda" else "device"
    return Phase(step, device, "validation", whole_volume(volume_shape), stitch, run)


def estimate_prediction(
    cfg: DictConfig,
    volume_shape: Sequence[int],
    stitch: str = "device",
    flip_axes: Sequence[int] = (),
    precision: str = PREDICT_PRECISION,
) -> InferenceEstimate:
    """Predicted memory of ``predict.py`` on one volume with the planned ``cfg``'s network and
    inferer, stitched on the ``device`` or the ``host``, averaged over the mirrorings of
    ``flip_axes``; its own trace, with no training state."""
    if stitch not in STITCH:
        raise UserInputError(f"stitch={stitch}: expected one of {', '.join(STITCH)}")
    started = time.perf_counter()
    shape = whole_volume(volume_shape)
    device, mode, step = fake_step(cfg, precision)
    module = step.module
    classes = int(module.num_classes)
    host = "meta" if device == "cuda" else "cpu"  # host memory: not in a CUDA ledger
    # the predictor holds the module and shares its inferer (the trace counts its calls)
    predictor = VolumePredictor(module, module.inferer, classes, flip_axes, stitch="device")
    target = torch.device(host if stitch == "host" else "cpu")
    predictor.stitch_device = lambda spatial_shape: target  # type: ignore[method-assign]

    def run(image_shape: tuple[int, ...]) -> None:
        with step.autocast():
            # the volume waits on the host until predict_step knows where it is stitched
            image = torch.empty(image_shape, dtype=step.input_dtype, device=host)
            out = predictor.predict_step({"image": image}, 0)
            del image, out

    phase = Phase(step, device, "prediction", shape, stitch, run, flips=len(predictor.flips))
    trace = trace_steps(step, mode, device, phase.then, steps=0)
    memory = cfg.get("memory")  # cuda_context_mib and gpu
    est = phase.estimate(
        trace, planned_precision(cfg, precision), memory, allocator_settings(cfg), started
    )
    if device == "cuda":  # a forward without training: a plain step's margin
        est.set_margin(margin_for(device, False, 1))
    return est


def validation_shape(cfg: DictConfig, datamodule: Any = None) -> tuple[list[int] | None, str]:
    """``memory.val_shape``, else the largest validation case by voxels (from its headers);
    ``None`` and why where neither is known."""
    configured = OmegaConf.select(cfg, "memory.val_shape")
    if configured is not None:
        return whole_volume(list(configured)), "memory.val_shape"
    from volseg.utils.instantiate import build

    try:
        datamodule = datamodule if datamodule is not None else build(cfg.data, "data")
        if not hasattr(datamodule, "validation_shapes"):
            return None, f"{cfg.data._target_} lists no validation shapes; set memory.val_shape"
        if not Path(datamodule.root).exists():
            return None, f"data.root={datamodule.root} does not exist yet; set memory.val_shape"
        shapes = datamodule.validation_shapes()
    except UserInputError as err:
        return None, str(err).splitlines()[0]
    if not shapes:
        return None, "no validation case; set memory.val_shape"
    largest = max(shapes, key=math.prod)
    return largest, f"the largest of {len(shapes)} validation case(s)"
