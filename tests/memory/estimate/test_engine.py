"""The engine: one build of the network and one fake-tensor trace per candidate of a plan, whose
events answer the step's memory, its FLOPs and its validation."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import compose_config, planned_config
from tests.estimates import estimate, estimate_validation, run_of
from volseg.memory import Candidate, estimate_run
from volseg.memory.estimate import engine
from volseg.memory.estimate.torch_private import RecordingMemTracker
from volseg.models.unet import UNet3D
from volseg.plan import make_plan

SMALL = [
    "model.net.widths=[4,8,16]",
    "data.batch_size=2",
    "data.patch_size=[16,32,32]",
    "memory.plan_device=cuda",
    "memory.val_shape=[24,48,48]",
]


@pytest.fixture
def counted(monkeypatch):
    """``{"builds": network constructions, "traces": fake-tensor traces}`` from here on, with
    the engine's answers forgotten (each test asks afresh)."""
    monkeypatch.setattr(engine, "_runs", type(engine._runs)())
    counts = {"builds": 0, "traces": 0}
    build, trace = UNet3D.__init__, RecordingMemTracker.__init__

    def counted_build(self, *args, **kwargs):
        counts["builds"] += 1
        build(self, *args, **kwargs)

    def counted_trace(self, *args, **kwargs):
        counts["traces"] += 1
        trace(self, *args, **kwargs)

    monkeypatch.setattr(UNet3D, "__init__", counted_build)
    monkeypatch.setattr(RecordingMemTracker, "__init__", counted_trace)
    return counts


def test_a_plan_builds_and_traces_the_network_once(tmp_path: Path, counted):
    plan = make_plan(compose_config("train", tmp_path, SMALL), estimate_step=True)
    assert counted == {"builds": 1, "traces": 1}
    # the step, its FLOPs and the validation, all from that trace
    assert plan.estimate["peak_allocated"] > 0 and plan.estimate["flops_per_step"] > 0
    assert plan.validation["peak_allocated"] > plan.validation["resident"] > 0


def test_each_candidate_is_one_build_and_one_trace(tmp_path: Path, counted):
    cfg = planned_config("train", tmp_path, SMALL)
    estimate(cfg)
    assert run_of(cfg).flops_per_step > 0  # the same run: answered from its trace
    assert counted == {"builds": 1, "traces": 1}
    estimate(cfg, batch_size=1)
    assert run_of(cfg, Candidate(batch_size=1)).flops_per_step > 0
    assert counted == {"builds": 2, "traces": 2}
    estimate_validation(cfg, [24, 48, 48])  # a validation is a new trace of the step...
    estimate(cfg)  # ...which answers for the step too
    assert counted == {"builds": 3, "traces": 3}


def test_the_engine_reads_the_plans_device_and_candidate(tmp_path: Path, counted):
    plan = make_plan(compose_config("train", tmp_path, SMALL))
    on_gpu = estimate_run(plan, Candidate(batch_size=1), [24, 48, 48])
    assert on_gpu.step.device == on_gpu.validation.device == "cuda"
    assert on_gpu.step.batch_size == 1 and on_gpu.step.precision == plan.value("trainer.precision")
    host = estimate_run(plan, Candidate(batch_size=1, stitch_device="cpu"), [24, 48, 48])
    assert host.validation.stitch == "host" and host.validation.host_stitching > 0
    # the same step in both traces: the candidate's validation keys do not change it
    assert host.step.peak_allocated == on_gpu.step.peak_allocated
    assert host.flops_per_step == on_gpu.flops_per_step
