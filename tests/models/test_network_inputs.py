"""Networks with particular inputs: one whose constructor fixes the input size (MONAI's UNETR),
and a user's U-Net whose decoder takes its skips as a list and pops them (checkpointed too)."""

from __future__ import annotations

import copy
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from tests.conftest import compose_config
from tests.estimates import estimate, plan_of
from volseg.memory.estimate.margins import planned_total
from volseg.memory.fit.lever_prices import lever_prices
from volseg.memory.fit.step_fit import fit_step
from volseg.models.networks import adapter_for
from volseg.plan import make_plan
from volseg.utils.errors import UserInputError
from volseg.utils.instantiate import build

#: UNETR small enough for a CPU test
UNETR = [
    "model/net=unetr",
    "model.net.hidden_size=48",
    "model.net.mlp_dim=96",
    "model.net.num_heads=4",
    "model.net.feature_size=4",
    "trainer.precision=32",
    "trainer.accelerator=cpu",
    "data.batch_size=2",
]

#: a user's U-Net in two modules: the encoder returns its skips as a list, the decoder pops them
POP_UNET = """
import torch
from torch import nn


def block(cin, cout):
    return nn.Sequential(nn.Conv3d(cin, cout, 3, padding=1), nn.BatchNorm3d(cout), nn.ReLU())


class Encoder(nn.Module):
    def __init__(self, cin, base):
        super().__init__()
        self.levels = nn.ModuleList([block(cin, base), block(base, 2 * base)])
        self.pool = nn.MaxPool3d(2)

    def forward(self, x):
        skips = []
        for level in self.levels:
            x = level(x)
            skips.append(x)
            x = self.pool(x)
        return x, skips


class Decoder(nn.Module):
    def __init__(self, base, classes):
        super().__init__()
        self.up = nn.Upsample(scale_factor=2)
        self.levels = nn.ModuleList([block(4 * base, 2 * base), block(3 * base, base)])
        self.out = nn.Conv3d(base, classes, 1)

    def forward(self, x, skips):
        for level in self.levels:
            x = level(torch.cat([self.up(x), skips.pop()], dim=1))
        return self.out(x)


class UNet(nn.Module):
    def __init__(self, in_channels, num_classes, base=4):
        super().__init__()
        self.encoder = Encoder(in_channels, base)
        self.bottom = block(2 * base, 2 * base)
        self.decoder = Decoder(base, num_classes)

    def forward(self, x):
        x, skips = self.encoder(x)
        return self.decoder(self.bottom(x), skips)
"""


def test_unetr_is_built_for_the_planned_patch(tmp_path):
    planned = make_plan(
        compose_config("train", tmp_path, [*UNETR, "data.patch_size=[32,64,48]"]),
        estimate_step=False,
    )
    decision = planned.decisions["model.net.img_size"]
    assert (decision.value, decision.source) == ([32, 64, 48], "planned")
    assert planned.value("model.divisible_by") == [16, 16, 16]  # no probe of a fixed size
    net = build(planned.run_config().model.net, "model.net")
    assert net(torch.zeros(1, 1, 32, 64, 48)).shape == (1, 5, 32, 64, 48)
    with pytest.raises(UserInputError, match=r"model.net.img_size=\[32, 32, 32\]: UNETR"):
        overrides = [*UNETR, "data.patch_size=[32,64,48]", "model.net.img_size=[32,32,32]"]
        make_plan(compose_config("train", tmp_path, overrides), estimate_step=False)


@pytest.mark.slow
def test_unetr_input_size_moves_with_the_planners_smaller_patch(tmp_path):
    overrides = [*UNETR, "data.patch_size=[32,64,64]", "memory.checkpointing_options=[none,all]"]
    cfg = make_plan(compose_config("train", tmp_path, overrides), estimate_step=False).run_config()
    at_patch = [
        estimate(cfg, batch_size=b, activation_checkpointing=o)
        for b in (1, 2)
        for o in ("none", "all")
    ]
    budget = min(planned_total(e) for e in at_patch) - 1  # nothing fits at 32x64x64
    answer = fit_step(plan_of(cfg, checkpointing_options=["none", "all"]), budget)
    assert answer.fallback == "a smaller patch"
    patch = answer.patch_size
    settings = answer.candidate.settings()
    assert settings["data.patch_size"] == patch
    assert settings["model.net.img_size"] == patch  # moved together
    assert answer.estimate["process_total"] <= budget


def _pop_unet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    (tmp_path / "popping_unet.py").write_text(textwrap.dedent(POP_UNET))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "popping_unet", raising=False)
    return [
        "model/net=custom",
        "model.net._target_=popping_unet.UNet",
        "trainer.precision=32",
        "trainer.accelerator=cpu",
        "data.batch_size=2",
        "data.patch_size=[16,32,32]",
        "memory.val_shape=[16,32,32]",  # validation of one window: the step sets the budget
    ]


@pytest.mark.parametrize("spec", ["all", ["decoder"]])
def test_a_decoder_popping_its_skips_from_a_list_is_checkpointed_with_the_same_gradients(
    tmp_path, monkeypatch, spec
):
    overrides = _pop_unet(tmp_path, monkeypatch)
    planned = make_plan(compose_config("train", tmp_path, overrides), estimate_step=False)
    torch.manual_seed(0)
    net = build(planned.run_config().model.net, "model.net")
    checkpointed = copy.deepcopy(net)
    adapter_for(net).apply_checkpointing(checkpointed, spec)
    decoder = checkpointed.decoder._checkpoint_wrapped_module  # inside torch's wrapper
    calls, forward = [], decoder.forward

    def counted(x, skips):
        calls.append(len(skips))
        return forward(x, skips)

    decoder.forward = counted  # (a recomputation runs no forward hooks)
    x = torch.randn(2, 1, 16, 32, 32)
    for module in (net, checkpointed):
        module(x).square().mean().backward()
    assert calls == [2, 2]  # run again in backward, on the two skips as they were passed
    for (name, a), (_, b) in zip(
        net.named_parameters(), checkpointed.named_parameters(), strict=True
    ):
        assert torch.allclose(a.grad, b.grad, atol=1e-6), name


@pytest.mark.slow
def test_a_decoder_popping_its_skips_plans_under_a_budget(tmp_path, monkeypatch):
    overrides = _pop_unet(tmp_path, monkeypatch)
    cfg = make_plan(compose_config("train", tmp_path, overrides), estimate_step=False).run_config()
    none, every = estimate(cfg), estimate(cfg, activation_checkpointing="all")  # no IndexError
    assert every.process_total < none.process_total  # every block, the decoder too
    budget = (planned_total(none) + planned_total(every)) // 2  # as the planner counts them
    planned = make_plan(
        compose_config("train", tmp_path, [*overrides, f"memory.budget={budget}"]), fit_budget=True
    )
    # the first setting after none, selective, keeps the decoder's concatenations out too
    assert planned.value("model.activation_checkpointing") == "selective"
    assert planned.estimate["process_total"] <= budget


@pytest.mark.slow  # one estimate per lever: ~30 s on 2 cores
def test_unetrs_lever_table_prices_a_smaller_patch_with_its_input_size(tmp_path):
    """The lever table's smaller patch moves UNETR's ``img_size`` with it: a row, no traceback
    (the network fixes its input size in its constructor)."""
    overrides = [*UNETR, "data.patch_size=[32,64,64]", "memory.plan_device=cpu"]
    cfg = make_plan(compose_config("train", tmp_path, overrides), estimate_step=False).run_config()
    rows = lever_prices(plan_of(cfg))
    smaller = next(r for r in rows if r.lever == "a smaller patch")
    assert smaller.setting == "data.patch_size=[16,32,32]"
    assert smaller.peak < rows[0].peak and smaller.flops_factor < 0.5
    assert all(r.peak is not None for r in rows)
