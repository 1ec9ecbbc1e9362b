"""benchmarks/estimator_accuracy.py: its measurement path through a real ``python train.py``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.conftest import load_benchmark
from volseg.memory.estimator import target_device
from volseg.utils.units import MIB

# a 2-level U-Net of 16-32 channels on a small embedded dataset: a run takes seconds
TINY = [
    "model.net.widths=[16,32]",
    "model.net.pooling=null",
    "data.batch_size=1",
    "data.patch_size=[16,32,32]",
    "data.synthetic.num_volumes=3",
    "data.synthetic.num_val=1",
    "data.synthetic.shape=[16,48,48]",
    "trainer.precision=32",
]


def _row(start: float, peak: float) -> dict[str, float]:
    return {
        "mem/step_start_allocated_mib": start,
        "mem/peak_allocated_mib": peak,
        "mem/peak_reserved_mib": peak,
    }


def test_a_step_with_accumulation_spans_its_micro_batches():
    bench = load_benchmark("estimator_accuracy")
    rows = [_row(100, 150), _row(120, 180), _row(110, 170), _row(130, 160)]
    steps = bench.step_rises(rows, accumulate_grad_batches=2)
    # from the first micro-batch's start to the highest peak of the step's micro-batches
    assert [s["growth"] / MIB for s in steps] == [80, 60]
    with pytest.raises(ValueError, match="whole steps"):
        bench.step_rises(rows[:3], accumulate_grad_batches=2)


@pytest.mark.parametrize(("device", "accelerator"), [("cpu", "cpu"), ("cuda", "gpu")])
def test_runs_and_estimates_target_the_same_device(device, accelerator, tmp_path):
    bench = load_benchmark("estimator_accuracy")
    for _, overrides in [row for grid in bench.GRIDS.values() for row in grid]:
        cfg = bench.compose(overrides, device, tmp_path)
        assert cfg.trainer.accelerator == accelerator
        assert target_device(cfg) == device
        assert cfg.trainer.max_steps == bench.STEPS


def test_the_networks_grid_estimates_a_users_own_class_from_a_file(tmp_path, monkeypatch):
    """The networks grid's custom row: ``my_unet.py`` written into the work dir, imported from
    there by the estimate (and by the children, through ``PYTHONPATH``), its constructor's
    ``n_channels``/``n_classes`` filled in; here at a smaller patch."""
    monkeypatch.setattr(sys, "path", list(sys.path))  # the work dir goes onto a copy
    bench = load_benchmark("estimator_accuracy")
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
    """docs/networks.md's table between its markers is what ``--write-docs`` makes of the
    committed ``benchmarks/results/cpu/estimator_networks.json``."""
    bench = load_benchmark("estimator_accuracy")
    results = json.loads(bench.NETWORKS_RESULTS.read_text())
    rows = results["grids"]["networks"]
    assert [row["name"] for row in rows] == [name for name, _ in bench.NETWORKS]
    assert all("planner" in row for row in rows)
    text = bench.DOCS.read_text()
    between = text.split(bench.TABLE_START + "\n", 1)[1].split(bench.TABLE_END, 1)[0]
    assert between == bench.networks_table(results)
    assert results["cpu"] in between and results["date"] in between


@pytest.mark.slow
def test_a_real_train_py_run_is_measured_against_its_own_config(tmp_path):
    bench = load_benchmark("estimator_accuracy")
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


def test_data_throughput_runs_on_tiny_generated_cases(tmp_path, capsys):
    """benchmarks/data_throughput.py at 1/8 of the real sizes: both of its tables come out, with
    a positive rate in every loader row (and the comparison with the MONAI loader)."""
    bench = load_benchmark("data_throughput")
    common = ["--scale", "0.125", "--batches", "2", "--cache", str(tmp_path)]
    bench.main([*common, "--datasets", "mr,stack", "--workers", "0", "--models", "unet_tiny"])
    out = capsys.readouterr().out
    loader_rows = [line for line in out.splitlines() if line.startswith("| loader |")]
    assert len(loader_rows) == 2
    assert all(float(row.rstrip(" |").split("|")[-1]) > 0 for row in loader_rows)
    assert "| CPU training step | 2x1x4x8x8 | unet_tiny" in out
    assert "| unet_large 2x1x26x150x320 | 27.4 |" in out  # the H200 step it must feed
    bench.main([*common, "--compare"])
    out = capsys.readouterr().out
    assert "| MONAI: CacheDataset" in out and "| volseg: data=folder" in out


def test_cpu_bf16_conv_marks_no_row_of_volsegs_convolution_wrong(capsys):
    bench = load_benchmark("cpu_bf16_conv")
    bench.main(["--channels", "8", "--trials", "1", "--depths", "2,3", "--size", "4"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| volseg")]
    assert len(rows) == 2 and not any("wrong" in row for row in rows), rows
