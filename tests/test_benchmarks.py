"""benchmarks/estimator_accuracy.py: its measurement path through a real ``python train.py``."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.conftest import REPO, TINY, load_benchmark
from volseg.memory.estimate.training_step import planned_device
from volseg.utils.units import MIB

#: a results file written on a CPU whose kernels were not held to an ISA (whatever this run's
#: ONEDNN_MAX_CPU_ISA), so that the CPU kind each test names is the one its flags make
NOT_HELD = {"onednn_max_cpu_isa": None, "aten_cpu_capability": None}


def _row(start: float, peak: float) -> dict[str, float]:
    return {
        "mem/step_start_allocated_mib": start,
        "mem/peak_allocated_mib": peak,
        "mem/peak_reserved_mib": peak,
    }


def test_a_step_with_accumulation_spans_its_micro_batches():
    bench = load_benchmark("harness")
    rows = [_row(100, 150), _row(120, 180), _row(110, 170), _row(130, 160)]
    steps = bench.step_rises(rows, accumulate_grad_batches=2)
    # from the first micro-batch's start to the highest peak of the step's micro-batches
    assert [s["growth"] / MIB for s in steps] == [80, 60]
    with pytest.raises(ValueError, match="whole steps"):
        bench.step_rises(rows[:3], accumulate_grad_batches=2)


@pytest.mark.slow
@pytest.mark.parametrize(("device", "accelerator"), [("cpu", "cpu"), ("cuda", "gpu")])
def test_runs_and_estimates_target_the_same_device(device, accelerator, tmp_path):
    bench = load_benchmark("estimator_accuracy")
    grid = load_benchmark("grid")
    for _, overrides in [row for configs in bench.GRIDS.values() for row in configs]:
        cfg = grid.compose(overrides, device, tmp_path)
        assert cfg.trainer.accelerator == accelerator
        assert planned_device(cfg) == device
        assert cfg.trainer.max_steps == grid.STEPS


@pytest.mark.slow
def test_the_networks_grid_estimates_a_users_own_class_from_a_file(tmp_path, monkeypatch):
    """The networks grid's custom row: ``my_unet.py`` written into the work dir, imported from
    there by the estimate (and by the children, through ``PYTHONPATH``), its constructor's
    ``n_channels``/``n_classes`` filled in; here at a smaller patch."""
    monkeypatch.delitem(sys.modules, "my_unet", raising=False)  # imported from the work dir
    bench = load_benchmark("grid")
    name, overrides = next(row for row in bench.NETWORKS if "my_unet.UNet" in row[0])
    small = [*overrides, "data.patch_size=[16,32,32]", "data.batch_size=1"]
    predicted = bench.predict(small, "cpu", tmp_path)
    assert (tmp_path / "my_unet.py").read_text() == bench.MY_UNET
    assert predicted["network"] == "my_unet.UNet"
    assert predicted["patch_size"] == [16, 32, 32] and predicted["batch_size"] == 1
    assert 0 < predicted["held_at_start"] < predicted["growth"]
    env = bench.child_env("cpu", tmp_path)
    assert env["PYTHONPATH"].split(":")[0] == str(tmp_path)
    assert env["MALLOC_MMAP_THRESHOLD_"] == "65536"


def test_docs_networks_table_is_the_committed_results_written_out():
    """docs/benchmarks.md's networks table between its markers is what ``tables.py`` makes of the
    committed ``benchmarks/results/cpu/estimator_networks.json``."""
    bench = load_benchmark("estimator_accuracy")
    results = json.loads(bench.NETWORKS_RESULTS.read_text())
    rows = results["grids"]["networks"]
    assert [row["name"] for row in rows] == [name for name, _ in bench.GRIDS["networks"]]
    assert all("planner" in row for row in rows)
    text = bench.DOCS.read_text()
    between = text.split(bench.TABLE_START + "\n", 1)[1].split(bench.TABLE_END, 1)[0]
    assert between == bench.networks_table(results)
    flowing = " ".join(between.split())  # the caption is a paragraph of short lines
    assert results["cpu"] in flowing and results["date"] in flowing


def test_docs_foreign_networks_table_is_the_dated_results_files_written_out():
    """docs/benchmarks.md's table of other projects' U-Nets is what ``tables.py`` makes of the
    newest complete ``<date>_estimator_networks.json`` holding the foreign-networks grid of each
    kind of CPU (a table each, oldest first), every network of the grid estimated, measured and
    planned in each."""
    bench = load_benchmark("estimator_accuracy")
    paths = bench.foreign_results()
    assert len(paths) >= 2  # the AVX2 and the AVX512_BF16 EPYC
    documents = [json.loads(path.read_text()) for path in paths]
    assert len({doc["cpu_description"] for doc in documents}) == len(documents)
    for path, results in zip(paths, documents, strict=True):
        assert path.name.split("_", 1)[1].startswith("estimator_networks")
        rows = results["grids"]["foreign-networks"]
        names = [name for name, _ in bench.GRIDS["foreign-networks"]]
        assert [row["name"] for row in rows] == names
        assert all("error" in row and "answer" in row["planner"] for row in rows)
        assert results["budget_of_growth"] is not None
        assert set(results["packages"]) == {"dynamic-network-architectures", "pytorch3dunet"}
    text = bench.DOCS.read_text()
    between = text.split(bench.FOREIGN_START + "\n", 1)[1].split(bench.FOREIGN_END, 1)[0]
    tables = [bench.networks_table(doc, "foreign-networks") for doc in documents]
    assert between == "\n".join(tables)
    for results in documents:
        assert results["cpu_description"] in between and results["date"] in between


@pytest.mark.slow
def test_a_real_train_py_run_is_measured_against_its_own_config(tmp_path):
    bench = load_benchmark("grid")
    predicted = bench.predict(TINY, "cpu", tmp_path)
    measured = bench.measure(TINY, "cpu", tmp_path, "tiny")
    assert len(measured["rises"]) == bench.STEPS
    assert all(rise > 0 for rise in measured["rises"])
    assert predicted["growth"] > 0
    # the run's own config (Hydra's record of it) is the one the estimate was composed from
    run = OmegaConf.load(tmp_path / "runs" / "tiny" / ".hydra" / "config.yaml")
    composed = bench.compose(TINY, "cpu", tmp_path / "data")
    for key in ("model", "data", "trainer"):
        assert OmegaConf.to_container(run[key]) == OmegaConf.to_container(composed[key]), key
    assert run.num_classes == composed.num_classes
    # same order of magnitude: a broken reading (a wrong column, MiB for bytes) is far off
    assert 0.5 < predicted["growth"] / measured["growth"] < 2, measured
    assert Path(tmp_path / "data" / "synthetic").is_dir()  # nothing written into the repository


def test_cpu_bf16_conv_marks_no_row_of_volsegs_convolution_wrong(capsys, tmp_path):
    bench = load_benchmark("cpu_bf16_conv")
    out = tmp_path / "bf16_conv.json"
    argv = ["--channels", "8", "--trials", "1", "--depths", "2,3", "--size", "4"]
    bench.main([*argv, "--json-out", str(out)])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| volseg")]
    assert len(rows) == 2 and not any("wrong" in row for row in rows), rows
    kept = [r for r in json.loads(out.read_text())["rows"] if r["layer"].startswith("volseg")]
    assert [r["input_shape"] for r in kept] == [[2, 8, 2, 4, 4], [2, 8, 3, 4, 4]]
    assert not any(any(r["wrong"]) for r in kept)


def test_validation_memory_table_reads_the_committed_results():
    text = load_benchmark("tables").validation_memory(REPO / "benchmarks" / "results")
    assert "| embedded |" in text and "torch " in text


def test_docs_tables_are_the_results_files_own():
    """Every table between ``<!-- table: NAME -->`` markers in docs/ is what
    ``python -m benchmarks tables`` builds from the committed results files."""
    tables = load_benchmark("tables")
    assert tables.main(["--check"]) == 0
    text = (REPO / "docs" / "benchmarks.md").read_text()
    for name in ("levers_cuda", "cuda_estimate_errors"):
        assert f"<!-- table: {name} -->\nbenchmarks/results/" in text, name


def test_tables_fill_markers_from_results_and_leave_the_others(tmp_path):
    tables = load_benchmark("tables")
    results_io = load_benchmark("results_io")
    results = tmp_path / "results"
    rows = [
        {"loader": "monai", "label": "MONAI", "first_batch_s": 1.0, "s_per_batch": 0.25},
        {"loader": "volseg", "label": "volseg", "first_batch_s": 2.0, "s_per_batch": 0.0125},
    ]
    doc = results_io.result("loader_compare", rows, argv=["--compare"], settings={"batch": 2})
    results_io.write(doc, results / "cpu" / "2026-01-01_loader_compare.json")
    text = (
        "a\n<!-- table: loader_compare -->\nold\n<!-- /table: loader_compare -->\nb\n"
        "<!-- table: training_overheads_stub -->\nkept\n<!-- /table: training_overheads_stub -->\n"
    )
    tables.TABLES["training_overheads_stub"] = lambda results: None  # no file yet
    try:
        new, done = tables.regenerate(text, results)
    finally:
        del tables.TABLES["training_overheads_stub"]
    assert done == ["loader_compare"]
    assert "| a ten-line MONAI loader: MONAI | 1.00 | 0.250 |" in new
    assert "| volseg: volseg | 2.00 | 0.013 |" in new
    assert "is wrong" not in new
    assert "old" not in new and "\nkept\n" in new and new.startswith("a\n")
    assert "`python -m benchmarks loader_compare --compare`" in new  # the command, as recorded
    with pytest.raises(KeyError, match="no such table"):
        tables.regenerate("<!-- table: nothing -->\n<!-- /table: nothing -->", results)
    # a file whose settings give the process's threads, not the comparison's one: said so
    doc = results_io.result("loader_compare", rows, argv=["--compare"], settings={"threads": 2})
    results_io.write(doc, results / "cpu" / "2026-01-02_loader_compare.json")
    table = tables.loader_compare(results)
    assert "2026-01-02_loader_compare.json (ran on 1 thread, not its recorded 2)" in table
    assert "2026-01-01_loader_compare.json |" in table


def test_a_default_results_file_never_replaces_an_earlier_run(tmp_path, monkeypatch):
    results_io = load_benchmark("results_io")
    monkeypatch.setattr(results_io, "RESULTS", tmp_path)
    doc = results_io.result("bench", [{"x": 1}], argv=[])
    first = results_io.write(doc, results_io.DEFAULT)
    second = results_io.write(doc, results_io.DEFAULT)
    assert first != second and second.name.endswith("_bench-2.json")
    assert results_io.latest("bench", "cpu", tmp_path) == second
    assert results_io.write(doc, "none") is None
    loaded = results_io.load(second)
    assert loaded["rows"] == [{"x": 1}] and loaded["torch"] and "cpu_flags" in loaded


def test_the_learning_table_averages_each_sides_runs(tmp_path):
    """``<!-- table: learning_mni152 -->``: the newest real_data file of that dataset with an
    nnU-Net side; per side the mean over seeds (the Dice per class stays in the file)."""
    tables = load_benchmark("tables")
    results_io = load_benchmark("results_io")
    results = tmp_path / "results"

    def row(side, method, seed, final, a, b):
        return {
            "side": side,
            "method": method,
            "seed": seed,
            "steps": 100 * seed,
            "dice_mean": final + 0.01,
            "final_dice_mean": final,
            "per_class": {"a": 0.0, "b": 0.0},  # the best validation's: not in the table
            "final_per_class": {"a": a, "b": b},
            "final_zero_classes": int(a == 0) + int(b == 0),
        }

    rows = [
        row("volseg", "volseg (default)", 1, 0.5, 0.4, 0.6),
        row("nnunet", "nnU-Net recipe at equal compute", 1, 0.3, 0.0, 0.6),
        row("volseg", "volseg (default)", 2, 0.7, 0.6, 0.8),
        row("nnunet", "nnU-Net recipe at equal compute", 2, 0.5, 0.2, 0.8),
    ]
    settings = {
        "data": "mni152",
        "budget_s": 300,
        "mode": "two at a time, 1 thread each",
        "precision": "32",
        "sides": ["volseg", "nnunet"],
        "seeds": [1, 2],
    }
    doc = results_io.result("real_data", rows, argv=["--seeds", "1", "2"], settings=settings)
    results_io.write(doc, results / "cpu" / "2026-01-01_real_data.json")
    other = results_io.result("real_data", rows[:1], settings={**settings, "data": "other"})
    results_io.write(other, results / "cpu" / "2026-01-02_real_data.json")  # newer, other data
    later = results_io.result(
        "real_data",
        [row("nnunet_nomirror", "nnU-Net recipe at equal compute, no mirroring", 1, 0.9, 0.8, 1.0)],
        settings={**settings, "sides": ["nnunet_nomirror"], "seeds": [1]},
    )
    results_io.write(later, results / "cpu" / "2026-01-03_real_data.json")
    other_terms = results_io.result(
        "real_data",
        [row("nnunet_nomirror", "other terms", 1, 0.1, 0.1, 0.1)],
        settings={**settings, "sides": ["nnunet_nomirror"], "budget_s": 600},
    )
    results_io.write(other_terms, results / "cpu" / "2026-01-04_real_data.json")
    other_cpu = results_io.result(
        "real_data",
        [row("nnunet_own_plan", "another CPU", 1, 0.1, 0.1, 0.1)],
        settings={**settings, "sides": ["nnunet_own_plan"], "seeds": [1]},
    )
    other_cpu["cpu"] = "another CPU model"  # a wall-clock budget buys other work there
    results_io.write(other_cpu, results / "cpu" / "2026-01-05_real_data.json")
    table = tables.learning(results, "mni152")
    assert "2026-01-01_real_data.json and " in table and "seeds 1, 2" in table
    assert "2026-01-03_real_data.json" in table and "2026-01-04" not in table
    assert "2026-01-05" not in table and "its own plan" not in table
    # nnU-Net's rows say what they ran: 100 of 250,000 steps is 0.04% of its schedule
    nomirror = (
        "nnU-Net v2's trainer, 0.04% of its schedule, volseg's patch and network, no mirroring"
    )
    assert f"| {nomirror} | 1 | 100 | 0.900 | 0.900 |" in table
    assert "other terms" not in table
    assert "| volseg | 2 | 150 | 0.600 | 0.500, 0.700 | 0.610 | 0, 0 |" in table
    nnunet = (
        "| nnU-Net v2's trainer, 0.06% of its schedule, volseg's patch and network | 2 | 150 "
        "| 0.400 | 0.300, 0.500 | 0.410 | 1, 0 |"
    )
    assert nnunet in table
    assert "| a |" not in table
    assert tables.learning(results, "mni152_regions") is None  # no file yet: marker kept


def test_the_learning_table_names_the_own_plan_and_reads_the_predicted_labels():
    """nnU-Net's own-plan side is named for its plan; where rows count their predicted labels,
    a column gives each run's share of background (100% only where every voxel is); rows
    without counts (older files) leave the table as it was."""
    tables = load_benchmark("tables")

    def row(side, seed, voxels=None):
        r = {
            "side": side,
            "method": "m",
            "seed": seed,
            "steps": 500,
            "dice_mean": 0.0,
            "final_dice_mean": 0.0,
            "per_class": {"a": 0.0},
            "final_per_class": {"a": 0.0},
            "final_zero_classes": 1,
        }
        return {**r, "predicted_voxels_per_class": voxels} if voxels else r

    label = tables.side_label("nnunet_own_plan", [row("nnunet_own_plan", 1)])
    assert label == "nnU-Net v2's trainer, 0.20% of its schedule, its own plan"
    assert tables.side_label("nnunet", [row("nnunet", 1)]).endswith("volseg's patch and network")
    # ten steps of 250,000: a share to one figure, not 0.00%
    few = tables.side_label("nnunet_own_plan", [{**row("nnunet_own_plan", 1), "steps": 10}])
    assert few == "nnU-Net v2's trainer, 0.004% of its schedule, its own plan"
    rows = [
        row("nnunet_own_plan", 1, {"bg": 1000, "a": 0}),
        row("nnunet_own_plan", 2, {"bg": 999_999, "a": 1}),
        row("volseg", 1, {"bg": 750, "a": 250}),
        row("monai_tutorial", 1),
    ]
    table = tables.learning_rows(rows).splitlines()
    assert table[0].endswith("| classes at 0 (final) | background, of the predicted voxels |")
    assert table[2] == f"| {label} | 2 | 500 | 0.000 | 0.000, 0.000 | 0.000 | 1, 1 | 100%, 99.99% |"
    assert table[3].endswith("| 1 | 75.00% |") and table[4].endswith("| 1 | - |")
    old = tables.learning_rows([row("nnunet", 1)]).splitlines()
    assert old[0].endswith("| classes at 0 (final) |") and old[2].endswith("| 0.000 | 1 |")


def _write_result(results_io, results, name, rows, file, **extra):
    doc = results_io.result(name, rows, argv=[], **extra)
    results_io.write(doc, results / "cpu" / file)


def test_the_overheads_table_gives_each_item_as_a_share_of_the_wall_time(tmp_path):
    tables = load_benchmark("tables")
    results_io = load_benchmark("results_io")
    items = {
        "checkpoint writes during training": {"seconds": 2.0, "calls": 3},
        "logging": {"seconds": 0.5, "calls": 40},
    }
    row = {
        "run": "short_epochs",
        "max_time_share": "0.02",
        "async_checkpoint": "true",
        "epochs": 4,
        "steps": 8,
        "wall_s": 40.0,
        "items": items,
    }
    _write_result(results_io, tmp_path, "training_overheads", [row], "2026-01-01_x.json")
    assert tables.training_overheads(tmp_path) is None  # not a training_overheads file name
    _write_result(
        results_io, tmp_path, "training_overheads", [row], "2026-01-01_training_overheads.json"
    )
    table = tables.training_overheads(tmp_path)
    line = next(x for x in table.splitlines() if x.startswith("| short_epochs"))
    # 2.0 s of 40 s = 5.0%, 0.5 s = 1.2% (1.25 rounds to even); items not timed: a dash
    assert (
        "| true | 8 | 40.0 | 2.00 s, 3 calls, 5.0% | – | – | 0.50 s, 40 calls, 1.2% | – | – |"
        in line
    )


def test_the_cpu_levers_table_gives_each_lever_against_the_first_row(tmp_path):
    tables = load_benchmark("tables")
    results_io = load_benchmark("results_io")
    rows = [
        {"lever": "none (fp32)", "added_mib": 2000.0, "activations_mib": 1000.0, "seconds": 4.0},
        {
            "lever": "checkpointing: all",
            "added_mib": 1500.0,
            "activations_mib": 400.0,
            "seconds": 5.0,
        },
    ]
    settings = {"shape": [26, 150, 320], "batch": 2, "steps": 2}
    _write_result(results_io, tmp_path, "levers", rows, "2026-01-01_levers.json", settings=settings)
    table = tables.levers_cpu(tmp_path)
    assert "batch 2 of 1×26×150×320, best of 2 steps" in table
    assert "| none (fp32) | 2,000 | 1.00 | 1,000 | 1.00 | 4.00 | 1.00 |" in table
    assert "| checkpointing: all | 1,500 | 0.75 | 400 | 0.40 | 5.00 | 1.25 |" in table


def test_the_throughput_table_divides_flops_by_the_dtypes_own_peak(tmp_path):
    tables = load_benchmark("tables")
    results_io = load_benchmark("results_io")
    row = {
        "model": "unet_tiny",
        "variant": "bf16 autocast",
        "lightning_s_per_step": 0.25,  # 4 it/s: 40 GFLOP/s of a 100 GFLOP/s bf16 peak
        "plain_s_per_step": 0.2,  # 5 it/s: 50 GFLOP/s
        "flops_per_step": 10e9,
        "of_dtype_peak": 0.4,
    }
    settings = {
        "batch": [2, 1, 32, 64, 64],
        "warmup": 3,
        "repeats": 3,
        "overrides": [],
        "matmul_peak_flops_per_s": {"fp32": 50e9, "bf16": 100e9},
    }
    _write_result(
        results_io,
        tmp_path,
        "train_throughput",
        [row],
        "2026-01-01_train_throughput.json",
        settings=settings,
    )
    table = tables.train_throughput(tmp_path)
    assert "| unet_tiny | bf16 autocast | 4.00 | 5.00 | 0.80 | 10.0 | 40 | 0.40 | 0.50 |" in table
    assert "matmul peak fp32 50 GFLOP/s, bf16 100" in table


def test_the_estimator_table_takes_the_newest_file_of_each_grid_and_cpu_kind(tmp_path):
    """Per grid and kind of CPU the newest file; each row says whether it is in sample; the
    configs of the held-out grid and of the grid judged on last have rows, every grid a summary
    line; the 2026-12-02 files' ``held-out`` grid is shown as what it is now, in sample."""
    tables = load_benchmark("tables")
    results_io = load_benchmark("results_io")
    samples = load_benchmark("samples")
    held_out, judged_last = "held-out-2026-12-06", list(samples.JUDGED)[-1]
    assert samples.grid(held_out)[0] == "held out" and judged_last == "held-out-2026-12-07"

    def row(grid, name, measured, estimated):
        return {
            "grid": grid,
            "name": name,
            "measured_bytes": measured * 2**20,
            "estimated_bytes": estimated * 2**20,
            "error": estimated / measured - 1,
        }

    avx2 = {"avx2": True, "avx512f": False, "avx512_bf16": False, "amx_bf16": False}
    amx = {**avx2, "avx512f": True, "avx512_bf16": True, "amx_bf16": True}

    def write(rows, file, flags):
        doc = results_io.result("estimator_accuracy", rows, argv=[])
        doc.update(cpu_flags=flags, **NOT_HELD)
        results_io.write(doc, tmp_path / "cpu" / file)

    old = [row(held_out, "old drawn", 100, 150), row("held-out", "old held", 100, 200)]
    write(old, "2026-01-01_estimator_accuracy.json", avx2)
    held = [row("held-out", "new held", 200, 190), row("held-out", "other", 100, 104)]
    write([*held, row(judged_last, "judged", 100, 101)], "2026-01-02_estimator_accuracy.json", avx2)
    write([row(held_out, "on amx", 100, 110)], "2026-01-03_estimator_accuracy.json", amx)
    failed = {"grid": held_out, "name": "broken", "failed": "error: no such key"}
    slow = {
        "grid": held_out,
        "name": "slow",
        "failed": "Command '[...]' timed out after 900 seconds",
    }
    rows = [row(held_out, "amx held", 100, 90), failed, slow]
    write(rows, "2026-01-03_estimator_accuracy-2.json", amx)
    table = tables.estimator_accuracy(tmp_path)
    # one row per config, one column per CPU kind, from the fewest instructions to the most
    assert "| grid | sample | config | AVX2 | AMX |" in table
    assert f"| {held_out} | held out | old drawn | 100.0 / 150.0 (+50.0%) | not run |" in table
    assert f"| {judged_last} | in sample | judged | 100.0 / 101.0 (+1.0%) | not run |" in table
    # an older grid in sample: its summary alone, the newest file's
    assert "old held" not in table and "new held" not in table
    assert "| checked-2026-12-02 |" not in table
    # new held: 190 of 200 (-5%) short, 104 of 100 (+4%) safe
    assert (
        "- checked-2026-12-02 (in sample), AVX2: mean |error| 4.5%, max |error| 5.0% (2 configs); "
        "safe in 1 of 2 (50%)" in table
    )
    assert (
        f"- {held_out} (held out), AVX2: mean |error| 50.0%, max |error| 50.0% (1 configs); "
        "safe in 1 of 1 (100%)" in table
    )
    # the newest AMX file of the held-out grid, its failed config shown and not counted
    assert "on amx" not in table
    assert f"| {held_out} | held out | amx held | not run | 100.0 / 90.0 (−10.0%) |" in table
    assert f"| {held_out} | held out | broken | not run | failed: error: no such key |" in table
    assert (
        f"| {held_out} | held out | slow | not run | failed: train.py ran past 900 s (stopped) |"
        in table
    )
    # 90 of 100 (-10%): short; the failed configs count neither way
    assert (
        f"- {held_out} (held out), AMX: mean |error| 10.0%, max |error| 10.0% (1 configs, "
        "2 failed); safe in 0 of 1 (0%)" in table
    )


def test_the_frozen_held_out_grid_is_the_generators_draw_and_is_held_out():
    """Each frozen grid file holds what its seeded generator draws from its stated ranges (no
    config picked by hand), and the tables call its rows held out."""
    draw_grid = load_benchmark("draw_grid")
    samples = load_benchmark("samples")
    grids = sorted((REPO / "benchmarks" / "grids").glob("*.json"))
    assert grids
    for path in grids:
        doc = json.loads(path.read_text())
        drawn = draw_grid.draw(doc["seed"], len(doc["configs"]), doc["ranges"], doc["divisor"])
        assert [(c["name"], c["overrides"]) for c in doc["configs"]] == drawn, path.name
        expected = "in sample" if path.stem in samples.JUDGED else doc["sample"]
        assert samples.grid(path.stem)[0] == expected
    assert samples.grid("held-out-2026-12-06")[0] == "held out"
    # the newest grid draws from every network the template ships a config for
    newest = json.loads((REPO / "benchmarks" / "grids" / "held-out-2026-12-06.json").read_text())
    assert newest["ranges"] == draw_grid.RANGES
    assert {"plain_conv_unet", "pytorch3dunet_unet3d"} <= set(newest["ranges"]["network"])
    assert samples.grid("held-out")[0] == "in sample"  # the 2026-12-02 grid: judged on since


def test_a_frozen_grid_judged_on_since_is_in_sample_whatever_its_file_says():
    """``held-out-2026-12-03-b``'s file says held out, but the estimator was judged on it: its
    rows read in sample, with the reason, in the tables and in ``samples.json``."""
    samples = load_benchmark("samples")
    frozen = json.loads((REPO / "benchmarks" / "grids" / "held-out-2026-12-03-b.json").read_text())
    assert frozen["sample"] == "held out"
    sample, why = samples.grid("held-out-2026-12-03-b")
    assert sample == "in sample" and "judged on it since" in why
    index = json.loads((REPO / "benchmarks" / "results" / "samples.json").read_text())["files"]
    for date in ("2026-12-03", "2026-12-04"):
        name = f"cpu/{date}_estimator_accuracy.json"
        assert index[name]["grids"]["held-out-2026-12-03-b"]["sample"] == "in sample"
    docs = (REPO / "docs" / "benchmarks.md").read_text()
    assert "held-out-2026-12-03-b (held out)" not in docs
    assert "- held-out-2026-12-03-b (in sample), AVX512_BF16: " in docs


def test_every_generated_table_says_whether_its_rows_are_in_sample():
    """Every marker's table ends with its sample line; of the learning tasks only the 83
    regions are held out; the index covers every results file."""
    tables = load_benchmark("tables")
    samples = load_benchmark("samples")
    lines = {name: samples.table_line(name) for name in tables.TABLES}
    assert all(line.startswith(("In sample", "Held out")) for line in lines.values()), lines
    held = sorted(name for name, line in lines.items() if line.startswith("Held out"))
    assert held == ["learning_mni152_regions_lr"]
    for doc in (REPO / "docs").glob("*.md"):
        text = doc.read_text()
        for name in re.findall(r"<!-- table: ([\w-]+) -->\n", text):
            body = text.split(f"<!-- table: {name} -->")[1].split(f"<!-- /table: {name} -->")[0]
            assert body.rstrip().endswith(lines[name]), (doc.name, name)
    index = json.loads((REPO / "benchmarks" / "results" / "samples.json").read_text())["files"]
    cpu = {f"cpu/{p.name}" for p in (REPO / "benchmarks" / "results" / "cpu").glob("*.json")}
    assert cpu <= set(index)


def test_the_bf16_convolution_table_marks_the_wrong_cells(tmp_path):
    tables = load_benchmark("tables")
    results_io = load_benchmark("results_io")
    rows = [
        {
            "layer": "torch.nn.Conv3d k=3",
            "input_shape": [2, 32, 2, 8, 8],
            "output": 0.0034,
            "input_gradient": 0.0036,
            "weight_gradient": 1.3e36,
            "wrong": [False, False, True],
        }
    ]
    _write_result(results_io, tmp_path, "cpu_bf16_conv", rows, "2026-01-01_cpu_bf16_conv.json")
    table = tables.cpu_bf16_conv(tmp_path)
    assert "| torch.nn.Conv3d k=3 | (2, 32, 2, 8, 8) | 0.0034 | 0.0036 | **1.3e+36** |" in table


#: the tables a doc may keep outside the generated markers, by their header: each describes
#: (files, sides, defaults, config keys, choices), none holds a measurement
DESCRIPTIVE_TABLES = {
    "README.md": ["| group | choices |"],
    "docs/benchmarks.md": ["| side | what it is | what is held to volseg's |"],
    "docs/configs.md": [
        "| group | choices |",
        "| device | `auto` runs | an explicit `16-mixed` runs "
        "| an explicit `bf16-mixed`/`bf16-true` |",
    ],
    "docs/data.md": ["| `data=` | classes | cases (train / val) |"],
    "docs/kernel-memory.md": [],
    "docs/memory.md": ["| key | meaning |", "| lever | config | what it does |"],
    "docs/networks.md": [
        "| `model/net=` | network | each patch side divides by | `model.activation_checkpointing` "
        "| `model.placement` |",
    ],
    "docs/plan.md": ["| key | `auto` / `null` resolves from | source when given |"],
    "docs/scale-out.md": ["| expression | Optuna distribution | drawn |"],
}
#: a cell that reads as a measured figure: an amount of memory, a time or a rate
MEASURED_FIGURE = re.compile(r"\d[\d,.]*\s*(MiB|GiB|GB|ms|it/s|s/step|s/batch|s)\b")


def _outside_generated_tables(text: str) -> str:
    """A doc's text without the tables that scripts write: ``<!-- table: NAME -->`` blocks
    (``benchmarks/tables.py``) and the networks tables (also ``benchmarks/tables.py``)."""
    text = re.sub(r"<!-- table: ([\w-]+) -->.*?<!-- /table: \1 -->", "", text, flags=re.S)
    return re.sub(r"<!-- ((?:foreign-)?networks-table): .*?<!-- /\1 -->", "", text, flags=re.S)


def test_every_doc_is_listed_for_the_hand_table_check():
    docs = {f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")} | {"README.md"}
    assert docs == set(DESCRIPTIVE_TABLES)


@pytest.mark.parametrize("doc", sorted(DESCRIPTIVE_TABLES))
def test_every_table_of_figures_in_the_docs_is_written_from_a_results_file(doc):
    """No doc keeps a hand-typed table of figures: outside the generated markers only the tables
    that describe are left, and none of their cells reads as a measured amount, time or rate."""
    outside = _outside_generated_tables((REPO / doc).read_text())
    lines = outside.splitlines()
    headers = [
        line
        for line, before in zip(lines, ["", *lines], strict=False)
        if line.startswith("|") and not before.startswith("|")
    ]
    assert headers == DESCRIPTIVE_TABLES[doc]
    figures = [line for line in lines if line.startswith("|") and MEASURED_FIGURE.search(line)]
    assert figures == []


def test_the_tight_budget_sentence_names_each_networks_plan_and_its_trained_peak(tmp_path):
    tables = load_benchmark("tables")
    results_io = load_benchmark("results_io")
    assert tables.networks_tight_budget(tmp_path) is None  # no file yet: the marker kept
    planned = {
        "budget_bytes": 117 * MIB,
        "answer": ["data.batch_size=2", "data.patch_size=[32,48,48]"],
        "measured_peak_bytes": int(113.8 * MIB),
        "under_budget": True,
    }
    rows = [
        {"grid": "monai-unets", "name": "MONAI UNet (16-256 channels)", "planner": planned},
        {
            "grid": "monai-unets",
            "name": "MONAI AttentionUnet (16-256 channels)",
            "planner": {"budget_bytes": 90 * MIB, "answer": None, "message": "nothing fits"},
        },
    ]
    file = "estimator_monai_unets.json"
    _write_result(results_io, tmp_path, "estimator_accuracy", rows, file, budget_of_growth=0.6)
    text = " ".join(tables.networks_tight_budget(tmp_path).split())  # a paragraph of lines
    assert text.startswith("Under a budget of the resident state plus 60% of the step's growth")
    assert (
        "MONAI UNet at 117 MiB: `data.batch_size=2` `data.patch_size=[32,48,48]`, trained at "
        "113.8 MiB (under)" in text
    )
    assert "MONAI AttentionUnet: nothing fits 90 MiB" in text and "in sample" in text


def test_the_summary_line_counts_the_estimates_at_or_above_the_measured_rise():
    """Safe: ``error >= 0`` (an estimate equal to the measured rise is safe); a failed config
    counts neither way. Four measured, three at or above: 75%."""
    grid = load_benchmark("grid")
    rows = [
        {"error": 0.10},
        {"error": 0.0},
        {"error": -0.20},
        {"error": 0.05},
        {"failed": "error: no such key"},
    ]
    assert grid.safe_count(rows) == (3, 4)
    assert grid.summary_line(rows) == (
        "mean |error| 8.8%, max |error| 20.0% (4 configs, 1 failed); safe in 3 of 4 (75%)"
    )
    assert grid.safe_text([{"error": -0.01}, {"error": -0.3}]) == "safe in 0 of 2 (0%)"
    assert grid.safe_text([{"failed": "x"}]) == "none measured"


def test_the_tables_name_a_cpu_kind_with_the_cpu_modules_own_function(monkeypatch):
    """One naming of CPU kinds: the tables' and the margins' (a results file's,
    ``results_io.cpu_kind``) and the planner's (this CPU's)."""
    tables = load_benchmark("tables")
    results_io = load_benchmark("results_io")
    margins = load_benchmark("cpu_margins")
    from volseg.utils import cpu

    assert tables.cpu_kind is results_io.cpu_kind is margins.cpu_kind
    with monkeypatch.context() as patched:
        patched.setattr(cpu, "kind_of", lambda *args: "named by volseg.utils.cpu")
        assert tables.cpu_kind({"cpu_flags": {}}) == "named by volseg.utils.cpu"
    amx = {"avx2": True, "avx512f": True, "avx512_bf16": True, "amx_bf16": True}
    assert tables.cpu_kind({"cpu_flags": amx, **NOT_HELD}) == "AMX"
    held = {"cpu_flags": amx, "onednn_max_cpu_isa": "AVX2", "aten_cpu_capability": None}
    assert tables.cpu_kind(held) == "AMX, held to AVX2"
    # a file from before cpu_flags were recorded: its CPU's description has them
    old = {"cpu": "Xeon (2 cores; avx2=yes avx512f=yes avx512_bf16=yes amx_bf16=no; bf16 native)"}
    assert tables.cpu_kind(old) == "AVX512_BF16"


def test_an_unknown_marker_is_refused_and_a_grid_not_run_is_said_so(tmp_path):
    """A marker tables.py does not know is refused by name; with no row of the frozen held-out
    grid (only an in-sample grid's), its sentence says it has not run."""
    tables = load_benchmark("tables")
    results_io = load_benchmark("results_io")
    with pytest.raises(KeyError, match="no such figure"):
        tables.regenerate("<!-- figure: nothing -->x<!-- /figure: nothing -->", tmp_path)
    rows = [{"grid": "held-out-2026-12-03-b", "name": "c", "error": 0.1}]
    doc = results_io.result("estimator_accuracy", rows, argv=[])
    doc.update(cpu_flags={"avx2": True}, **NOT_HELD)
    results_io.write(doc, tmp_path / "cpu" / "2026-01-01_estimator_accuracy.json")
    kinds = tables.estimator_held_out_kinds(tmp_path)
    assert kinds == (
        "The held-out grid `held-out-2026-12-06` has not run yet.\n"
        "The held-out grid `held-out-2026-12-08` has not run yet."
    )
