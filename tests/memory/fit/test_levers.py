"""Every lever with its price: the table lists each lever that applies to the network, every
checkpointing setting its adapter offers among them, with its predicted peak, its step-time
factor (its ops timed on this machine) and its FLOPs factor."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import TINY, compose_config
from tests.estimates import plan_of
from volseg.memory.fit.lever_prices import device_speed, lever_prices
from volseg.models.networks import adapter_for
from volseg.plan import planned_config
from volseg.plan.report import format_lever_prices


@pytest.mark.slow  # one estimate per lever: ~20 s on 2 cores
def test_the_table_prices_every_lever_that_applies(tmp_path):
    overrides = [*TINY, "memory.plan_device=cpu", "trainer.precision=32", "data.batch_size=2"]
    cfg = planned_config(compose_config("train", tmp_path, overrides))
    rows = lever_prices(plan_of(cfg))
    by_setting = {r.setting: r for r in rows}
    assert rows[0].lever == "as configured" and rows[0].time_factor == 1.0
    offered = adapter_for(str(cfg.model.net._target_)).checkpointing_choices
    listed = [r.setting for r in rows if r.lever == "activation checkpointing"]
    assert listed == [f"model.activation_checkpointing={o}" for o in offered if o != "none"]
    every = by_setting["model.activation_checkpointing=all"]
    assert every.flops_factor > 1.05 and every.peak < rows[0].peak  # recomputes, holds less
    micro = by_setting["data.batch_size=1 trainer.accumulate_grad_batches=2"]
    assert micro.flops_factor == pytest.approx(1.0, abs=0.05)  # the same samples a step
    assert all(r.time_factor > 0 for r in rows[:-1])  # timed here: a CPU is always present
    assert by_setting["trainer.precision=bf16-mixed"].lever == "mixed precision"
    assert rows[-1].lever == "two-device split" and rows[-1].time_factor is None
    text = format_lever_prices(rows)
    assert "model.activation_checkpointing=all" in text and "not modelled" in text


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has the GPU to time on")
def test_no_step_time_is_predicted_for_a_gpu_this_machine_lacks():
    # its rows' time column is "?": FLOPs alone are not a time
    assert device_speed("cuda") is None
    assert device_speed("cpu") is not None


def test_a_lever_the_network_refuses_is_a_row_that_says_why(tmp_path, monkeypatch):
    """A candidate the engine cannot estimate (a setting the network does not take) is listed
    with its reason; the other rows stand."""
    from volseg.memory.fit import lever_prices as prices

    overrides = [*TINY, "memory.plan_device=cpu", "trainer.precision=bf16-mixed"]
    cfg = planned_config(compose_config("train", tmp_path, overrides))
    engine = prices.estimate_run

    def refusing(plan, candidate=None, shape=None):
        if candidate is not None and candidate.offload_activations:
            raise ValueError("this network keeps its activations\nsecond line")
        return engine(plan, candidate, shape)

    monkeypatch.setattr(prices, "estimate_run", refusing)
    monkeypatch.setattr(prices, "device_speed", lambda device: None)  # no timing: FLOPs only
    rows = lever_prices(plan_of(cfg))
    offload = next(r for r in rows if r.lever == "activation offload")
    assert offload.peak is None and offload.flops_factor is None
    assert offload.why == "not estimated: ValueError: this network keeps its activations"
    assert rows[0].peak > 0 and any(r.lever == "activation checkpointing" for r in rows)
    line = next(x for x in format_lever_prices(rows).splitlines() if "offload" in x)
    assert "—" in line and "not estimated: ValueError" in line
