"""The CPU planner's margins: fitted per CPU kind on in-sample estimator rows only (the newest
file of each grid and kind, failed configs out), each row checked against the margin fitted
without it, figures worked out by hand here; the packaged ``cpu_margins.json`` is what the
committed files give; and the planner, ``memory.budget``'s check and ``plan.yaml`` apply the
margin on a CPU step's growth."""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from importlib.resources import files
from unittest import mock

import pytest

from tests.conftest import REPO, TINY, compose_config, load_benchmark
from volseg.memory.estimate import engine
from volseg.memory.estimate import margins as residuals
from volseg.memory.estimate.margins import planned_total
from volseg.utils import cpu
from volseg.utils.errors import BudgetExceeded
from volseg.utils.units import MIB

RESULTS = REPO / "benchmarks" / "results"
BENCH = load_benchmark("cpu_margins")

AVX2 = {"avx2": True, "avx512f": False, "avx512_bf16": False, "amx_bf16": False}
AMX = {"avx2": True, "avx512f": True, "avx512_bf16": True, "amx_bf16": True}
NOT_HELD = {"onednn_max_cpu_isa": None, "aten_cpu_capability": None}


def _row(grid: str, name: str, measured: int, estimated: int) -> dict:
    return {
        "grid": grid,
        "name": name,
        "measured_bytes": measured * MIB,
        "estimated_bytes": estimated * MIB,
        "error": estimated / measured - 1,
    }


def _write(results, file: str, date: str, flags: dict, rows: list[dict]) -> None:
    doc = {"benchmark": "estimator_accuracy", "date": date, "cpu_flags": flags, **NOT_HELD}
    (results / "cpu").mkdir(parents=True, exist_ok=True)
    (results / "cpu" / file).write_text(json.dumps({**doc, "rows": rows}))


@pytest.fixture
def fixture_results(tmp_path):
    """AVX2: tuned a (100 measured / 90 estimated MiB), b (100 / 95), c (50 / 60), and a failed
    config; an older tuned file (100 / 10) that the newer one replaces; a held-out grid's row
    (100 / 20) that is never fitted on. AMX: the judged grid's d (100 / 100) and e (80 / 100)."""
    results = tmp_path / "results"
    _write(results, "2026-01-01_estimator_accuracy.json", "2026-01-01", AVX2, [
        _row("tuned", "old", 100, 10),
    ])  # fmt: skip
    _write(results, "2026-01-02_estimator_accuracy.json", "2026-01-02", AVX2, [
        _row("tuned", "a", 100, 90),
        _row("tuned", "b", 100, 95),
        _row("tuned", "c", 50, 60),
        {"grid": "tuned", "name": "broken", "failed": "error: no such key"},
    ])  # fmt: skip
    _write(results, "2026-01-03_estimator_accuracy.json", "2026-01-03", AVX2, [
        _row("held-out-2026-12-06", "held", 100, 20),
    ])  # fmt: skip
    _write(results, "2026-01-04_estimator_accuracy.json", "2026-01-04", AMX, [
        _row("held-out-2026-12-03-b", "d", 100, 100),
        _row("held-out-2026-12-03-b", "e", 80, 100),
    ])  # fmt: skip
    return results


def test_each_kinds_margin_is_the_least_that_makes_its_in_sample_rows_safe(fixture_results):
    """AVX2: 100 / 90 is the worst, 1.111..., +12% (rounded up); the older file's and the
    held-out grid's rows are not fitted on, the failed config not counted. AMX: every row at or
    below its estimate, no margin. A kind with none: the largest, AVX2's +12%."""
    doc = BENCH.margins(fixture_results)
    assert doc["command"] == "python -m benchmarks cpu_margins"
    margins = doc["margins"]
    assert list(margins) == ["AVX2", "AMX"]
    assert margins["AVX2"]["fraction"] == 0.12
    assert (margins["AVX2"]["runs"], margins["AVX2"]["safe_without_margin"]) == (3, 1)
    assert margins["AVX2"]["from"]["config"] == "a"
    assert "a (tuned, results/cpu/2026-01-02_estimator_accuracy.json" in (margins["AVX2"]["source"])
    assert (
        "the worst of 3 in-sample runs on AVX2 (1 safe without a margin)"
        in (margins["AVX2"]["source"])
    )
    assert margins["AMX"]["fraction"] == 0.0
    assert (margins["AMX"]["runs"], margins["AMX"]["safe_without_margin"]) == (2, 2)
    assert margins["AMX"]["source"].startswith("none needed")
    assert doc["unrecorded"]["fraction"] == 0.12 and doc["unrecorded"]["kind"] == "AVX2"
    assert "held" not in {r["config"] for r in doc["leave_one_out"]["runs"]}


def test_leave_one_out_by_hand(fixture_results):
    """Without a (100 / 90), AVX2's worst is b (100 / 95): +6%, and 90 x 1.06 = 95.4 < 100, not
    safe. Without b, a's +12%: 95 x 1.12 = 106.4, safe. c (50 / 60) and AMX's rows are safe
    with any margin. 4 of 5."""
    loo = BENCH.margins(fixture_results)["leave_one_out"]
    got = {r["config"]: (r["margin_without_it"], r["safe"]) for r in loo["runs"]}
    assert got == {
        "a": (0.06, False),
        "b": (0.12, True),
        "c": (0.12, True),
        "d": (0.0, True),
        "e": (0.0, True),
    }
    assert (loo["safe"], loo["of"]) == (4, 5)
    assert loo["by_kind"] == {"AVX2": {"safe": 2, "of": 3}, "AMX": {"safe": 2, "of": 2}}


def test_a_row_alone_on_its_kind_is_checked_against_the_margin_of_a_kind_with_none(tmp_path):
    """AMX's only row (100 / 80, +25%) left out, AMX has no row: it gets the unrecorded margin,
    the largest of the others, AVX2's +12% (100 / 90): 80 x 1.12 = 89.6 < 100, not safe."""
    results = tmp_path / "results"
    _write(results, "2026-01-01_estimator_accuracy.json", "2026-01-01", AVX2, [
        _row("tuned", "a", 100, 90),
    ])  # fmt: skip
    _write(results, "2026-01-02_estimator_accuracy.json", "2026-01-02", AMX, [
        _row("tuned", "alone", 100, 80),
    ])  # fmt: skip
    doc = BENCH.margins(results)
    assert doc["margins"]["AMX"]["fraction"] == 0.25
    assert doc["unrecorded"]["fraction"] == 0.25 and doc["unrecorded"]["kind"] == "AMX"
    rows = {r["config"]: (r["margin_without_it"], r["safe"]) for r in doc["leave_one_out"]["runs"]}
    assert rows == {"a": (0.25, True), "alone": (0.12, False)}


def test_the_rounding_keeps_the_margin_on_the_safe_side():
    assert BENCH.round_up(1.111) == 0.12
    assert BENCH.round_up(1.12) == 0.12  # exactly a whole percent stays
    assert BENCH.round_up(0.9) == 0.0  # an estimate above the measured rise needs none


def test_the_packaged_margins_are_the_committed_files_own(tmp_path):
    """An estimator results file committed without rewriting the package's file fails here:
    ``python -m benchmarks cpu_margins``."""
    packaged = json.loads(
        (files("volseg.memory.estimate") / residuals.CPU_MARGINS_FILE).read_text()
    )
    assert packaged == BENCH.margins(RESULTS)
    written = BENCH.write_margins(RESULTS, tmp_path / "cpu_margins.json")
    assert json.loads(written.read_text()) == packaged
    kinds, other = residuals.packaged_cpu_margins()
    assert {k: (m.share, m.fixed_mib) for k, m in kinds.items()} == {
        k: (m["share"], m["fixed_mib"]) for k, m in packaged["margins"].items()
    }
    assert other.share == packaged["unrecorded"]["share"]


def test_the_held_out_grid_is_never_fitted_on():
    packaged = json.loads(
        (files("volseg.memory.estimate") / residuals.CPU_MARGINS_FILE).read_text()
    )
    grids = {r["grid"] for r in BENCH.fitted_rows(RESULTS)}
    assert "held-out-2026-12-06" not in grids
    assert {"held-out-2026-12-03-b", "held-out-2026-12-04", "held-out-2026-12-05"} <= grids
    assert all("held-out-2026-12-06" not in m["source"] for m in packaged["margins"].values())


def test_a_kind_with_no_recorded_run_gets_a_stated_margin_never_zero():
    kinds, other = residuals.packaged_cpu_margins()
    assert "other" not in kinds  # no AVX2: no recorded run
    margin = residuals.cpu_margin("other")
    assert (margin.share, margin.fixed_mib) == (other.share, other.fixed_mib)
    assert margin.share > 0 or margin.fixed_mib > 0
    assert margin.source.startswith("no in-sample estimator run on other, so +")
    held = residuals.cpu_margin("AMX, held to AVX2")
    assert held.share == other.share and "on AMX, held to AVX2" in held.source
    for kind, margin in kinds.items():
        assert residuals.cpu_margin(kind) == margin


def test_cpu_kind_honours_the_isa_the_process_is_held_to(monkeypatch):
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    monkeypatch.setattr(cpu, "cpu_flags", lambda: dict(AMX))
    assert cpu.cpu_kind() == "AMX"
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert cpu.cpu_kind() == "AMX, held to AVX2"
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    assert cpu.cpu_kind() == "AMX, held to AVX2, ATen held to avx2"
    assert cpu.kind_of(AVX2) == "AVX2"
    assert cpu.kind_of({**AVX2, "avx512f": True}) == "AVX-512"


@pytest.fixture
def tiny_cpu(tmp_path):
    """The tiny config planned for the CPU, and a known margin for the kind the estimate is made
    on: +50% of the step's growth (a fresh engine cache, so no earlier answer is reused)."""
    from volseg.plan import planned_config

    cfg = planned_config(compose_config("train", tmp_path, [*TINY, "memory.plan_device=cpu"]))
    margin = residuals.Margin(0.5, "a run of this kind (test)")
    with (
        mock.patch.object(residuals, "cpu_kind", lambda: "AVX2"),
        mock.patch.object(residuals, "cpu_margin", lambda kind: margin if kind == "AVX2" else None),
        mock.patch.object(engine, "_runs", OrderedDict()),
    ):
        yield cfg


def test_a_cpu_budget_between_the_bare_estimate_and_the_margin_is_refused(tiny_cpu):
    """The margin goes on the step's growth: a budget that holds the bare estimate but not the
    estimate plus half its growth is refused, naming the margin; one that holds both fits."""
    from tests.estimates import estimate
    from volseg.plan.report import check_estimate_fits
    from volseg.utils.units import Budget

    est = estimate(tiny_cpu)
    assert (est.device, est.margin) == ("cpu", 0.5)
    assert est.margin_source == "a run of this kind (test)"
    added = math.ceil(0.5 * est.step_peak_growth)
    assert added > 0 and est.margin_bytes == added
    between = est.process_total + added // 2
    assert est.total_within(between) is None and not est.fits(between)
    with pytest.raises(BudgetExceeded, match=r"plus a margin of \+0.0 MiB \+ 50.0% of its growth"):
        check_estimate_fits(est, Budget.of(f"{between}B"))
    enough = est.process_total + added
    assert est.total_within(enough) == enough
    assert check_estimate_fits(est, Budget.of(f"{enough}B")) == enough
    # estimate_memory.py's report: the figure a budget is checked against, and the margin's source
    from volseg.plan.report import format_estimate

    report = format_estimate(est, 10)
    assert f"{'planned (+0.0 MiB + 50.0% of growth)':<52}{enough / MIB:>12,.1f} MiB" in report
    assert "the CPU margin of its kind: a run of this kind (test)" in report


def test_the_planner_plans_a_cpu_step_with_its_margin(tiny_cpu):
    """A budget that holds batch 2 bare but not with its margin: the planner answers batch 1
    (without the margin it would have kept batch 2)."""
    from tests.estimates import estimate, plan_of
    from volseg.memory.fit.step_fit import fit_step

    two = estimate(tiny_cpu, batch_size=2)
    budget = two.process_total + two.margin_bytes // 2
    assert not two.fits(budget) and two.process_total <= budget
    plan = plan_of(tiny_cpu, checkpointing_options=["none"])
    answer = fit_step(plan, budget)
    assert answer.batch_size == 1 and answer.estimate["margin"] == 0.5
    # one step more, as the planner counts it (with the margin), is over the budget
    more = answer.next_step_estimate
    assert planned_total(more) > budget >= planned_total(answer.estimate)
    assert more["process_total"] <= budget  # bare, batch 2 would have fit
    with mock.patch.object(residuals, "cpu_margin", lambda kind: residuals.Margin(0.0, "none")):
        engine._runs.clear()
        bare = fit_step(plan, budget)
    assert bare.batch_size >= 2


def test_the_run_plan_records_the_cpu_margin_and_its_source(tiny_cpu, tmp_path):
    """``plan.yaml``'s estimate keeps the margin and its source, said once; the batch's ``why``
    names the margin and where its source is; a budget between refuses the run before anything
    is built."""
    from tests.estimates import estimate
    from volseg.plan import make_plan

    est = estimate(tiny_cpu)
    enough = est.process_total + est.margin_bytes + MIB
    overrides = [*TINY, "memory.plan_device=cpu"]
    planned = make_plan(compose_config("train", tmp_path, [*overrides, f"memory.budget={enough}B"]))
    assert planned.estimate["margin"] == 0.5
    assert planned.estimate["margin_source"] == "a run of this kind (test)"
    why = planned.decisions["data.batch_size"].why
    assert why.endswith("with a margin of +0.0 MiB + 50.0% (estimate.margin_source)")
    assert "a run of this kind" not in why  # the source is said once, in the estimate
    between = est.process_total + est.margin_bytes // 2
    with pytest.raises(BudgetExceeded, match="margin of"):
        make_plan(compose_config("train", tmp_path, [*overrides, f"memory.budget={between}B"]))


def test_an_unrecorded_kind_plans_with_the_stated_margin(tmp_path):
    """On a kind with no recorded run the estimate carries the largest margin of any kind, and
    its source says why."""
    from tests.estimates import estimate
    from volseg.plan import planned_config

    cfg = planned_config(compose_config("train", tmp_path, [*TINY, "memory.plan_device=cpu"]))
    with (
        mock.patch.object(residuals, "cpu_kind", lambda: "other"),
        mock.patch.object(engine, "_runs", OrderedDict()),
    ):
        est = estimate(cfg)
    _, other = residuals.packaged_cpu_margins()
    assert est.margin == other.share and est.margin_fixed_mib == other.fixed_mib
    assert est.margin_source.startswith("no in-sample estimator run on other")
