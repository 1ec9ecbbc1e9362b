"""Whatever a user's network returns: a dict or a tuple trains with ``model.net_output`` naming
the logits, a list of outputs with ``model/loss=deep_supervision``; anything else is one line
naming the setting, and a patch the network cannot take names the nearest ones that work."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
import torch

from tests.conftest import SMALL_PATCH, compose_config
from volseg.models.networks.outputs import describe_output, select_output
from volseg.plan.network import nearest_patches
from volseg.tasks.train import train
from volseg.utils.entry import run_task

#: a user's networks: each returns its logits (B, K, D, H, W) in another structure
USER_NETS = """
import torch
from torch import nn


class Small(nn.Module):
    def __init__(self, in_channels, num_classes):
        super().__init__()
        self.body = nn.Sequential(nn.Conv3d(in_channels, 4, 3, padding=1), nn.ReLU())
        self.head = nn.Conv3d(4, num_classes, 1)
        self.aux = nn.Conv3d(4, num_classes, 1)


class DictOut(Small):
    def forward(self, x):
        h = self.body(x)
        return {"aux": self.aux(h), "logits": self.head(h)}


class TupleOut(Small):
    def forward(self, x):
        h = self.body(x)
        return self.head(h), h


class ListOut(Small):
    def forward(self, x):
        h = self.body(x)
        return [self.head(h), self.aux(h)[:, :, ::2, ::2, ::2]]


class FourPoolings(nn.Module):
    def __init__(self, in_channels, num_classes):
        super().__init__()
        self.inc = nn.Conv3d(in_channels, 4, 3, padding=1)
        self.out = nn.Conv3d(8, num_classes, 1)

    def forward(self, x):
        high = self.inc(x)
        low = nn.functional.interpolate(nn.functional.avg_pool3d(high, 16), scale_factor=16)
        return self.out(torch.cat([high, low], 1))
"""


@pytest.fixture
def user_nets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "user_nets.py").write_text(textwrap.dedent(USER_NETS))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "user_nets", raising=False)
    return "user_nets"


def _overrides(data_root: Path, net: str, *more: str) -> list[str]:
    return [
        f"data.root={data_root}",
        f"data.patch_size={SMALL_PATCH}",
        "data.samples_per_volume=1",
        "model/net=custom",
        f"model.net._target_=user_nets.{net}",
        "model.inferer.sw_batch_size=1",
        "trainer.accelerator=cpu",
        "trainer.precision=32",
        "logger=csv",
        "extras.print_config=false",
        "callbacks.rich_progress_bar=null",
        "callbacks.model_summary=null",
        "memory.plan_step=false",
        *more,
    ]


MISTAKES = [
    (["DictOut"], "model.net_output: DictOut returns a dict (keys aux, logits) in training; "),
    (["DictOut", "model.net_output=0"], "model.net_output=0: DictOut returns a dict"),
    (["DictOut", "model.net_output=logit"], "model.net_output=logit: DictOut returns a dict"),
    (["TupleOut"], "name the logits' index with model.net_output=0"),
    (["ListOut"], "model.loss: ListOut returns a list of 2 (tensor, tensor) in training; "),
    (["ListOut"], "model/loss=deep_supervision"),
    (["FourPoolings", "data.patch_size=[24,32,40]"], "divide by 16 (model.divisible_by)"),
    (["FourPoolings", "data.patch_size=[24,32,40]"], "data.patch_size=[16,32,32] or [32,32,48]"),
]


@pytest.mark.parametrize(("args", "expected"), MISTAKES, ids=lambda v: str(v))
def test_a_network_output_or_patch_that_cannot_train_is_one_line_and_exit_2(
    args, expected, user_nets, small_dataset, tmp_path, capsys
):
    cfg = compose_config("train", tmp_path / "run", _overrides(small_dataset, *args))
    with pytest.raises(SystemExit) as stopped:
        run_task(train, cfg)
    err = capsys.readouterr().err
    assert stopped.value.code == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    assert expected in err, err
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.parametrize(
    "args",
    [
        ["DictOut", "model.net_output=logits"],
        ["TupleOut", "model.net_output=0"],
        ["ListOut", "model/loss=deep_supervision"],
    ],
    ids=lambda v: v[0],
)
def test_a_network_returning_a_dict_tuple_or_list_trains_with_its_setting(
    args, user_nets, small_dataset, tmp_path
):
    cfg = compose_config("train", tmp_path / "run", _overrides(small_dataset, *args, "debug=fdr"))
    metrics = train(cfg)
    assert torch.isfinite(torch.tensor(metrics["train/loss"]))


def test_select_output_takes_a_key_or_an_index():
    logits, aux = torch.zeros(1), torch.ones(1)
    assert select_output({"logits": logits, "aux": aux}, "logits") is logits
    assert select_output((aux, logits), 1) is logits
    assert select_output(logits, None) is logits
    with pytest.raises(TypeError):
        select_output((logits,), "logits")
    assert describe_output({"a": logits}) == "a dict (keys a)"


def test_the_nearest_patches_divide_by_the_multiple():
    assert nearest_patches([26, 150, 320], [16, 16, 16]) == [[16, 144, 320], [32, 160, 320]]
    assert nearest_patches([8, 48, 48], [16, 16, 16]) == [[16, 48, 48]]
