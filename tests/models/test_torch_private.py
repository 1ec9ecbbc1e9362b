"""torch's private names in models/, as volseg.models.networks.contract imports them (the one
place): where torch moves or changes one, its test says what of volseg breaks. And the public
classes that stand for torch's private BatchNorm and convolution bases."""

from __future__ import annotations

import inspect
from collections import namedtuple

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from volseg.models.checkpointing import BATCH_NORMS, CONVOLUTIONS
from volseg.models.networks import contract
from volseg.models.networks.probe import has_batch_norm, probe_divisibility, training_output


def test_the_checkpoint_wrapper_is_where_torch_had_it():
    """torch.distributed.algorithms._checkpoint.checkpoint_wrapper: no public path in torch."""
    breaks = (
        "model.activation_checkpointing of every network but UNet3D "
        "(NetworkAdapter.apply_checkpointing: all, selective, a list or a mapping)"
    )
    wrapper = inspect.signature(contract.checkpoint_wrapper).parameters
    assert "checkpoint_fn" in wrapper, breaks
    applier = inspect.signature(contract.apply_activation_checkpointing).parameters
    assert {"checkpoint_wrapper_fn", "check_fn"} <= set(applier), breaks
    net = nn.Sequential(nn.Conv3d(1, 2, 3, padding=1), nn.ReLU(), nn.Conv3d(2, 2, 1))
    keys = set(net.state_dict())
    calls = []

    def recompute(module, *args, **kwargs):
        calls.append(module)
        return module(*args, **kwargs)

    contract.apply_activation_checkpointing(
        net,
        checkpoint_wrapper_fn=lambda m: contract.checkpoint_wrapper(m, checkpoint_fn=recompute),
        check_fn=lambda m: isinstance(m, nn.Conv3d),
    )
    net(torch.randn(1, 1, 4, 4, 4))
    assert calls == [net[0]._checkpoint_wrapped_module, net[2]._checkpoint_wrapped_module], breaks
    # a checkpoint of a checkpointed network loads into one without (and back)
    assert set(net.state_dict()) == keys, "checkpoints of a checkpointed network: " + breaks


def test_torchs_pytree_is_where_torch_had_it():
    """torch.utils._pytree: torch 2.13 has no public torch.utils.pytree."""
    first = "the probe's output of a network (probe.shape_taker, contract.first_tensor)"
    a, b = torch.zeros(1), torch.ones(2)
    assert contract.first_tensor([a, b]) is a, first
    assert contract.first_tensor({"logits": b, "aux": a}) is b, first
    assert contract.first_tensor((1, [None, {"x": a}])) is a, first
    assert contract.first_tensor([1, "x"]) is None, first
    recompute = "a checkpointed block called with containers (contract._recompute: nnU-Net's skips)"
    Pair = namedtuple("Pair", "left right")
    args = ([a, b], {"skips": Pair(a, b)})
    copied = contract.tree_map(lambda leaf: leaf, args)
    assert copied == args and copied[0] is not args[0], recompute  # containers rebuilt
    assert type(copied[1]["skips"]) is Pair and copied[1]["skips"].left is a, recompute
    place = "model.placement (contract._inputs_to: a submodule's tensor inputs moved)"
    moved = contract.tree_map_only(torch.Tensor, lambda t: t.to(torch.float64), ([a], {"k": 3}))
    assert moved[0][0].dtype == torch.float64 and moved[1] == {"k": 3}, place


def _classes_below(base: type) -> set[type]:
    return {c for c in vars(nn).values() if isinstance(c, type) and issubclass(c, base)}


def test_the_public_batch_norms_and_convolutions_are_all_of_torchs():
    """BATCH_NORMS and CONVOLUTIONS stand for torch's private _BatchNorm and _ConvNd: a class
    torch adds below them and not to these tuples would not count (checkpointing's frozen
    statistics and selective chains, the plan's BatchNorm note, selective's lone layers)."""
    batch_norm = getattr(nn.modules.batchnorm, "_BatchNorm", None)
    conv = getattr(nn.modules.conv, "_ConvNd", None)
    assert batch_norm is not None and conv is not None, "torch moved its bases: check the tuples"
    missing = {c for c in _classes_below(batch_norm) if not issubclass(c, BATCH_NORMS)}
    assert not missing, f"BatchNorm layers not in BATCH_NORMS: {missing}"
    missing = {c for c in _classes_below(conv) if not issubclass(c, CONVOLUTIONS)}
    assert not missing, f"convolutions not in CONVOLUTIONS: {missing}"
    assert all(issubclass(c, batch_norm) for c in BATCH_NORMS)
    assert all(issubclass(c, conv) for c in CONVOLUTIONS)


class ReadsAValue(nn.Module):
    """A network whose constructor reads a tensor's value (no meta tensor has one), holding a
    tensor as a plain attribute and making one without a device in its forward; pooled by 4,
    with BatchNorm, deep supervision's list in training."""

    def __init__(self, in_channels: int = 1, num_classes: int = 2) -> None:
        super().__init__()
        kernel = int(torch.tensor(3).item())
        self.conv = nn.Conv3d(in_channels, num_classes, kernel, padding=1)
        self.norm = nn.BatchNorm3d(num_classes)
        self.pool, self.up = nn.MaxPool3d(4), nn.Upsample(scale_factor=4)
        self.scale = torch.ones(num_classes, 1, 1, 1)  # not a buffer: Module.to leaves it

    def forward(self, x: torch.Tensor) -> torch.Tensor | list[torch.Tensor]:
        y = self.up(self.pool(self.norm(self.conv(x)))) * self.scale + torch.zeros(1)
        return [y, y[:, :, ::2, ::2, ::2]] if self.training else y


def test_a_network_built_on_the_cpu_is_probed_on_the_meta_device():
    cfg = OmegaConf.create({"_target_": f"{__name__}.ReadsAValue"})
    with pytest.raises(RuntimeError), torch.device("meta"):  # its constructor fails there
        ReadsAValue()
    assert probe_divisibility(cfg, 1) == [4, 4, 4]
    assert has_batch_norm(cfg)
    out = training_output(cfg, 1, [8, 16, 16])
    assert [tuple(t.shape) for t in out] == [(1, 2, 8, 16, 16), (1, 2, 4, 8, 8)]
    assert all(t.is_meta for t in out)


@pytest.mark.parametrize(
    ("layer", "options", "expected"),
    [
        ("BatchNorm3d", {"num_features": 2}, True),
        ("SyncBatchNorm", {"num_features": 2}, True),
        ("LazyBatchNorm3d", {}, True),
        ("InstanceNorm3d", {"num_features": 2}, False),
    ],
)
def test_every_batch_norm_is_one(layer, options, expected):
    cfg = OmegaConf.create({"_target_": f"torch.nn.{layer}", **options})
    assert has_batch_norm(cfg) is expected
