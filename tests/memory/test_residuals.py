"""The planner's CUDA margins are the committed results files' own figures, computed here again
from the files alone (``benchmarks/results/cuda/*.json``: measured;
``benchmarks/results/cpu/*_cuda_estimate_errors.json``: the estimate of each run), and ship in
the wheel as ``volseg/memory/cuda_margins.json``."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import zipfile
from importlib.resources import files
from pathlib import Path

import pytest

from tests.conftest import REPO, load_benchmark
from volseg.memory import residuals

RESULTS = REPO / "benchmarks" / "results"
BENCH = load_benchmark("cuda_estimate_errors")


def _recorded() -> dict[tuple[str, str], dict]:
    runs = {}
    for path in sorted((RESULTS / "cuda").glob("*.json")):
        for run in json.loads(path.read_text())["runs"]:
            if not run["held_out"]:
                runs[(path.stem, run["name"])] = run
    return runs


def _estimates() -> dict[tuple[str, str], dict]:
    newest = BENCH.results_io.latest(BENCH.BENCHMARK, "cpu", RESULTS)
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


def test_the_packaged_margins_are_the_committed_files_own(tmp_path):
    """A recorded run or an estimate committed without rewriting the package's file fails here:
    ``python benchmarks/cuda_estimate_errors.py --margins-only``."""
    text = (files("volseg.memory") / residuals.MARGINS_FILE).read_text()
    packaged = json.loads(text)
    assert packaged == BENCH.margins(RESULTS)
    assert BENCH.write_margins(RESULTS, tmp_path / "margins.json").read_text() == text
    assert set(packaged["margins"]) == set(residuals.KINDS)
    assert residuals.packaged_margins() == {
        kind: residuals.Margin(**m) for kind, m in packaged["margins"].items()
    }


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


def test_without_the_estimates_there_are_no_margins_to_write(tmp_path):
    with pytest.raises(FileNotFoundError, match="cuda_estimate_errors"):
        BENCH.margins(tmp_path)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This checkout's wheel, built offline from a copy (a build in the checkout leaves
    ``build/`` there)."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    shutil.copytree(REPO / "src", source / "src", ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    _pip("wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", tmp / "dist", source)
    (built,) = (tmp / "dist").glob("volseg-*.whl")
    return built


def _pip(*args: object) -> None:
    command = [sys.executable, "-m", "pip", "--disable-pip-version-check", *map(str, args)]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def _installed_margins(site: Path, cwd: Path) -> tuple[dict, str]:
    """``volseg.memory.residuals``'s margins as a process outside the checkout, with only
    ``site`` on its path for volseg, imports them; and its stderr."""
    code = (
        "import json, volseg.memory.residuals as r; print(json.dumps({'file': r.__file__, "
        "'margins': {k: {'fraction': m.fraction, 'source': m.source} for k, m in "
        "[('offload', r.OFFLOAD), ('accumulation', r.ACCUMULATION), ('other', r.OTHER)]}}))"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PROJECT_ROOT")}
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        env={**env, "PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert Path(out["file"]).is_relative_to(site), out["file"]  # not the checkout's volseg
    return out["margins"], done.stderr


def test_the_wheel_ships_the_margins_and_an_install_plans_with_them(wheel, tmp_path):
    with zipfile.ZipFile(wheel) as archive:
        assert "volseg/memory/cuda_margins.json" in archive.namelist()
    site = tmp_path / "site"
    _pip("install", "--no-deps", "--no-index", "--target", site, wheel)
    margins, _ = _installed_margins(site, tmp_path)
    assert margins == BENCH.margins(RESULTS)["margins"]
    # an install without the file plans with no margin, and says so
    (site / "volseg" / "memory" / residuals.MARGINS_FILE).unlink()
    margins, stderr = _installed_margins(site, tmp_path)
    assert all(m["fraction"] == 0.0 and m["source"].startswith("none") for m in margins.values())
    assert "cuda_margins.json is missing" in stderr
