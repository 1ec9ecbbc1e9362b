"""The CUDA estimate against every GPU run kept in ``benchmarks/results/cuda/*.json``.

Each file is what ``benchmarks/gpu_checks.sh`` wrote on a GPU (or, for the first H200 file, the
figures of that GPU's earlier runs in the same form): the run's ``train.py`` overrides and what
it measured. Every run not ``held_out`` holds the estimate of the same overrides
(``memory.plan_device=cuda``, and ``estimate.zero_grad`` from the run's ``zero_grad``: the scripts
that step the optimizer by hand set the gradients to None after the update, train.py inside
Lightning's closure) to its peak allocated within 5% (or, where only the rise above the
step's start was measured, ``step_peak_growth_mib``) and its peak reserved within 10%; held-out
runs are reported by ``benchmarks/gpu_checks.sh`` and never tuned on. A run the estimate does
not yet reach is listed in ``NOT_YET`` with its measured error and why: it fails loudly (strict
xfail) as soon as the estimate does reach it, so that it is taken off the list; any other
exception than the bound's ``AssertionError`` fails it too (``raises=``).
"""

from __future__ import annotations

import json
import tempfile
from functools import cache
from importlib.resources import files
from pathlib import Path

import pytest

from tests.conftest import REPO, load_benchmark, planned_config
from tests.estimates import estimate
from volseg.utils.units import MIB

RESULTS = sorted((REPO / "benchmarks" / "results" / "cuda").glob("*.json"))
ALLOCATED_WITHIN = 0.05
RESERVED_WITHIN = 0.10

#: (file stem, run name) -> why the estimate is not yet within bounds (errors as estimated
#: against measured on 2026-12-01, torch 2.13.0+cpu estimating for CUDA, each run with its
#: loop's ``estimate.zero_grad``)
NOT_YET: dict[tuple[str, str], str] = {
    ("2026-11-30_nvidia-h200", "reference table: unet_large 16-true"): (
        "reserved -12.7% (5,786 / 6,630 MiB), allocated -4.6%: float16 weights with "
        "channels_last; what holds the extra cache is not in the recorded figures "
        "(gpu_checks.sh keeps an allocator snapshot of this run)"
    ),
    ("2026-11-30_nvidia-h200", "reference table: unet_small 16-true"): (
        "allocated -5.6% (5,323 / 5,639 MiB), reserved -5.9%: as unet_large 16-true"
    ),
    ("2026-11-30_nvidia-h200", "levers: activation offload"): (
        "allocated -9.0% (3,973 / 4,367 MiB), reserved -33% (4,980 / 7,434 MiB): with the "
        "loop's gradients modelled the baseline is exact, so offload's forward holds ~390 MiB "
        "the estimate lacks, and the allocator keeps more segments around the offloaded "
        "tensors' copies back than the replay of the same allocations creates"
    ),
    ("2026-11-30_nvidia-h200", "levers: micro-batch 1 (x2 accumulation)"): (
        "allocated -12% (3,518 / 4,010 MiB), reserved -32% (3,692 / 5,420 MiB) at batch 1: "
        "the estimate peaks at the second micro-batch's last full-resolution convolution, "
        "where batch 2 is exact; cuDNN's choice at batch 1 is not in any snapshot"
    ),
    ("2026-11-30_nvidia-h200", "levers: micro-batch 1 + offload"): (
        "allocated -23% (2,380 / 3,106 MiB), reserved -36% (2,748 / 4,306 MiB) at batch 1"
    ),
    ("2026-11-30_nvidia-h200", "estimator step: unet_tiny bf16-mixed b2 32x64x64"): (
        "reserved -18% (180 / 220 MiB): small segments (2 MiB small-pool, 20 MiB large-pool) "
        "on a step of ~150 MiB"
    ),
    ("2026-11-30_nvidia-h200", "estimator step: depth 3 [8,16,32] fp32 b4 16x64x64"): (
        "reserved -22% (208 / 268 MiB): as above, a step of ~150 MiB"
    ),
    ("2026-11-30_nvidia-h200", "estimator step: unet_small fp32 b1 16x64x64"): (
        "allocated rise -11% (244 / 273 MiB), reserved +17% (552 / 470 MiB): float32 "
        "channels_last, whose cuDNN workspace no snapshot has shown"
    ),
    ("2026-11-30_nvidia-h200", "estimator step: width 32 batch-norm bf16-true b2 16x96x96"): (
        "allocated rise -5.3% (340 / 359 MiB), reserved -16% (442 / 524 MiB)"
    ),
}


def _runs(with_reasons: bool = True) -> list:
    params = []
    for path in RESULTS:
        for run in json.loads(path.read_text())["runs"]:
            if run["held_out"]:
                continue
            reason = NOT_YET.get((path.stem, run["name"])) if with_reasons else None
            # only the bound's assert may fail: a crash in the estimate fails the test
            not_yet = pytest.mark.xfail(strict=True, reason=reason, raises=AssertionError)
            marks = [not_yet] if reason else []
            params.append(pytest.param(run, id=f"{path.stem}: {run['name']}", marks=marks))
    return params


def _loop(run: dict) -> tuple[str, ...]:
    """The run's overrides with the measured loop's ``estimate.zero_grad`` (``zero_grad``:
    ``after_update`` for the scripts that step the optimizer by hand; Lightning's otherwise)."""
    return (*run["overrides"], f"+estimate.zero_grad={run.get('zero_grad', 'closure')}")


@cache
def _estimate(overrides: tuple[str, ...]):
    """The CUDA estimate of a run's overrides (made once: two tests read it)."""
    with tempfile.TemporaryDirectory() as run_dir:
        cfg = planned_config("train", Path(run_dir), [*overrides, "memory.plan_device=cuda"])
        return estimate(cfg)


def _error(estimated: float, measured: float) -> float:
    return estimated / measured - 1


def test_results_are_in_the_recorded_format():
    assert RESULTS, "no benchmarks/results/cuda/*.json"
    for path in RESULTS:
        doc = json.loads(path.read_text())
        assert {"gpu", "torch", "cuda", "driver", "runs"} <= set(doc), path
        for run in doc["runs"]:
            assert {"name", "overrides", "held_out", "measured"} <= set(run), run
            assert {"peak_allocated_mib", "peak_reserved_mib", "nvidia_smi_mib", "step_s"} <= set(
                run["measured"]
            ), run["name"]
            # where the measured loop set the gradients to None (train.py: Lightning's closure)
            assert run.get("zero_grad", "closure") in ("closure", "after_update"), run["name"]


@pytest.mark.slow  # about 4 s a run, 16 runs: ~65 s on a shared 2-core CPU
@pytest.mark.parametrize("run", _runs())
def test_cuda_estimate_holds_to_the_recorded_run(run):
    est = _estimate(_loop(run))
    measured = run["measured"]
    errors = {}
    if measured.get("peak_allocated_mib") is not None:
        errors["allocated"] = _error(est.peak_allocated / MIB, measured["peak_allocated_mib"])
    elif measured.get("step_peak_growth_mib") is not None:
        errors["allocated"] = _error(est.step_peak_growth / MIB, measured["step_peak_growth_mib"])
    if measured.get("peak_reserved_mib") is not None:
        errors["reserved"] = _error(est.peak_reserved / MIB, measured["peak_reserved_mib"])
    assert errors, f"{run['name']}: nothing measured to compare"
    assert abs(errors.get("allocated", 0.0)) <= ALLOCATED_WITHIN, errors
    assert abs(errors.get("reserved", 0.0)) <= RESERVED_WITHIN, errors


@pytest.mark.slow  # the estimates of the test above, made once
@pytest.mark.parametrize("run", _runs(with_reasons=False))
def test_estimate_plans_with_the_margin_of_its_kind_of_step(run):
    """The estimate of each recorded run carries the packaged margin of its kind of step
    (offload, accumulation, other; ``volseg/memory/estimate/cuda_margins.json``), which the planner
    adds
    to its reserved peak. How those margins do on runs they were not fitted on:
    ``tests/memory/estimate/test_margins.py`` (leave-one-out)."""
    est = _estimate(_loop(run))
    packaged = json.loads((files("volseg.memory.estimate") / "cuda_margins.json").read_text())
    kind = _kind(run["overrides"])
    margin = packaged["margins"][kind]
    packaged_margin = (margin["share"], margin["fixed_mib"], margin["source"])
    assert (est.margin, est.margin_fixed_mib, est.margin_source) == packaged_margin, kind
    assert margin["runs"] >= 3, margin


def _kind(overrides: list[str]) -> str:
    values = dict(o.split("=", 1) for o in overrides)
    if values.get("model.offload_activations", "false") != "false":
        return "offload"
    return "accumulation" if values.get("trainer.accumulate_grad_batches", "1") != "1" else "other"


@pytest.mark.slow  # the estimates of the tests above, made once
@pytest.mark.parametrize("run", _runs(with_reasons=False))
def test_committed_estimate_is_the_estimators_own(run, request):
    """The planner's margins (``volseg/memory/estimate/cuda_margins.json``) are computed from the
    estimates committed in ``benchmarks/results/cpu/*_cuda_estimate_errors.json``: they must be
    what the estimator gives today (rerun ``python -m benchmarks cuda_estimate_errors`` when it
    changes)."""
    newest = load_benchmark("results_io").latest("cuda_estimate_errors")
    file_stem = request.node.callspec.id.split(": ", 1)[0]
    rows = {(r["file"], r["run"]): r for r in json.loads(newest.read_text())["rows"]}
    committed = rows[(file_stem, run["name"])]
    est = _estimate(_loop(run))
    # the CUDA estimate is traced on the host CPU, and its channels-last steps come out up to
    # 0.25% apart between an Intel Xeon (AMX) and an AMD EPYC (AVX512_BF16); an estimator change
    # that moves a figure of the docs' tables moves it by more
    assert est.peak_reserved == pytest.approx(committed["estimated_peak_reserved"], rel=5e-3), (
        newest.name
    )
    assert est.peak_allocated == pytest.approx(committed["estimated_peak_allocated"], rel=5e-3), (
        newest.name
    )
