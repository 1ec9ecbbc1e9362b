"""What the plan learns of a network no adapter knows, on meta tensors."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import hydra
import torch
from omegaconf import DictConfig, OmegaConf

from volseg.models.checkpointing import BATCH_NORMS
from volseg.models.networks.contract import first_tensor

#: what constructors call the image channels and the classes, volseg's name first
IN_CHANNEL_NAMES = (
    "in_channels",
    "n_channels",
    "in_ch",
    "in_chans",
    "input_channels",
    "num_input_channels",
    "n_input_channels",
    "channels_in",
)
CLASS_NAMES = (
    "num_classes",
    "out_channels",
    "n_classes",
    "classes",
    "out_ch",
    "output_channels",
    "num_output_channels",
    "n_output_channels",
    "channels_out",
)
#: the probe tries sides 3 * 2^k for k up to this (a multiple of up to 64 is found)
MAX_POWER = 6


def channel_names(cls: type) -> dict[str, str]:
    """``{"in_channels": name, "num_classes": name}``: the first of :data:`IN_CHANNEL_NAMES` /
    :data:`CLASS_NAMES` the constructor takes (volseg's where it takes ``**kwargs``)."""
    params = inspect.signature(cls.__init__).parameters
    var_keyword = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    out = {}
    for key, names in (("in_channels", IN_CHANNEL_NAMES), ("num_classes", CLASS_NAMES)):
        found = next((n for n in names if n in params), key if var_keyword else None)
        if found is not None:
            out[key] = found
    return out


def _moved_to_meta(net: torch.nn.Module) -> torch.nn.Module:
    """``net`` on the meta device: its parameters and buffers, and the tensors its modules hold
    as plain attributes (which ``Module.to`` leaves where they are)."""
    net = net.to("meta")
    for module in net.modules():
        for name, value in list(vars(module).items()):
            if isinstance(value, torch.Tensor) and not value.is_meta:
                setattr(module, name, value.to("meta"))
    return net


def _built_for_probing(net_cfg: DictConfig, training: bool = False) -> tuple[torch.nn.Module, Any]:
    """The network on the meta device (in train mode with ``training``), and the context to run
    it in. Where the constructor reads a value (no meta tensor has one), it is built on the CPU
    and moved there, and runs under ``torch.device("meta")``: what its forward makes without a
    device is a meta tensor too."""
    options = OmegaConf.to_container(net_cfg, resolve=True)
    try:
        with torch.device("meta"):
            net = hydra.utils.instantiate(options)
    except Exception:
        net = _moved_to_meta(hydra.utils.instantiate(options))
        return net.train(training), torch.device("meta")
    return net.train(training), contextlib.nullcontext()


def shape_taker(net_cfg: DictConfig, in_channels: int) -> Callable[[Sequence[int]], bool]:
    """Whether the network maps a patch ``[D, H, W]`` to logits of its shape."""
    net, context = _built_for_probing(net_cfg)

    def takes(shape: Sequence[int]) -> bool:
        shape = [int(s) for s in shape]
        try:
            with context, torch.no_grad():
                out = first_tensor(net(torch.empty(1, in_channels, *shape, device="meta")))
        except Exception:  # any complaint about the shape: it does not take that shape
            return False
        return out is not None and list(out.shape[-3:]) == shape

    return takes


def probe_divisibility(net_cfg: DictConfig, in_channels: int) -> list[int]:
    """Per axis, the smallest ``2^k`` such that the network keeps every side ``3 * 2^j`` (``k <= j
    <= MAX_POWER``); ``ValueError`` when it keeps none."""
    takes = shape_taker(net_cfg, in_channels)
    large = 3 * 2**MAX_POWER
    divisors = []
    for axis in range(3):
        sides = [3 * 2**k for k in range(MAX_POWER + 1)]
        kept = [takes([side if a == axis else large for a in range(3)]) for side in sides]
        if not kept[-1]:
            raise ValueError(
                f"divisible_by: probing {net_cfg.get('_target_')} on meta tensors, no side up to "
                f"{large} voxels kept its shape on axis {'DHW'[axis]}; set model.divisible_by="
                "[D,H,W] (what each patch side must divide by)"
            )
        first = MAX_POWER
        while first > 0 and kept[first - 1]:
            first -= 1
        divisors.append(2**first)
    return divisors


def describe(value: Any) -> str:
    """A divisibility ``[d, h, w]`` as text: ``16`` when the axes agree."""
    return str(value[0]) if len(set(value)) == 1 else str(list(value))


def network_divisibility(
    net_cfg: DictConfig, patch: Sequence[int] | None, in_channels: int
) -> tuple[list[int], str]:
    """What each patch side must divide by and why: the adapter's (``patch``: the training patch;
    ``None``: before one is planned), else probed."""
    from volseg.models.networks import adapter_for

    adapter = adapter_for(str(net_cfg._target_))
    known = adapter.divisibility(net_cfg, patch)
    if known is not None:
        why = f"{adapter.family}: its settings make each side divide by {describe(known)}"
        return list(known), why
    probed = probe_divisibility(net_cfg, in_channels)
    why = f"probed on meta tensors: the smallest multiple each side keeps ({describe(probed)})"
    return probed, why


def training_output(net_cfg: DictConfig, in_channels: int, patch: Sequence[int]) -> Any:
    """What the network returns in training for ``patch``; ``None`` where it fails."""
    try:
        net, context = _built_for_probing(net_cfg, training=True)
        with context, torch.no_grad():
            return net(torch.empty(1, in_channels, *[int(s) for s in patch], device="meta"))
    except Exception:  # any complaint: not this probe's to report
        return None


def has_batch_norm(net_cfg: DictConfig) -> bool:
    """Whether the network of ``net_cfg`` holds a BatchNorm layer (built on the meta device)."""
    try:
        net, _ = _built_for_probing(net_cfg)
    except Exception:  # not buildable here: building it for the run says why
        return False
    return any(isinstance(m, BATCH_NORMS) for m in net.modules())
