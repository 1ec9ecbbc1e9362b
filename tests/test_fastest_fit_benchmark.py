"""``python -m benchmarks fastest_fit``'s pure parts on hand-made figures: the rank correlation,
what fits by measured peak, the best and each answer's ratio to it, the budget rule and the
summary. Nothing here trains or times."""

from __future__ import annotations

import pytest

from tests.conftest import load_benchmark
from volseg.utils.units import MIB

ff = load_benchmark("fastest_fit")


def test_spearman_of_orders_with_and_without_ties():
    assert ff.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert ff.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # ranks 1, 2, 3, 4 against 1, 2.5, 2.5, 4 (the tie: its mean rank); about their means 2.5:
    # products 2.25 + 0 + 0 + 2.25 over sqrt(5 x 4.5)
    assert ff.spearman([1, 2, 3, 4], [1, 5, 5, 9]) == pytest.approx(4.5 / (5 * 4.5) ** 0.5)
    # one swap of five: 1 - 6 x 2 / (5 x 24)
    assert ff.spearman([1, 2, 3, 4, 5], [1, 3, 2, 4, 5]) == pytest.approx(0.9)
    assert ff.spearman([3.0], [1.0]) is None  # one pair
    assert ff.spearman([1, 2, 3], [7, 7, 7]) is None  # a constant side


def _row(seconds: float, peak_mib: float, batch: int, micro: int = 1, planned_mib: float = 0):
    return {
        "seconds": seconds,
        "seconds_per_sample": seconds / (batch * micro),
        "measured_peak": peak_mib * MIB,
        "planned_total": (planned_mib or peak_mib) * MIB,
        "predicted_seconds": seconds * 2,  # the same order as measured
    }


ROWS = {
    (1, 1, "none"): _row(1.0, 80, 1),  # 1.0 s a sample
    (2, 1, "none"): _row(1.2, 120, 2),  # 0.6: the fastest, over a budget of 100
    (2, 1, "all"): _row(1.6, 90, 2, planned_mib=105),  # 0.8: fits, though planned over 100
    (4, 1, "all"): _row(2.8, 100, 4),  # 0.7: fits, at exactly 100
    (1, 2, "none"): _row(2.2, 95, 1, 2, planned_mib=99),  # 1.1
}


def test_fitting_is_by_measured_peak_at_most_the_budget():
    assert set(ff.fitting(ROWS, 100 * MIB)) == {
        (1, 1, "none"),
        (2, 1, "all"),
        (4, 1, "all"),
        (1, 2, "none"),
    }
    assert set(ff.fitting(ROWS, 79 * MIB)) == set()


def test_a_case_ranks_each_answer_against_the_best_that_fits_by_measured_peak():
    answers = {
        "fastest_fit": (2, 1, "all"),
        "largest_batch": None,  # nothing fits the old rule
        "fixed_order": (2, 1, "none"),  # over the budget
        "planner_seconds": 1.5,
    }
    c = ff.case("net", "tight", 100 * MIB, ROWS, answers)
    assert c["best"] == [4, 1, "all"]
    assert c["fitting"] == 4
    assert c["fastest_fit"]["vs_best"] == pytest.approx(0.8 / 0.7)
    assert c["fastest_fit"]["over_budget"] is False
    assert c["largest_batch"] == {"shape": None}
    assert c["fixed_order"]["over_budget"] is True
    assert c["fixed_order"]["vs_best"] == pytest.approx(0.6 / 0.7)
    assert c["pick_vs_fixed_order"] == pytest.approx(0.8 / 0.6)
    assert c["spearman"] == pytest.approx(1.0) and c["spearman_n"] == 4
    assert c["planned_fits_measured_over"] == []
    assert c["measured_fits_planned_over"] == [[2, 1, "all"]]


def test_a_case_where_nothing_measured_fits_has_no_best_and_no_ratio():
    answers = {"fastest_fit": (1, 1, "none"), "largest_batch": None, "fixed_order": None,
               "planner_seconds": 0.1}  # fmt: skip
    c = ff.case("net", "tight", 50 * MIB, ROWS, answers)
    assert c["best"] is None and c["fitting"] == 0
    assert c["fastest_fit"]["over_budget"] is True and c["fastest_fit"]["vs_best"] is None
    assert c["spearman"] is None


def test_budgets_tight_between_checkpointing_at_batch_two_and_none_loose_over_batch_four():
    planned = {
        (1, 1, "none"): 300 * MIB,
        (2, 1, "none"): 400 * MIB,
        (4, 1, "none"): 600 * MIB,
        (1, 1, "all"): 250 * MIB,  # batch 1: not counted for the tight rule
        (2, 1, "all"): 320 * MIB,
        (3, 1, "selective"): 380 * MIB,
        (2, 2, "none"): 200 * MIB,  # micro-batches: not counted either
    }
    found = ff.budgets(planned)
    assert found["tight"] == 360 * MIB  # halfway between 320 and 400
    assert found["loose"] == 630 * MIB  # 5% over 600, whole MiB
    assert planned[(2, 1, "none")] > found["tight"] >= planned[(2, 1, "all")]
    # checkpointing that lowers no batch >= 2 below batch 2 without: no tight budget
    planned[(2, 1, "all")] = planned[(3, 1, "selective")] = 450 * MIB
    assert ff.budgets(planned)["tight"] is None


def test_summary_worst_and_median_per_planner_and_the_pick_beside_the_spread():
    def case(pick: float, fixed: float, rho: float, over: bool = False) -> dict:
        return {
            "spearman": rho,
            "fastest_fit": {"shape": [2, 1, "all"], "vs_best": pick, "over_budget": over},
            "largest_batch": {"shape": None},
            "fixed_order": {"shape": [2, 1, "none"], "vs_best": fixed, "over_budget": False},
            "pick_vs_fixed_order": pick / fixed,
        }

    total = ff.summary(
        [case(1.0, 1.0, 0.9), case(1.1, 1.5, 0.5, over=True), case(1.3, 1.3, 1)], 0.1
    )
    assert total["fastest_fit"]["median_vs_best"] == pytest.approx(1.1)
    assert total["fastest_fit"]["worst_vs_best"] == pytest.approx(1.3)
    assert total["fastest_fit"]["over_budget"] == 1
    assert total["largest_batch"] == {"median_vs_best": None, "worst_vs_best": None,
                                      "answered": 0, "over_budget": 0}  # fmt: skip
    assert total["worst_spearman"] == 0.5
    assert total["pick_vs_fixed_order_beyond_spread"] == [pytest.approx(1.1 / 1.5)]
    assert "fastest_fit: median 1.100x the best" in ff.table([], total)
