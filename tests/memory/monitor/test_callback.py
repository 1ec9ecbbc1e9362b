"""The memory monitor on the CPU: mem/* keys, timeline, per-layer trace, OOM report, no leak."""

from __future__ import annotations

import csv
import json
import logging
import subprocess
import sys
from pathlib import Path

import hydra
import lightning as L
import pytest
import torch

from tests.conftest import REPO, compose_config, tiny_train_overrides
from volseg.memory.monitor.callback import MemoryMonitor
from volseg.memory.monitor.layers import CSV_COLUMNS
from volseg.plan import make_plan
from volseg.tasks.train import train

SIZE_KEYS = [
    "mem/allocated_mib",
    "mem/reserved_mib",
    "mem/peak_allocated_mib",
    "mem/peak_reserved_mib",
    "mem/peak_fwd_mib",
    "mem/peak_bwd_mib",
    "mem/peak_opt_mib",
]
COUNT_KEYS = ["mem/fragmentation_mib", "mem/alloc_retries", "mem/ooms"]


def _mem_rows(run_dir: Path) -> dict[int, dict[str, float]]:
    with open(run_dir / "csv" / "metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r.get("mem/allocated_mib")]
    return {
        int(r["step"]): {k: float(v) for k, v in r.items() if k.startswith("mem/") and v}
        for r in rows
    }


@pytest.fixture(scope="module")
def traced_run(small_dataset, tmp_path_factory) -> Path:
    """2 epochs (4 steps) at float32 with step 2 traced per module; activations dominate.

    A fresh process, as `python train.py` is: the resident-memory figures of a long pytest
    process also move with whatever earlier tests left for the garbage collector.
    """
    run_dir = tmp_path_factory.mktemp("traced")
    overrides = [
        *tiny_train_overrides(small_dataset),
        "model.net.widths=[16,32,64]",
        "data.patch_size=[16,48,48]",
        "trainer.precision=32",
        "memory.trace_step=2",
        "memory.host_mmap_threshold=65536",
        f"hydra.run.dir={run_dir}",
    ]
    result = subprocess.run(
        [sys.executable, "train.py", *overrides],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Memory by module" in (run_dir / "train.log").read_text()
    return run_dir


@pytest.mark.slow
def test_every_step_logs_every_key_and_the_run_gets_pictures(traced_run):
    rows = _mem_rows(traced_run)
    assert sorted(rows) == [0, 1, 2, 3]
    for step, row in rows.items():
        for key in SIZE_KEYS:
            assert row[key] > 0, (step, key)
        for key in COUNT_KEYS:
            assert row[key] >= 0, (step, key)
        # the step's peak is the largest of its phases' peaks and at least what is held at its end
        phases = [row["mem/peak_fwd_mib"], row["mem/peak_bwd_mib"], row["mem/peak_opt_mib"]]
        assert row["mem/peak_allocated_mib"] == pytest.approx(max(phases), abs=0.01)
        assert row["mem/peak_allocated_mib"] >= row["mem/allocated_mib"] - 0.01
    assert (traced_run / "memory_timeline.png").stat().st_size > 10_000
    memory = json.loads((traced_run / "summary.json").read_text())["memory"]
    assert memory["device"] == "host" and memory["logged_steps"] == 4
    assert memory["peak_phase"] in {"fwd", "bwd", "opt"}
    assert memory["peak_allocated_mib"] == pytest.approx(
        max(r["mem/peak_allocated_mib"] for r in rows.values()), abs=0.1
    )


def test_layer_trace_accounts_for_the_forward_peak(traced_run):
    with open(traced_run / "memory_layers.csv") as f:
        layers = list(csv.DictReader(f))
    assert list(layers[0]) == CSV_COLUMNS
    assert (traced_run / "memory_layers.png").stat().st_size > 5_000
    blocks = {
        r["module"]: float(r["own_activations_mib"]) for r in layers if r["is_block"] == "True"
    }
    assert {"net.inc", "net.downs.0", "net.ups.0", "net.head"} <= set(blocks)
    # full-resolution levels (encoder inc, decoder ups.0) hold most of the activations ...
    assert blocks["net.inc"] + blocks["net.ups.0"] > 0.5 * sum(blocks.values())
    # ... and the parameters are a sliver next to them
    params = float(next(r for r in layers if r["module"] == "net")["own_params_mib"])
    assert params < 0.1 * sum(blocks.values())
    # what the modules' forwards kept alive is what the process grew by in the forward phase
    step = _mem_rows(traced_run)[2]
    growth = step["mem/peak_fwd_mib"] - step["mem/step_start_allocated_mib"]
    assert sum(blocks.values()) == pytest.approx(growth, rel=0.10)
    phases = {r["phase"] for r in layers if r["module"] == "net"}
    assert {"pre_forward", "post_forward", "pre_backward", "post_backward"} <= phases


def test_optimizer_state_is_not_mistaken_for_activations(traced_run):
    with open(traced_run / "memory_layers.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["module"] == "net"]
    after_forward = next(r for r in rows if r["phase"] == "post_forward")
    params = float(after_forward["params_mib"])
    # AdamW keeps two moments per parameter: exactly 2x the parameter bytes, from step 1 on
    assert float(after_forward["optimizer_state_mib"]) == pytest.approx(2 * params, rel=0.01)
    assert float(after_forward["activations_mib"]) > 10 * params


class _OutOfMemoryAtStep(L.Callback):
    """Makes the first decoder level's forward raise CUDA's OOM error at ``step``."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            pl_module.net.ups[0].register_forward_hook(self._raise)

    @staticmethod
    def _raise(module, args, output) -> None:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


def _fit_until_out_of_memory(train_cfg, raiser: L.Callback, **trainer_options) -> None:
    """Fit with the memory monitor until ``raiser`` raises CUDA's OOM error (re-raised)."""
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        callbacks=[MemoryMonitor(train_cfg.paths.output_dir), raiser],
        **trainer_options,
    )
    planned = make_plan(train_cfg, estimate_step=False).run_config()  # lr=auto planned
    with pytest.raises(torch.OutOfMemoryError):
        trainer.fit(hydra.utils.instantiate(planned.model), hydra.utils.instantiate(planned.data))


def test_out_of_memory_prints_the_report_and_re_raises(train_cfg, capsys):
    _fit_until_out_of_memory(train_cfg, _OutOfMemoryAtStep(1))
    out = capsys.readouterr().out
    assert "CUDA out of memory in a training step." in out
    assert "failed during: fwd" in out
    assert "by category: params" in out and "optimizer_state" in out
    assert "activation checkpointing" in out and "data.batch_size" in out


class _OutOfMemoryInValidation(L.Callback):
    """Raises CUDA's OOM error from the network's forward during the first real validation."""

    def on_validation_start(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            pl_module.net.ups[0].register_forward_hook(_OutOfMemoryAtStep._raise)


def test_out_of_memory_in_validation_names_validation_and_its_levers(train_cfg, capsys):
    _fit_until_out_of_memory(train_cfg, _OutOfMemoryInValidation(), num_sanity_val_steps=0)
    out = capsys.readouterr().out
    assert "CUDA out of memory in validation (sliding-window inference)." in out
    assert "training step" not in out and "failed during" not in out
    assert "model.inferer.sw_batch_size=1" in out and "model.inferer.device=cpu" in out


def test_each_rank_dumps_its_own_snapshot(tmp_path):
    from volseg.memory.monitor.callback import snapshot_path

    assert snapshot_path(tmp_path, 0, 1) == tmp_path / "memory_snapshot.pickle"
    paths = {snapshot_path(tmp_path, rank, 4) for rank in range(4)}
    assert len(paths) == 4 and tmp_path / "memory_snapshot_rank3.pickle" in paths


def test_snapshots_on_cpu_say_they_need_cuda_and_training_goes_on(train_cfg, tmp_path, caplog):
    train_cfg.memory.snapshot_steps = 2
    with caplog.at_level(logging.INFO):
        train(train_cfg)
    assert "allocator snapshots need CUDA" in caplog.text
    assert not (Path(train_cfg.paths.output_dir) / "memory_snapshot.pickle").exists()
    assert (Path(train_cfg.paths.output_dir) / "summary.json").is_file()


@pytest.mark.slow
def test_no_memory_growth_over_200_steps(small_dataset, tmp_path):
    overrides = [
        *tiny_train_overrides(small_dataset),
        "model.net.widths=[4,8]",
        "data.samples_per_volume=50",  # 4 volumes x 50 / batch 2 = 100 steps per epoch
        "trainer.max_epochs=2",
        "trainer.limit_val_batches=0",
        "trainer.precision=32",
        "memory.host_mmap_threshold=65536",
        "callbacks.model_checkpoint=null",
        "callbacks.early_stopping=null",
    ]
    cfg = compose_config("train", tmp_path / "run", overrides)
    train(cfg)
    rows = _mem_rows(Path(cfg.paths.output_dir))
    assert max(rows) == 199
    after_10th, after_last = rows[9]["mem/allocated_mib"], rows[199]["mem/allocated_mib"]
    assert after_last == pytest.approx(after_10th, rel=0.01)


def test_cuda_snapshot_records_k_steps_once_and_dumps(tmp_path, monkeypatch):
    from types import SimpleNamespace

    calls = []
    monkeypatch.setattr(
        torch.cuda.memory,
        "_record_memory_history",
        lambda enabled="all", **kw: calls.append(("record", enabled)),
    )
    monkeypatch.setattr(
        torch.cuda.memory, "_dump_snapshot", lambda path: calls.append(("dump", path))
    )
    monitor = MemoryMonitor(tmp_path, every_n_steps=1000, snapshot_steps=2)
    monitor.reader = SimpleNamespace(kind="cuda")  # a CUDA run, steps not logged (1000)
    trainer = SimpleNamespace(global_step=7, global_rank=0, world_size=1)  # resumed at step 7
    for _ in range(5):
        monitor.on_train_batch_start(trainer, None, None, 0)
        trainer.global_step += 1
        monitor.on_train_batch_end(trainer, None, None, None, 0)
    snapshot = str(tmp_path / "memory_snapshot.pickle")
    # recording starts at the fit's first step, stops after 2 steps, and never starts again
    assert calls == [("record", "all"), ("dump", snapshot), ("record", None)]


def test_a_split_network_gets_a_reader_for_its_other_device():
    from types import SimpleNamespace

    from volseg.memory.monitor.callback import placed_readers
    from volseg.models.levers import MemoryLevers

    def placed(encoder: str, decoder: str) -> SimpleNamespace:
        return SimpleNamespace(
            levers=MemoryLevers(placement={"encoder": encoder, "decoder": decoder})
        )

    readers = placed_readers(placed("cuda:0", "cpu"), torch.device("cuda", 0))
    assert list(readers) == ["cpu"] and readers["cpu"].kind == "host"
    same = placed("cpu", "cpu")
    assert placed_readers(same, torch.device("cpu")) == {}
    assert placed_readers(SimpleNamespace(), torch.device("cpu")) == {}


def test_cuda_runs_log_the_host_resident_set_next_to_the_device_keys(tmp_path):
    from types import SimpleNamespace

    from volseg.data.host_memory import process_rss
    from volseg.memory.monitor.readers import MemoryReading

    class FakeCudaReader:
        kind = "cuda"

        def read(self) -> MemoryReading:
            return MemoryReading(100 * 2**20, 200 * 2**20, 150 * 2**20, 250 * 2**20)

        def reset_peak(self) -> None:
            pass

    monitor = MemoryMonitor(tmp_path)
    monitor.reader = FakeCudaReader()
    trainer = SimpleNamespace(global_step=0, loggers=[], is_global_zero=True)
    monitor.on_train_batch_start(trainer, None, None, 0)
    monitor.on_before_backward(trainer, None, None)
    monitor.on_after_backward(trainer, None)
    trainer.global_step += 1
    monitor.on_train_batch_end(trainer, None, None, None, 0)
    row = monitor.history[0]
    assert row["mem/allocated_mib"] == 100  # the device's, from the allocator
    assert row["mem/host_rss_mib"] == pytest.approx(process_rss() / 2**20, rel=0.2)
    assert monitor.summary()["peak_host_rss_mib"] == round(row["mem/host_rss_mib"], 1)
