"""A step's time on its device, from its traced ops: each op that computes (a convolution, a
matrix product: an op with a FLOP formula) or normalizes is replayed once on the device at its
traced shapes and timed; every other op costs a fixed ``call`` (Python, dispatch, autograd) plus
the bytes it reads and writes at the device's bandwidth; each checkpointed segment adds its own
bookkeeping, and each op a selective policy sees (forward and recompute) that policy's dispatch.
These per-event costs are solved by least squares from probes run on the device: chains of a
U-Net's units (a convolution, a norm, a leaky ReLU) on tiny maps, plain and checkpointed, whose
per-op costs are a network's (a sine's are a third of a selective policy's per conv-net op: its
arguments and saved tensors are few). Every timing is the fastest of many runs after warm-up runs
(:func:`_fastest`): on a shared machine, the run the least disturbed.

Kernel speed depends on shapes in ways no table holds (on a CPU, torch runs small batch-1
convolutions on its native kernels, ``ConvParams::use_mkldnn``; oneDNN's speed varies tenfold
with channels), so it is measured, on the device itself: the lever table compares one step with
another on one device, never with a figure from another machine.
"""

from __future__ import annotations

import functools
import math
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any, NamedTuple
from unittest import mock

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

from volseg.models import checkpointing

_NORMS = ("native_batch_norm", "native_group_norm", "native_layer_norm")


class TensorSpec(NamedTuple):
    """A traced tensor as a replay rebuilds it: shape, strides, dtype."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype


def spec_of(value: Any) -> Any:
    """``value`` with each tensor as its :class:`TensorSpec` and each list a tuple (hashable)."""
    if isinstance(value, Tensor):
        return TensorSpec(tuple(value.shape), tuple(value.stride()), value.dtype)
    if isinstance(value, (list, tuple)):
        return tuple(spec_of(v) for v in value)
    if isinstance(value, dict):
        return tuple((k, spec_of(v)) for k, v in value.items())
    return value


def _built(value: Any, device: str) -> Any:
    """:func:`spec_of`'s ``value`` with each spec a tensor of random values on ``device``."""
    if isinstance(value, TensorSpec):
        tensor = torch.empty_strided(value.shape, value.stride, dtype=value.dtype, device=device)
        return tensor.normal_() if tensor.is_floating_point() else tensor.zero_()
    if isinstance(value, tuple):
        return [_built(v, device) for v in value]
    return value


#: a replayed op: ``(func, args spec, kwargs spec)``
Replay = tuple[Any, Any, Any]


def spec_bytes(value: Any) -> int:
    """The bytes of every tensor of a :func:`spec_of` value."""
    if isinstance(value, TensorSpec):
        return math.prod(value.shape) * value.dtype.itemsize
    return sum(map(spec_bytes, value)) if isinstance(value, tuple) else 0


@functools.cache
def replay_seconds(op: Replay, device: str) -> float | None:
    """``op``'s fastest run on ``device`` (seconds, :func:`_fastest`); ``None``
    where its traced arguments do not run on their own (an op the trace's fake tensors pass)."""
    func, args, kwargs = op
    built_args, built_kwargs = _built(args, device), dict(_built(kwargs, device))
    try:
        with torch.no_grad():
            return _fastest(lambda: func(*built_args, **built_kwargs), device, seconds=0.05)
    except RuntimeError:
        return None


@dataclass
class StepWork:
    """What one traced optimizer step asks of its device: ``calls`` (ops dispatched),
    ``segments`` and ``selective_segments`` (checkpointed segments run, those with a selective
    policy among them), ``segment_calls`` (ops a segment's forward dispatches: each saved tensor
    goes through checkpoint's hooks), ``selective_calls`` (ops a selective policy saw, forward
    and recompute), ``replayed`` (each op timed by replay, with its count) and ``bytes`` (read
    and written by every other op)."""

    device: str
    calls: int = 0
    segments: int = 0
    selective_segments: int = 0
    segment_calls: int = 0
    selective_calls: int = 0
    bytes: int = 0
    replayed: Counter[Replay] = field(default_factory=Counter)
    in_segment: int = field(default=0, repr=False)  # segments entered, not yet left

    def add(self, func: Any, args: tuple, kwargs: dict | None, out: Any) -> None:
        """One dispatched op ``func(*args, **kwargs) -> out``."""
        self.calls += 1
        self.segment_calls += self.in_segment > 0
        packet = func.overloadpacket
        if packet in flop_registry or packet.__name__.startswith(_NORMS):
            self.replayed[(func, spec_of(args), spec_of(kwargs or {}))] += 1
            return
        tensors = [*args, *(out if isinstance(out, (tuple, list)) else (out,))]
        self.bytes += sum(t.numel() * t.element_size() for t in tensors if isinstance(t, Tensor))

    def counts(self) -> dict[str, int]:
        """How many times the step pays each of :class:`DeviceSpeed`'s per-event costs, by
        the cost's name."""
        return {
            "call": self.calls,
            "segment": self.segments,
            "selective_segment": self.selective_segments,
            "segment_call": self.segment_calls,
            "selective_call": self.selective_calls,
        }

    def seconds(self, speed: DeviceSpeed) -> float:
        """The step's predicted time on its device, of ``speed`` (seconds)."""
        replayed = 0.0
        for op, n in self.replayed.items():
            took = replay_seconds(op, self.device)
            replayed += n * (spec_bytes(op[1]) / speed.bandwidth if took is None else took)
        per_event = sum(n * getattr(speed, cost) for cost, n in self.counts().items())
        return per_event + self.bytes / speed.bandwidth + replayed


@contextmanager
def counted_segments(work: StepWork, counting: Callable[[], bool]) -> Iterator[None]:
    """Count into ``work`` the checkpointed segments and selective policy calls that run while
    ``counting()``, and mark the ops a segment's forward dispatches."""

    def counter(fn: Callable[..., Any], count: str) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            if not counting():
                return fn(*args, **kwargs)
            setattr(work, count, getattr(work, count) + 1)
            work.in_segment += count == "segments"
            try:
                return fn(*args, **kwargs)
            finally:
                work.in_segment -= count == "segments"

        return counted

    names = {
        "checkpoint": "segments",
        "create_selective_checkpoint_contexts": "selective_segments",
        "_keep_expensive": "selective_calls",
    }
    with ExitStack() as stack:
        for name, count in names.items():
            fn = getattr(checkpointing, name)
            stack.enter_context(mock.patch.object(checkpointing, name, counter(fn, count)))
        yield


@dataclass(frozen=True)
class DeviceSpeed:
    """One device's costs of what is not replayed (seconds): a ``call``, a checkpointed
    ``segment``, a ``segment_call``'s more, a ``selective_segment``'s more and a
    ``selective_call``'s more; ``bandwidth`` (bytes/s an elementwise op reads and writes)."""

    call: float
    segment: float
    segment_call: float
    selective_segment: float
    selective_call: float
    bandwidth: float


def _fastest(
    run: Callable[[], Any],
    device: str,
    least: int = 5,
    seconds: float = 0.1,
    warm: int = 3,
    most: int = 2000,
    long: float = 0.05,
) -> float:
    """The fastest timing of ``run`` after ``warm`` warm-up runs, run at least ``least`` times and
    for at least ``seconds`` (up to ``most`` times): on a shared machine, the run the least
    disturbed. The warm-up runs take what only the first runs pay: a oneDNN primitive's creation,
    and the page faults of a large buffer until the allocator keeps its memory (the first few
    runs of a batch-1 convolution's backward, ``slow_conv3d``, fault in its tens of MB). A run
    whose first takes ``long`` seconds or more pays those as a small share: the fastest of two
    more (a 3D network's large convolutions: what a plan of several batches spends replaying)."""

    def timed() -> float:
        start = time.perf_counter()
        run()
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    if warm and timed() >= long:
        return min(timed(), timed())
    for _ in range(warm - 1):
        timed()
    times: list[float] = []
    while len(times) < most and (len(times) < least or sum(times) < seconds):
        times.append(timed())
    return min(times)


class _Counting(TorchDispatchMode):
    """Counts the ops run under it into ``work``, as a traced step's are."""

    def __init__(self, work: StepWork) -> None:
        super().__init__()
        self.work = work

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        out = func(*args, **(kwargs or {}))
        self.work.add(func, args, kwargs, out)
        return out


def _probe(run: Callable[[], Any], device: str) -> tuple[StepWork, float]:
    """``run``'s work, counted as a traced step's is, and its fastest time (seconds)."""
    run()
    work = StepWork(device)
    with _Counting(work), counted_segments(work, lambda: True):
        run()
    return work, _fastest(run, device)


def _chain(x: Tensor, links: int) -> Tensor:
    """``links`` sines of ``x`` one after the other."""
    for _ in range(links):
        x = x.sin()  # saves its input: a checkpointed segment's hooks see it
    return x


def _layers(x: Tensor, weight: Tensor, scale: Tensor, links: int) -> Tensor:
    """``links`` units of a 3D U-Net on ``x``, one after the other: a 3x3x3 convolution, a norm
    (batch and instance norm in turn) and a leaky ReLU; the ops a network's segment runs, each
    with the arguments and saved tensors that a selective policy and checkpoint's hooks see."""
    for link in range(links):
        x = torch.nn.functional.conv3d(x, weight, padding=1)
        if link % 2:
            x = torch.nn.functional.instance_norm(x, weight=scale, bias=scale)
        else:
            x = torch.nn.functional.batch_norm(x, None, None, scale, scale, training=True)
        x = torch.nn.functional.leaky_relu(x)
    return x


def _count(work: StepWork, cost: str) -> float:
    """How many times a probe's ``work`` pays ``cost`` (:meth:`StepWork.counts`); ``probe``:
    once."""
    return 1.0 if cost == "probe" else float(work.counts()[cost])


def _priced(work: StepWork, speed: DeviceSpeed | None) -> float:
    """What ``speed`` prices of ``work`` but its per-event costs: its replayed ops and bytes
    (seconds; ``None``: nothing)."""
    if speed is None:
        return 0.0
    return StepWork(work.device, bytes=work.bytes, replayed=work.replayed).seconds(speed)


def _solved(
    probes: list[tuple[StepWork, float]],
    known: dict[str, float],
    names: list[str],
    priced: DeviceSpeed | None = None,
) -> dict[str, float]:
    """The costs ``names`` that the probes' times leave after the ``known`` costs and what
    ``priced`` prices (:func:`_priced`), each cost times its count (:func:`_count`): least
    squares over the probes (at least as many as names) of their relative errors, so that each
    probe's timing noise weighs its share; none below zero."""
    counts = torch.tensor([[_count(w, n) for n in names] for w, _ in probes], dtype=torch.float64)
    rest = torch.tensor(
        [
            t - _priced(w, priced) - sum(_count(w, k) * v for k, v in known.items())
            for w, t in probes
        ],
        dtype=torch.float64,
    )
    weight = 1 / torch.tensor([t for _, t in probes], dtype=torch.float64).clamp(min=1e-12)
    solved = torch.linalg.lstsq(counts * weight[:, None], (rest * weight)[:, None]).solution
    return dict(zip(names, solved.squeeze(1).clamp(min=0).tolist(), strict=True))


#: chain lengths of each probe: the costs are solved by least squares over them
_LINKS = (1, 4, 12)


@functools.cache
def measure_speed(device: str) -> DeviceSpeed:
    """``device``'s :class:`DeviceSpeed`, from probes run on it once a process (a second or two
    on a CPU): chains of a U-Net's units (:func:`_layers`) on tiny maps, plain, checkpointed and
    selectively checkpointed, whose counts solve for each cost, their replayed ops and bytes
    taken off; the bandwidth from an elementwise op on larger maps."""
    leaf = torch.zeros((), device=device, requires_grad=True)
    sines = [_probe(lambda n=n: _chain(leaf, n).backward(), device) for n in (1, 16, 64)]
    call = _solved(sines, {}, ["call", "probe"])["call"]
    # an elementwise op's forward and backward on 16-channel 8x32x32 maps, its calls taken off
    x = torch.randn(2, 16, 8, 32, 32, device=device, requires_grad=True)
    work, took = _probe(lambda: torch.nn.functional.leaky_relu(x).sum().backward(), device)
    bandwidth = work.bytes / max(took - work.calls * call, took / 4)
    priced = DeviceSpeed(0.0, 0.0, 0.0, 0.0, 0.0, bandwidth)

    maps = torch.randn(1, 4, 2, 2, 2, device=device, requires_grad=True)
    weight = torch.randn(4, 4, 3, 3, 3, device=device, requires_grad=True)
    scale = torch.ones(4, device=device, requires_grad=True)

    def layers(links: int, **segment: Any) -> tuple[StepWork, float]:
        run = functools.partial(_layers, weight=weight, scale=scale, links=links)
        if not segment:
            return _probe(lambda: run(maps).sum().backward(), device)
        seg = checkpointing.checkpoint_segment
        return _probe(lambda: seg(run, [], maps, **segment).sum().backward(), device)

    # ``probe``: what every probe spends once (its backward's start, the leaves' gradients)
    costs = _solved([layers(n) for n in _LINKS], {}, ["call", "probe"], priced)
    # replays slowed by another process can leave the units' calls nothing: the sines' then
    costs["call"] = costs["call"] or call
    full = [layers(n, selective=False) for n in _LINKS]
    costs |= _solved(full, costs, ["segment", "segment_call"], priced)
    selective = [layers(n, selective=True) for n in _LINKS]
    costs |= _solved(selective, costs, ["selective_segment", "selective_call"], priced)
    del costs["probe"]
    return DeviceSpeed(**costs, bandwidth=bandwidth)
