"""``memory.allocator``: checked as torch checks it, written into ``PYTORCH_CUDA_ALLOC_CONF``
before CUDA starts, inherited by loader workers and DDP processes, recorded in the plan."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import REPO, compose_config
from volseg.utils.alloc_conf import (
    ENV,
    ENV_GENERIC,
    alloc_conf,
    apply_allocator,
    resolve_allocator,
    run_allocator_node,
)
from volseg.utils.errors import UserInputError


def test_keys_become_torchs_string_in_order_with_its_booleans():
    node = {
        "expandable_segments": True,
        "max_split_size_mb": 512,
        "release_lock_on_cudamalloc": None,
    }
    assert alloc_conf(node) == "expandable_segments:True,max_split_size_mb:512"
    divisions = {"roundup_power2_divisions": {256: 1, 512: 2, ">": 4}}
    assert alloc_conf(divisions) == "roundup_power2_divisions:[256:1,512:2,>:4]"
    assert alloc_conf({"garbage_collection_threshold": 0.6}) == "garbage_collection_threshold:0.6"
    assert alloc_conf({"expandable_segments": None}) is None and alloc_conf(None) is None


@pytest.mark.parametrize(
    ("node", "named"),
    [
        ({"expandable_segment": True}, "memory.allocator.expandable_segment: not an allocator"),
        ({"expandable_segments": "yes"}, "memory.allocator.expandable_segments=yes: expected"),
        ({"max_split_size_mb": 4}, "memory.allocator.max_split_size_mb=4: expected"),
        ({"max_split_size_mb": True}, "memory.allocator.max_split_size_mb=True"),
        ({"garbage_collection_threshold": 1.0}, "memory.allocator.garbage_collection_threshold"),
        ({"roundup_power2_divisions": 3}, "memory.allocator.roundup_power2_divisions=3"),
        ({"roundup_power2_divisions": {100: 2}}, "memory.allocator.roundup_power2_divisions"),
        ({"pinned_num_register_threads": 256}, "memory.allocator.pinned_num_register_threads"),
        ({"backend": "cudaMallocAsync"}, "memory.allocator.backend: torch reads"),
        ("expandable_segments:True", "memory.allocator=expandable_segments:True: expected"),
    ],
    ids=str,
)
def test_a_bad_key_or_value_is_one_error_naming_it(node, named):
    with pytest.raises(UserInputError) as raised:
        alloc_conf(node)
    assert str(raised.value).startswith(named) and "\n" not in str(raised.value)


def test_the_config_wins_over_the_environment_and_says_so(caplog):
    environ = {ENV: "garbage_collection_threshold:0.5"}
    with caplog.at_level(logging.WARNING):
        choice = apply_allocator({"expandable_segments": True}, environ)
    assert environ == {ENV: "expandable_segments:True", ENV_GENERIC: "expandable_segments:True"}
    assert choice.source == "configured"
    assert "garbage_collection_threshold:0.5" in choice.why
    assert "replaces 'garbage_collection_threshold:0.5'" in caplog.text
    # no key set: the environment's value stays, and is what the run uses
    environ = {ENV_GENERIC: "expandable_segments:True"}
    assert apply_allocator({"expandable_segments": None}, environ).source == "the environment"
    assert environ == {ENV_GENERIC: "expandable_segments:True"}
    assert resolve_allocator(None, {}).value is None


def test_a_plan_files_setting_reaches_the_environment_too(tmp_path):
    plan = tmp_path / "plan.yaml"
    plan.write_text("config:\n  memory:\n    allocator:\n      expandable_segments: true\n")
    cfg = compose_config("train", tmp_path / "run", [f"plan={plan}"])
    assert alloc_conf(run_allocator_node(cfg)) == "expandable_segments:True"
    cfg = compose_config("train", tmp_path / "run", [f"plan={plan}", "+memory.allocator.x=1"])
    with pytest.raises(UserInputError, match="memory.allocator.x"):
        alloc_conf(run_allocator_node(cfg))


def test_the_plan_records_the_setting_and_the_estimate_models_it(tmp_path, monkeypatch):
    from volseg.plan import make_plan

    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.delenv(ENV_GENERIC, raising=False)
    overrides = ["memory.allocator.expandable_segments=true", "memory.plan_device=cuda"]
    cfg = compose_config("train", tmp_path / "run", overrides)
    plan = make_plan(cfg, estimate_step=False)
    decision = plan.decisions["memory.allocator"]
    assert (decision.value, decision.source) == ("expandable_segments:True", "configured")
    default = make_plan(compose_config("train", tmp_path / "run"), estimate_step=False)
    assert default.decisions["memory.allocator"].source == "default"


# the child: the real train config's memory.allocator through run_task (what every entry point
# calls), then a DataLoader worker and two DDP processes (ddp_fork, CPU) report what they see
CHILD = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    import torch
    import lightning as L
    from volseg.utils.config import compose_run_config
    from volseg.utils.entry import run_task

    out = Path(sys.argv[1])

    class Seen(torch.utils.data.Dataset):
        def __len__(self):
            return 2
        def __getitem__(self, i):
            return os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))
        def training_step(self, batch, i):
            seen = {"process": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"), "worker": batch[0],
                    "cuda_initialized": torch.cuda.is_initialized()}
            (out / f"rank{self.global_rank}.json").write_text(json.dumps(seen))
            return self.w.sum() * 0
        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    def task(cfg):
        loader = torch.utils.data.DataLoader(Seen(), batch_size=1, num_workers=1)
        trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp_fork", max_steps=1,
                            logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False)
        trainer.fit(Module(), loader)

    overrides = ["memory.allocator.expandable_segments=true",
                 "memory.allocator.max_split_size_mb=512"]
    cfg = compose_run_config(Path("configs"), "train", overrides, out / "run")
    run_task(task, cfg)
    """
)


def test_worker_and_ddp_processes_inherit_the_setting(tmp_path):
    env = {**os.environ, ENV: "garbage_collection_threshold:0.5", "PROJECT_ROOT": str(REPO)}
    result = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    expected = "expandable_segments:True,max_split_size_mb:512"
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert seen == {"process": expected, "worker": expected, "cuda_initialized": False}
    # the user's own value was replaced, and a warning said so
    assert "replaces 'garbage_collection_threshold:0.5'" in result.stdout + result.stderr


@pytest.mark.slow
def test_a_bad_key_on_the_command_line_is_one_line_and_exit_2(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "train.py",
            "memory.allocator.max_split_size_mb=4",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.strip().splitlines() == [
        "error: memory.allocator.max_split_size_mb=4: expected a whole number >= 20"
    ]
