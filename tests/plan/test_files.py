"""A saved plan laid under a new one (``train.py plan=PATH``): what the new plan keeps."""

from __future__ import annotations

from omegaconf import OmegaConf

from volseg.plan.files import inherit_sources
from volseg.plan.run_plan import Decision, RunPlan


def test_a_plan_from_a_file_keeps_its_validation_estimate_and_names_the_file():
    validation = {"peak_allocated": 123_456_789, "sw_batch_size": 2}
    planned = RunPlan(
        config=OmegaConf.create({}),
        decisions={"data.batch_size": Decision(2, "configured", "")},
        estimate={"peak_allocated": 987_654_321},
        validation=validation,
    )
    saved = {
        "decisions": {"data.batch_size": {"value": 2, "source": "planned", "why": "fits 16 GiB"}},
        "fingerprint": {"cases": 6},
    }
    plan = inherit_sources(planned, saved, "plan file plan.yaml")
    assert plan.validation == validation and plan.estimate == planned.estimate
    assert plan.decisions["data.batch_size"] == Decision(
        2, "plan file plan.yaml", "planned: fits 16 GiB"
    )
    assert plan.fingerprint == {"cases": 6}
