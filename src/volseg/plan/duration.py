"""A planned run's wall time, predicted before its first step: its optimizer steps times the
step's time, plus its validations, plus its checkpoint writes, each limit of the run applied as
the run applies it (``trainer.max_steps`` caps the steps, ``trainer.max_time`` the duration).

- The step's time: the traced step's ops replayed on this machine
  (:meth:`volseg.speed.step_time.StepWork.seconds`); for a CUDA plan made without a GPU, the
  stated GPU model's (:func:`volseg.speed.gpu_model.modelled_seconds`), said to be modelled.
- A validation: each validation volume's sliding windows, in batches of
  ``model.inferer.sw_batch_size``, one batch's forward counted on fake tensors and replayed as the
  step's ops are; the whole-volume work around them (stitching, argmax, loss, Dice) run once on a
  volume of the largest validation shape with the network's output given, and timed.
- A checkpoint write: the checkpoint's bytes (weights, buffers, optimizer state, as the trace
  holds them) at the rate this machine writes a file of that size in the run's folder, or copies
  it in memory where ``async_checkpoint`` writes in the background (the loop pays the copy).

Not included: the run's start (building, reading and caching the data), the loading of each
batch, Lightning's own work between steps, and an early stop.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.callbacks import Timer
from monai.data.utils import dense_patch_slices
from monai.inferers.utils import _get_scan_interval
from omegaconf import DictConfig, OmegaConf
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from volseg.data.host_memory import local_processes
from volseg.data.loader_options import available_cores
from volseg.models.build import build_model
from volseg.speed.gpu_model import gpu_model, modelled_seconds
from volseg.speed.step_time import StepWork, measure_speed
from volseg.utils.config import plain
from volseg.utils.errors import UserInputError
from volseg.utils.instantiate import build

#: bytes a write or a copy is timed with (a larger checkpoint's time is scaled from it)
PROBE_BYTES = 16 * 2**20
#: a volume's whole-volume work is timed on at most this many voxels x classes (scaled above)
WHOLE_VOLUME_ELEMENTS = 2**25
#: validations' counts and timings kept for plans asked again (a test suite's, a sweep's)
CACHED_VALIDATIONS = 32
#: epochs simulated at most (a run of more is predicted as far as that)
MAX_EPOCHS_SIMULATED = 100_000
#: what no figure here holds
NOT_INCLUDED = (
    "the run's start (building, reading and caching the data), loading each batch, Lightning's "
    "work between steps; an early stop (callbacks.early_stopping) ends a run sooner"
)


def predict_duration(
    cfg: DictConfig,
    run: Any,
    datamodule: Callable[[DictConfig], Any] | Any = None,
    estimate: Mapping[str, Any] | None = None,
) -> Mapping[str, Any]:
    """The planned run's wall time (``seconds``, of fitting: sanity check, training, validation,
    checkpoint writes) and every input of it, as ``plan.yaml`` keeps them; ``{"not_predicted":
    why}`` where it is not. Predicted when first read (writing ``plan.yaml``, the log line): a
    plan only asked for its decisions does not time anything.

    ``cfg``: the planned config; ``run``: the engine's answer for its step
    (:class:`volseg.memory.RunEstimate`, ``None``: no step estimate); ``datamodule``: the
    datamodule the plan reads the data with, or a callable returning it from ``cfg`` (the case
    counts and validation shapes are read from it, never a voxel); ``estimate``: the plan's step
    summary (its ``not_estimated`` says why there is no ``run``)."""
    if run is None:
        why = (estimate or {}).get("not_estimated")
        return {"not_predicted": why or "no step estimate (memory.plan_step=false)"}
    return Predicted(functools.partial(_answer, cfg, run, datamodule))


class Predicted(Mapping[str, Any]):
    """A prediction made when first read (then kept): ``predict()``'s mapping."""

    def __init__(self, predict: Callable[[], dict[str, Any]]) -> None:
        self._predict: Callable[[], dict[str, Any]] | None = predict
        self._found: dict[str, Any] = {}

    def _answer(self) -> dict[str, Any]:
        if self._predict is not None:
            self._found, self._predict = self._predict(), None
        return self._found

    def __getitem__(self, key: str) -> Any:
        return self._answer()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._answer())

    def __len__(self) -> int:
        return len(self._answer())

    def __repr__(self) -> str:
        return "Predicted(not read yet)" if self._predict is not None else repr(self._found)


def _answer(cfg: DictConfig, run: Any, datamodule: Any) -> dict[str, Any]:
    try:
        return _predict(cfg, run, datamodule)
    except _NotPredicted as err:
        return {"not_predicted": str(err)}
    except UserInputError:
        raise
    except Exception as err:  # a setting not modelled here: the run goes on without a time
        return {"not_predicted": f"{type(err).__name__}: {err}".splitlines()[0]}


class _NotPredicted(Exception):
    """Why a run's time is not predicted."""


def duration_line(duration: Mapping[str, Any]) -> str:
    """The one line ``train.py`` prints: "about N min on this machine: S steps at T s a step, V
    validations at U s, W checkpoint writes", or why it is not predicted."""
    if "not_predicted" in duration or "seconds" not in duration:
        return f"run time: not predicted ({duration.get('not_predicted', 'no prediction')})"
    where = "on this machine" if duration["timed"] == "replayed" else duration["timed"]
    line = (
        f"run time: about {_minutes(duration['seconds'])} {where}: "
        f"{duration['optimizer_steps']:,} steps at {_secs(duration['step_seconds'])} a step, "
        f"{duration['validations']} validations at {_secs(duration['validation_seconds'])}, "
        f"{duration['checkpoint_writes']} checkpoint writes"
    )
    if duration.get("capped_by"):
        line += f"; {duration['capped_by']}"
    elif duration.get("stopped_by") == "trainer.max_steps":
        line += f" (trainer.max_steps={duration['max_steps']} ends it)"
    load, cores = duration.get("load_average"), duration.get("cores")
    if load is not None and cores and load > cores:
        line += (
            f" (timed while this machine was busy, load {load:.1f} on {cores} cores: its "
            "replays, and the run, are slower than on a quiet one)"
        )
    return line


def _minutes(seconds: float) -> str:
    minutes = seconds / 60
    if minutes < 1:
        return f"{seconds:.0f} s"
    return f"{minutes:.1f} min" if minutes < 10 else f"{minutes:,.0f} min"


def _secs(seconds: float) -> str:
    return f"{seconds:.3g} s"


# --- the run's shape: steps, epochs, validations, from the configs and the data ------------------


@dataclass(frozen=True)
class _Data:
    """What the run's loaders hold: training volumes and each validation volume's shape."""

    train_volumes: int
    val_shapes: list[list[int]]
    source: str


def _data(cfg: DictConfig, datamodule: Any) -> _Data:
    """The training volumes and validation shapes of ``cfg.data`` (headers only); the embedded
    dataset not generated yet: those it will be generated with."""
    data = cfg.data
    synthetic = data.get("synthetic")
    root = Path(str(data.root))
    if synthetic and not root.exists() and Path(str(synthetic.root)).resolve() == root.resolve():
        volumes, val = int(synthetic.num_volumes), int(synthetic.num_val)
        shape = [int(s) for s in synthetic.shape]
        return _Data(volumes - val, [shape] * val, "data.synthetic (generated at the run's start)")
    if not root.exists():
        raise _NotPredicted(f"data.root={root} does not exist yet: no case to count")
    try:
        module = datamodule(cfg) if callable(datamodule) else datamodule
        if module is None:
            module = build(cfg.data, "data")
        if not hasattr(module, "split") or not hasattr(module, "validation_shapes"):
            raise _NotPredicted(f"{data._target_} does not list its cases")
        _, problems = module.split()
        if problems:
            raise _NotPredicted(f"the dataset's layout: {problems[0]}")
        shapes = module.validation_shapes()
    except UserInputError as err:
        raise _NotPredicted(str(err).splitlines()[0]) from None
    return _Data(len(module.train_cases), [list(map(int, s)) for s in shapes], str(root))


def _limited(count: int, limit: Any, key: str) -> int:
    """``count`` batches under Lightning's ``limit_*_batches`` (an int: at most that many; a
    float: that share, rounded down)."""
    if limit is None:
        return count
    if isinstance(limit, bool) or not isinstance(limit, int | float):
        raise _NotPredicted(f"{key}={limit}: not a number")
    if isinstance(limit, int):
        return min(count, limit)
    return int(count * limit)


def _max_time(trainer: DictConfig) -> float | None:
    """``trainer.max_time`` in seconds (Lightning's formats: ``DD:HH:MM:SS`` or a dict of
    ``timedelta``'s keys); ``None`` without one."""
    value = plain(trainer.get("max_time"))
    if value is None or str(value).strip().lower() in ("", "null", "none"):
        return None
    try:
        return float(Timer(duration=value).time_remaining())
    except Exception as err:  # Lightning's own error names the format
        raise UserInputError(f"trainer.max_time={value}: {err}") from None


@dataclass
class _Run:
    """The run's loop as the trainer will run it, and what each part of it costs (seconds)."""

    batches_per_epoch: int
    accumulate: int
    step_s: float
    max_epochs: int | None
    max_steps: int | None
    max_time: float | None
    #: validation: whether it runs, every n epochs (None: by batches across epochs), every
    #: ``val_check_batch`` batches (None: at the epoch's end), its time, the sanity check's
    validates: bool
    every: int | None
    val_check_batch: int | None
    validation_s: float
    sanity_s: float
    #: callbacks.validation_budget's max_fraction (None: not in the run)
    budget_fraction: float | None
    checkpoints: _Checkpoints
    write_s: float

    @property
    def steps_per_epoch(self) -> int:
        return -(-self.batches_per_epoch // self.accumulate)


@dataclass
class _Checkpoints:
    """When the run's checkpoint callbacks write: at each validation (a monitored one: at most
    once a validation, when its metric improves), at epoch ends, every N steps or minutes."""

    per_validation: int = 0
    per_epoch_end: int = 0
    #: those at epoch ends that skip a save costing more than this share of the time since
    time_share: float | None = None
    every_n_steps: list[int] = field(default_factory=list)
    every_minutes: list[float] = field(default_factory=list)
    #: a save at the end of training where the last epoch end's was skipped or not reached
    at_train_end: int = 0
    #: an epoch-end save of the state a validation's save just wrote links to that file
    links: bool = False


def _checkpoints(cfg: DictConfig) -> _Checkpoints:
    """The checkpoint callbacks of ``cfg.callbacks`` (a ``ModelCheckpoint`` by its keys)."""
    found = _Checkpoints(links=cfg.get("async_checkpoint") is True)
    if cfg.trainer.get("enable_checkpointing") is False:
        return found
    for node in (cfg.get("callbacks") or {}).values():
        if not isinstance(node, DictConfig) or "save_top_k" not in node or "dirpath" not in node:
            continue
        if node.get("save_top_k") == 0:
            continue
        if node.get("monitor") is not None:
            found.per_validation += 1
        elif node.get("save_on_train_epoch_end") is True:
            found.per_epoch_end += 1
            found.time_share = node.get("max_time_share")
            found.at_train_end += 1 if "save_every_minutes" in node else 0
        else:
            found.per_validation += 1
        for key in ("save_every_n_steps", "every_n_train_steps"):
            if node.get(key):
                found.every_n_steps.append(int(node[key]))
        if node.get("save_every_minutes"):
            found.every_minutes.append(float(node.save_every_minutes))
    return found


@dataclass
class _Simulated:
    seconds: float = 0.0
    training_s: float = 0.0
    steps: int = 0
    epochs: int = 0
    validations: int = 0
    writes: int = 0
    stopped_by: str = ""
    truncated: bool = False


def _simulate(run: _Run) -> _Simulated:
    """The run epoch by epoch, as Lightning and volseg's callbacks run it: validation at its
    batches and epochs (``callbacks.validation_budget`` raising the interval after a validation,
    and validating the last epoch), the checkpoints, and the limits: ``max_steps`` at a step,
    ``max_time`` at the step that reaches it (Lightning's ``Timer``; a validation due in that
    epoch still runs)."""
    out = _Simulated()
    batch_s = max(run.step_s / run.accumulate, 1e-9)
    ckpt = run.checkpoints
    every, final, last_in_time = run.every, False, False
    clock, trained, total_batches = 0.0, 0.0, 0  # clock: since training began (Timer's)
    epoch_times: list[float] = []
    since_save = 0.0  # seconds since the last epoch-end save
    saved_last = True  # the last epoch end saved (else the end of training does)
    for epoch in range(MAX_EPOCHS_SIMULATED):
        if run.max_epochs is not None and epoch >= run.max_epochs:
            out.stopped_by = "trainer.max_epochs"
            break
        if run.max_steps is not None and out.steps >= run.max_steps:
            out.stopped_by = "trainer.max_steps"
            break
        if run.budget_fraction is not None and not final:
            # ValidationBudget.on_train_epoch_start: the last epoch is validated
            final = run.max_epochs is not None and epoch + 1 >= run.max_epochs
            if not final and run.max_time is not None and epoch_times:
                # another epoch and validation after this one's would not fit: this one's
                # validation is the last, and the run stops after it
                cycle = _mean(epoch_times) + (run.validation_s if out.validations else 0.0)
                final = last_in_time = run.max_time - clock < 2 * cycle
            every = 1 if final else every
        val_epoch = run.validates and (every is None or (epoch + 1) % every == 0)
        # the batches this epoch trains: cut by max_steps (whole steps) and max_time
        batches = run.batches_per_epoch
        if run.max_steps is not None:
            batches = min(batches, (run.max_steps - out.steps) * run.accumulate)
        timed_out = False
        if run.max_time is not None:
            fit = max(1, math.ceil((run.max_time - clock) / batch_s - 1e-9))
            timed_out = fit <= batches
            batches = min(batches, fit)
        # validations inside the epoch (every val_check_batch batches) or at its end; a stop
        # by max_time validates a validation epoch (Lightning's should_stop)
        if not val_epoch:
            checks = 0
        elif run.val_check_batch is None:
            checks = 1 if batches == run.batches_per_epoch or timed_out else 0
        elif every is None:  # counted across epochs
            checks = (total_batches + batches) // run.val_check_batch
            checks -= total_batches // run.val_check_batch
        else:
            checks = batches // run.val_check_batch or int(timed_out)
        epoch_s = batches * batch_s
        steps = -(-batches // run.accumulate)
        out.steps += steps
        total_batches += batches
        trained += epoch_s
        since_save += epoch_s + checks * run.validation_s
        writes = checks * ckpt.per_validation
        writes += sum(int(epoch_s // (60 * minutes)) for minutes in ckpt.every_minutes)
        writes += sum(steps // n for n in ckpt.every_n_steps)
        out.validations += checks
        if checks and run.budget_fraction is not None and epoch_times and every and not final:
            # ValidationBudget.on_validation_end: validation near max_fraction of the time
            share = run.budget_fraction * max(_mean(epoch_times), 1e-9)
            every = max(run.every or 1, math.ceil(run.validation_s / share))
        # the callback's epoch: from its start to its end, the validation at its end inside
        epoch_times.append(epoch_s + checks * run.validation_s)
        # the epoch-end saves (an epoch a limit ends early ends too)
        saves = ckpt.per_epoch_end
        if saves and ckpt.time_share is not None and run.write_s > ckpt.time_share * since_save:
            saves = 0
        saved_last = bool(saves)
        if saves and ckpt.links and checks and ckpt.per_validation:
            saves = 0  # the validation's save just wrote this state: a link, no write
        if saved_last:
            since_save = 0.0
        writes += saves
        out.writes += writes
        clock += epoch_s + checks * run.validation_s + writes * run.write_s
        out.epochs = epoch + 1
        if timed_out:
            out.stopped_by = "trainer.max_time"
            break
        if last_in_time and checks:
            out.stopped_by = "trainer.max_time (callbacks.validation_budget: its last validation)"
            break
    else:
        out.truncated = True
        out.stopped_by = f"{MAX_EPOCHS_SIMULATED:,} epochs (predicted that far)"
    if not saved_last:
        out.writes += ckpt.at_train_end
        clock += ckpt.at_train_end * run.write_s
    out.training_s = trained
    out.seconds = run.sanity_s + clock
    return out


def _mean(times: list[float]) -> float:
    """The mean of the last three (ValidationBudget's epoch time)."""
    recent = times[-3:]
    return sum(recent) / len(recent)


# --- what each part costs -----------------------------------------------------------------------


class _Counted(TorchDispatchMode):
    """Counts the ops run under it into ``work``, as a traced step's are (``StepWork.add``)."""

    def __init__(self, work: StepWork) -> None:
        super().__init__()
        self.work = work

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        out = func(*args, **(kwargs or {}))
        self.work.add(func, args, kwargs, out)
        return out


def _fastest(run: Callable[[], Any], device: str, runs: int = 3) -> float:
    """The fastest of ``runs`` timings of ``run`` after one warm-up (seconds)."""
    times = []
    for _ in range(runs + 1):
        start = time.perf_counter()
        run()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return min(times[1:])


_MIXED = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}
_TRUE = {"bf16-true": torch.bfloat16, "16-true": torch.float16}


def _precision_context(precision: str, device: str) -> contextlib.AbstractContextManager:
    """The forward's autocast at Lightning's ``precision`` (its cast cache off, as Lightning's)."""
    if precision in _MIXED:
        dtype = torch.bfloat16 if device == "cpu" else _MIXED[precision]
        return torch.autocast(device, dtype=dtype, cache_enabled=False)
    return contextlib.nullcontext()


def window_count(volume_shape: list[int], roi_size: list[int], overlap: Any) -> int:
    """Windows MONAI's sliding window runs over one volume (its own scan rule: a side smaller
    than the window is padded to it)."""
    image = [max(int(v), int(r)) for v, r in zip(volume_shape, roi_size, strict=True)]
    overlaps = list(overlap) if isinstance(overlap, list | tuple) else [float(overlap)] * 3
    interval = _get_scan_interval(image, list(roi_size), 3, overlaps)
    return len(dense_patch_slices(image, list(roi_size), interval))


@dataclass(frozen=True)
class _Validation:
    """One window batch's forward (seconds) and the whole-volume work of a volume of ``shape``
    (seconds; 0 where not timed)."""

    window_batch_s: float
    whole_volume_s: float
    shape: list[int]


#: a validation's counted window batch and timed whole-volume work, by what they depend on
_validations: dict[tuple, tuple[StepWork, float]] = {}


def _validation_times(
    cfg: DictConfig, device: str, shape: list[int], seconds: Callable[[StepWork], float]
) -> _Validation:
    """A window batch's forward, counted on fake tensors and priced by ``seconds``; the
    whole-volume work around the windows of a ``shape`` volume run for real on ``device`` (a
    device this machine lacks: not timed)."""
    # what they depend on: the model (its inferer too), precision, channels, device and shape
    precision, model = str(cfg.trainer.precision), OmegaConf.to_yaml(cfg.model)
    key = (model, precision, cfg.get("in_channels"), device, tuple(shape))
    if key not in _validations:
        _validations[key] = _measure_validation(cfg, device, shape)
        while len(_validations) > CACHED_VALIDATIONS:
            _validations.pop(next(iter(_validations)))
    work, whole = _validations[key]
    return _Validation(seconds(work), whole, shape)


def _measure_validation(cfg: DictConfig, device: str, shape: list[int]) -> tuple[StepWork, float]:
    """One window batch's forward, counted (``StepWork``), and the whole-volume work's seconds
    (0.0: ``device`` is not on this machine)."""
    here = device if device == "cpu" or torch.cuda.is_available() else None
    precision = str(cfg.trainer.precision)
    module = build_model(cfg).eval()
    if precision in _TRUE:
        module = module.to(_TRUE[precision])
    if here is not None:
        module = module.to(here)
    dtype = _TRUE.get(precision, torch.float32)
    roi = [int(r) for r in module.inferer.roi_size]
    channels = int(cfg.get("in_channels", 1))
    work = StepWork(device)
    counted_on = here or "cpu"  # a device this machine lacks: its ops as the CPU dispatches them
    with FakeTensorMode(allow_non_fake_inputs=True):
        window = torch.empty(
            (int(module.inferer.sw_batch_size), channels, *roi), dtype=dtype, device=counted_on
        )
        with _precision_context(precision, counted_on), torch.no_grad(), _Counted(work):
            out = module(window)
        out_shape, out_dtype = tuple(out.shape), out.dtype
    if here is None:
        return work, 0.0
    # the whole-volume work: the network's output given (zeros), all else as validation runs it,
    # on a volume of at most WHOLE_VOLUME_ELEMENTS voxels x classes (scaled by voxels above)
    scale = min(1.0, WHOLE_VOLUME_ELEMENTS / (out_shape[1] * math.prod(shape)))
    timed = [max(r, round(s * scale ** (1 / 3))) for s, r in zip(shape, roi, strict=True)]
    image = torch.zeros((1, channels, *timed), dtype=dtype, device=here)
    label = torch.zeros((1, 1, *timed), dtype=dtype, device=here)

    def given(x: torch.Tensor) -> torch.Tensor:
        return torch.zeros((x.shape[0], *out_shape[1:]), dtype=out_dtype, device=x.device)

    module.forward = given  # the windows' forward is priced from the count above
    with _precision_context(precision, here):
        took = _fastest(lambda: module.validate_cases(image, label), here, runs=2)
    return work, took * math.prod(shape) / math.prod(timed)


@functools.cache
def _rates(folder: str, device: str) -> tuple[float, float]:
    """Bytes a second this machine writes a checkpoint-like file in ``folder`` (``torch.save``)
    and copies a tensor in memory (to the host, from ``device``)."""
    probe = torch.zeros(PROBE_BYTES, dtype=torch.uint8)
    with tempfile.TemporaryDirectory(dir=folder) as scratch:
        path = Path(scratch) / "probe.ckpt"
        write = _fastest(lambda: torch.save({"state": probe}, path), "cpu", runs=2)
    here = device if device == "cpu" or torch.cuda.is_available() else "cpu"
    source = probe.to(here)
    target = torch.empty_like(probe)
    copy = _fastest(lambda: target.copy_(source), here, runs=3)
    return PROBE_BYTES / write, PROBE_BYTES / max(copy, 1e-9)


def _existing(path: Path) -> Path:
    """``path`` or its nearest existing parent."""
    for candidate in (path, *path.parents):
        if candidate.is_dir():
            return candidate
    return Path(tempfile.gettempdir())


def _checkpoint_cost(cfg: DictConfig, run: Any) -> tuple[int, float, str]:
    """A checkpoint's bytes, what the loop pays to save one (seconds) and how that was found."""
    step = run.step
    nbytes = int(step.params + step.buffers + step.optimizer_state)
    folder = OmegaConf.select(cfg, "callbacks.last_checkpoint.dirpath", default=None)
    folder = folder or OmegaConf.select(cfg, "callbacks.model_checkpoint.dirpath", default=None)
    try:
        where = _existing(Path(str(folder))) if folder else Path(tempfile.gettempdir())
    except Exception:  # an unresolved run folder (no Hydra run): the temporary folder
        where = Path(tempfile.gettempdir())
    write_rate, copy_rate = _rates(str(where), step.device)
    if cfg.get("async_checkpoint") is True:
        seconds = nbytes / copy_rate
        how = (
            f"async_checkpoint=true: the loop copies {nbytes / 2**20:,.1f} MiB to host memory at "
            f"{copy_rate / 2**30:,.1f} GiB/s (measured); the write runs beside it"
        )
    else:
        seconds = nbytes / write_rate
        how = f"{nbytes / 2**20:,.1f} MiB written at {write_rate / 2**20:,.0f} MiB/s in {where}"
    return nbytes, seconds, how


def _load() -> tuple[float, int] | None:
    """This machine's 1-minute load average and the cores this process may use (``None`` where
    the system does not say): replays timed on a busy machine are slower."""
    try:
        return round(os.getloadavg()[0], 2), available_cores()
    except OSError:
        return None


def _seconds_of(cfg: DictConfig, run: Any) -> tuple[Callable[[StepWork], float], str]:
    """How a traced step's work becomes seconds on the run's device: replayed on it here, or the
    GPU model's for a CUDA plan made without a GPU (``memory.gpu`` names it)."""
    device = run.step.device
    if device == "cpu" or (device == "cuda" and torch.cuda.is_available()):
        speed = measure_speed(device)
        return (lambda work: work.seconds(speed)), "replayed"
    # nothing to replay on here: the GPU model's stated figures (unset: its default GPU, assumed)
    gpu, _ = gpu_model(OmegaConf.select(cfg, "memory.gpu"))
    return (lambda work: modelled_seconds(work, gpu)), f"modelled for the {gpu.name}"


def _predict(cfg: DictConfig, run: Any, datamodule: Any) -> dict[str, Any]:
    trainer = cfg.trainer
    for key in ("fast_dev_run", "overfit_batches"):
        if trainer.get(key):
            raise _NotPredicted(f"trainer.{key}={trainer.get(key)}: a debugging run")
    load = _load()  # before the replays add to it
    seconds, timed = _seconds_of(cfg, run)
    data = _data(cfg, datamodule)
    device = run.step.device
    world = local_processes(trainer, device) * int(trainer.get("num_nodes") or 1)
    # training: every volume samples_per_volume times an epoch, shared by the ranks, in batches
    batch = int(cfg.data.batch_size)
    per_volume = int(cfg.data.get("samples_per_volume") or 1)
    samples = data.train_volumes * per_volume
    loader = math.ceil(math.ceil(samples / world) / batch)
    batches = _limited(loader, plain(trainer.get("limit_train_batches")), "limit_train_batches")
    if batches < 1:
        raise _NotPredicted("no training batch an epoch (trainer.limit_train_batches)")
    accumulate = int(trainer.get("accumulate_grad_batches") or 1)
    step_s = seconds(run.work)
    # validation: this rank's share of the volumes, batch 1
    val_shapes = data.val_shapes[::world]
    val_batches = _limited(
        len(val_shapes), plain(trainer.get("limit_val_batches")), "limit_val_batches"
    )
    val_shapes = val_shapes[:val_batches]
    inferer = cfg.model.inferer
    roi = [int(r) for r in inferer.roi_size]
    sw_batch = int(inferer.sw_batch_size)
    windows = [window_count(s, roi, plain(inferer.overlap)) for s in val_shapes]
    if val_shapes:
        largest = max(val_shapes, key=math.prod)
        timing = _validation_times(cfg, device, largest, seconds)
        per_voxel = timing.whole_volume_s / math.prod(largest)
        case_s = [
            w / sw_batch * timing.window_batch_s + per_voxel * math.prod(s)
            for w, s in zip(windows, val_shapes, strict=True)
        ]
    else:
        timing, case_s = None, []
    sanity = int(trainer.get("num_sanity_val_steps") or 0)
    sanity_cases = case_s if sanity < 0 else case_s[:sanity]
    interval = plain(trainer.get("val_check_interval"))
    every = trainer.get("check_val_every_n_epoch")
    if interval is None or (isinstance(interval, float) and interval == 1.0):
        val_check = None
    elif isinstance(interval, float):
        val_check = max(1, int(batches * interval))
    elif isinstance(interval, int):
        val_check = interval
    else:
        raise _NotPredicted(f"trainer.val_check_interval={interval}: a time, not modelled")
    epochs_asked, steps_asked = trainer.get("max_epochs"), trainer.get("max_steps")
    max_epochs = None if epochs_asked in (None, -1) else int(epochs_asked)
    max_steps = None if steps_asked in (None, -1) else int(steps_asked)
    max_time = _max_time(trainer)
    if max_epochs is None and max_steps is None and max_time is None:
        if epochs_asked is not None:
            raise _NotPredicted("no limit ends the run (max_epochs=-1, no max_steps or max_time)")
        max_epochs = 1000  # Lightning's default where nothing else ends a run
    budget = OmegaConf.select(cfg, "callbacks.validation_budget")
    checkpoints = _checkpoints(cfg)
    nbytes, write_s, write_how = _checkpoint_cost(cfg, run)
    loop = _Run(
        batches_per_epoch=batches,
        accumulate=accumulate,
        step_s=step_s,
        max_epochs=max_epochs,
        max_steps=max_steps,
        max_time=max_time,
        validates=bool(case_s),
        every=None if every is None else int(every),
        val_check_batch=val_check,
        validation_s=sum(case_s),
        sanity_s=sum(sanity_cases),
        budget_fraction=None if budget is None else float(budget.max_fraction),
        checkpoints=checkpoints,
        write_s=write_s,
    )
    sim = _simulate(loop)
    limit = {
        "trainer.max_epochs": f"trainer.max_epochs={max_epochs}",
        "trainer.max_steps": f"trainer.max_steps={max_steps}",
    }.get(sim.stopped_by, sim.stopped_by)
    steps_from = (
        f"{data.train_volumes} training volumes x data.samples_per_volume={per_volume}"
        f"{f' / {world} processes' if world > 1 else ''} / data.batch_size={batch} = "
        f"{loader} batches an epoch"
    )
    if batches != loader:
        steps_from += f", {batches} with trainer.limit_train_batches"
    if accumulate > 1:
        steps_from += f", a step every {accumulate} (trainer.accumulate_grad_batches)"
    steps_from += f"; {sim.epochs} epochs, ended by {limit}"
    result: dict[str, Any] = {
        "seconds": round(sim.seconds, 1),
        "timed": timed,
        "device": device,
        "optimizer_steps": sim.steps,
        "steps_per_epoch": loop.steps_per_epoch,
        "epochs": sim.epochs,
        "steps_from": steps_from,
        "step_seconds": round(step_s, 4),
        "training_seconds": round(sim.training_s, 1),
        "validations": sim.validations,
        "validation_seconds": round(loop.validation_s, 3),
        "sanity_validation_seconds": round(loop.sanity_s, 3),
        "validation_from": _validation_from(val_shapes, windows, roi, inferer, timing),
        "checkpoint_writes": sim.writes,
        "checkpoint_bytes": nbytes,
        "checkpoint_write_seconds": round(write_s, 4),
        "checkpoint_from": write_how,
        "stopped_by": sim.stopped_by,
        "max_steps": max_steps,
        "max_time_seconds": max_time,
        "data_from": data.source,
        "not_included": NOT_INCLUDED,
    }
    if load is not None and timed == "replayed" and device == "cpu":
        result["load_average"], result["cores"] = load
    if sim.stopped_by == "trainer.max_time":
        result["capped_by"] = (
            f"trainer.max_time={plain(trainer.max_time)} caps it: the run stops at the step that "
            f"reaches {max_time / 60:,.1f} min of training"
        )
    elif sim.stopped_by.startswith("trainer.max_time"):
        result["capped_by"] = (
            f"trainer.max_time={plain(trainer.max_time)} caps it: the run stops after the last "
            "validation that fits in it (callbacks.validation_budget)"
        )
    return result


def _validation_from(
    shapes: list[list[int]],
    windows: list[int],
    roi: list[int],
    inferer: DictConfig,
    timing: _Validation | None,
) -> str:
    """How one validation's time is found, in words."""
    if timing is None:
        return "no validation volume"
    return (
        f"{len(shapes)} volume(s) (largest {timing.shape}), {sum(windows)} windows of "
        f"model.inferer.roi_size={roi} at overlap {plain(inferer.overlap)}, in batches of "
        f"model.inferer.sw_batch_size={int(inferer.sw_batch_size)} at "
        f"{timing.window_batch_s:.3g} s a batch; the whole-volume work "
        f"{timing.whole_volume_s:.3g} s for the largest"
    )
