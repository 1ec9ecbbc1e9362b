"""A step's predicted time: what a trace counts of it (ops, checkpoint segments, a selective
policy's calls, replayed ops), how the device's costs are solved from probes, and how they add
up. No assertion rests on a timing: timings are the benchmark's (``lever_time_factors``)."""

from __future__ import annotations

import pytest
import torch
from torch.nn.modules.conv import _ConvNd

from tests.conftest import TINY, compose_config
from tests.estimates import run_of
from volseg.memory import Candidate
from volseg.models import checkpointing
from volseg.models.build import build_model
from volseg.plan import planned_config
from volseg.speed import step_time
from volseg.speed.step_time import (
    DeviceSpeed,
    StepWork,
    _fastest,
    _layers,
    _probe,
    _solved,
    measure_speed,
    replay_seconds,
)

aten = torch.ops.aten


def _convolutions(work: StepWork, func=aten.convolution.default) -> int:
    return sum(n for (f, _, _), n in work.replayed.items() if f is func)


@pytest.fixture(scope="module")
def works(tmp_path_factory):
    """The traced work of TINY's step with each checkpointing setting, and at batch 1 x 2."""
    overrides = [*TINY, "memory.plan_device=cpu", "trainer.precision=32", "data.batch_size=2"]
    cfg = planned_config(compose_config("train", tmp_path_factory.mktemp("run"), overrides))
    candidates = {
        "none": Candidate(activation_checkpointing="none"),
        "selective": Candidate(activation_checkpointing="selective"),
        "all": Candidate(activation_checkpointing="all"),
        "micro": Candidate(
            activation_checkpointing="none", batch_size=1, accumulate_grad_batches=2
        ),
    }
    works = {name: run_of(cfg, c).work for name, c in candidates.items()}
    # each convolution module of the network runs once a forward
    works["modules"] = sum(isinstance(m, _ConvNd) for m in build_model(cfg).modules())
    return works


def test_a_trace_counts_its_segments_and_what_they_recompute(works):
    none, every, selective = works["none"], works["all"], works["selective"]
    assert _convolutions(none) == works["modules"]
    assert none.segments == none.segment_calls == none.selective_calls == 0
    # all: every block's convolutions run again in backward; the ops of each segment's forward
    # pass through checkpoint's hooks
    assert _convolutions(every) > _convolutions(none)
    assert every.segments > 0 and every.segment_calls > 0 and every.selective_segments == 0
    # selective: the policy sees every op of its segments, and keeps every convolution's output
    # but the cheap 1-channel input one's
    assert selective.selective_segments == selective.segments > 0
    assert selective.selective_calls > 0
    assert _convolutions(none) < _convolutions(selective) < _convolutions(every)


def test_micro_batches_trace_twice_the_ops_at_half_the_batch(works):
    none, micro = works["none"], works["micro"]
    assert _convolutions(micro) == 2 * _convolutions(none)
    batches = {spec[0].shape[0] for (f, spec, _) in micro.replayed if f is aten.convolution.default}
    assert batches == {1}
    assert micro.calls > none.calls


def test_the_step_time_adds_each_count_at_its_cost():
    work = StepWork(
        "cpu",
        calls=10,
        segments=2,
        selective_segments=1,
        segment_calls=4,
        selective_calls=6,
        bytes=1000,
    )
    speed = DeviceSpeed(
        call=1.0,
        segment=10.0,
        segment_call=100.0,
        selective_segment=1000.0,
        selective_call=10_000.0,
        bandwidth=10.0,
    )
    # 10 calls + 2 segments + 4 segment calls + 1 selective segment + 6 policy calls + 100
    assert work.seconds(speed) == 10 + 20 + 400 + 1000 + 60_000 + 100


def test_a_replayed_op_runs_at_its_traced_shapes_and_one_that_cannot_is_priced_by_bytes():
    x, w = torch.randn(1, 2, 4, 4, 4), torch.randn(3, 2, 3, 3, 3)
    work = StepWork("cpu")
    args = (x, w, None, [1, 1, 1], [1, 1, 1], [1, 1, 1], False, [0, 0, 0], 1)
    work.add(aten.convolution.default, args, None, torch.empty(1, 3, 4, 4, 4))
    (op,) = work.replayed
    assert work.bytes == 0 and replay_seconds(op, "cpu") > 0
    # the weight's channels do not match the input's: no such convolution runs
    wrong = (x, torch.randn(3, 5, 3, 3, 3), *args[2:])
    broken = StepWork("cpu")
    broken.add(aten.convolution.default, wrong, None, torch.empty(1, 3, 4, 4, 4))
    (op,) = broken.replayed
    assert replay_seconds(op, "cpu") is None
    speed = DeviceSpeed(0.0, 0.0, 0.0, 0.0, 0.0, bandwidth=1.0)
    assert broken.seconds(speed) == pytest.approx(x.numel() * 4 + 3 * 5 * 27 * 4)


def test_costs_are_solved_from_the_probes_counts():
    # two probes: 3 calls and 1 probe start, 7 calls and 1 start; a call 2 s, a start 5 s
    probes = [(StepWork("cpu", calls=3), 3 * 2 + 5.0), (StepWork("cpu", calls=7), 7 * 2 + 5.0)]
    assert _solved(probes, {}, ["call", "probe"]) == pytest.approx({"call": 2, "probe": 5})
    # with the call known, a segment's cost is what is left
    seg = [(StepWork("cpu", calls=3, segments=1, segment_calls=1), 3 * 2 + 5 + 11 + 13.0)]
    seg.append((StepWork("cpu", calls=9, segments=1, segment_calls=4), 9 * 2 + 5 + 11 + 4 * 13.0))
    solved = _solved(seg, {"call": 2, "probe": 5}, ["segment", "segment_call"])
    assert solved == pytest.approx({"segment": 11, "segment_call": 13})


def test_costs_are_least_squares_over_more_probes_than_costs_after_what_is_priced():
    # three probes of 1 start (5 s) and 2, 4, 8 calls (2 s each), timed 0.5 s off each way
    probes = [
        (StepWork("cpu", calls=2), 2 * 2 + 5 + 0.5),
        (StepWork("cpu", calls=4), 4 * 2 + 5 - 0.5),
        (StepWork("cpu", calls=8), 8 * 2 + 5 + 0.5),
    ]
    solved = _solved(probes, {}, ["call", "probe"])
    assert solved["call"] == pytest.approx(2, abs=0.2)
    assert solved["probe"] == pytest.approx(5, abs=1)
    # what the device's speed prices (bytes here: 100 s of them) is taken off before solving
    priced = [(StepWork("cpu", calls=n, bytes=1000), n * 2 + 5 + 100.0) for n in (1, 3, 9)]
    speed = DeviceSpeed(0.0, 0.0, 0.0, 0.0, 0.0, bandwidth=10.0)
    assert _solved(priced, {}, ["call", "probe"], speed) == pytest.approx({"call": 2, "probe": 5})


def test_the_fastest_run_leaves_the_warm_up_runs_out(monkeypatch):
    # a fake clock: the first three runs warm up (a primitive's creation, page faults: 10 s; one
    # 0.5 s, not counted however fast), then 1 s each, one 3 s (disturbed)
    clock = [0.0]
    durations = iter([0.5, 10.0, 10.0, 1.0, 3.0, *[1.0] * 100])
    monkeypatch.setattr(step_time.time, "perf_counter", lambda: clock[0])
    runs = []

    def run():
        runs.append(1)
        clock[0] += next(durations)

    assert _fastest(run, "cpu", least=5, seconds=0.0, warm=3, long=100.0) == 1.0
    assert len(runs) == 3 + 5
    # at least ``seconds`` of runs after the warm-up: 7 runs of 1 s or 3 s
    runs.clear()
    durations = iter([10.0, 10.0, 10.0, 3.0, *[2.0] * 100])
    assert _fastest(run, "cpu", least=2, seconds=15.0, warm=3, long=100.0) == 2.0
    assert len(runs) == 3 + 7
    # a long first run (a large convolution): its first-call costs are a small share of it, so
    # the fastest of two more runs, not three warm-ups and five runs
    runs.clear()
    durations = iter([0.2, 0.15, 0.1, *[0.01] * 100])
    assert _fastest(run, "cpu", least=5, seconds=0.0, warm=3, long=0.05) == pytest.approx(0.1)
    assert len(runs) == 3


def test_the_probes_are_a_networks_units_kept_and_recomputed_as_a_segments_are():
    x = torch.randn(1, 4, 2, 2, 2, requires_grad=True)
    weight = torch.randn(4, 4, 3, 3, 3, requires_grad=True)
    scale = torch.ones(4, requires_grad=True)

    def run(**segment):
        def layers(maps):
            return _layers(maps, weight, scale, links=2)

        if not segment:
            return lambda: layers(x).sum().backward()
        return lambda: checkpointing.checkpoint_segment(layers, [], x, **segment).sum().backward()

    (plain, _), (full, _), (selective, _) = (
        _probe(run(**segment), "cpu") for segment in ({}, {"selective": False}, {"selective": True})
    )
    # each unit: a convolution and a norm, each replayed; batch norm and instance norm in turn
    assert _convolutions(plain) == 2 and _convolutions(plain, aten.native_batch_norm.default) == 2
    # a full segment runs its convolutions again in backward; a selective one keeps them
    assert _convolutions(full) == 4 and _convolutions(selective) == 2
    assert full.segments == selective.selective_segments == 1
    # the policy sees every op of the units, the convolutions and norms among them
    assert selective.selective_calls > 2 * 3
    assert full.segment_calls > 2 * 3 and plain.segment_calls == 0


def test_the_device_costs_are_measured_and_positive():
    speed = measure_speed("cpu")
    assert speed.call > 0 and speed.bandwidth > 0
    assert min(speed.segment, speed.segment_call, speed.selective_call) >= 0
