"""Every figure README and docs cite is made by today's code (by the sources its benchmark
declares), every margins file is what its inputs give, and no committed results file changes a
figure: a re-run or a re-estimate that changes one is a new file."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from benchmarks import restamp, results_io
from tests.conftest import REPO
from volseg.utils.units import MIB

RESULTS = REPO / "benchmarks" / "results"
SELECTIVE = RESULTS / "cpu" / "2026-12-06_selective_checkpointing.json"


def test_no_cited_figure_comes_from_other_code_and_every_margin_from_its_inputs():
    """After a change to a source a cited figure depends on: ``python -m benchmarks restamp``
    (estimates, margins), or the command the stale file records (a new file)."""
    stale = restamp.stale()
    assert not stale, "stale figures, see `python -m benchmarks restamp --check`: " + "; ".join(
        f"{p.name} ({kind}: {why})" for p, kind, why in stale
    )


def test_every_cited_file_names_a_benchmark_that_declares_its_sources_or_is_dated():
    for path in restamp.cited():
        benchmark = results_io.benchmark_of(path, json.loads(path.read_text()))
        assert benchmark in results_io.SOURCES or benchmark in results_io.DATED, path.name
    assert not set(results_io.SOURCES) & results_io.DATED


def _cited_of(benchmark: str) -> Path:
    """The newest cited file of ``benchmark`` (any, for one no doc cites today)."""
    paths = [p for p in restamp.cited() if p.name.endswith(".json") and benchmark in p.name]
    return (paths or [SELECTIVE])[-1]


def _copy(tmp: Path, cited: list[Path]) -> Path:
    """A repository of today's sources, README citing ``cited`` (copied, each stamped by the
    copy's sources as a run of today's code stamps it) and every other results file."""
    for source in (results_io.MEMORY, results_io.MODELS, results_io.SPEED):
        ignore = shutil.ignore_patterns("__pycache__", "*.json")  # the margins: a test of their own
        shutil.copytree(REPO / source, tmp / source, ignore=ignore)
    shutil.copytree(RESULTS, tmp / "benchmarks/results")
    for path in cited:
        doc = json.loads(path.read_text())
        doc.pop("estimates", None), doc.pop(results_io.STAMPS, None)
        sources = results_io.SOURCES[results_io.benchmark_of(path, doc)]
        doc["code"] = {"sources": {s: results_io.source_hash(s, tmp) for s in sources}}
        (tmp / path.relative_to(REPO)).write_text(json.dumps(doc))
    links = " ".join(f"[{p.name}]({p.relative_to(REPO)})" for p in cited)
    (tmp / "README.md").write_text(f"figures: {links}\n")
    return tmp


@pytest.mark.parametrize(
    ("benchmark", "source"),
    [
        ("estimator_accuracy", results_io.MEMORY),
        ("rule_effects", results_io.MEMORY),
        ("lever_time_factors", results_io.SPEED),
        ("lever_time_factors", results_io.MODELS),
        ("selective_checkpointing", results_io.MODELS),
        ("selective_checkpointing", results_io.MEMORY),
    ],
)
def test_a_doctored_copy_is_stale_once_a_source_its_benchmark_declares_changes(
    tmp_path, benchmark, source
):
    """Fresh while its stamp is today's code; stale once that code changes by a byte, and once
    its record of the code is gone."""
    here = _cited_of(benchmark)
    repo = _copy(tmp_path, [here])
    assert restamp.stale(repo) == []
    (repo / source / "__init__.py").open("a").write("\n# one more line\n")
    assert [(p.name, why.split(",")[0]) for p, _, why in restamp.stale(repo)] == [
        (here.name, f"made by {results_io.source_hash(source)[:19]}")
    ]
    copy = repo / here.relative_to(REPO)
    doc = json.loads(copy.read_text())
    del doc["code"]
    copy.write_text(json.dumps(doc))
    assert "no record of the code" in restamp.stale(repo)[0][2]


def test_a_stamp_of_the_same_bytes_makes_a_stale_estimate_fresh_again(tmp_path):
    here = _cited_of("estimator_accuracy")
    repo = _copy(tmp_path, [here])
    (repo / results_io.MEMORY / "__init__.py").open("a").write("\n# one more line\n")
    copy = repo / here.relative_to(REPO)
    doc = json.loads(copy.read_text())
    stamped = {"code": {"sources": {results_io.MEMORY: results_io.source_hash("x", repo)}}}
    doc[results_io.STAMPS] = [stamped]
    stamped["code"]["sources"][results_io.MEMORY] = results_io.source_hash(results_io.MEMORY, repo)
    copy.write_text(json.dumps(doc))
    assert restamp.stale(repo) == []


def _under_estimate_cpu(doc: dict) -> None:
    for row in doc["rows"]:
        if isinstance(row.get("measured_bytes"), int):
            row["measured_bytes"] += 64 * MIB


def _under_estimate_cuda(doc: dict) -> None:
    for row in doc["rows"]:
        row["estimated_peak_reserved"] -= 64 * MIB


@pytest.mark.parametrize(
    ("writer", "doctor"),
    [("cpu_margins.json", _under_estimate_cpu), ("cuda_margins.json", _under_estimate_cuda)],
)
def test_a_margins_file_is_stale_once_its_inputs_change(tmp_path, writer, doctor):
    """Margins written from a copy of the results files are fresh, until the estimates fall
    64 MiB short of the runs a margin was fitted on (the AVX2 margin's worst run; every recorded
    GPU run)."""
    from benchmarks import cpu_margins, cuda_estimate_errors

    repo = _copy(tmp_path, [])
    packaged = REPO / "src/volseg/memory/estimate" / writer
    made = (cpu_margins if writer == "cpu_margins.json" else cuda_estimate_errors).margins(
        repo / "benchmarks/results"
    )
    (repo / packaged.relative_to(REPO)).write_text(json.dumps(made))
    assert restamp.stale(repo) == []
    if writer == "cpu_margins.json":
        target = REPO / json.loads(packaged.read_text())["margins"]["AVX2"]["from"]["file"]
    else:
        target = results_io.latest(restamp.CUDA_ESTIMATES, "cpu", RESULTS)
    doc = json.loads(target.read_text())
    doctor(doc)
    (repo / target.relative_to(REPO)).write_text(json.dumps(doc))
    assert [(p.name, kind) for p, kind, _ in restamp.stale(repo)] == [(writer, "margins")]


def test_no_committed_results_file_changes_a_figure():
    """Each committed results file on disk against the version it is held to (its first, or
    ``results_io.APPEND_ONLY_FROM``'s for a file from before the rule): only stamps added."""
    assert results_io.rewritten() == []


def test_a_changed_row_of_a_committed_file_is_found_and_an_added_stamp_is_not(tmp_path):
    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=tmp_path, capture_output=True, text=True)
        return done.stdout.strip()

    git("init", "-q")
    git("config", "user.email", "t@t"), git("config", "user.name", "t")
    path = tmp_path / "benchmarks/results/cpu/2026-01-01_x.json"
    path.parent.mkdir(parents=True)
    doc = {"benchmark": "x", "rows": [{"measured_bytes": 100}]}
    path.write_text(json.dumps(doc))
    git("add", "."), git("commit", "-qm", "a run")
    since = git("rev-parse", "HEAD")
    doc[results_io.STAMPS] = [{"code": {}}]
    path.write_text(json.dumps(doc))
    assert results_io.rewritten(tmp_path, since) == []
    git("commit", "-qam", "a stamp")
    doc[results_io.STAMPS] = [{"code": {"changed": True}}]
    path.write_text(json.dumps(doc))
    assert results_io.rewritten(tmp_path, since) == [path.relative_to(tmp_path).as_posix()]
    doc[results_io.STAMPS] = [{"code": {}}]
    doc["rows"][0]["measured_bytes"] = 101
    path.write_text(json.dumps(doc))
    assert results_io.rewritten(tmp_path, since) == [path.relative_to(tmp_path).as_posix()]


def test_readme_gives_the_worst_error_of_every_held_out_grid_and_names_its_grid():
    """Read from the results files here, not through the tables: the newest file of each
    held-out grid on each CPU kind, every finished row."""
    from benchmarks import samples

    newest: dict[tuple[str, str], dict] = {}
    for path in results_io.runs("estimator_accuracy", "cpu"):  # oldest first
        doc = json.loads(path.read_text())
        for row in doc["rows"]:
            newest[(row["grid"], results_io.cpu_kind(doc))] = doc
    worst = max(
        (
            (abs(row["error"]), row)
            for (grid, _), doc in newest.items()
            if samples.grid(grid)[0] == samples.OUT
            for row in doc["rows"]
            if row["grid"] == grid and "error" in row
        ),
        key=lambda pair: pair[0],
    )[1]
    bullet = next(
        line for line in (REPO / "README.md").read_text().splitlines() if "held-out grid" in line
    )
    assert f"**{results_io.pct(worst['error']).replace('−', '-')}**" in bullet.replace("−", "-")
    assert f"`{worst['grid']}`" in bullet


def test_a_run_is_stamped_with_the_code_it_started_with_not_the_code_at_its_end(tmp_path):
    """``python -m benchmarks`` holds the code before a run: an edit while it runs (another
    engineer's, in the same tree) changes neither the stamp nor the run's figures' claim."""
    for source in (results_io.MEMORY, "src/volseg"):
        (tmp_path / source).mkdir(parents=True, exist_ok=True)
    (tmp_path / results_io.MEMORY / "x.py").write_text("x = 1\n")
    results_io.hold_code(tmp_path)
    try:
        started = results_io.code("estimator_accuracy", tmp_path)
        (tmp_path / results_io.MEMORY / "x.py").write_text("x = 2\n")
        assert results_io.code("estimator_accuracy", tmp_path) == started
    finally:
        del results_io._STARTED[tmp_path]
    assert results_io.code("estimator_accuracy", tmp_path)["sources"] != started["sources"]
