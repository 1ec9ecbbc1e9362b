"""The lever table prices ``selective`` activation checkpointing: its predicted peak below the
configured step's, its FLOPs factor (norms and activations are recomputed, which FLOPs do not
count; convolutions are not, but for a cheap input convolution) below ``all``'s."""

from __future__ import annotations

import re

from tests.conftest import TINY, compose_config
from tests.estimates import plan_of
from volseg.memory.fit.lever_prices import lever_prices
from volseg.plan import planned_config
from volseg.plan.report import format_lever_prices
from volseg.utils.units import MIB


def test_the_lever_table_shows_selectives_memory_and_time_price(tmp_path):
    # checkpointing none, so that every other setting is a row of its own
    overrides = [
        *TINY,
        "memory.plan_device=cpu",
        "trainer.precision=32",
        "model.activation_checkpointing=none",
    ]
    rows = lever_prices(plan_of(planned_config(compose_config("train", tmp_path, overrides))))
    by_setting = {r.setting: r for r in rows}
    configured = rows[0]
    selective = by_setting["model.activation_checkpointing=selective"]
    every = by_setting["model.activation_checkpointing=all"]
    assert selective.peak < 0.9 * configured.peak  # holds less ...
    # ... and recomputes no convolution but the input one (1 -> 16 channels, 27 products per
    # output value): well under 1% of the step's FLOPs, where all recomputes every block's
    assert 1.0 < selective.flops_factor < 1.01
    assert every.flops_factor > 1.1
    line = next(
        line
        for line in format_lever_prices(rows).splitlines()
        if line.endswith("model.activation_checkpointing=selective  (its recomputed forward)")
    )
    mib, time, flops = re.search(r"([\d,]+) MiB\s+([\d.]+)x\s+([\d.]+)x", line).groups()
    assert int(mib.replace(",", "")) == round(selective.peak / MIB)
    assert float(time) == round(selective.time_factor, 2)
    assert float(flops) == round(selective.flops_factor, 2)
