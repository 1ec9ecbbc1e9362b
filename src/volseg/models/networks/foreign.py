"""Adapters for nnU-Net's ``dynamic-network-architectures`` U-Nets and pytorch-3dunet's (neither
imported here)."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from functools import partial
from typing import Any

import torch
from hydra.utils import get_class
from torch import nn

from volseg.models.checkpointing import selective_chain
from volseg.models.networks.contract import (
    CheckpointSpec,
    NetworkAdapter,
    Planned,
    flatten_chain,
    sequential_inside,
    stride_product,
)
from volseg.utils.config import plain
from volseg.utils.errors import UserInputError


class DynamicUNetAdapter(NetworkAdapter):
    """nnU-Net's U-Nets: divisible by the product of their ``strides``; deep supervision; blocks
    named one level down (the decoder holds the encoder)."""

    family = "nnU-Net's dynamic-network-architectures U-Net"
    checkpointing_list = "submodule names (encoder.stages.0, decoder.stages.1, ...)"

    def plan(self, net_cfg: Any, patch: Sequence[int]) -> list[Planned]:
        """``_convert_: all``: their constructors take lists, not ``ListConfig``."""
        if net_cfg.get("_convert_") in (None, "none"):
            why = "its constructor takes plain lists (strides, kernel sizes), not ListConfig"
            return [Planned("model.net._convert_", "all", "planned", why)]
        return []

    def divisibility(self, net_cfg: Any, patch: Sequence[int] | None) -> list[int]:
        return stride_product(net_cfg.strides, int(net_cfg.n_stages))

    def deep_supervision(self, net_cfg: Any) -> bool:
        return bool(net_cfg.get("deep_supervision", False))

    def blocks(self, net: nn.Module) -> list[tuple[str, nn.Module]]:
        found: list[tuple[str, nn.Module]] = []
        for owner, lists in (("encoder", ("stem", "stages")), ("decoder", DECODER_LISTS)):
            parent = getattr(net, owner, None)
            for name in lists:
                child = getattr(parent, name, None)
                if isinstance(child, nn.Sequential | nn.ModuleList):
                    found += [(f"{owner}.{name}.{n}", c) for n, c in child.named_children()]
                elif isinstance(child, nn.Module):
                    found.append((f"{owner}.{name}", child))
        return [(n, m) for n, m in found if any(True for _ in m.parameters())]

    def checkpointed_modes(
        self, net: nn.Module, spec: CheckpointSpec
    ) -> list[tuple[nn.Module, str]]:
        """``selective``: the decoder's stages are left to :func:`_decoder_forward_selectively`
        (see :meth:`apply_checkpointing`)."""
        modes = super().checkpointed_modes(net, spec)
        if spec != "selective":
            return modes
        stages = {id(m) for m in net.decoder.stages}
        return [(m, mode) for m, mode in modes if id(m) not in stages]

    def apply_checkpointing(self, net: nn.Module, spec: CheckpointSpec) -> None:
        """``selective`` also runs the decoder as :func:`_decoder_forward_selectively`: a stage's
        input, the concatenation (its level's largest map), would be kept by a checkpoint of the
        stage alone."""
        super().apply_checkpointing(net, spec)
        if spec == "selective":
            net.decoder.forward = partial(_decoder_forward_selectively, self, net.decoder)

    def chain(self, block: nn.Module) -> list[nn.Module]:
        """Also through the ``nn.Sequential`` their blocks' forwards run as they are
        (:data:`CHAINED_BY`)."""
        return flatten_chain(block, _dynamic_sequential_inside)


#: the decoder's lists of blocks, in the order its forward runs them
DECODER_LISTS = ("transpconvs", "stages", "seg_layers")
#: dynamic-network-architectures' blocks whose forward is one ``nn.Sequential`` attribute's
CHAINED_BY = {"StackedConvBlocks": "convs", "ConvDropoutNormReLU": "all_modules"}


def _dynamic_sequential_inside(module: nn.Module) -> nn.Sequential | None:
    name = CHAINED_BY.get(type(module).__name__)
    return getattr(module, name) if name is not None else sequential_inside(module)


def _decoder_forward_selectively(
    adapter: DynamicUNetAdapter, decoder: nn.Module, skips: list[torch.Tensor]
) -> Any:
    """``UNetDecoder.forward`` (``skips`` as the encoder made them, the bottleneck last), each
    stage a selective chain whose first segment runs the transposed convolution and the
    concatenation with the skip, so the concatenation is recomputed in backward, not kept.
    Evaluation and forwards without grad run the decoder's own forward."""
    if not (decoder.training and torch.is_grad_enabled()):
        return type(decoder).forward(decoder, skips)
    x, outputs = skips[-1], []
    for s, stage in enumerate(decoder.stages):
        up = decoder.transpconvs[s]

        def merge(x: torch.Tensor, skip: torch.Tensor, up: nn.Module = up) -> torch.Tensor:
            return torch.cat((up(x), skip), 1)

        x = selective_chain(
            adapter.chain(stage), x, skips[-(s + 2)], before=merge, before_modules=[up]
        )
        if decoder.deep_supervision or s == len(decoder.stages) - 1:
            outputs.append(decoder.seg_layers[s if decoder.deep_supervision else -1](x))
    return outputs[::-1] if decoder.deep_supervision else outputs[0]


class Pytorch3DUNetAdapter(NetworkAdapter):
    """pytorch-3dunet's ``AbstractUNet``s: ``is_segmentation`` must be false (volseg's loss takes
    logits); an argument their ``**kwargs`` would drop is refused; divisibility probed."""

    #: no ``selective``: the residual blocks add the skip in place onto a convolution's output
    #: (``out += residual``), which torch's selective checkpointing refuses (a kept output mutated)
    checkpointing_choices = ("none", "all")
    family = "pytorch-3dunet U-Net"

    def plan(self, net_cfg: Any, patch: Sequence[int]) -> list[Planned]:
        cls = get_class(str(net_cfg._target_))
        named = {
            name
            for klass in cls.__mro__
            if klass.__module__.startswith("pytorch3dunet")
            for name, p in inspect.signature(klass.__init__).parameters.items()
            if p.kind not in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)
        } - {"self", "basic_module", "is3d"}
        unknown = sorted(str(k) for k in net_cfg if not str(k).startswith("_") and k not in named)
        if unknown:
            raise UserInputError(
                f"model.net.{unknown[0]}: {cls.__name__} takes no argument {unknown[0]!r} (its "
                f"constructor would drop it); it takes {', '.join(sorted(named))}"
            )
        configured = plain(net_cfg.get("is_segmentation", None))
        if configured is None:
            why = (
                f"{cls.__name__} applies its final sigmoid or softmax in training too unless "
                "is_segmentation is false; volseg's loss takes logits"
            )
            return [Planned("model.net.is_segmentation", False, "planned", why)]
        if configured is not False:
            raise UserInputError(
                f"model.net.is_segmentation={configured}: {cls.__name__} would then apply a "
                "sigmoid or softmax in training too, and volseg's loss takes logits (it applies "
                "the softmax itself): set model.net.is_segmentation=false"
            )
        return [Planned("model.net.is_segmentation", False, "configured")]
