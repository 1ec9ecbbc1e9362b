"""trainer.precision=auto and the CPU rules: each device kind, explicit values, the log line."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest
import torch

from tests.conftest import REPO, compose_config, planned_config, tiny_train_overrides
from volseg.memory.estimate.training_step import planned_precision
from volseg.plan.make import plan_device
from volseg.tasks.train import train
from volseg.utils import cpu
from volseg.utils.cpu import cpu_bf16_native
from volseg.utils.errors import UserInputError
from volseg.utils.precision import EMULATED_BF16_STEP_SLOWDOWN, log_choice, resolve_precision

# (requested, device, native bf16 / GPU bf16) -> what runs
CASES = [
    ("auto", "cuda", True, "bf16-mixed"),
    ("auto", "cuda", False, "16-mixed"),
    ("16-mixed", "cuda", True, "16-mixed"),
    ("bf16-mixed", "cuda", False, "bf16-mixed"),
    ("auto", "cpu", True, "bf16-mixed"),
    ("auto", "cpu", False, "32"),
    ("16-mixed", "cpu", True, "bf16-mixed"),
    ("16-mixed", "cpu", False, "32"),
    ("bf16-mixed", "cpu", False, "bf16-mixed"),
    ("bf16-true", "cpu", False, "bf16-true"),
    ("16-true", "cpu", False, "16-true"),
    ("32", "cpu", True, "32"),
]


@pytest.mark.parametrize(("requested", "device", "bf16", "runs"), CASES)
def test_precision_resolves_by_device_kind(requested, device, bf16, runs):
    choice = resolve_precision(requested, device, bf16_native=bf16, cuda_bf16=bf16)
    assert (choice.requested, choice.precision, choice.device) == (requested, runs, device)


def test_cuda_auto_asks_the_gpu(monkeypatch, tmp_path):
    """The capability query decides, not a guess: a stand-in GPU without bfloat16 gets fp16."""
    cfg = compose_config("train", tmp_path, ["trainer.accelerator=auto"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    assert plan_device(cfg).value == "cuda"
    assert resolve_precision("auto", "cuda").precision == "16-mixed"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert resolve_precision("auto", "cuda").precision == "bf16-mixed"


def test_explicit_bf16_on_an_emulating_cpu_warns_with_the_slowdown(caplog):
    choice = resolve_precision("bf16-mixed", "cpu", bf16_native=False)
    with caplog.at_level(logging.INFO, logger="volseg.utils.precision"):
        log_choice(choice)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    message = warnings[0].getMessage()
    assert len(warnings) == 1 and "60x to 65x slower per training step" in message
    assert choice.precision == "bf16-mixed"


def test_the_plan_resolves_the_trainer_precision_with_one_log_line(caplog, tmp_path):
    assert compose_config("train", tmp_path, []).trainer.precision == "auto"
    with caplog.at_level(logging.INFO, logger="volseg.utils.precision"):
        cfg = planned_config("train", tmp_path, ["trainer.accelerator=cpu"])
    expected = "bf16-mixed" if cpu_bf16_native() else "32"
    choice = resolve_precision("auto", "cpu")
    assert cfg.trainer.precision == choice.precision == expected
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [f"trainer.precision=auto runs as {expected} on cpu: {choice.reason}"]


def test_the_estimator_takes_the_plans_precision_and_resolves_none(tmp_path):
    cfg = compose_config("train", tmp_path / "raw", [])  # trainer.precision=auto, not planned
    with pytest.raises(UserInputError, match="planned precision"):
        planned_precision(cfg)
    planned = planned_config("train", tmp_path / "planned", ["memory.plan_device=cuda"])
    assert planned_precision(planned) == "bf16-mixed"  # no GPU here: one with bfloat16 assumed


@pytest.mark.slow
def test_summary_records_the_choice(small_dataset, tmp_path):
    overrides = [*tiny_train_overrides(small_dataset), "trainer.max_epochs=1"]
    overrides += ["trainer.limit_train_batches=1", "trainer.limit_val_batches=1"]
    cfg = compose_config("train", tmp_path, overrides)
    train(cfg)
    summary = json.loads((tmp_path / "summary.json").read_text())
    choice = summary["precision_choice"]
    assert choice["requested"] == "auto" and choice["device"] == "cpu"
    assert choice["precision"] == summary["precision"].replace("-true", "")


@pytest.mark.slow
def test_sixteen_mixed_runs_as_float32_where_bf16_is_emulated(small_dataset, tmp_path):
    """oneDNN capped at AVX2 behaves as on an AVX2-only CPU: 16-mixed must not run as bf16."""
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2", "PYTHONUNBUFFERED": "1"}
    args = [
        "train.py",
        "trainer.precision=16-mixed",
        f"data.root={small_dataset}",
        "data.patch_size=[16,32,32]",
        "model.net.widths=[4,8,16]",
        "trainer.max_steps=1",
        "trainer.limit_val_batches=1",
        "callbacks.rich_progress_bar=null",
        "memory.plan_step=false",
        f"hydra.run.dir={tmp_path}",
    ]
    result = subprocess.run(
        [sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    log = (tmp_path / "train.log").read_text()
    assert "trainer.precision=16-mixed runs as 32 on cpu: fp16 autocast needs CUDA" in log
    assert json.loads((tmp_path / "summary.json").read_text())["precision"] == "32-true"
    # one step ends the run before its first validation: said so, not "Best ...: -inf"
    assert "Best val/dice_mean: none, no validation ran (stopped at step 1" in log


def test_native_bf16_needs_the_bf16_instructions_not_only_onednn(monkeypatch):
    """oneDNN says yes from plain AVX-512 on; only AVX512_BF16/AMX make bf16 fast."""
    monkeypatch.setattr(cpu.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True)
    without = {flag: False for flag in cpu.ISA_FLAGS} | {"avx2": True, "avx512f": True}
    monkeypatch.setattr(cpu, "cpu_flags", lambda: without)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    assert not cpu.cpu_bf16_native()  # AVX-512 without AVX512_BF16
    monkeypatch.setattr(cpu, "cpu_flags", lambda: without | {"avx512_bf16": True})
    assert cpu.cpu_bf16_native()
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert not cpu.cpu_bf16_native()
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")
    assert cpu.cpu_bf16_native()
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)
    assert not cpu.cpu_bf16_native()


@pytest.mark.parametrize(
    ("amx", "cap", "expected"),
    [
        (True, None, True),
        (True, "AVX512_CORE_AMX", True),
        (True, "AVX512_CORE_BF16", False),  # held below AMX: the blocked avx512_core_bf16 kernels
        (True, "AVX2", False),
        (False, None, False),
    ],
)
def test_onednn_runs_bf16_convolutions_on_amx_only_with_amx_and_no_lower_cap(
    monkeypatch, amx, cap, expected
):
    """The bf16 convolution scratch rule (``volseg.memory.estimate.workspace``) follows this
    choice."""
    flags = {flag: False for flag in cpu.ISA_FLAGS} | {"amx_bf16": amx}
    monkeypatch.setattr(cpu, "cpu_flags", lambda: flags)
    if cap is None:
        monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    else:
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    assert cpu.onednn_uses_amx() is expected


def test_the_emulated_bf16_slowdown_is_the_results_files_own():
    """The warning's range is the training-step ratio of every ``cpu_precision.py`` file run with
    oneDNN held to AVX2 kernels, rounded (read here from the committed files)."""
    ratios = []
    for path in sorted((REPO / "benchmarks" / "results" / "cpu").glob("*_cpu_precision*.json")):
        doc = json.loads(path.read_text())
        if doc.get("onednn_max_cpu_isa") == "AVX2":
            ratios += [r["bf16_s"] / r["float32_s"] for r in doc["rows"] if "step" in r["work"]]
    assert len(ratios) >= 2
    assert (round(min(ratios)), round(max(ratios))) == EMULATED_BF16_STEP_SLOWDOWN
