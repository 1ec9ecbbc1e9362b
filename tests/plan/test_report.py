"""The step's report adds up: every byte of the process total on a printed line, percentages of
one stated total, the CUDA context labelled as assumed or measured, and the levers the estimate
does not model named."""

from __future__ import annotations

import re

from tests.conftest import compose_config
from volseg.memory.estimate.training_step import MemoryEstimate
from volseg.plan.report import format_estimate, unmodelled_levers
from volseg.utils.units import MIB


def _cuda_step() -> MemoryEstimate:
    mib = [55, 0, 55, 110, 8046, 20, 396]  # params ... kernel workspace; 8 MiB of batch besides
    params, buffers, grads, state, acts, temps, work = (m * MIB for m in mib)
    allocated = sum(mib) * MIB + 8 * MIB
    return MemoryEstimate(
        device="cuda",
        precision="16-mixed",
        batch_size=2,
        patch_size=[26, 150, 320],
        activation_checkpointing="none",
        num_parameters=14_500_000,
        params=params,
        buffers=buffers,
        grads=grads,
        optimizer_state=state,
        activations=acts,
        temporaries=temps,
        peak_allocated=allocated,
        kernel_workspace=work,
        step_peak_growth=allocated,
        peak_reserved=allocated + 300 * MIB,
        cuda_context=500 * MIB,
        process_total=allocated + 800 * MIB,
        seconds=1.0,
        modules={"net.ups.3": 2400 * MIB, "net.inc": 1000 * MIB, "loss.dice": 40 * MIB},
    )


def _figures(report: str, first: str, last: str) -> list[tuple[str, float, float]]:
    block = report[report.index(first) : report.index(last)]
    found = re.findall(r"^    (\S.*?)\s+([\d,]+\.\d) MiB\s+([\d.]+)%$", block, re.M)
    return [(name, float(mib.replace(",", "")), float(pct)) for name, mib, pct in found]


def test_every_byte_of_the_process_total_is_on_a_line_and_shares_are_of_one_total():
    est = _cuda_step()
    report = format_estimate(est, 10, context_source="assumed: typical, not measured for this GPU")
    rows = _figures(report, "at the step's peak", "activations by module")
    parts = [r for r in rows if not r[0].startswith("=")]
    assert sum(mib for _, mib, _ in parts) == est.process_total / MIB
    assert abs(sum(pct for _, _, pct in parts) - 100) < 0.5
    names = [name for name, *_ in parts]
    assert "kernel workspace (cuDNN's, as modelled)" in names
    assert "CUDA context (assumed: typical, not measured for this GPU)" in names
    assert "allocator cache (reserved − allocated)" in names
    modules = _figures(report + "~~END", "activations by module", "~~END")
    assert "of the 8,046.0 MiB of activations" in report
    assert ("net.ups.3", 2400.0, round(100 * 2400 / 8046, 1)) in modules
    assert sum(mib for _, mib, _ in modules) == 8046.0  # the rest outside any module


def test_levers_the_estimate_does_not_model_are_named(tmp_path):
    overrides = ["model.placement={encoder: cuda:0, decoder: cuda:1}", "model.compile=true"]
    cfg = compose_config("train", tmp_path, overrides)
    found = unmodelled_levers(cfg)
    assert found[0].startswith("model.placement=") and "one device holding everything" in found[0]
    assert found[1].startswith("model.compile=true")
    assert unmodelled_levers(compose_config("train", tmp_path, [])) == []
    report = format_estimate(_cuda_step(), 10, unmodelled=found)
    assert report.splitlines()[-2].startswith("  not modelled: model.placement=")
