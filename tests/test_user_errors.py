"""Every ordinary mistake on a command line: exit code 2, one message naming the key or file, no
traceback. Most rows run in-process (the composed config through ``run_task``, as the entry
points call it); the mistakes only Hydra sees (unknown keys, missing config files) run as
``python train.py ...``."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import REPO, compose_config, tiny_train_overrides
from volseg.tasks.estimate_memory import run_estimate
from volseg.tasks.evaluate import evaluate
from volseg.tasks.plan import plan_command
from volseg.tasks.predict import predict
from volseg.tasks.train import train
from volseg.utils.config import RENAMED_KEYS, renamed_key
from volseg.utils.entry import run_task

TASKS: dict[str, Callable[[Any], Any]] = {
    "train": train,
    "eval": evaluate,
    "predict": predict,
    "estimate_memory": run_estimate,
    "plan": plan_command,
}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A file that is no checkpoint, a checkpoint of no volseg run, and a volseg checkpoint
    whose weights belong to another network."""
    root = tmp_path_factory.mktemp("files")
    junk = root / "junk.ckpt"
    junk.write_bytes(b"not a checkpoint")
    foreign = root / "foreign.ckpt"
    torch.save({"state_dict": {"w": torch.zeros(1)}}, foreign)
    other_net = root / "other_net.ckpt"
    config = {"model": {"net": {"widths": [2, 4]}}, "data": {"patch_size": [16, 32, 32]}}
    state = {"net.encoder.0.weight": torch.zeros(2, 1, 3, 3, 3)}
    torch.save({"state_dict": state, "volseg": {"config": config}}, other_net)
    return {"junk": junk, "foreign": foreign, "other_net": other_net, "dir": root}


# (entry point, overrides, what the message must contain); {junk}, {foreign}, {other_net},
# {dir} are the files above, {data} the small dataset. Train rows add the tiny-run overrides.
TABLE = [
    ("train", ["data.batch_size=0"], "data.batch_size=0"),
    ("train", ["data.batch_size=two"], "data.batch_size=two"),
    ("train", ["data.samples_per_volume=-1"], "data.samples_per_volume=-1"),
    ("train", ["data.val_fraction=1.5"], "data.val_fraction=1.5"),
    ("train", ["data.cache_rate=2"], "data.cache_rate=2"),
    ("train", ["data.cache=ram"], "data.cache=ram"),
    ("train", ["data.cache=disk", "data.cache_dir=null"], "data.cache_dir"),
    ("train", ["data.patch_size=[16,32]"], "data.patch_size=[16, 32]"),
    ("train", ["data.num_workers=-1"], "data.num_workers=-1"),
    ("train", ["data.root={dir}/nowhere"], "nowhere"),
    ("train", ["data=folder", "data.root=???"], "data.root: no value"),
    ("train", ["model.net.widths=[8]"], "model.net.widths"),
    ("train", ["model.net.decoder_widths=[4]"], "model.net.decoder_widths"),
    ("train", ["model.net.norm=layer"], "model.net.norm"),
    ("train", ["model.net.upsampling=nearest"], "model.net.upsampling"),
    ("train", ["model.net.pooling=half"], "model.net.pooling"),
    ("train", ["model.net.dropout=2"], "model.net"),
    ("train", ["+model.net.kernel=5"], "model.net"),
    ("train", ["model.net._target_=volseg.models.unet.UNet9D"], "model.net"),
    ("train", ["model.optimizer._target_=torch.optim.Adamm"], "model.optimizer"),
    ("train", ["model.activation_checkpointing=middle"], "model.activation_checkpointing"),
    ("train", ["model.activation_checkpointing=[7]"], "model.activation_checkpointing"),
    (
        "train",
        ["model.activation_checkpointing={{encoder: selective, decoder: some}}"],
        "model.activation_checkpointing",
    ),
    ("train", ["model.placement={{a:cpu}}"], "model.placement"),
    (
        "train",
        ["model.placement={{encoder:cuda:7,decoder:cpu}}"],
        "model.placement: encoder: cuda:7 is not a device of this machine",
    ),
    ("train", ["model.placement={{encoder:gpu0,decoder:cpu}}"], "'gpu0' is no device"),
    ("train", ["data.patch_size=[2,32,32]"], "data.patch_size=[2, 32, 32] is too thin"),
    ("train", ["trainer.precision=17"], "trainer.precision=17"),
    ("train", ["trainer.accelerator=tpux"], "trainer.accelerator=tpux"),
    ("train", ["trainer.devices=0"], "trainer.devices=0"),
    ("train", ["memory.budget=lots"], "memory.budget=lots"),
    ("train", ["+memory.allocator.expandable_segment=true"], "memory.allocator.expandable_segment"),
    ("train", ["memory.allocator.max_split_size_mb=4"], "memory.allocator.max_split_size_mb=4"),
    ("predict", ["memory.allocator.expandable_segments=yes"], "allocator.expandable_segments=yes"),
    ("train", ["seed=abc"], "seed=abc"),
    ("train", ["ckpt_path={dir}/missing.ckpt"], "missing.ckpt: file not found"),
    ("train", ["ckpt_path={junk}"], "junk.ckpt: not a loadable checkpoint"),
    ("train", ["ckpt_path={foreign}"], "foreign.ckpt: no volseg config"),
    ("train", ["ckpt_path={other_net}"], "other_net.ckpt: its weights do not fit"),
    ("eval", [], "no value for ckpt_path (no default); set it on the command line: python eval"),
    ("eval", ["ckpt_path={junk}"], "junk.ckpt: not a loadable checkpoint"),
    ("eval", ["ckpt_path={dir}"], "is a folder; give a checkpoint file"),
    ("predict", [], "no value for ckpt_path, input, output"),
    ("predict", ["ckpt_path={junk}", "input={data}"], "no value for output"),
    ("predict", ["ckpt_path={dir}/missing.ckpt", "input=x", "output=y"], "missing.ckpt"),
    ("estimate_memory", ["memory.budget=lots"], "memory.budget=lots"),
    ("train", ["in_channels=2"], "1 image channel(s) (case_000.nii.gz: "),
    ("estimate_memory", ["in_channels=2"], "but in_channels=2: set in_channels=1"),
    ("plan", ["in_channels=2"], "but in_channels=2: set in_channels=1"),
    ("estimate_memory", ["memory.json_out={dir}/no/such/e.json"], "memory.json_out="),
    ("estimate_memory", ["memory.json_out={dir}"], "is a folder"),
    ("estimate_memory", ["memory.json_out={junk}"], "exists"),
]


def _fill(values: list[str], files: dict[str, Path], data: Path) -> list[str]:
    return [v.format(**files, data=data) for v in values]


@pytest.mark.parametrize(("entry", "overrides", "expected"), TABLE, ids=lambda v: str(v))
def test_mistake_is_one_line_and_exit_2(
    entry, overrides, expected, files, small_dataset, tmp_path, capsys
):
    args = _fill(overrides, files, small_dataset)
    trains = ("train", "estimate_memory", "plan")
    base = tiny_train_overrides(small_dataset) if entry in trains else []
    cfg = compose_config(entry, tmp_path / "run", [*base, *args])
    with pytest.raises(SystemExit) as stopped:
        run_task(TASKS[entry], cfg)
    err = capsys.readouterr().err
    assert stopped.value.code == 2, err
    assert "Traceback" not in err
    assert expected.format(**files) in err, err
    assert err.startswith("error: ")
    assert not (tmp_path / "run" / "checkpoints").exists()  # stopped before any training


def _run(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, *args, f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["train.py", "data.batchsize=2"], "data.batchsize"),  # a key that does not exist
        (["train.py", "model=unet_huge"], "unet_huge"),  # a config file that does not exist
        (["train.py", "trainer.max_epochs=[1"], "trainer.max_epochs=[1"),  # does not parse
        (["predict.py", "ckpt_path=x.ckpt"], "no value for input, output"),
        (["train.py", "data.batch_size=0"], "data.batch_size=0"),
    ],
    ids=lambda v: str(v),
)
def test_command_line_mistake_exits_2_without_traceback(args, expected, tmp_path):
    result = _run(args, tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr + result.stdout
    assert expected in result.stderr


def test_renamed_keys_are_named_with_their_replacement():
    assert renamed_key(["data.batch_size=2", "estimate.budget=8GiB"]) == (
        "estimate.budget=8GiB: estimate.budget is gone; use " + RENAMED_KEYS["estimate.budget"]
    )
    assert renamed_key(["memory.budget=8GiB", "+estimate.zero_grad=after_update"]) is None


@pytest.mark.slow
@pytest.mark.parametrize(
    ("entry", "old", "replacement"),
    [
        ("plan.py", "estimate.budget=83MiB", "use memory.budget"),
        ("estimate_memory.py", "estimate.device=cuda", "use memory.plan_device"),
        ("estimate_memory.py", "estimate.search=patch", "use memory.budget"),
        ("train.py", "estimate.zero_grad=after_update", "only the benchmarks"),
    ],
)
def test_an_old_key_is_one_line_naming_its_replacement(entry, old, replacement, tmp_path):
    result = _run([entry, old], tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {old}: ")
    assert replacement in lines[0] and "Traceback" not in result.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    ("arg", "line"),
    [
        (
            "trainer.max_epoch=1",
            "error: trainer.max_epoch=1: trainer.max_epoch is not a config key; did you mean "
            "trainer.max_epochs",
        ),
        (
            "model=unet_huge",
            "error: model=unet_huge: no model named 'unet_huge' in configs/model/; did you mean "
            "unet_large",
        ),
    ],
)
def test_a_typo_is_one_line_naming_the_closest_keys_or_options(arg, line, tmp_path):
    result = _run(["train.py", arg], tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(line), result.stderr
    assert "+trainer" not in lines[0] and "base" not in lines[0]  # no key nothing reads


def test_typos_are_answered_from_the_composed_config():
    from volseg.utils.overrides import explain, group_options

    configs = Path(__file__).resolve().parents[1] / "configs"
    # model/base.yaml is what every preset builds on, not a model to pick
    assert "base" not in group_options(configs, "model")
    assert "unet_tiny" in group_options(configs, "model")
    assert explain(configs, "train", ["model.net.widht=[4,8]"]) == (
        "model.net.widht=[4,8]: model.net.widht is not a config key; did you mean model.net.widths?"
    )
    assert explain(configs, "train", ["trainer.max_epochs=2"]) is None  # composes
