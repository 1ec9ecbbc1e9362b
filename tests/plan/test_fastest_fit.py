"""The fastest fit: ``data.batch_size=auto`` and ``model.activation_checkpointing=auto`` planned
together. The pick is the candidate that fits with the fewest predicted seconds per sample; a
configured batch keeps its samples a step; the table says each candidate, the pick and what is
over the budget; a network of a fixed input size plans with no traceback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import compose_config, tiny_train_overrides
from tests.estimates import estimate
from tests.plan.test_batch_size_auto import CURVES
from volseg.plan import fastest_fit as ff
from volseg.plan import make_plan
from volseg.plan.fastest_fit import FastestFit, Ranked
from volseg.plan.report import fastest_fit_table
from volseg.utils.units import MIB

#: a 2-level U-Net (an estimate in about a second) whose activations, not the CUDA context and
#: the allocator's rounding, grow its planned bytes with the batch
SMALL_NET = ("model.net.widths=[8,16]", "data.patch_size=[16,64,64]")
#: a plan for a GPU this machine lacks: times from the stated GPU model, the same on every CPU
ON_CUDA = ("memory.plan_device=cuda", "trainer.precision=16-mixed")


def _row(batch: int, seconds: float | None, fits: bool = True, **more: Any) -> Ranked:
    """A candidate of ``batch`` whose step takes ``seconds``."""
    more.setdefault("accumulate_grad_batches", 1)
    more.setdefault("activation_checkpointing", "none")
    return Ranked(batch_size=batch, peak=100 * MIB, fits=fits, seconds_per_step=seconds, **more)


def test_the_pick_is_the_fitting_candidate_with_the_fewest_seconds_a_sample() -> None:
    rows = [
        _row(1, 0.30),  # 0.30 s a sample
        _row(2, 0.50),  # 0.25: the pick
        _row(4, 1.20),  # 0.30
        _row(8, 0.80, fits=False),  # 0.10, but over the budget
        _row(2, 0.56, activation_checkpointing="all"),  # 0.28
    ]
    fit = FastestFit(10**9, "test", rows)
    assert (fit.pick.batch_size, fit.pick.activation_checkpointing) == (2, "none")
    assert [r.seconds_per_sample for r in fit.ranked()] == [0.25, 0.28, 0.30, 0.30]
    # equal time a sample: the step of more samples first (batch 4 before batch 1)
    assert [r.batch_size for r in fit.ranked()[2:]] == [4, 1]
    # micro-batches count every sample of the optimizer step
    micro = _row(2, 0.9, accumulate_grad_batches=2)
    assert (micro.samples, micro.seconds_per_sample) == (4, 0.225)
    assert FastestFit(10**9, "test", [*rows, micro]).pick is micro
    assert FastestFit(10**9, "test", [_row(1, None, fits=False)]).pick is None


@pytest.mark.parametrize(
    ("largest", "ranked"),
    [(0, []), (1, [1]), (3, [1, 2, 3]), (6, [1, 2, 3, 4, 6]), (20, [1, 2, 3, 4, 8, 16, 20])],
)
def test_the_batches_ranked_are_the_first_four_the_powers_of_two_and_the_largest(
    largest: int, ranked: list[int]
) -> None:
    assert ff._ranked_batches(largest) == ranked


def test_a_configured_batch_is_kept_by_its_micro_batches() -> None:
    assert ff._micro_batches(12) == [12, 6, 4, 3, 2, 1]
    assert ff._micro_batches(1) == [1]


class _Step:
    def __init__(self, total: int, budget: int) -> None:
        self.total, self.budget = total, budget

    def fits(self, budget: int) -> bool:
        return self.total <= budget


class _Run:
    def __init__(self, total: int) -> None:
        self.step = _Step(total, 0)


@pytest.mark.parametrize("curve", CURVES.values(), ids=CURVES.keys())
def test_the_largest_batch_found_is_the_largest_that_fits_every_budget(
    curve: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Against every batch's bytes counted one by one: an answer one lower or one higher at any
    budget fails."""
    monkeypatch.setattr(ff, "planned_total", lambda step: step.total)
    most = 12
    for budget in range(curve(most) + 2):
        search = ff._Search(None, budget, most)
        monkeypatch.setattr(search, "run", lambda n, k, c: _Run(curve(n)))
        fitting = [n for n in range(1, most + 1) if curve(n) <= budget]
        assert search.largest("none", 1) == max(fitting, default=0), budget


def _config(tmp_path: Path, data: Path, *more: str) -> Any:
    overrides = [*tiny_train_overrides(data), *SMALL_NET, *more]
    return compose_config("train", tmp_path, overrides)


def test_both_levers_auto_plan_the_fastest_candidate_that_fits(
    small_dataset: Path, tmp_path: Path
) -> None:
    """A budget between what batch 3 and batch 4 need without checkpointing: the plan's batch and
    checkpointing are its table's pick, the pick fits and is the fastest a sample of those that
    fit; what is over the budget is in the table, by how much."""
    cfg = _config(tmp_path, small_dataset, *ON_CUDA, "data.batch_size=1")
    planned = make_plan(cfg, estimate_step=False).run_config()
    need = {b: estimate(planned, batch_size=b).total_within(10**15) for b in (3, 4)}
    budget = (need[3] + need[4]) // 2
    auto = make_plan(
        _config(
            tmp_path,
            small_dataset,
            *ON_CUDA,
            "data.batch_size=auto",
            "model.activation_checkpointing=auto",
            f"memory.budget={budget}",
        ),
        fit_budget=True,
    )
    fit = auto.estimate["fastest_fit"]
    pick = fit["pick"]
    assert auto.value("data.batch_size") == pick["batch_size"]
    assert auto.value("model.activation_checkpointing") == pick["activation_checkpointing"]
    assert auto.decisions["data.batch_size"].why.startswith("the fastest that fits")
    settings = {r["activation_checkpointing"] for r in fit["rows"]}
    assert settings == {"none", "selective", "decoder", "encoder", "all"}  # UNet3D's adapter's
    fitting = [r for r in fit["rows"] if r["fits"]]
    assert pick["seconds_per_sample"] == min(r["seconds_per_sample"] for r in fitting)
    # the planned config's step fits; batch 4 without checkpointing is over, and shown so
    after = estimate(auto.run_config())
    assert after.fits(budget)
    over = [
        r for r in fit["rows"] if r["batch_size"] == 4 and r["activation_checkpointing"] == "none"
    ]
    assert over and not over[0]["fits"] and over[0]["peak"] > budget
    table = "\n".join(fastest_fit_table(fit))
    assert "modelled for the H100 SXM" in table
    assert f"batch 4 no checkpointing +{(over[0]['peak'] - budget) / MIB:,.0f} MiB" in table
    marked = [line for line in table.splitlines() if line.startswith("  >")]
    assert len(marked) == 1 and marked[0].endswith("the pick")
    # plan.yaml keeps the table with the pick
    saved = yaml.safe_load(auto.write(tmp_path / "plan").read_text())
    assert saved["estimate"]["fastest_fit"]["pick"] == pick
    assert any(note.startswith(f"effective batch {pick['batch_size']} ") for note in auto.notes)


def test_a_named_gpu_is_the_model_the_time_is_predicted_with(
    small_dataset: Path, tmp_path: Path
) -> None:
    def fit(gpu: str) -> dict[str, Any]:
        cfg = _config(
            tmp_path,
            small_dataset,
            *ON_CUDA,
            "data.batch_size=auto",
            "memory.budget=8GiB",
            "memory.max_batch_size=2",
            f"memory.gpu={gpu}",
        )
        return make_plan(cfg, estimate_step=False).estimate["fastest_fit"]

    t4, h100 = fit("T4"), fit("H100")
    assert "T4" in t4["time_model"] and "H100" in h100["time_model"]
    assert t4["modelled"] and h100["modelled"]
    assert t4["pick"]["seconds_per_step"] > h100["pick"]["seconds_per_step"]


def test_a_configured_batch_keeps_its_samples_a_step(small_dataset: Path, tmp_path: Path) -> None:
    """Checkpointing ``auto`` with a configured batch 4 that does not fit without it: the plan
    trains 4 samples a step, by checkpointing or micro-batches, and every candidate does."""
    cfg = _config(tmp_path, small_dataset, *ON_CUDA, "data.batch_size=4")
    planned = make_plan(cfg, estimate_step=False).run_config()
    # what batch 4 needs with every block checkpointed: without checkpointing, it does not fit
    need = {
        c: estimate(planned, activation_checkpointing=c).total_within(10**15)
        for c in ("all", "none")
    }
    budget = need["all"]
    assert not estimate(planned, activation_checkpointing="none").fits(budget)
    auto = make_plan(
        _config(
            tmp_path,
            small_dataset,
            *ON_CUDA,
            "data.batch_size=4",
            "model.activation_checkpointing=auto",
            f"memory.budget={budget}",
        ),
        fit_budget=True,
    )
    batch, accumulate = (
        auto.value(k) for k in ("data.batch_size", "trainer.accumulate_grad_batches")
    )
    assert batch * accumulate == 4
    assert (batch, auto.value("model.activation_checkpointing")) != (4, "none")
    assert estimate(auto.run_config()).fits(budget)
    rows = auto.estimate["fastest_fit"]["rows"]
    assert all(r["batch_size"] * r["accumulate_grad_batches"] == 4 for r in rows)


def test_checkpointing_auto_with_no_budget_is_no_recomputation(
    small_dataset: Path, tmp_path: Path
) -> None:
    cfg = _config(tmp_path, small_dataset, "model.activation_checkpointing=auto")
    plan = make_plan(cfg, estimate_step=False)
    decided = plan.decisions["model.activation_checkpointing"]
    assert (decided.value, decided.source) == ("none", "planned")
    assert "no memory.budget" in decided.why
    assert plan.run_config().model.activation_checkpointing == "none"


#: networks of other projects, small enough for a CPU test: UNETR fixes its input size in its
#: constructor (img_size, planned from the patch)
FOREIGN = {
    "UNETR": [
        "model/net=unetr",
        "model.net.hidden_size=48",
        "model.net.mlp_dim=96",
        "model.net.num_heads=4",
        "model.net.feature_size=4",
    ],
    "SwinUNETR": ["model/net=swin_unetr", "data.patch_size=[32,64,64]"],
    "SegResNet": ["model/net=segresnet"],
}


@pytest.mark.parametrize(
    "network",
    [  # a minute each on 2 cores: slow
        pytest.param("UNETR", marks=pytest.mark.slow),
        pytest.param("SwinUNETR", marks=pytest.mark.slow),
        pytest.param("SegResNet", marks=pytest.mark.slow),
    ],
)
def test_a_foreign_network_plans_both_levers_with_its_adapters_settings(
    network: str, small_dataset: Path, tmp_path: Path
) -> None:
    volseg_net = ("model.net.widths", "model.net.pooling")  # UNet3D's, not theirs
    overrides = [
        *(o for o in tiny_train_overrides(small_dataset) if not o.startswith(volseg_net)),
        "data.patch_size=[32,32,32]",
        *FOREIGN[network],
        "memory.plan_device=cuda",
        "trainer.precision=32",
        "data.batch_size=auto",
        "model.activation_checkpointing=auto",
        "memory.budget=8GiB",
        "memory.max_batch_size=2",
    ]
    plan = make_plan(compose_config("train", tmp_path, overrides), fit_budget=True)
    fit = plan.estimate["fastest_fit"]
    target = str(plan.config.model.net._target_)
    offered = set(ff.adapter_for(target).checkpointing_choices)
    assert {r["activation_checkpointing"] for r in fit["rows"]} == offered
    assert plan.value("model.activation_checkpointing") in offered
    assert plan.value("data.batch_size") == fit["pick"]["batch_size"] == 2  # fits 8 GiB
    assert estimate(plan.run_config()).fits(8 * 1024 * MIB)
