"""The planner's CUDA margins are the committed results files' own figures, computed here again
from the files alone (``benchmarks/results/cuda/*.json``: measured;
``benchmarks/results/cpu/*_cuda_estimate_errors.json``: the estimate of each run)."""

from __future__ import annotations

import json
import math

import pytest

from tests.conftest import REPO
from volseg.memory import residuals

RESULTS = REPO / "benchmarks" / "results"


def _recorded() -> dict[tuple[str, str], dict]:
    runs = {}
    for path in sorted((RESULTS / "cuda").glob("*.json")):
        for run in json.loads(path.read_text())["runs"]:
            if not run["held_out"]:
                runs[(path.stem, run["name"])] = run
    return runs


def _estimates() -> dict[tuple[str, str], dict]:
    newest = residuals.estimates_file()
    return {(r["file"], r["run"]): r for r in json.loads(newest.read_text())["rows"]}


def _kind(overrides: list[str]) -> str:
    if any(o.startswith("model.offload_activations=") and o[-4:] != "alse" for o in overrides):
        return "offload"
    accumulation = [o for o in overrides if o.startswith("trainer.accumulate_grad_batches=")]
    if accumulation and accumulation[-1] != "trainer.accumulate_grad_batches=1":
        return "accumulation"
    return "other"


def test_every_recorded_gpu_run_has_a_committed_estimate():
    """A run recorded after the estimates would be left out of the margins: rerun
    ``python benchmarks/cuda_estimate_errors.py`` and commit its file."""
    missing = set(_recorded()) - set(_estimates())
    assert not missing, missing


@pytest.mark.parametrize(
    ("kind", "margin"),
    [
        ("offload", residuals.OFFLOAD),
        ("accumulation", residuals.ACCUMULATION),
        ("other", residuals.OTHER),
    ],
)
def test_margin_is_the_largest_shortfall_in_the_files(kind, margin):
    estimates = _estimates()
    ratios = {}
    for key, run in _recorded().items():
        if _kind(run["overrides"]) == kind:
            mib = estimates[key]["estimated_peak_reserved"] / 2**20
            ratios[run["name"]] = run["measured"]["peak_reserved_mib"] / mib
    assert ratios, kind
    worst = max(ratios, key=ratios.get)
    # a whole percent, rounded up: it covers the run it came from
    assert margin.fraction == math.ceil(100 * (ratios[worst] - 1) - 1e-9) / 100
    assert margin.fraction >= ratios[worst] - 1
    assert margin.source.startswith(worst + " (reserved ")


def test_cuda_margin_picks_the_kind_of_step():
    assert residuals.cuda_margin(True, 2) is residuals.OFFLOAD
    assert residuals.cuda_margin(False, 2) is residuals.ACCUMULATION
    assert residuals.cuda_margin(False, 1) is residuals.OTHER


def test_without_the_files_there_is_no_margin_and_the_source_says_why(tmp_path):
    with pytest.raises(FileNotFoundError, match="cuda_estimate_errors"):
        residuals.load_margins(tmp_path)
    assert residuals._missing().fraction == 0.0
    assert "no estimates of recorded GPU runs" in residuals._missing().source
