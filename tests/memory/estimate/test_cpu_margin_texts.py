"""What each CPU margin's text says (``benchmarks/cpu_margins.py``), worked out by hand: a kind
with no run is given the figures it applies and why; the held kind that stands in for AVX-512
(an AVX512_BF16 CPU held to AVX512_CORE_VNNI) is fitted as AVX-512 and says so; each kind says
whether its worst run is covered by the margin fitted without it; and the packaged
``cpu_margins.json`` and README's CPU margin line say the same per kind."""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import REPO, load_benchmark
from volseg.memory.estimate import margins as residuals
from volseg.utils.units import MIB

BENCH = load_benchmark("cpu_margins")
AVX2 = {"avx2": True, "avx512f": False, "avx512_bf16": False, "amx_bf16": False}
BF16 = {"avx2": True, "avx512f": True, "avx512_bf16": True, "amx_bf16": False}
HELD = "AVX512_BF16, held to AVX512_CORE_VNNI"


def _margin(fixed_mib: float, share: float, fraction: float = 0.0) -> dict:
    return {"fixed_mib": fixed_mib, "share": share, "fraction": fraction, "source": "s"}


def test_an_unrecorded_kind_is_told_the_figures_it_applies_and_whose_they_are():
    """Each part the largest of the fitted kinds': AMX's 2.6 MiB, X's 1.5%."""
    fitted = {"AVX2": _margin(0.1, 0.0, 0.01), "X": _margin(0.5, 0.015), "AMX": _margin(2.6, 0.0)}
    got = BENCH.unrecorded(fitted)
    assert (got["fixed_mib"], got["share"]) == (2.6, 0.015)
    assert got["source"] == (
        "no in-sample estimator run on this kind of CPU, so +2.6 MiB + 1.5% of the step's growth: "
        "the largest fixed part (AMX's 2.6 MiB) and the largest share (X's 1.5%) of the 3 "
        "fitted kinds (AVX2; X; AMX)"
    )


def test_with_no_fitted_share_the_text_says_none_has_one():
    got = BENCH.unrecorded({"AVX2": _margin(0.1, 0.0), "AMX": _margin(2.6, 0.0)})["source"]
    assert "+2.6 MiB + 0.0% of the step's growth" in got
    assert "the largest share (0.0%: none of them has one)" in got
    assert "+4%" not in got  # the one-part fraction of another kind is not what it applies


def _write(results, name: str, flags: dict, held: str | None, rows: list[tuple]) -> None:
    doc = {"benchmark": "estimator_accuracy", "date": "2026-01-01", "cpu_flags": flags}
    doc |= {"onednn_max_cpu_isa": held, "aten_cpu_capability": None}
    doc["rows"] = [
        {"grid": "tuned", "name": n, "measured_bytes": m * MIB, "estimated_bytes": e * MIB}
        for n, m, e in rows
    ]
    (results / "cpu").mkdir(parents=True, exist_ok=True)
    (results / "cpu" / name).write_text(json.dumps(doc))


@pytest.fixture
def held_results(tmp_path):
    """AVX2: a (100 measured / 99 estimated MiB) and b (50 / 60). The held kind: c (100 / 98)
    and d (200 / 199)."""
    results = tmp_path / "results"
    _write(results, "2026-01-01_estimator_accuracy.json", AVX2, None, [
        ("a", 100, 99), ("b", 50, 60),
    ])  # fmt: skip
    _write(results, "2026-01-01_estimator_accuracy-2.json", BF16, "AVX512_CORE_VNNI", [
        ("c", 100, 98), ("d", 200, 199),
    ])  # fmt: skip
    return results


def test_the_held_kind_is_fitted_as_avx512_and_says_what_it_was_recorded_on(held_results):
    """c is the worst (2 MiB short, d 1 MiB): fixed 2.0 MiB, no share. The held kind itself plans
    with the same margin, marked as AVX-512's."""
    doc = BENCH.margins(held_results)
    assert {s["kind"] for s in BENCH.fitted_rows(held_results)} == {"AVX2", "AVX-512"}
    avx512 = doc["margins"]["AVX-512"]
    assert (avx512["fixed_mib"], avx512["share"], avx512["runs"]) == (2.0, 0.0, 2)
    assert (
        "the worst of 2 in-sample runs on AVX-512 as recorded on its stand-in, an AVX512_BF16 CPU "
        "held to AVX512_CORE_VNNI by ONEDNN_MAX_CPU_ISA: no bf16 kernels (0 safe without a "
        "margin)" in avx512["source"]
    )
    assert doc["margins"][HELD] == {**avx512, "same_as": "AVX-512"}
    assert list(doc["leave_one_out"]["two_part_by_kind"]) == ["AVX2", "AVX-512"]


def test_each_kind_says_whether_its_worst_run_is_covered_fitted_without_it(held_results):
    """AVX2 without a (100 / 99): b alone needs none, a is 1 MiB short: not covered. AVX-512
    without c (100 / 98): d alone (200 / 199) is a share, 1 / 199 rounded up to 0.6%, and
    98 x 0.6% = 0.59 MiB leaves c short: not covered. A kind whose worst run
    is covered says so: AVX2's newer file, a beside e (1000 / 998) and f (2000 / 1998), both 2 MiB
    short: without a, 2.0 MiB withholds less than a share (2 / 998 of each), and covers a."""
    doc = BENCH.margins(held_results)
    assert doc["margins"]["AVX2"]["source"].endswith(
        "; left out of its own fit, the worst run is not covered by the margin fitted without it "
        "(+0.0 MiB + 0.0%)"
    )
    assert doc["margins"]["AVX-512"]["source"].endswith(
        "; left out of its own fit, the worst run is not covered by the margin fitted without it "
        "(+0.0 MiB + 0.6%)"
    )
    _write(held_results, "2026-01-02_estimator_accuracy.json", AVX2, None, [
        ("a", 100, 99), ("e", 1000, 998), ("f", 2000, 1998),
    ])  # fmt: skip
    avx2 = BENCH.margins(held_results)["margins"]["AVX2"]["source"]
    assert avx2.endswith(
        "the worst run is covered by the margin fitted without it (+2.0 MiB + 0.0%)"
    )


def test_the_packaged_avx512_margin_is_the_stand_ins_and_says_so():
    """A real Ice Lake (``cpu_kind()`` = AVX-512) and this CPU held to AVX512_CORE_VNNI plan
    with the margin of the held runs; a kind still unrecorded is given the figures."""
    doc = json.loads((REPO / "src/volseg/memory/estimate/cpu_margins.json").read_text())
    assert doc["margins"]["AVX-512"]["runs"] >= 10
    ice_lake, held = residuals.cpu_margin("AVX-512"), residuals.cpu_margin(HELD)
    assert (ice_lake.fixed_mib, ice_lake.share) == (held.fixed_mib, held.share)
    assert "as recorded on its stand-in, an AVX512_BF16 CPU held to AVX512_CORE_VNNI" in held.source
    other = residuals.cpu_margin("other")
    unrecorded = doc["unrecorded"]
    figures = f"+{unrecorded['fixed_mib']:.1f} MiB + {unrecorded['share']:.1%}"
    assert other.source.startswith(f"no in-sample estimator run on other, so {figures} of the")
    assert "the largest fixed part (" in other.source


def _kinds(listed: str) -> set[str]:
    """``A, B (a note) and C`` -> {A, B, C}."""
    return {re.sub(r" \(.*\)$", "", k) for k in re.split(r", | and ", listed)}


def test_readme_says_per_kind_whether_the_worst_run_left_out_is_covered():
    """README's CPU margin bullet names each kind whose worst run the margin fitted without it
    covers, and each it does not, as ``cpu_margins.json``'s leave-one-out has them (README's short
    name for the kind held to AVX2)."""
    doc = json.loads((REPO / "src/volseg/memory/estimate/cpu_margins.json").read_text())
    names = {"AVX512_BF16, held to AVX2, ATen held to avx2": "AVX512_BF16 held to AVX2"}
    bullet = next(
        line for line in (REPO / "README.md").read_text().splitlines()
        if line.startswith("- CPU planner's margin")
    )  # fmt: skip
    listed = r"the worst run is (?:covered on (.+) but )?not (?:covered )?on (.+)\. \["
    said = re.search(listed, bullet)  # "covered on A but not on B", or "not covered on B"
    loo = doc["leave_one_out"]["two_part_by_kind"]
    covered = {names.get(k, k) for k, tally in loo.items() if tally["worst_covered"]}
    named = _kinds(said[1]) if said[1] else set()
    assert (named, _kinds(said[2])) == (covered, {names.get(k, k) for k in loo} - covered)
