"""benchmarks/cuda_results.py: the grids a GPU run measures are valid configs before it runs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.conftest import REPO, load_benchmark, planned_config
from volseg.models.build import build_model

cuda_results = load_benchmark("cuda_results")


def test_recorded_grid_is_every_recorded_config():
    recorded = dict(cuda_results.recorded_grid())
    path = REPO / "benchmarks" / "results" / "cuda" / "2026-11-30_nvidia-h200.json"
    for run in json.loads(path.read_text())["runs"]:
        assert recorded[run["name"].removeprefix("train.py: ")] == run["overrides"]


@pytest.mark.parametrize(
    "name, overrides", cuda_results.HELD_OUT, ids=[n for n, _ in cuda_results.HELD_OUT]
)
def test_held_out_config_composes_and_builds(name, overrides, tmp_path: Path):
    """A typo in a held-out override would cost a GPU run: each composes and its module builds
    (levers validated) as train.py builds it."""
    cfg = planned_config("train", tmp_path, [*overrides, "trainer=gpu"])
    module = build_model(cfg)
    # the network is the one the overrides describe: its levels and its classes
    assert len(module.net.downs) == len(cfg.model.net.widths) - 1
    assert module.net.head.out_channels == cfg.num_classes
    named = re.search(r"(\d+) classes", name)
    assert cfg.num_classes == (int(named.group(1)) if named else 5)  # as the run's name says


def test_step_seconds_skips_the_first_step(tmp_path: Path):
    metrics = tmp_path / "csv" / "metrics.csv"
    metrics.parent.mkdir()
    metrics.write_text("step,time/step_s,mem/x\n0,9.0,\n1,,1\n1,2.0,\n2,4.0,\n")
    rows = load_benchmark("harness").read(tmp_path, 0.0).rows
    assert cuda_results.step_seconds(rows) == 3.0


#: the configs written for the whole-run checks (levers, new held-out, whole runs)
NEW: list[tuple[str, list[str]]] = [
    *cuda_results.HELD_OUT_NEW,
    *cuda_results.LEVERS,
    *[
        (j.name, list(j.overrides))
        for j in cuda_results.WHOLE_RUN + cuda_results.WHOLE_RUN_HELD_OUT
    ],
]


@pytest.mark.parametrize("name, overrides", NEW, ids=[n for n, _ in NEW])
def test_new_config_composes_and_builds(name, overrides, tmp_path: Path):
    """As the held-out grid's: a typo would cost a GPU run (MONAI networks included)."""
    cfg = planned_config("train", tmp_path, [*overrides, "trainer=gpu"])
    build_model(cfg)
    named = re.search(r"(\d+) classes", name)
    assert cfg.num_classes == (int(named.group(1)) if named else 5)


def test_runs_are_named_once_and_held_out_configs_are_not_recorded():
    jobs = cuda_results.all_jobs()
    assert len({j.name for j in jobs}) == len(jobs)
    recorded = [sorted(o) for _, o in cuda_results.recorded_grid()]
    assert all(sorted(j.overrides) not in recorded for j in jobs if j.held_out)
    # each allocator pair: one config, expandable segments off and on
    by_name = {j.name: j for j in jobs}
    pairs = [
        (by_name[n.removesuffix(cuda_results.ON)], j)
        for n, j in by_name.items()
        if n.endswith(cuda_results.ON) and n.removesuffix(cuda_results.ON) in by_name
    ]
    assert len(pairs) >= 1 + len(cuda_results.ALLOCATOR_MAIN)
    for off, on in pairs:
        assert [o for o in off.overrides if not o.startswith(cuda_results.EXPANDABLE)] == [
            o for o in on.overrides if not o.startswith(cuda_results.EXPANDABLE)
        ]
        assert f"{cuda_results.EXPANDABLE}=false" in off.overrides
        assert f"{cuda_results.EXPANDABLE}=true" in on.overrides
    # the most wanted first: the reference both ways, then the whole runs
    assert [j.group for j in jobs[:3]] == ["allocator", "allocator", "whole run"]


def test_the_committed_estimates_cover_every_run():
    """The GPU run reads each run's estimate from the newest ``--estimate`` file: every run of
    today's grid is there with its overrides (rerun ``python -m benchmarks cuda_results
    --estimate`` after changing the grid)."""
    estimates, source = cuda_results.newest_estimates()
    assert source
    for job in cuda_results.all_jobs():
        assert estimates.get(job.name, {}).get("overrides") == list(job.overrides), job.name
        if job.volume:
            assert {"validation", "prediction"} <= set(estimates[job.name]), job.name


def _run(name: str, group: str, allocated: float, reserved: float, smi: float, step: float):
    measured = {
        "peak_allocated_mib": allocated,
        "peak_reserved_mib": reserved,
        "nvidia_smi_mib": smi,
        "step_s": step,
    }
    return {"name": f"train.py: {name}", "group": group, "measured": measured}


def test_allocator_comparison_and_levers_are_read_from_the_runs():
    ref, on = cuda_results.REFERENCE_NAME, cuda_results.ON
    runs = [
        _run(ref, "allocator", 6000, 7000, 7600, 0.100),
        _run(ref + on, "allocator", 6000, 6100, 6700, 0.110),
        _run("levers toward 4x: x", "levers", 1400, 1700, 2300, 0.130),
        _run("levers toward 4x: y", "levers", 3000, 3500, 4100, 0.400),
    ]
    (row,) = cuda_results.allocator_comparison(runs)
    assert row["config"] == ref
    assert row["reserved_off_over_on"] == round(7000 / 6100, 2)
    assert row["nvidia_smi_off_over_on"] == round(7600 / 6700, 2)
    assert row["step_time_on_over_off"] == 1.1
    levers = cuda_results.levers_toward_4x(runs)
    assert levers["baseline"]["name"] == ref
    rows = {r["name"]: r for r in levers["rows"]}
    assert set(rows) == {ref + on, "levers toward 4x: x", "levers toward 4x: y"}
    x = rows["levers toward 4x: x"]
    assert x["reaches_4x"] == {"allocated": True, "reserved": True, "nvidia_smi": False}
    assert x["within_1_35x_time"] and x["time_ratio"] == 1.3
    y = rows["levers toward 4x: y"]
    assert not any(y["reaches_4x"].values()) and not y["within_1_35x_time"]


def test_a_large_generated_volume_is_tiled_to_its_shape():
    image, label = load_benchmark("grid").generated_volume((40, 300, 257))
    assert image.shape == label.shape == (40, 300, 257)
    assert label.max() > 0


@pytest.mark.slow  # 5 train.py/predict.py processes of a tiny network: ~90 s on 2 shared cores
def test_dry_run_writes_the_whole_run_entries(tmp_path: Path):
    """``--dry-run`` (what ``gpu_checks.sh --dry-run`` runs) on the CPU: the reference both
    ways, a whole run with validation and predict.py peaks beside their estimates, a lever run,
    and the comparisons made of them; two runs in flight, taking turns."""
    groups = ["allocator", "whole run", "levers"]
    path = cuda_results.main(
        ["--dry-run", "--groups", *groups, "--jobs", "2", "--out", str(tmp_path)]
    )
    doc = json.loads(path.read_text())
    assert not doc["not_run"], doc["not_run"]
    assert set(doc["code"]) == {"commit", "dirty", "sources"}  # stamped as every results file
    assert doc["code"]["sources"]["src/volseg"].startswith("sha256:")
    runs = {r["name"].removeprefix("train.py: "): r for r in doc["runs"]}
    ref = cuda_results.REFERENCE_NAME
    assert {ref, ref + cuda_results.ON} <= set(runs)
    for run in runs.values():
        assert run["measured"]["peak_allocated_mib"] > 0 and run["measured"]["step_s"] > 0
        assert run["estimated"]["peak_allocated_mib"] > 0
    (whole,) = [r for r in runs.values() if r["group"] == "whole run"]
    for part, key in (
        ("validation", "val_peak_allocated_mib"),
        ("prediction", "peak_allocated_mib"),
    ):
        assert whole[part]["measured"][key] > 0, part
        assert whole[part]["estimated"]["peak_allocated_mib"] > 0, part
        assert whole[part]["volume_shape"] == list(cuda_results.TINY_VOLUME)
    (row,) = doc["allocator_comparison"]
    assert row["config"] == ref and row["step_time_on_over_off"] > 0
    names = [r["name"] for r in doc["levers_toward_4x"]["rows"]]
    assert any(n.startswith("levers toward 4x: ") for n in names)
    lever = next(r for r in runs.values() if r["group"] == "levers")
    assert "trainer.accumulate_grad_batches=2" in lever["overrides"]


@pytest.mark.slow  # a 6-step train.py of unet_tiny in process: ~30 s on 2 cores
def test_the_gpu_speed_run_stamps_its_file_with_the_code(tmp_path: Path):
    out = tmp_path / "speed.json"
    load_benchmark("gpu_train_speed").main(["--dry-run", "--out", str(out)])
    doc = json.loads(out.read_text())
    assert doc["code"]["sources"]["src/volseg"].startswith("sha256:") and doc["step_s"] > 0
